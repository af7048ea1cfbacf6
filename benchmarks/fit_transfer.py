"""A step fit from one workload predicting another workload's steps, on this host.

    python benchmarks/fit_transfer.py [--tasks 15] [--workloads cpu_short_chat cpu_mixed] [--keep DIR [--reuse]]
                                      [--co-tenants 2]

Two of samples/workloads/ scaled down to --tasks tasks (a copy of each TOML), each captured on the
bundled engine (`inferledger capture`, its microbenchmarks repeated over the run) and rebuilt
(`inferledger reconstruct`); then `inferledger fit A --test B` and `fit B --test A` (ledger/step_fit.py
`transfer`): the |error| in percent of the one run's fit on every step of the other, all steps and by
kind, against cpu_ms and against the wall time. Also recorded: each run's measured rates (the best of
its microbenchmark repeats, and every repeat), its steps faster than their bound, and the load average
over its capture (the host samples' 1-minute load, so a rerun with --reuse still says how busy the host
was while the steps ran).
With --co-tenants N, N CPU-burning processes (benchmarks/co_tenants.py) run through both captures:
the steps then wait for a CPU, which `cpu_ms` leaves out (steps.contention_ms records it), and the
figures say how much of the steps' time that wait was.
Targets: median |error| <= 10 % both ways, p90 <= 20 %, with co-tenants and without.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)
from co_tenants import CoTenants  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"median_abs_error_pct": 10.0, "p90_abs_error_pct": 20.0}


def scaled(name: str, tasks: int, into: Path) -> Path:
    """A copy of samples/workloads/NAME.toml with n_tasks = tasks and its task file's path made absolute."""
    src = ROOT / "samples" / "workloads" / f"{name}.toml"
    text = src.read_text()
    text = re.sub(r'^file = "([^"]+)"', lambda m: f'file = "{(src.parent / m.group(1)).resolve()}"', text, flags=re.M)
    text, n = re.subn(r"^n_tasks = \d+", f"n_tasks = {tasks}", text, flags=re.M)
    if not n:
        raise SystemExit(f"{src}: no n_tasks line to scale")
    out = into / f"{name}.toml"
    out.write_text(text)
    return out


def run_facts(run: Path) -> dict:
    from inferledger.ledger.query import open_ledger
    from inferledger.probes.run_folder import Manifest

    manifest = Manifest.read(run)
    params = manifest.block("device_params")
    registered = manifest.block("prediction").get("registered") or {}
    with open_ledger(run) as led:
        _, ((beats, steps, wait),) = led.rows(
            "SELECT count(*) FILTER (WHERE beats_bound), count(bound_ms), "
            "sum(contention_ms) / nullif(sum(measured_ms) FILTER (WHERE contention_ms IS NOT NULL), 0) FROM step_model")
        _, ((lo, hi),) = led.rows("SELECT min(value), max(value) FROM samples WHERE metric = 'host_load1'")
    return {"captured_utc": registered.get("wall_utc"), "steps": steps, "steps_below_bound": beats, "cpu_wait_share": wait, "load_1m_min": lo, "load_1m_max": hi,
            "memory_gb_s": (params.get("memcpy_gbps") or {}).get("peak"),
            "matmul_tflop_per_s": (params.get("matmul_tflops") or {}).get("peak"),
            "repeats": [{"at": r["at"], "memory_gb_s": r["memcpy_gbps"], "matmul_tflop_per_s": r["matmul_tflops"]}
                        for r in (params.get("repeats") or {}).get("runs", [])]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=15, help="tasks per workload (the samples have 40)")
    ap.add_argument("--workloads", nargs=2, default=["cpu_short_chat", "cpu_mixed"], help="two samples/workloads names")
    ap.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    ap.add_argument("--reuse", action="store_true", help="with --keep: use the runs already there, captured before")
    ap.add_argument("--co-tenants", type=int, default=0, help="CPU-burning processes beside both captures")
    a = ap.parse_args(argv)
    rec = results.start("fit_transfer", {k: str(v) for k, v in vars(a).items()})

    from inferledger.ledger.fit_read import transfer

    cli = str(Path(sys.executable).parent / "inferledger")
    root = a.keep or Path(tempfile.mkdtemp(prefix="fit-transfer-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        runs = []
        for name in a.workloads:
            run = root / name
            if a.reuse and (run / "ledger.duckdb").is_file():
                runs.append(run)
                continue
            with CoTenants(a.co_tenants):
                subprocess.run([cli, "capture", "-w", str(scaled(name, a.tasks, root)), "-o", str(run)], check=True,
                               stdout=subprocess.DEVNULL)
            subprocess.run([cli, "reconstruct", str(run)], check=True, stdout=subprocess.DEVNULL)
            runs.append(run)
        figures: dict = {"workloads": a.workloads, "runs": {r.name: run_facts(r) for r in runs}, "pairs": []}
        for train, test in ((runs[0], runs[1]), (runs[1], runs[0])):
            fit, summary = transfer(train, test)
            figures["pairs"].append({"train": train.name, "test": test.name, **summary,
                                     "fit": {"alpha_ms": fit.alpha_ms, "per_seq_ms": fit.ms_per_seq,
                                             "compute_efficiency_ratio": fit.compute_efficiency,
                                             "on_cpu_ms_per_wait_ms_ratio": fit.ms_per_wait_ms}})
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    figures["targets"] = [{"pair": f"{p['train']} -> {p['test']}", "figure": k, "target_pct": v,
                           "measured_pct": p[f"held_out_{k}"],
                           "met": None if p[f"held_out_{k}"] is None else bool(p[f"held_out_{k}"] <= v)}
                          for p in figures["pairs"] for k, v in TARGETS.items()]
    figures["co_tenants"] = a.co_tenants
    path = rec.write(json.loads(json.dumps(figures, default=float)),
                     notes="errors against cpu_ms (the step less its wait for a CPU, steps.contention_ms) and "
                           "against the wall step time; cpu_wait_share: the runs' steps' wait over their time")
    print(json.dumps(figures, indent=1, default=float))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
