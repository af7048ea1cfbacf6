"""Client loop lag in an embedded capture (the demo's shape), with the step thread placed or not.

The demo's client, HTTP front end and engine share one process. This runs a fixed closed-loop
capture (--concurrency chats of --prompt-tokens prompt tokens, --max-tokens output tokens with
ignore_eos, --tasks tasks, the embedded engine) --pairs times with the engine's step thread placed
(EngineConfig.cpu_threads="auto") and not (None: torch's own threads), the order alternating within
each pair, one model loaded for all. Beside every capture a bare asyncio loop runs in a separate
process with the same 10 ms watcher: the lag a client would see here whoever else is in its
process (the machine's floor). Prints per run the client's loop lag p99 and maximum (from the
capture's manifest), the bare loop's p99, the wall time, the load average before; then the median of
the paired ratios auto / none.

    .venv/bin/python benchmarks/loop_lag.py [--pairs 3] [--concurrency 8] [--tasks 16] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from inferledger.collectors.capture.run import capture  # noqa: E402
from inferledger.collectors.capture.options import CaptureOptions  # noqa: E402
from inferledger.engine.loader import load_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)

ROOT = Path(__file__).resolve().parent.parent
# the client's watcher, alone in a process: sleep 10 ms, count how late it woke; stop on SIGTERM
BARE_LOOP = """\
import asyncio, json, signal, time
from inferledger.probes.quantile import quantile

async def main():
    stop, lags = asyncio.Event(), []
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    while not stop.is_set():
        t = time.monotonic_ns()
        await asyncio.sleep(0.01)
        lags.append(max(0.0, (time.monotonic_ns() - t) / 1e6 - 10.0))
    print(json.dumps({"p99_ms": quantile(lags, 0.99), "max_ms": max(lags), "samples": len(lags)}), flush=True)

asyncio.run(main())
"""


def workload(folder: Path, a) -> Path:
    path = folder / "loop_lag.toml"
    path.write_text(f'name = "loop-lag"\nseed = 3\n[taskset]\nfile = "{ROOT}/samples/tasks/basic.jsonl"\n'
                    f'[arrivals]\nprocess = "closed"\nconcurrency = {a.concurrency}\nn_tasks = {a.tasks}\n'
                    f'[contract]\ndeadline_ms = 600000\n[client]\ntimeout_ms = 300000\nmax_attempts = 1\n'
                    f'[generation]\nmax_tokens = {a.max_tokens}\ntemperature = 0.0\nignore_eos = true\n'
                    f'[[classes]]\nname = "chat"\nprompt_tokens = {a.prompt_tokens}\n')
    return path


def one_run(bundle, wl: Path, out: Path, cpu_threads, threads_default: int) -> dict:
    """One capture with a bare loop beside it; the client's lag from the manifest, the bare loop's from it."""
    torch.set_num_threads(threads_default)  # what an earlier placed run changed goes back first
    load = os.getloadavg()[0]
    bare = subprocess.Popen([sys.executable, "-c", BARE_LOOP], stdout=subprocess.PIPE, text=True)
    try:
        bare.stdout.readline()  # "ready": its loop runs before the capture starts
        res = capture(wl, out, CaptureOptions(engine_config={"cpu_threads": cpu_threads}), bundle=bundle)
    finally:
        bare.send_signal(signal.SIGTERM)
        floor = json.loads(bare.communicate(timeout=60)[0].strip().splitlines()[-1])
    client = res.manifest["client"]
    placement = res.manifest["engine_config"]["resolved"].get("cpu_placement") or {}
    return {"placement": "auto" if cpu_threads == "auto" else "none", "loop_lag_p99_ms": client["loop_lag_p99_ms"],
            "loop_lag_max_ms": client["loop_lag_max_ms"], "wall_s": round(res.wall_s, 3),
            "load_1m_before": round(load, 2), "bare_loop_p99_ms": round(floor["p99_ms"], 3),
            "bare_loop_max_ms": round(floor["max_ms"], 3), "attempts_completed": res.load.completed,
            "step_threads": placement.get("threads_read_back")}


def _median_ratio(pairs: list[dict], key: str) -> float | None:
    """Median over the pairs of auto / none; None when a pair has no none figure to divide by."""
    ratios = [p["auto"][key] / p["none"][key] for p in pairs if p["none"][key]]
    return round(statistics.median(ratios), 3) if ratios and len(ratios) == len(pairs) else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary folder, removed)")
    a = ap.parse_args(argv)
    rec = results.start("loop_lag", vars(a))
    base = a.out or Path(tempfile.mkdtemp(prefix="loop_lag_"))
    base.mkdir(parents=True, exist_ok=True)
    bundle = load_model()  # dtype auto, as the demo runs
    threads_default = torch.get_num_threads()
    runs = []
    try:
        wl = workload(base, a)
        for i in range(a.pairs):
            for spec in ((None, "auto") if i % 2 == 0 else ("auto", None)):
                row = {"run": len(runs) + 1, **one_run(bundle, wl, base / f"run{len(runs) + 1}", spec, threads_default)}
                runs.append(row)
                print(f"run {row['run']}: cpu_threads {row['placement']:<4}  loop lag p99 {row['loop_lag_p99_ms']:6.2f} ms"
                      f"  max {row['loop_lag_max_ms']:6.1f} ms  bare loop p99 {row['bare_loop_p99_ms']:6.2f} ms  wall "
                      f"{row['wall_s']:5.1f} s  load before {row['load_1m_before']:.2f}", flush=True)
    finally:
        if not a.out:
            shutil.rmtree(base, ignore_errors=True)
    pairs = [(runs[2 * i], runs[2 * i + 1]) for i in range(a.pairs)]
    by = [{r["placement"]: r for r in p} for p in pairs]
    p99, wall = (_median_ratio(by, "loop_lag_p99_ms"), _median_ratio(by, "wall_s"))
    print(f"median of the paired ratios auto / none: loop lag p99 {p99}, wall {wall}")
    path = rec.write({"dtype": str(bundle.dtype).removeprefix("torch."), "concurrency": a.concurrency,
                      "tasks": a.tasks, "prompt_tokens": a.prompt_tokens, "output_tokens": a.max_tokens,
                      "torch_threads_default": threads_default, "runs": runs,
                      "auto_over_none_p99_ratio": p99, "auto_over_none_wall_ratio": wall})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
