"""Many small Parquet parts against one: what 2-second flushing costs `reconstruct`, and what compaction saves.

    python benchmarks/parts_compaction.py [--attempts 2000] [--tokens 64] [--parts 300 1800] [--repeat 3]

A capture flushes its buffers every 2 s (collectors/rundir/writer.py), so a 10-minute run leaves about 300
parts per folder and an hour-long `serve --out` about 1800. The synthetic run of
`benchmarks/ledger_scale.py` (same generator) is written as N parts of equal size, rebuilt, then
compacted by `probes/run_dir.compact` (what a clean end of capture and serve does) and
rebuilt again; the best of `--repeat` rebuilds is kept each time. The ledger's row counts must agree
between the two layouts (else exit 1), and the script prints seconds and the ratio many/one.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)
from ledger_scale import CLOCK, HOST, generate  # noqa: E402  (the same synthetic run)


def _best_rebuild(run: Path, repeat: int) -> tuple[float, tuple]:
    from inferledger.ledger.reconstruct import reconstruct

    best, counts = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        s = reconstruct(run)
        best = min(best, time.perf_counter() - t0)
        counts = (s.n_events, s.n_attempts, s.n_tasks, s.n_gaps)
    return best, counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attempts", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--parts", type=int, nargs="+", default=[300, 1800])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    rec = results.start("parts_compaction", vars(a))

    from inferledger.probes.run_dir import compact
    from inferledger.collectors.rundir.writer import RunWriter, write_table_atomic
    from inferledger.probes.events import EVENT_SCHEMA

    table = generate(a.attempts, a.tokens, a.seed, "parts")
    print(f"{table.num_rows} events ({a.attempts} attempts x {a.tokens} tokens)")
    ok, measured = True, []
    for n_parts in a.parts:
        root = Path(tempfile.mkdtemp(prefix="parts-"))
        run = root / "parts"
        try:
            rows = -(-table.num_rows // n_parts)
            for i, start in enumerate(range(0, table.num_rows, rows)):
                write_table_atomic(table.slice(start, rows), run / "events" / f"part-{i:05d}.parquet")
            w = RunWriter(run, "parts")
            w.clock_domain(CLOCK, host=HOST, kind="monotonic")
            w.close()
            written = len(list((run / "events").glob("part-*.parquet")))
            many_s, many = _best_rebuild(run, a.repeat)
            t0 = time.perf_counter()
            compact(run / "events", EVENT_SCHEMA)
            compact_s = time.perf_counter() - t0
            one_s, one = _best_rebuild(run, a.repeat)
            ok &= many == one
            measured.append({"parts": written, "reconstruct_s": round(many_s, 3), "compaction_s": round(compact_s, 3),
                             "reconstruct_one_part_s": round(one_s, 3), "many_over_one_ratio": round(many_s / one_s, 3),
                             "counts_agree": many == one})
            print(f"{written:5d} parts: reconstruct {many_s:6.2f} s; compacted in {compact_s:5.2f} s to 1 part: "
                  f"reconstruct {one_s:6.2f} s; ratio many/one {many_s / one_s:5.2f}"
                  + ("" if many == one else f"  COUNTS DIFFER {many} vs {one}"))
        finally:
            shutil.rmtree(root)
    path = rec.write({"attempts": a.attempts, "output_tokens": a.tokens, "events": table.num_rows, "repeat": a.repeat,
                      "rows": measured})
    print(f"results: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
