"""The simulated clock against the real engine: TPOT p50 within 5 %, TTFT p50 within 10 %, E2E p99 within 10 %.

    python benchmarks/study_fidelity.py [--scale default] [--out DIR]

Runs `inferledger study fidelity` (a real run to fit the step model on, a real run of a different
workload, and that workload's requests on the simulated clock with the fit) into a study folder, and
records each figure's real and simulated value, the error and its target, and the fit's parameters.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", default="default")
    ap.add_argument("--out", type=Path, default=None, help="the study folder (default: a temporary one)")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    rec = results.start("study_fidelity", {"scale": a.scale})
    import inferledger

    out = a.out or Path(tempfile.mkdtemp(prefix="study-fidelity-")) / "fidelity"
    t0 = time.perf_counter()
    res = inferledger.study("fidelity", out, scale=a.scale)
    wall = time.perf_counter() - t0
    tables = {t.name: t for t in res.tables}
    rows = [dict(zip(tables["fidelity"].columns, r)) for r in tables["fidelity"].rows]
    fit = dict(zip(tables["fit"].columns, tables["fit"].rows[0]))
    steps = [dict(zip(tables["steps"].columns, r)) for r in tables["steps"].rows]
    figures = {
        "study_wall_s": round(wall, 2),
        "figures": [{"figure": r["figure"], "real_ms": r["real_ms"], "sim_ms": r["sim_ms"],
                     "error_ratio": r["error_ratio"], "target_ratio": r["target_ratio"], "met": r["met"],
                     "requests": r["n_real"]} for r in rows],
        "fit": {"alpha_ms": fit["alpha_ms"], "per_gflop_ms": fit["ms_per_gflop"], "per_mb_ms": fit["ms_per_mb"],
                "gap_alpha_ms": fit["gap_alpha_ms"], "gap_per_seq_ms": fit["gap_ms_per_seq"],
                "n_train": fit["n_train"], "n_held_out": fit["n_held_out"],
                "held_out_median_abs_pct": fit["held_out_median_abs_pct"]},
        "steps": [{"run": s["run"], "steps": s["steps"], "step_p50_ms": s["step_ms_p50"], "busy_s": s["busy_s"]}
                  for s in steps]}
    path = rec.write(figures)
    for r in rows:
        if r["target_ratio"] is not None:
            err = "unknown" if r["error_ratio"] is None else f"{r['error_ratio']:+.1%}"
            print(f"{r['figure']}: real {r['real_ms']:.1f} ms, sim {r['sim_ms']:.1f} ms, {err} "
                  f"(target ±{r['target_ratio']:.0%}: {'met' if r['met'] else 'not met'})")
    print(f"study {wall:.0f} s; folder {out}; results {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
