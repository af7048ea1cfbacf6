"""What the per-step contention records cost: µs per step, and their share of the median decode step.

Every engine step reads the schedstat of its step thread and of its intra-op workers twice
(probes/schedstat.py ComputeThreads: begin after step.start, end before step.end) and adds four
numbers to step.end. This measures that pair of reads (and the attributes' dict) --iterations times,
in batches of 100 (the figure: the median batch's wall time per step, beside the mean and the CPU time),
in a thread with 1 intra-op thread (the placed step thread behind the server: no workers) and with
torch's default thread count (its workers read too), then runs the engine on --seqs requests of
--tokens decode tokens and takes its median decode-only step, with the records on as always.
Targets: under 20 µs per step and under 0.5 % of the median decode step.

    .venv/bin/python benchmarks/step_records_cost.py [--iterations 20000] [--seqs 4] [--tokens 32]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the command line runs the engine
os.environ.setdefault("INFERLEDGER_COMPILE", "off")

import torch  # noqa: E402

from inferledger.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from inferledger.engine.loader import load_model  # noqa: E402
from inferledger.probes.schedstat import ComputeThreads  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)

TARGET_US, TARGET_PCT = 20.0, 0.5
BATCH = 100  # steps' records timed together; the figure is the median batch


def records_us(threads: int, iterations: int) -> dict:
    """µs per begin + end + attrs (us: the median batch's wall time per step; mean_us: the mean, host
    preemption included; cpu_us: the thread's CPU time per step) and the workers read, in a fresh thread
    holding `threads` intra-op threads."""
    out = {}

    def body() -> None:
        torch.set_num_threads(threads)
        torch.ones(1 << 16).add_(1)  # the OpenMP team exists, as after a first step
        ct = ComputeThreads()
        ct.begin(threads)
        sched = ct.end()
        assert sched is not None, ct.unavailable
        walls, cpu0 = [], time.thread_time_ns()
        for _ in range(iterations // BATCH):
            t0 = time.perf_counter_ns()
            for _ in range(BATCH):
                ct.begin(threads)
                ct.end().attrs()
            walls.append((time.perf_counter_ns() - t0) / BATCH / 1e3)
        out["us"] = statistics.median(walls)  # a batch the host preempted is contention, not the records' cost
        out["cpu_us"] = (time.thread_time_ns() - cpu0) / (len(walls) * BATCH) / 1e3
        out["mean_us"] = statistics.fmean(walls)
        out["workers"] = sched.workers
        ct.close()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out


class _Steps:
    """A sink keeping step.start / step.end times and the batch kinds."""

    def __init__(self) -> None:
        self.start: dict[int, tuple[int, list]] = {}
        self.ms: list[tuple[float, bool]] = []  # (step ms, decode only)

    def emit(self, row: dict) -> None:
        if row["name"] == "step.start":
            self.start[row["step_id"]] = (row["ts_ns"], json.loads(row["attrs"])["batch"])
        elif row["name"] == "step.end":
            t0, batch = self.start.pop(row["step_id"])
            self.ms.append(((row["ts_ns"] - t0) / 1e6, all(b[1] == "decode" for b in batch)))


def median_decode_ms(bundle, seqs: int, tokens: int) -> tuple[float, int]:
    sink = _Steps()
    engine = LLMEngine(bundle, EngineConfig(max_num_seqs=seqs), sink=sink, run_id="bench")
    prompt = bundle.tokenizer.encode("The weather today is")
    for i in range(seqs):
        engine.add_request(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True), request_id=f"r{i}")
    while engine.has_unfinished():
        engine.step()
    engine.close()
    decode = [ms for ms, only in sink.ms if only]
    return statistics.median(decode), len(decode)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args(argv)
    rec = results.start("step_records_cost", vars(a))
    default_threads = torch.get_num_threads()
    alone, workers = records_us(1, a.iterations), records_us(default_threads, a.iterations)
    alone_us, with_us = alone["us"], workers["us"]
    bundle = load_model()
    step_ms, n_decode = median_decode_ms(bundle, a.seqs, a.tokens)
    worst = max(alone_us, with_us)
    share = worst / (step_ms * 1e3) * 100
    figures = {"step_thread_alone_us": round(alone_us, 3), "with_workers_us": round(with_us, 3),
               "step_thread_alone_cpu_us": round(alone["cpu_us"], 3), "with_workers_cpu_us": round(workers["cpu_us"], 3),
               "step_thread_alone_mean_us": round(alone["mean_us"], 3), "with_workers_mean_us": round(workers["mean_us"], 3),
               "workers": workers["workers"], "threads": default_threads, "median_decode_step_ms": round(step_ms, 3),
               "decode_steps": n_decode, "share_of_decode_step_pct": round(share, 4),
               "dtype": str(next(bundle.model.parameters()).dtype).removeprefix("torch."),
               "targets": [{"target": f"step records < {TARGET_US:g} µs per step", "measured": f"{worst:.2f} µs",
                            "met": worst < TARGET_US},
                           {"target": f"step records < {TARGET_PCT:g} % of the median decode step",
                            "measured": f"{share:.3f} %", "met": share < TARGET_PCT}]}
    path = rec.write(figures)
    cpu = results.cpu_info()
    print(f"CPU: {cpu.get('model')}; flags {' '.join(cpu.get('flags') or ['unknown'])}; "
          f"load (1 min) {os.getloadavg()[0]:.2f}")
    print(f"records: {alone_us:.2f} µs per step (step thread alone; CPU {alone['cpu_us']:.2f} µs), {with_us:.2f} µs "
          f"({workers['workers']} worker(s); CPU {workers['cpu_us']:.2f} µs); "
          f"median decode step {step_ms:.2f} ms over {n_decode} steps: {share:.3f} % -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
