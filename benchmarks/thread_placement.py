"""Pinned or not: one compute thread left to the OS against the same thread pinned to one CPU.

The engine offline (LLM.generate steps in this thread), one intra-op thread, one prompt of
--prompt-tokens tokens decoded for --max-tokens greedy tokens (ignore_eos). --rounds pairs of runs,
free (the OS puts the thread on whichever CPU frees first) and pinned (bound to the last CPU, where
cpu_threads="pinned" puts the step thread of a 2-CPU host), the order alternating within each pair
so neither always runs first. Prints tokens/s per run with the load average before it, the median
of each placement and the ratio pinned / free: measured in the same run, so it holds on a busy host
where the absolute figures do not.

    .venv/bin/python benchmarks/thread_placement.py [--rounds 3] [--prompt-tokens 60] [--max-tokens 24]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from inferledger.engine import LLM, EngineConfig, SamplingParams  # noqa: E402
from inferledger.engine.loader import load_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)
from engine_throughput import TEXT  # noqa: E402  (the same prose for prompts)


def one_run(llm: LLM, prompt: list[int], max_tokens: int, cpus: set[int]) -> float:
    """tokens/s of one generate with this thread allowed only `cpus`."""
    os.sched_setaffinity(0, cpus)
    t0 = time.perf_counter()
    out, = llm.generate([prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    dt = time.perf_counter() - t0
    assert len(out.token_ids) == max_tokens
    return max_tokens / dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="pairs of runs, free and pinned")
    ap.add_argument("--prompt-tokens", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16 or auto")
    a = ap.parse_args(argv)
    all_cpus = set(os.sched_getaffinity(0))
    if len(all_cpus) < 2:
        ap.error(f"this process may use {len(all_cpus)} CPU: pinned and free would be the same")
    rec = results.start("thread_placement", vars(a))
    torch.set_num_threads(1)
    bundle = load_model(dtype=a.dtype)
    llm = LLM(bundle=bundle, config=EngineConfig(max_num_seqs=1, enable_prefix_caching=False))
    prompt = bundle.tokenizer.encode(TEXT * 4)[: a.prompt_tokens]
    pinned_cpu = max(all_cpus)
    llm.generate([prompt], SamplingParams(max_tokens=2))  # warm-up
    runs = []
    try:
        for i in range(a.rounds):
            for placement in (("free", "pinned") if i % 2 == 0 else ("pinned", "free")):
                load = os.getloadavg()[0]
                tok_s = one_run(llm, prompt, a.max_tokens, all_cpus if placement == "free" else {pinned_cpu})
                runs.append({"run": len(runs) + 1, "placement": placement, "tok_s": round(tok_s, 3),
                             "load_1m_before": round(load, 2)})
                print(f"run {len(runs)}: {placement:<6} {tok_s:6.2f} tok/s  (load before {load:.2f})", flush=True)
    finally:
        os.sched_setaffinity(0, all_cpus)
    free = statistics.median(r["tok_s"] for r in runs if r["placement"] == "free")
    pinned = statistics.median(r["tok_s"] for r in runs if r["placement"] == "pinned")
    print(f"median free {free:.2f} tok/s, pinned to CPU {pinned_cpu} {pinned:.2f} tok/s: pinned / free {pinned / free:.2f}")
    path = rec.write({"threads": 1, "dtype": str(bundle.dtype).removeprefix("torch."), "prompt_tokens": len(prompt),
                      "output_tokens": a.max_tokens, "pinned_cpu": pinned_cpu, "cpus": sorted(all_cpus), "runs": runs,
                      "free_median_tok_s": round(free, 3), "pinned_median_tok_s": round(pinned, 3),
                      "pinned_over_free_ratio": round(pinned / free, 3)})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
