"""The CUDA path, checked in one run of at most 8 minutes on a GPU machine (docs/CUDA.md).

Phases, each written to DIR/cuda_check.json as soon as it ends (its result, or its traceback: a
failing phase loses nothing already measured, and the phases after it still run unless they need
what failed):

  env          versions, cuDNN, the device, its UUID and the NVML device matched to it by UUID
  bandwidth    memcpy GB/s on the device (read + write): the ceiling MBU is measured against
  numerics     what bf16 matmuls accumulate in, measured; fp32 matmul precision (TF32 or not)
  attention    per attention shape of the engine: the SDPA backend the dispatcher runs, and each
               backend pinned alone (takes the shape? error against fp64?)
  load         the model on the CPU (fp32, the reference) and on the device (fp32, bf16)
  reference    CPU fp32 greedy tokens and teacher-forced logits along them
  correctness  per configuration (dtype x SDPA pin), eager and CUDA graphs over the batch
               buckets: logits and tokens against the CPU reference (cuda_model_checks.py)
  mbu          decode step device time at batch 1 and 64 (CUDA events), eager and graphs -> MBU
  throughput   tokens/s eager against graphs at several concurrencies, every bucket captured first
  capture      an embedded capture on the device: device.step per step.end, the cuda clock's mapping
               and drift, NVML energy of the matched GPU, joules per good result
  cudnn        last (a cuDNN fault can poison the CUDA context): the attention shapes with cuDNN
               pinned, and bf16 correctness with cuDNN first, math its fallback

    python benchmarks/cuda_check.py --out DIR [--device cuda] [--budget-s 400] [--model-free]

`--device cpu` runs the same code as a dry run on the CPU (no graphs, no device clock, no NVML):
the test suite does that. `--model-free` runs only env, bandwidth, numerics and attention (the
first call on a GPU machine, before the second half of the model arrives). A phase that would start
after --budget-s is recorded as skipped, so the run ends inside the device call's limit.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules below
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import cuda_model_checks as mc  # noqa: E402
import cuda_probes as probes  # noqa: E402
import results  # noqa: E402  (benchmarks/results.py: this run's results file)
from cuda_results import cuda_figures  # noqa: E402

WORKLOAD = Path(__file__).resolve().parent.parent / "samples" / "workloads" / "cuda_check.toml"
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Name three prime numbers.",
             "Why is the sky blue?", "Explain what a hash table is.", "Count from one to ten.",
             "What is photosynthesis?", "Give me a word that rhymes with cat.", "Who wrote Hamlet?",
             "Describe a sunset in one sentence."]
# the SDPA configurations the model is checked under: the dispatcher's choice, cuDNN excluded
# (the pinned main one) and math alone; cuDNN first (math its fallback) runs in its own phase, last,
# so that a cuDNN failure that poisons the CUDA context cannot take the other phases with it
SDPA_CONFIGS = {"default": None, "no_cudnn": ["flash", "efficient", "math"], "math": ["math"]}
CUDNN_CONFIG = ["cudnn", "math"]
NOT_CUDNN = ["flash", "efficient", "math"]


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    qs = [QUESTIONS[i % len(QUESTIONS)] + (" Please be brief." * (i // len(QUESTIONS))) for i in range(n)]
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}])) for q in qs]


class Report:
    """The JSON on disk, rewritten (atomically) after every phase."""

    def __init__(self, path: Path, budget_s: float, header: dict) -> None:
        self.path, self.budget_s, self.t0 = path, budget_s, time.perf_counter()
        self.data = {**header, "budget_s": budget_s, "phases": {}}
        self.write()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def phase(self, name: str, fn, *, needs: tuple[str, ...] = ()):
        """Run fn() as phase `name`; -> its result, or None when it failed or was skipped."""
        entry: dict = {}
        missing = [n for n in needs if not self.data["phases"].get(n, {}).get("ok")]
        if missing:
            entry = {"ok": False, "skipped": f"needs {', '.join(missing)}"}
        elif self.elapsed() > self.budget_s:
            entry = {"ok": False, "skipped": f"budget: {self.elapsed():.0f} s of {self.budget_s:.0f} s spent"}
        result = None
        if not entry:  # on disk while it runs: a run killed by its timeout shows where it was
            self.data["phases"][name] = {"ok": None, "running_since_s": round(self.elapsed(), 1)}
            self.write()
            t0 = time.perf_counter()
            try:
                result = fn()
                entry = {"ok": True, "result": _jsonable(result)}
            except Exception as exc:  # recorded with its traceback; the next phases still run
                entry = {"ok": False, "error": repr(exc)[:500], "traceback": traceback.format_exc()[-4000:]}
            entry["seconds"] = round(time.perf_counter() - t0, 2)
        self.data["phases"][name] = entry
        self.write()
        print(f"[{self.elapsed():6.1f} s] {name}: " + ("ok" if entry.get("ok") else entry.get("skipped")
                                                      or entry.get("error")), flush=True)
        return result

    def write(self) -> None:
        self.data["seconds"] = round(self.elapsed(), 1)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        os.replace(tmp, self.path)


def _jsonable(value):
    """Drop what JSON cannot hold (tensors in the reference) from a phase's result."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items() if not isinstance(v, torch.Tensor)}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class CheckPlan(NamedTuple):
    """How much each phase does (the command's flags)."""
    n_prompts: int = 8
    tokens: int = 32
    concurrency: tuple[int, ...] = (1, 8, 64)
    mbu_batches: tuple[int, ...] = (1, 64)
    mbu_context: int = 256  # context tokens of each sequence in the MBU steps
    mbu_steps: int = 20  # decode steps timed per MBU batch (the median of all but the first two)
    capture_seqs: int = 16  # max_num_seqs of the capture phase
    workload: Path = WORKLOAD  # the capture phase's workload
    budget_s: float = 400.0  # no phase starts after this many seconds
    model_free: bool = False  # only the phases that need no model
    sdpa_configs: dict | None = None  # None: SDPA_CONFIGS on CUDA, the default alone elsewhere
    bandwidth_mib: int = 1024  # buffer copied by the bandwidth phase


