"""The report at scale: a 10,000-attempt run must report in <= 20 s into a file <= 15 MB.

    python benchmarks/report_scale.py [--attempts 10000] [--tokens 256] [--seed 7] [--out DIR] [--exports]

Steps: generate the synthetic run of benchmarks/ledger_scale.py (imported, same generator, same
Parquet layout), add KV occupancy samples every 50 ms (kv_blocks_used from the run's own kv.alloc /
kv.free events, a fixed pool), `reconstruct` it (timed, not a target here), then time `build_report`
(wall and CPU seconds) and measure the file. `--exports` also times the Perfetto and OTLP exports.
Prints the figures against the targets; exits 1 when a target is missed and `--strict` is given.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)

TARGET_S = 20.0
TARGET_MB = 15.0
SAMPLE_EVERY_MS = 50


def _ledger_scale():
    path = Path(__file__).with_name("ledger_scale.py")
    spec = importlib.util.spec_from_file_location("ledger_scale", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def add_kv_samples(run_dir: Path, clock: str, host: str) -> int:
    """kv_blocks_used / cached / free every 50 ms: blocks held between each attempt's kv.alloc and kv.free."""
    import duckdb
    import numpy as np
    import pyarrow as pa

    from inferledger.collectors.rundir.writer import write_table_atomic
    from inferledger.probes.events import SAMPLE_SCHEMA

    con = duckdb.connect()
    rows = con.execute(
        "SELECT arg_min(ts_ns, ts_ns) FILTER (WHERE name = 'kv.alloc'), arg_max(ts_ns, ts_ns) FILTER (WHERE name = 'kv.free'), "
        "max(value) FROM read_parquet(?) WHERE name IN ('kv.alloc', 'kv.free') GROUP BY attempt_id",
        [str(run_dir / "events" / "part-*.parquet")]).fetchnumpy()
    con.close()
    t0, t1, blocks = rows[list(rows)[0]], rows[list(rows)[1]], rows[list(rows)[2]]
    grid = np.arange(t0.min(), t1.max() + 1, SAMPLE_EVERY_MS * 1_000_000, dtype=np.int64)
    held = np.zeros(len(grid))
    order_a, order_f = np.argsort(t0), np.argsort(t1)
    cum_a = np.concatenate([[0.0], np.cumsum(blocks[order_a])])
    cum_f = np.concatenate([[0.0], np.cumsum(blocks[order_f])])
    held = cum_a[np.searchsorted(t0[order_a], grid, "right")] - cum_f[np.searchsorted(t1[order_f], grid, "right")]
    total = float(held.max() * 1.25 + 16)
    cached = np.minimum(total - held, 64.0)
    n = len(grid)
    metrics = [("kv_blocks_used", held), ("kv_blocks_cached", cached), ("kv_blocks_free", total - held - cached)]
    table = pa.table({
        "run_id": [run_dir.name] * (3 * n), "ts_ns": np.tile(grid, 3), "clock": [clock] * (3 * n),
        "source": ["engine"] * (3 * n), "host": [host] * (3 * n), "device": [None] * (3 * n),
        "metric": [m for m, _ in metrics for _ in range(n)],
        "value": np.concatenate([v for _, v in metrics]), "unit": ["blocks"] * (3 * n)}, schema=SAMPLE_SCHEMA)
    write_table_atomic(table, run_dir / "samples" / "part-00000.parquet")
    return 3 * n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attempts", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", help="folder for the run (kept); default: a temporary folder, removed")
    ap.add_argument("--exports", action="store_true", help="also time the Perfetto and OTLP exports")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    a = ap.parse_args(argv)
    rec = results.start("report_scale", vars(a))

    ls = _ledger_scale()
    from inferledger.report.build import build_report
    from inferledger.ledger.reconstruct import reconstruct

    base = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="report_scale_"))
    run_dir = base / f"bench-{a.attempts}x{a.tokens}"
    try:
        print(f"machine: nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}; run {run_dir}", flush=True)
        imp = ls.phase_import(run_dir, a.attempts, a.tokens, a.seed)
        n_samples = add_kv_samples(run_dir, ls.CLOCK, ls.HOST)
        print(f"generated {imp['events']:,} events, {n_samples:,} KV samples in {imp['seconds']:.1f} s", flush=True)
        t0 = time.perf_counter()
        s = reconstruct(run_dir)
        reconstruct_s = time.perf_counter() - t0
        print(f"reconstruct: {s.n_attempts:,} attempts in {reconstruct_s:.1f} s", flush=True)
        c0, t0 = _cpu_s(), time.perf_counter()
        res = build_report(run_dir)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
        mb = res.bytes / 1e6
        extra = []
        if a.exports:
            from inferledger.report.export import export_run

            for fmt in ("perfetto", "otlp"):
                t0 = time.perf_counter()
                r = export_run(run_dir, fmt)
                size = Path(r.destination).stat().st_size / 1e6
                extra.append((fmt, time.perf_counter() - t0, size, r.counts))
    finally:
        if not a.out:
            shutil.rmtree(base, ignore_errors=True)

    print()
    print(f"report: {res.attempts:,} attempts -> {wall:.2f} s wall, {cpu:.2f} s CPU, {mb:.2f} MB "
          f"(plotly.js inlined: ~4.8 MB of it)   load average now {os.getloadavg()[0]:.2f}")
    for fmt, sec, size, counts in extra:
        print(f"export {fmt}: {sec:.2f} s, {size:.1f} MB  {counts}")
    targets = [(f"report <= {TARGET_S:g} s", f"{wall:.2f} s", wall <= TARGET_S),
               (f"report file <= {TARGET_MB:g} MB", f"{mb:.2f} MB", mb <= TARGET_MB)]
    print(f"\n{'target':<24} {'measured':>10}  met")
    for name, got, ok in targets:
        print(f"{name:<24} {got:>10}  {'yes' if ok else 'NO'}")
    path = rec.write({"attempts": a.attempts, "output_tokens": a.tokens, "events": imp["events"], "kv_samples": n_samples,
                      "reconstruct_s": round(reconstruct_s, 3),
                      "report": {"attempts": res.attempts, "wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
                                 "size_mb": round(mb, 3)},
                      "exports": [{"format": fmt, "wall_s": round(sec, 3), "size_mb": round(size, 2), "counts": counts}
                                  for fmt, sec, size, counts in extra],
                      "targets": [{"target": name, "measured": got, "met": ok} for name, got, ok in targets]})
    print(f"results: {path}")
    return 1 if a.strict and not all(ok for *_x, ok in targets) else 0


if __name__ == "__main__":
    sys.exit(main())
