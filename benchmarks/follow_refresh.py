"""`reconstruct --follow` on a capture of 10,000 attempts: each refresh, from a part's rename to the new ledger's.

    python benchmarks/follow_refresh.py [--attempts 10000] [--tokens 256] [--seed 7] [--flush-s 2]
        [--refreshes 5] [--at 0.8] [--out DIR]

The synthetic run of benchmarks/ledger_scale.py (the same generator: Poisson arrivals at ~50 req/s,
one engine.token per 8 tokens, ~302 events per attempt of 256 tokens) is written as a capture writes
it: its events cut at every `--flush-s` seconds of simulated time into parts, each written under a
dot name and renamed whole, the manifest saying `running` until the end. The parts up to `--at` of
the run are written at once and the ledger built (the first refresh: whole); then each of the next
`--refreshes` parts lands and is refreshed as `reconstruct --follow` refreshes it (ledger/incremental.py,
in this process, as the follow loop runs it), timed from the part's rename to the new ledger renamed
over ledger.duckdb, with the time of each step, the process's CPU time (all its threads: on a shared host
the figure the others' load moves least), how the refresh was built and the load average. Then
a whole rebuild of the same parts (what each refresh cost before the incremental path), whose tables
must equal the last incremental ledger's (every table, as the identical-tables tests hold them; the script
exits 1 otherwise),
and the final refresh once the manifest says complete (whole, as a fresh `reconstruct`).

The target (issue "the ledger at the speed of its data"): each refresh within 2 s of the flush it
reads. The follow loop's look interval (`--every`, 2 s by default) adds up to that much before a
refresh starts; the figure here is the refresh itself.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402
from ledger_scale import CLOCK, HOST, generate  # noqa: E402  (the same synthetic run)

TARGET_S = 2.0


def _cut(events, flush_s: float) -> list:
    """The events (in time order) cut at every flush_s seconds of simulated time: one table per flush."""
    import numpy as np

    ts = events.column("ts_ns").to_numpy()
    edges = np.arange(ts[0], ts[-1] + 1, int(flush_s * 1e9))[1:]
    bounds = [0, *np.searchsorted(ts, edges, side="left").tolist(), len(ts)]
    return [events.slice(a, b - a) for a, b in zip(bounds, bounds[1:]) if b > a]


def _start(run: Path, n: int, t: int, seed: int) -> None:
    from inferledger.collectors.rundir.writer import RunWriter
    from inferledger.probes.run_folder import Manifest

    w = RunWriter(run, run.name)
    w.clock_domain(CLOCK, host=HOST, kind="monotonic")
    w.flush()
    w.write_manifest({"source": "benchmarks/follow_refresh.py (synthetic)",
                      "workload": {"attempts": n, "output_tokens": t, "seed": seed, "arrival_rps": 50}})
    Manifest({**Manifest.read(run).body, "state": "running"}).write(run)
    (run / "events").mkdir(exist_ok=True)


def _flush(run: Path, table, i: int) -> None:
    """Part i as a capture writes it: under a dot name, renamed whole."""
    import pyarrow.parquet as pq

    tmp = run / "events" / f".part-{i:05d}.parquet.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, run / "events" / f"part-{i:05d}.parquet")


def _differing(a: Path, b: Path) -> list[str]:
    """What differs between two ledgers, table by table: the identical-tables helper the tests use
    (tests/scale_util.py: rows in a total order, floats within 1e-9 relative, as DuckDB's threads sum)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from scale_util import ledger_differences

    return ledger_differences(a, b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attempts", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--flush-s", type=float, default=2.0, help="simulated seconds between two parts (the capture's flush)")
    ap.add_argument("--refreshes", type=int, default=5, help="parts landed and refreshed one by one, each timed")
    ap.add_argument("--at", type=float, default=0.8, help="the share of the run's parts written before the timed ones")
    ap.add_argument("--out", help="folder for the run (kept); default a temporary folder, removed")
    a = ap.parse_args(argv)
    if a.attempts < 1 or a.tokens < 2 or a.refreshes < 1 or not 0 < a.at < 1 or a.flush_s <= 0:
        ap.error("need --attempts >= 1, --tokens >= 2, --refreshes >= 1, 0 < --at < 1 and --flush-s > 0")

    import pyarrow as pa

    from inferledger.ledger.incremental import refresh, state_path
    from inferledger.ledger.reconstruct import BuildOptions, reconstruct
    from inferledger.probes.run_folder import Manifest

    rec = results.start("follow_refresh", vars(a))
    base = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="follow_refresh_"))
    run = base / f"follow-{a.attempts}x{a.tokens}"
    shutil.rmtree(run, ignore_errors=True)
    try:
        events = pa.concat_tables(generate(a.attempts, a.tokens, a.seed, run.name))
        flushes = _cut(events, a.flush_s)
        first = int(len(flushes) * a.at)
        if first + a.refreshes > len(flushes):
            ap.error(f"the run has {len(flushes)} flushes: --at {a.at} and --refreshes {a.refreshes} pass its end")
        print(f"machine: nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}; {events.num_rows:,} events in "
              f"{len(flushes)} flushes of {a.flush_s:g} s; the first {first} written at once", flush=True)
        _start(run, a.attempts, a.tokens, a.seed)
        for i in range(first):
            _flush(run, flushes[i], i)
        live = BuildOptions(live=True)
        t0 = time.perf_counter()
        done = refresh(run, live, None)
        state = done.state
        rows = [{"part": first - 1, "how": done.how, "wall_s": round(time.perf_counter() - t0, 3),
                 "events": done.summary.n_events, "new_events": sum(f.num_rows for f in flushes[:first]),
                 "load_1m": os.getloadavg()[0], "steps": {}}]
        print(f"first refresh ({first} parts, {done.summary.n_events:,} events): {rows[0]['wall_s']:.2f} s, {done.how}",
              flush=True)
        for i in range(first, first + a.refreshes):
            _flush(run, flushes[i], i)
            t0, c0 = time.perf_counter(), time.process_time()  # from the part's rename
            done = refresh(run, live, state)
            wall = time.perf_counter() - t0  # to the new ledger renamed in place
            cpu = time.process_time() - c0  # this process's CPU (every thread's) meanwhile: less the host's load
            state = done.state
            steps = {f"{k.replace(' ', '_')}_s": round(v, 3) for k, v in done.steps.items()}
            rows.append({"part": i, "how": done.how, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                         "events": done.summary.n_events,
                         "new_events": flushes[i].num_rows, "load_1m": os.getloadavg()[0], "steps": steps})
            print(f"part {i}: {wall:.2f} s, CPU {cpu:.2f} s ({done.summary.n_events:,} events, "
                  f"{flushes[i].num_rows:,} new), {done.how}; "
                  + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()), flush=True)
        t0 = time.perf_counter()
        fresh = reconstruct(run, live, out=base / "whole.duckdb")
        whole_s = time.perf_counter() - t0
        differ = _differing(run / "ledger.duckdb", fresh.path)
        print(f"whole rebuild of the same parts: {whole_s:.2f} s; tables differing from the incremental ledger: "
              f"{', '.join(differ) or 'none'}", flush=True)
        for i in range(first + a.refreshes, len(flushes)):
            _flush(run, flushes[i], i)
        Manifest({**Manifest.read(run).body, "state": "complete"}).write(run)
        t0 = time.perf_counter()
        final = refresh(run, BuildOptions(live=False), state)
        final_s = time.perf_counter() - t0
        state_path(run / "ledger.duckdb").unlink(missing_ok=True)
        print(f"final refresh ({final.summary.n_events:,} events): {final_s:.2f} s, {final.how}", flush=True)
    finally:
        if not a.out:
            shutil.rmtree(base, ignore_errors=True)
    timed = [r["wall_s"] for r in rows[1:]]
    worst = max(timed)
    figures = {"attempts": a.attempts, "output_tokens": a.tokens, "events": events.num_rows, "flushes": len(flushes),
               "flush_s": a.flush_s, "refreshes": rows, "worst_refresh_s": worst,
               "median_refresh_s": sorted(timed)[len(timed) // 2], "whole_s": round(whole_s, 3),
               "final_s": round(final_s, 3), "tables_differing": differ,
               "targets": [{"target": f"each refresh <= {TARGET_S:g} s of its flush", "measured": f"{worst:.2f} s",
                            "met": worst <= TARGET_S}]}
    print(f"\nresults: {rec.write(figures)}")
    if differ:
        print(f"\nthe incremental ledger differs from a whole rebuild in: {', '.join(differ)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
