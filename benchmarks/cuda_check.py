"""The CUDA path, checked in one run on a GPU machine; docs/CUDA.md records what it printed.

1. Greedy equality: the same prompts, 32 tokens each, batched, through the engine on the CPU (fp32,
   the reference) and on the device in fp32 and bf16, each eager and with CUDA graphs. Reports, per
   configuration, how many sequences are identical to the reference and the tokens matched before
   the first divergence; graphs against eager in the same dtype must be identical.
2. Throughput on the device (bf16): eager against CUDA graphs at several concurrencies, output
   tokens/s and the ratio.
3. Device clock and energy: an embedded `capture` on the device (HTTP server, load client, the NVML
   energy sampler, `device.step` events from CUDA events). The run directory is written under --out
   so the ledger can rebuild it on a machine that has DuckDB; the script itself checks that every
   step.end has its device.step, the cuda clock's mapping (epsilon, drift) and the energy readings.

    python benchmarks/cuda_check.py --out DIR [--device cuda] [--prompts 8] [--tokens 32]

`--device cpu` runs the same code as a dry run on the CPU (no graphs, no device clock, no NVML):
the test suite does that, so the script cannot rot between GPU sessions. Everything measured goes
to DIR/cuda_check.json; the run directory to DIR/run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from inferledger.engine import LLM, EngineConfig, SamplingParams  # noqa: E402
from inferledger.engine.loader import load_model  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Name three prime numbers.",
             "Why is the sky blue?", "Explain what a hash table is.", "Count from one to ten.",
             "What is photosynthesis?", "Give me a word that rhymes with cat.", "Who wrote Hamlet?",
             "Describe a sunset in one sentence."]


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    qs = [QUESTIONS[i % len(QUESTIONS)] + (" Please be brief." * (i // len(QUESTIONS))) for i in range(n)]
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}])) for q in qs]


def greedy(bundle, prompts, tokens: int, graphs) -> list[list[int]]:
    cfg = EngineConfig(max_num_seqs=len(prompts), graph_batch_sizes=graphs, probes=False,
                       enable_prefix_caching=False)
    llm = LLM(bundle=bundle, config=cfg)
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))]


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict:
    prefix = []
    for a, b in zip(ref, got):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(n)
    return {"identical": sum(a == b for a, b in zip(ref, got)), "sequences": len(ref),
            "matched_prefix_tokens": prefix, "tokens_each": len(ref[0]) if ref else 0}


def throughput(bundle, prompts, tokens: int, concurrency: int, graphs) -> float:
    cfg = EngineConfig(max_num_seqs=concurrency, graph_batch_sizes=graphs, probes=False,
                       enable_prefix_caching=False, max_num_batched_tokens=max(512, concurrency))
    llm = LLM(bundle=bundle, config=cfg)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    llm.generate(prompts, params)  # warm-up: graph capture for every bucket and width it meets
    _sync(bundle)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    _sync(bundle)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def _sync(bundle) -> None:
    if bundle.device.type == "cuda":
        torch.cuda.synchronize()


WORKLOAD = Path(__file__).resolve().parent.parent / "samples" / "workloads" / "cpu_short_chat.toml"


def capture_run(bundle, run_dir: Path, max_num_seqs: int, workload: Path = WORKLOAD) -> dict:
    """An embedded capture on the device, then what can be checked without the ledger."""
    import pyarrow.parquet as pq

    from inferledger.cli.capture import capture

    capture(workload, run_dir, bundle=bundle, max_num_seqs=max_num_seqs)
    events = pq.read_table(run_dir / "events").to_pylist()
    samples = pq.read_table(run_dir / "samples").to_pylist() if (run_dir / "samples").exists() else []
    clocks = pq.read_table(run_dir / "clocks.parquet").to_pylist()
    ends = {e["step_id"]: json.loads(e["attrs"]) for e in events if e["name"] == "step.end"}
    dev = [e for e in events if e["name"] == "device.step"]
    host_ms = {}
    starts = {e["step_id"]: e["ts_ns"] for e in events if e["name"] == "step.start"}
    for e in events:
        if e["name"] == "step.end" and e["step_id"] in starts:
            host_ms[e["step_id"]] = (e["ts_ns"] - starts[e["step_id"]]) / 1e6
    modes: dict[str, int] = {}
    for a in ends.values():
        modes[a["mode"]] = modes.get(a["mode"], 0) + 1
    mapping = [c for c in clocks if c.get("from_clock") and c["from_clock"].startswith("cuda:")]
    energy = sorted((s["ts_ns"], s["value"]) for s in samples if s["metric"] == "gpu_energy_mj")
    n_out = sum(e["value"] for e in events if e["name"] == "engine.token")
    return {
        "steps": len(ends), "device_steps": len(dev),
        "every_step_has_device_time": sorted(d["step_id"] for d in dev) == sorted(ends),
        "step_modes": modes,
        "device_ms_total": round(sum(d["value"] for d in dev), 3),
        "host_step_ms_total": round(sum(host_ms.values()), 3),
        "cuda_mapping": [{k: c[k] for k in ("from_clock", "to_clock", "offset_ns", "epsilon_ns", "method")}
                         for c in mapping],
        "gpu_energy_readings": len(energy),
        "gpu_energy_j": round((energy[-1][1] - energy[0][1]) / 1e3, 3) if len(energy) > 1 else None,
        "output_tokens": n_out,
        "gaps": [g for g in _gaps(run_dir)],
    }


def _gaps(run_dir: Path) -> list[str]:
    import pyarrow.parquet as pq

    path = run_dir / "gaps.parquet"
    if not path.exists():
        return []
    return [f"{g['scope']}: {g['affects']}: {g['detail']}" for g in pq.read_table(path).to_pylist()]


def run_checks(device: str, out: Path, *, n_prompts: int = 8, tokens: int = 32,
               concurrency=(1, 8, 32), capture_seqs: int = 8, workload: Path = WORKLOAD,
               cpu_bundle=None, device_bundles=None) -> dict:
    """Every check; `cpu_bundle` / `device_bundles` ({"float32": b, "bfloat16": b}) reuse loaded models."""
    out.mkdir(parents=True, exist_ok=True)
    on_cuda = device.startswith("cuda")
    report: dict = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
                    "gpu": torch.cuda.get_device_name(0) if on_cuda else None}
    t_start = time.perf_counter()
    cpu = cpu_bundle or load_model(device="cpu")
    dtypes = ("float32", "bfloat16") if on_cuda else ("float32",)
    bundles = device_bundles or {d: load_model(device=device, dtype=getattr(torch, d)) for d in dtypes}
    prompts = chat_prompts(cpu.tokenizer, n_prompts)
    ref = greedy(cpu, prompts, tokens, graphs=None)
    buckets = tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b < n_prompts) + (n_prompts,)
    eq = report["greedy"] = {}
    for d, b in bundles.items():
        eager = greedy(b, prompts, tokens, graphs=None)
        graphs = greedy(b, prompts, tokens, graphs=buckets)
        eq[d] = {"eager_vs_cpu_fp32": agreement(ref, eager), "graphs_vs_cpu_fp32": agreement(ref, graphs),
                 "graphs_vs_eager": agreement(eager, graphs)}
    main = bundles["bfloat16" if on_cuda else "float32"]
    tp = report["throughput"] = []
    for c in concurrency:
        ps = chat_prompts(cpu.tokenizer, max(c, n_prompts))
        gb = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b < c) + (c,)
        eager = throughput(main, ps, tokens, c, graphs=None)
        graphs = throughput(main, ps, tokens, c, graphs=gb)
        tp.append({"concurrency": c, "eager_tok_s": round(eager, 1), "graphs_tok_s": round(graphs, 1),
                   "graphs_over_eager": round(graphs / eager, 3)})
    report["capture"] = capture_run(main, out / "run", capture_seqs, workload)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    (out / "cuda_check.json").write_text(json.dumps(report, indent=2))
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = ap.parse_args()
    report = run_checks(args.device, args.out, n_prompts=args.prompts, tokens=args.tokens,
                        concurrency=tuple(args.concurrency))
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