def run_checks(device: str, out: Path, plan: CheckPlan = CheckPlan(), *, cpu_bundle=None, device_bundles=None) -> dict:
    """Every phase; `cpu_bundle` / `device_bundles` ({"float32": b, "bfloat16": b}) reuse loaded models."""
    n_prompts, tokens, concurrency, mbu_batches = plan.n_prompts, plan.tokens, plan.concurrency, plan.mbu_batches
    mbu_context, capture_seqs, workload, budget_s = plan.mbu_context, plan.capture_seqs, plan.workload, plan.budget_s
    model_free, sdpa_configs, bandwidth_mib = plan.model_free, plan.sdpa_configs, plan.bandwidth_mib
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    on_cuda = dev.type == "cuda"
    if on_cuda:  # the numerics under test are the defaults except TF32, which no fp32 check may use
        torch.backends.cuda.matmul.allow_tf32 = False
    rep = Report(out / "cuda_check.json", budget_s, {"device": device, "model_free": model_free})
    P = rep.phase
    P("env", lambda: probes.environment(dev))
    bw = P("bandwidth", lambda: probes.memory_bandwidth(dev, bandwidth_mib))
    P("numerics", lambda: probes.accumulation(dev))
    P("attention", lambda: probes.attention_backends(dev, backends=NOT_CUDNN))
    if model_free:
        return rep.data
    from inferledger.engine.loader import load_model

    loaded: dict = {}

    def load():
        loaded["cpu"] = cpu_bundle or load_model(device="cpu")
        dtypes = ("float32", "bfloat16") if on_cuda else ("float32",)
        loaded["dev"] = device_bundles or {d: load_model(device=device, dtype=getattr(torch, d)) for d in dtypes}
        return {"identity": loaded["cpu"].identity, "device_dtypes": list(loaded["dev"])}
    P("load", load)
    prompts = chat_prompts(loaded["cpu"].tokenizer, n_prompts) if "cpu" in loaded else []
    ref = P("reference", lambda: mc.cpu_reference(loaded["cpu"], prompts, tokens), needs=("load",))

    def correctness():
        configs = sdpa_configs or (SDPA_CONFIGS if on_cuda else {"default": None})
        res = {}
        for dtype, bundle in loaded["dev"].items():
            for name, pin in configs.items():
                if dtype == "float32" and name not in ("default", "math"):
                    continue  # fp32 checks the arithmetic; the kernel choices are compared in bf16
                key = f"{dtype}/{name}"
                try:
                    res[key] = mc.correctness(bundle, name, pin, ref, prompts, tokens)
                except Exception as exc:  # one configuration failing (a backend refusing a shape) is a result
                    res[key] = {"error": repr(exc)[:500], "traceback": traceback.format_exc()[-2000:]}
                rep.data["phases"]["correctness"] = {"ok": None, "partial": _jsonable(res)}
                rep.write()
        return res
    P("correctness", correctness, needs=("reference",))
    main = (loaded.get("dev") or {}).get("bfloat16" if on_cuda else "float32")
    hbm = (bw or {}).get("best_gb_s")

    def mbu():
        return [mc.decode_mbu(main, b, mbu_context, graphs, hbm, steps=plan.mbu_steps) for b in mbu_batches
                for graphs in ((False, True) if on_cuda else (False,))]
    P("mbu", mbu, needs=("load",))

    def throughput():
        rows = []
        for c in concurrency:
            ps = chat_prompts(loaded["cpu"].tokenizer, max(c, n_prompts))
            eager, graphs = mc.throughput(main, ps, tokens, c, False), mc.throughput(main, ps, tokens, c, True)
            rows.append({"concurrency": c, "eager_tok_s": eager["tok_s"], "graphs_tok_s": graphs["tok_s"],
                         "graphs_over_eager": round(graphs["tok_s"] / eager["tok_s"], 3) if eager["tok_s"] else None,
                         "graphs_captured_before": graphs["graphs_captured_before"]})
        return rows
    P("throughput", throughput, needs=("load",))
    from cuda_capture_check import capture_run

    P("capture", lambda: capture_run(main, out / "run", capture_seqs, workload), needs=("load",))

    def cudnn():
        res = {"attention": probes.attention_backends(dev, backends=["cudnn"], default=False)}
        try:
            res["bfloat16/cudnn"] = mc.correctness(main, "cudnn", CUDNN_CONFIG, ref, prompts, tokens)
        except Exception as exc:  # a refusal is the result of this configuration
            res["bfloat16/cudnn"] = {"error": repr(exc)[:500], "traceback": traceback.format_exc()[-2000:]}
        return res
    if on_cuda:
        P("cudnn", cudnn, needs=("reference",))
    return rep.data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--mbu-batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--mbu-context", type=int, default=256, help="context tokens of each sequence in the MBU steps")
    ap.add_argument("--bandwidth-mib", type=int, default=1024, help="buffer copied by the bandwidth phase")
    ap.add_argument("--capture-seqs", type=int, default=16, help="max_num_seqs of the capture phase")
    ap.add_argument("--workload", type=Path, default=WORKLOAD, help="the capture phase's workload")
    ap.add_argument("--budget-s", type=float, default=400.0, help="no phase starts after this many seconds")
    ap.add_argument("--model-free", action="store_true", help="only the phases that need no model")
    args = ap.parse_args()
    rec = results.start("cuda_check", vars(args))
    plan = CheckPlan(n_prompts=args.prompts, tokens=args.tokens, concurrency=tuple(args.concurrency),
                     mbu_batches=tuple(args.mbu_batches), mbu_context=args.mbu_context,
                     bandwidth_mib=args.bandwidth_mib, capture_seqs=args.capture_seqs, workload=args.workload,
                     budget_s=args.budget_s, model_free=args.model_free)
    data = run_checks(args.device, args.out, plan)
    failed = [n for n, p in data["phases"].items() if not p.get("ok")]
    print(f"wrote {args.out / 'cuda_check.json'}; phases not ok: {failed or 'none'}")
    print(f"results: {rec.write(cuda_figures(data))}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
