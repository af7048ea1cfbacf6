"""The load study finds the knee on this machine within 10 minutes and names its first cause.

    python benchmarks/study_load.py [--scale default] [--out DIR] [--seed 7]

Runs `inferledger study load` (the speed probe's capacity, then Poisson arrivals at multiples of it on
the real engine, each point a capture) into a study folder, and records per point the offered,
completed and good rates, the good share, Little's law and the knee's indicators, then the knee and the
sentence naming its first cause. Target: the study's wall time <= 600 s, a knee found, its cause named.
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

TARGET_S = 600.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", default="default")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None, help="the study folder (default: a temporary one)")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    rec = results.start("study_load", {"scale": a.scale, "seed": a.seed})
    import inferledger

    out = a.out or Path(tempfile.mkdtemp(prefix="study-load-")) / "load"
    t0 = time.perf_counter()
    res = inferledger.study("load", out, scale=a.scale, seed=a.seed)
    wall = time.perf_counter() - t0
    tables = {t.name: t for t in res.tables}
    load, knee = tables["load"], tables["knee"]
    points = [dict(zip(load.columns, row)) for row in load.rows]
    knee_rps, knee_multiple, _, _, _, sentence = knee.rows[0]
    figures = {
        "study_wall_s": round(wall, 2), "capacity_note": load.note,
        "points": [{"run": p["run"], "multiple_ratio": None if p["multiple"] is None else float(p["multiple"]),
                    "offered_per_s": p["offered_rps"],
                    "attempted_per_s": p["attempted_rps"], "completed_per_s": p["completed_rps"],
                    "goodput_per_s": p["goodput_rps"], "good_share": p["good_share"],
                    "little_l_ratio": p["little_l"], "little_lambda_w_ratio": p["little_lambda_w"],
                    "little_rel_err_ratio": p["little_rel_err"],
                    "ttft_p50_ms": p["ttft_p50_ms"], "e2e_p99_ms": p["e2e_p99_ms"], "first_cause": p["first_cause"],
                    "first_cause_share": p["first_cause_share"],
                    **{c: p[c] for c in load.columns if c.endswith("_share") and c != "first_cause_share"}}
                   for p in points],
        "knee_per_s": knee_rps, "knee_multiple_ratio": None if knee_multiple is None else float(knee_multiple),
        "first_cause": sentence,
        "target_met": wall <= TARGET_S and knee_rps is not None and "first cause:" in sentence}
    path = rec.write(figures)
    print(sentence)
    print(f"study {wall:.0f} s (target <= {TARGET_S:.0f} s); folder {out}; results {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
