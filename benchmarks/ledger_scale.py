"""Ledger at scale: reconstruct a synthetic run of ~3 million events and race a per-request loop.

    python benchmarks/ledger_scale.py [--attempts 10000] [--tokens 256] [--out DIR] [--seed 7] [--stages]
        [--memory-limit 4GB] [--no-peer] [--buckets 8 --engine ray --workers 2] [--reuse]

`--memory-limit` takes the bounded-memory path (peak target 6 GiB at any size); `--buckets` repartitions
the run first (its own phase), `--engine ray` then shards the ledger over a local Ray and records each
worker's peak RSS beside the largest shard's input. `--reuse` (with `--out`) rebuilds the run directory an
earlier run of the same size left there, skipping the import (and the repartition when it is partitioned).

Phases, each in its own subprocess so its peak RSS (getrusage ru_maxrss in the child) is its own:

  import  generate the run directory with numpy/pyarrow (no Python loop per event) and write it as
          Parquet parts of at most 500k rows through `write_table_atomic`, plus clocks.parquet,
          tasks.parquet (empty: the contracts ride on `task.start`) and manifest.json
  ledger  `reconstruct(run_dir)`: the whole ledger.duckdb
  query   `inferledger.open(run_dir)` (what `inferledger query` opens) and two questions a user asks of
          the finished ledger: quantiles over request_metrics (a row per attempt) and the
          p99 ITL of each layer over `itl` (a row per output event), each timed, with the phase's peak RSS
  peer    what a user writes without the ledger: pandas reads the events, groups by attempt and loops
          over the groups in Python computing TTFT (client and server), the client's ITL maximum and
          TPOT per request

The peer's per-attempt ttft_client_ms, ttft_server_ms, tpot_ms and itl_client_max_ms must equal the
ledger's `request_metrics` (max abs diff < 1e-6 ms) or the script exits 1: a benchmark of wrong
numbers is worthless. `--stages` also times reconstruct's steps one SQL statement at a time, the
same way reconstruct runs them, to find the slow stage.

The synthetic run, per attempt i (task T{i}, request R{i}, attempt A{i}), all on one monotonic clock
`mono:bench` in integer ns: Poisson arrivals (~50 req/s) give `arrival.planned` and `task.start`
(deadline_ms 7000); the client's attempt.created, attempt.sent, attempt.first_byte, one
attempt.chunk per output token (kinds [content], value 1) and attempt.done (usage.completion_tokens);
the engine's engine.enqueued, engine.scheduled (queue 0-500 ms), engine.prefill (20-200 ms),
engine.token every 8 tokens with value 8 (the last one carries the remainder), engine.finished
(reason length), kv.alloc, kv.release, kv.free; and the checker's verdict. Token k is committed at
t_k, with gaps lognormal around 20 ms and occasional 200 ms stalls; the client receives chunk k
0.1-2 ms after t_k; an engine.token event is stamped at the first token of its group of 8, so the
first engine.token is the first token and the server's TTFT precedes the client's.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: stdlib only, so the parent stays small)

PART_ROWS = 500_000
CLOCK = "mono:bench"
HOST = "bench"
TOKENS_PER_ENGINE_EVENT = 8
COMPARED = ("ttft_client_ms", "ttft_server_ms", "tpot_ms", "itl_client_max_ms")
TOLERANCE_MS = 1e-6
TARGET_RECONSTRUCT_S = 15.0
TARGET_PEAK_GIB = 4.0
TARGET_BOUNDED_PEAK_GIB = 6.0  # with --memory-limit: whatever the run's size
TARGET_SPEEDUP = 5.0


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 ** 2)  # KiB on Linux


def _cpu_s() -> float:
    """user + system CPU seconds of this process (all its threads): steadier than wall time on a busy host."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# --------------------------------------------------------------------------------------------------
# import: generate and write the run directory
# --------------------------------------------------------------------------------------------------
CHUNK_ATTEMPTS = 20_000  # generated and written this many attempts at a time: the import's memory is bounded


def generate(n: int, t: int, seed: int, run_id: str):
    """The events of the synthetic run as pyarrow Tables with EVENT_SCHEMA, one per chunk of attempts,
    each in time order (the chunks follow each other in arrival order)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    state = {"first": 0, "arrival_ns": 1_000_000_000_000, "seq": [0, 0, 0]}
    while state["first"] < n:
        yield _chunk(min(CHUNK_ATTEMPTS, n - state["first"]), t, rng, run_id, state)


def _chunk(n: int, t: int, rng, run_id: str, state: dict):
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from inferledger.probes.events import EVENT_SCHEMA

    MS = 1_000_000

    def u(lo_ms, hi_ms, shape=n):
        return (rng.uniform(lo_ms, hi_ms, shape) * MS).astype(np.int64)

    # client side
    arrival = state["arrival_ns"] + np.cumsum(rng.exponential(1e9 / 50.0, n)).astype(np.int64)  # ~50 req/s
    state["arrival_ns"] = int(arrival[-1])
    task_start = arrival + u(0.01, 0.5)
    created = task_start + u(0.01, 0.2)
    sent = created + u(0.05, 1.0)
    # engine side
    enqueued = sent + u(0.2, 2.0)
    scheduled = enqueued + u(0.0, 500.0)
    kv_alloc = scheduled + u(0.001, 0.05)
    prefill_end = scheduled + u(20.0, 200.0)
    gaps = rng.lognormal(np.log(20.0), 0.25, (n, t))
    gaps[rng.random((n, t)) < 0.005] += 200.0  # occasional stalls
    gaps[:, 0] = rng.uniform(0.05, 0.5, n)  # first token: just after the prefill
    tok = prefill_end[:, None] + np.cumsum((gaps * MS).astype(np.int64), axis=1)  # t_k, (n, t)
    finished = tok[:, -1] + u(0.05, 0.5)
    kv_release = finished + u(0.01, 0.1)
    kv_free = kv_release + u(0.01, 0.5)
    # the client sees each token 0.1-2 ms after the engine committed it
    chunk = tok + u(0.1, 2.0, (n, t))
    first_byte = enqueued + u(0.5, 3.0)  # response headers: before any token
    done = chunk[:, -1] + u(0.1, 1.0)
    verdict_ts = done + u(1.0, 50.0)
    correct = rng.random(n) < 0.9
    prompt = rng.integers(64, 2048, n)
    blocks = -(-(prompt + t) // 16)

    groups = -(-t // TOKENS_PER_ENGINE_EVENT)
    eng_tok_ts = tok[:, ::TOKENS_PER_ENGINE_EVENT]
    eng_tok_val = np.full(groups, float(TOKENS_PER_ENGINE_EVENT))
    eng_tok_val[-1] = t - TOKENS_PER_ENGINE_EVENT * (groups - 1)

    attrs_dict = ["{}", json.dumps({"kinds": ["content"]}, separators=(",", ":")),
                  json.dumps({"usage": {"completion_tokens": t}}, separators=(",", ":")),
                  json.dumps({"cached_tokens": 0}, separators=(",", ":")),
                  json.dumps({"reason": "length"}, separators=(",", ":")),
                  json.dumps({"correct": False}, separators=(",", ":")),
                  json.dumps({"correct": True}, separators=(",", ":")),
                  json.dumps({"deadline_ms": 7000}, separators=(",", ":"))]
    sources = ["client", "engine", "checker"]
    names: list[str] = []
    blocks_out = []  # (attempt index, name code, source code, ts, value, attrs code, id flags)
    idx = np.arange(n, dtype=np.int64)
    first = state["first"]
    state["first"] += n

    def block(name, source, ts, *, value=None, attrs=0, ids="tra"):
        ts = np.asarray(ts)
        k = ts.shape[1] if ts.ndim == 2 else 1
        if name not in names:
            names.append(name)
        att = np.repeat(idx, k)
        val = np.full(n * k, np.nan) if value is None else np.broadcast_to(np.asarray(value, float), ts.shape).reshape(-1)
        at = np.broadcast_to(np.asarray(attrs, np.int8), (n,) if ts.ndim == 1 else ts.shape).reshape(-1)
        blocks_out.append((att, np.full(n * k, names.index(name), np.int8), np.full(n * k, sources.index(source), np.int8),
                           ts.reshape(-1), val, at, ids))

    block("arrival.planned", "client", arrival, ids="t")
    block("task.start", "client", task_start, attrs=7, ids="t")
    block("attempt.created", "client", created)
    block("attempt.sent", "client", sent)
    block("attempt.first_byte", "client", first_byte)
    block("attempt.chunk", "client", chunk, value=1.0, attrs=1)
    block("attempt.done", "client", done, attrs=2)
    block("engine.enqueued", "engine", enqueued, value=prompt, ids="ra")
    block("engine.scheduled", "engine", scheduled, ids="ra")
    block("kv.alloc", "engine", kv_alloc, value=blocks, ids="ra")
    block("engine.prefill", "engine", prefill_end, value=prompt, attrs=3, ids="ra")
    block("engine.token", "engine", eng_tok_ts, value=np.broadcast_to(eng_tok_val, eng_tok_ts.shape), ids="ra")
    block("engine.finished", "engine", finished, value=float(t), attrs=4, ids="ra")
    block("kv.release", "engine", kv_release, value=blocks, ids="ra")
    block("kv.free", "engine", kv_free, value=blocks, ids="ra")
    block("verdict", "checker", verdict_ts, attrs=np.where(correct, 6, 5).astype(np.int8), ids="ta")

    att = np.concatenate([b[0] for b in blocks_out])
    name_c = np.concatenate([b[1] for b in blocks_out])
    src_c = np.concatenate([b[2] for b in blocks_out])
    ts = np.concatenate([b[3] for b in blocks_out])
    val = np.concatenate([b[4] for b in blocks_out])
    attrs_c = np.concatenate([b[5] for b in blocks_out])
    has = {c: np.concatenate([np.full(len(b[0]), c in b[6]) for b in blocks_out]) for c in "tra"}

    order = np.lexsort((att, ts))  # time order, as a capture would flush it
    att, name_c, src_c, ts, val, attrs_c = att[order], name_c[order], src_c[order], ts[order], val[order], attrs_c[order]
    has = {c: m[order] for c, m in has.items()}
    seq = np.empty(len(ts), np.int64)  # per-source sequence numbers, increasing with time
    for s in range(len(sources)):
        m = src_c == s
        seq[m] = state["seq"][s] + np.arange(int(m.sum()))
        state["seq"][s] += int(m.sum())

    def dict_col(codes, values):
        return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(values, pa.string())).dictionary_decode()

    def id_col(prefix, flag):
        ids = pa.array([f"{prefix}{first + i}" for i in range(n)], pa.string())  # one string per attempt, not per event
        return ids.take(pa.array(att, mask=~flag))

    nrows = len(ts)
    const = lambda v: dict_col(np.zeros(nrows, np.int8), [v])
    source = dict_col(src_c, sources)
    cols = {
        "run_id": const(run_id),
        "event_id": pc.binary_join_element_wise(source, pc.cast(pa.array(seq), pa.string()), ":"),
        "seq": pa.array(seq),
        "source": source,
        "host": const(HOST),
        "name": dict_col(name_c, names),
        "ts_ns": pa.array(ts),
        "clock": const(CLOCK),
        "task_id": id_col("T", has["t"]),
        "session_id": pa.nulls(nrows, pa.string()),
        "request_id": id_col("R", has["r"]),
        "attempt_id": id_col("A", has["a"]),
        "step_id": pa.nulls(nrows, pa.int64()),
        "value": pa.array(val, mask=np.isnan(val)),
        "attrs": dict_col(attrs_c, attrs_dict),
    }
    return pa.Table.from_arrays([cols[f.name] for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)


def phase_import(run_dir: Path, n: int, t: int, seed: int) -> dict:
    import numpy  # noqa: F401  (imported before the clock starts)
    import pyarrow  # noqa: F401

    from inferledger.collectors.rundir.writer import RunWriter, write_table_atomic
    from inferledger.probes import events  # noqa: F401

    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_id = run_dir.name
    c0, t0 = _cpu_s(), time.perf_counter()
    gen_s, rows, part = 0.0, 0, 0
    chunks = generate(n, t, seed, run_id)
    while True:
        g0 = time.perf_counter()
        table = next(chunks, None)
        gen_s += time.perf_counter() - g0
        if table is None:
            break
        for start in range(0, table.num_rows, PART_ROWS):
            write_table_atomic(table.slice(start, PART_ROWS), run_dir / "events" / f"part-{part:05d}.parquet")
            part += 1
        rows += table.num_rows
    w = RunWriter(run_dir, run_id)
    w.clock_domain(CLOCK, host=HOST, kind="monotonic")
    w.flush()  # clocks.parquet and an empty tasks.parquet
    w.write_manifest({"source": "benchmarks/ledger_scale.py (synthetic)",
                      "workload": {"attempts": n, "output_tokens": t, "seed": seed, "arrival_rps": 50,
                                   "deadline_ms": 7000}})
    t2 = time.perf_counter()
    size = sum(p.stat().st_size for p in (run_dir / "events").glob("part-*.parquet"))
    return {"seconds": t2 - t0, "cpu_s": _cpu_s() - c0, "generate_s": gen_s, "write_s": t2 - t0 - gen_s, "events": rows,
            "parts": part, "parquet_mib": size / 2 ** 20, "peak_gib": _peak_gib()}


# --------------------------------------------------------------------------------------------------
# ledger
# --------------------------------------------------------------------------------------------------
def reusable(run_dir: Path, n: int, t: int, seed: int) -> dict | None:
    """The import figures of a run directory an earlier run generated with these parameters, else None."""
    import pyarrow.parquet as pq

    try:
        workload = json.loads((run_dir / "manifest.json").read_text()).get("workload") or {}
    except (OSError, ValueError):
        return None
    if (workload.get("attempts"), workload.get("output_tokens"), workload.get("seed")) != (n, t, seed):
        return None
    parts = sorted((run_dir / "events").rglob("part-*.parquet"))
    if not parts:
        return None
    return {"events": sum(pq.ParquetFile(p).metadata.num_rows for p in parts), "parts": len(parts),
            "parquet_mib": sum(p.stat().st_size for p in parts) / 2 ** 20,
            "partitioned": (run_dir / "events" / "layout.json").exists()}


def phase_repartition(run_dir: Path, buckets: int) -> dict:
    from inferledger.collectors.rundir.repartition import repartition

    c0, t0 = _cpu_s(), time.perf_counter()
    counts = repartition(run_dir, buckets, memory_limit="2GB")
    return {"seconds": time.perf_counter() - t0, "cpu_s": _cpu_s() - c0, "partitions": len(counts),
            "largest_partition_events": max(counts.values()), "peak_gib": _peak_gib()}


def phase_ledger(run_dir: Path, memory_limit: str | None = None, engine: str = "local", workers: int = 2) -> dict:
    from inferledger.ledger.reconstruct import BuildOptions, reconstruct

    shards: list = []
    c0, t0 = _cpu_s(), time.perf_counter()
    s = reconstruct(run_dir, BuildOptions(memory_limit=memory_limit, engine=engine, workers=workers),
                    profile=shards if engine == "ray" else None)
    sec = time.perf_counter() - t0
    res = {"seconds": sec, "cpu_s": _cpu_s() - c0, "events": s.n_events, "attempts": s.n_attempts,
           "peak_gib": _peak_gib(), "ledger_mib": s.path.stat().st_size / 2 ** 20}
    if shards:  # each Ray worker's peak RSS (a worker runs shard after shard) beside the largest partition
        peaks: dict[int, float] = {}
        for sh in shards:
            peaks[sh["pid"]] = max(peaks.get(sh["pid"], 0.0), sh["peak_rss_kib"] / 2 ** 20)
        res.update(shards=len(shards), worker_peak_gib=sorted(round(v, 3) for v in peaks.values()),
                   largest_shard_input_mib=round(max(sh["parts_bytes"] for sh in shards) / 2 ** 20, 1),
                   shards_wall_s=round(sum(sh["seconds"] for sh in shards), 2))
    return res


QUERIES = {  # what a user asks of a finished ledger: per-attempt figures, then an event-sized table
    "request_metrics_quantiles_s": "SELECT quantile_cont(ttft_client_ms, [0.5, 0.99]), quantile_cont(tpot_ms, [0.5, 0.99]) "
                               "FROM request_metrics",
    "itl_p99_by_layer_s": "SELECT layer, count(*), quantile_cont(gap_ms, 0.99) FROM itl GROUP BY layer ORDER BY layer",
    # the events themselves: a scan of every event, then one attempt's (a ledger inside its run folder reads
    # them from the run's Parquet parts, one written elsewhere from its own copy)
    "events_by_name_s": "SELECT name, count(*), sum(value) FROM events GROUP BY name ORDER BY name",
    "events_of_one_attempt_s": "SELECT count(*), max(ts_ns) FROM events WHERE attempt_id = 'A77'",
}


def phase_query(run_dir: Path) -> dict:
    """`inferledger.open(run)` (the query surface of `inferledger query`) and each of QUERIES, timed."""
    import inferledger

    c0, t0 = _cpu_s(), time.perf_counter()
    times = {}
    with inferledger.open(str(run_dir)) as led:
        for label, sql in QUERIES.items():
            q0 = time.perf_counter()
            led.sql(sql).fetchall()
            times[label] = round(time.perf_counter() - q0, 3)
    return {"seconds": time.perf_counter() - t0, "cpu_s": _cpu_s() - c0, "queries_s": times, "peak_gib": _peak_gib()}


def phase_stages(run_dir: Path) -> dict:
    """reconstruct's steps one by one (its own `profile` hook), each SQL statement timed."""
    from inferledger.ledger.reconstruct import reconstruct

    profile: list = []
    reconstruct(run_dir, profile=profile)  # in its run folder, as the ledger phase builds it
    steps = [{"stage": st, "step": label, "seconds": sec} for st, label, sec in profile]
    return {"steps": steps, "seconds": sum(s["seconds"] for s in steps), "peak_gib": _peak_gib()}


# --------------------------------------------------------------------------------------------------
# peer: the per-request loop a user would write
# --------------------------------------------------------------------------------------------------
def _output_bearing(attrs: str | None) -> bool:
    kinds = json.loads(attrs).get("kinds") if attrs else None
    return kinds is None or any(k in kinds for k in ("content", "reasoning", "tool_call"))


def phase_peer(run_dir: Path, result: Path) -> dict:
    import math

    import numpy as np
    import pandas as pd

    c0, t0 = _cpu_s(), time.perf_counter()
    files = sorted(str(p) for p in (run_dir / "events").rglob("part-*.parquet"))  # either layout
    df = pd.read_parquet(files, columns=["attempt_id", "name", "ts_ns", "seq", "attrs"])
    df = df[df["attempt_id"].notna()]
    rows = []
    for attempt_id, g in df.groupby("attempt_id", sort=False):
        g = g.sort_values(["ts_ns", "seq"])
        name = g["name"]
        sent = g.loc[name == "attempt.sent", "ts_ns"]
        done = g[name == "attempt.done"]
        enq = g.loc[name == "engine.enqueued", "ts_ns"]
        tokens = g.loc[name == "engine.token", "ts_ns"]
        chunks = g[name == "attempt.chunk"]
        content = chunks.loc[chunks["attrs"].map(_output_bearing), "ts_ns"].to_numpy()

        ttft_client = (content[0] - sent.iloc[0]) / 1e6 if len(content) and len(sent) else math.nan
        ttft_server = (tokens.iloc[0] - enq.iloc[0]) / 1e6 if len(tokens) and len(enq) else math.nan
        itl_max = (np.diff(content) / 1e6).max() if len(content) > 1 else math.nan
        tpot = math.nan
        if len(done) and len(sent):
            usage = json.loads(done["attrs"].iloc[0] or "{}").get("usage") or {}
            n_tokens = usage.get("completion_tokens")
            e2e = (done["ts_ns"].iloc[0] - sent.iloc[0]) / 1e6
            if n_tokens is not None and n_tokens > 1:
                tpot = (e2e - ttft_client) / (n_tokens - 1)
        rows.append((attempt_id, ttft_client, ttft_server, tpot, itl_max))
    out = pd.DataFrame(rows, columns=["attempt_id", *COMPARED])
    sec, cpu = time.perf_counter() - t0, _cpu_s() - c0
    out.to_parquet(result)
    return {"seconds": sec, "cpu_s": cpu, "events": len(df), "attempts": len(out), "peak_gib": _peak_gib()}


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------
def _child(phase: str, *args: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--phase", phase, *args]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"phase {phase} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(ledger_db: Path, peer_file: Path) -> tuple[dict, list[str]]:
    import duckdb
    import numpy as np
    import pandas as pd

    con = duckdb.connect(str(ledger_db), read_only=True)
    led = con.execute(f"SELECT attempt_id, {', '.join(COMPARED)} FROM request_metrics").df()
    con.close()
    peer = pd.read_parquet(peer_file)
    problems = []
    if len(led) != len(peer) or set(led.attempt_id) != set(peer.attempt_id):
        problems.append(f"attempt sets differ: ledger {len(led)} rows, peer {len(peer)} rows")
    m = led.merge(peer, on="attempt_id", suffixes=("_ledger", "_peer"))
    diffs = {}
    for c in COMPARED:
        a = m[f"{c}_ledger"].to_numpy(float)
        b = m[f"{c}_peer"].to_numpy(float)
        null_mismatch = int((np.isnan(a) != np.isnan(b)).sum())
        both = ~np.isnan(a) & ~np.isnan(b)
        diffs[c] = float(np.abs(a[both] - b[both]).max()) if both.any() else 0.0
        if null_mismatch:
            problems.append(f"{c}: NULL in one and not the other for {null_mismatch} attempts")
        if diffs[c] >= TOLERANCE_MS:
            problems.append(f"{c}: max abs diff {diffs[c]:.3g} ms >= {TOLERANCE_MS} ms")
        if not both.any():
            problems.append(f"{c}: no attempt has a value in both (nothing was compared)")
    return diffs, problems


def main(argv=None) -> int:
    from inferledger.ledger.memory import default_memory_limit

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attempts", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", help="folder for the run directory (kept); default: a temporary folder, removed")
    ap.add_argument("--stages", action="store_true", help="also time reconstruct one SQL statement at a time")
    ap.add_argument("--memory-limit", help="reconstruct's --memory-limit (the bounded-memory path), e.g. 4GB")
    ap.add_argument("--no-peer", action="store_true", help="skip the per-request loop (it holds the run in memory)")
    ap.add_argument("--engine", choices=("local", "ray"), default="local", help="reconstruct's --engine")
    ap.add_argument("--workers", type=int, default=2, help="with --engine ray: the local Ray's CPUs")
    ap.add_argument("--buckets", type=int, help="repartition the run into this many task buckets before the ledger "
                    "(needed by --engine ray)")
    ap.add_argument("--reuse", action="store_true", help="with --out: rebuild the run directory an earlier run left "
                    "there (same --attempts, --tokens and --seed, from its manifest) instead of generating it again; "
                    "a partitioned one is not repartitioned")
    ap.add_argument("--phase", choices=("import", "repartition", "ledger", "query", "peer", "stages"), help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.phase:  # child: one phase, one JSON line on stdout
        run_dir = Path(a.run_dir)
        res = {"import": lambda: phase_import(run_dir, a.attempts, a.tokens, a.seed),
               "ledger": lambda: phase_ledger(run_dir, a.memory_limit, a.engine, a.workers),
               "repartition": lambda: phase_repartition(run_dir, a.buckets),
               "query": lambda: phase_query(run_dir),
               "peer": lambda: phase_peer(run_dir, Path(a.result)),
               "stages": lambda: phase_stages(run_dir)}[a.phase]()
        print(json.dumps(res))
        return 0

    if a.attempts < 1 or a.tokens < 2:
        ap.error("need --attempts >= 1 and --tokens >= 2 (TPOT and ITL need two tokens)")
    if a.reuse and not a.out:
        ap.error("--reuse needs --out, the folder an earlier run left its run directory in")
    if a.engine == "ray" and not a.buckets:
        ap.error("--engine ray needs --buckets (it shards the partitioned layout)")
    rec = results.start("ledger_scale", {k: v for k, v in vars(a).items() if k not in ("phase", "run_dir", "result")})
    base = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="ledger_scale_"))
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        ap.error(f"--out {base}: cannot create it ({exc.strerror})")
    run_dir = base / f"bench-{a.attempts}x{a.tokens}"
    peer_file = base / "peer_metrics.parquet"
    try:
        from importlib.metadata import version  # the parent stays small: a child's ru_maxrss can inherit it
        print(f"machine: nproc {os.cpu_count()}, duckdb {version('duckdb')}, python {sys.version.split()[0]}, "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
        print(f"run directory: {run_dir}", flush=True)
        disk = shutil.disk_usage(base)
        print(f"disk: {disk.free / 2 ** 30:.0f} GiB free of {disk.total / 2 ** 30:.0f} GiB", flush=True)
        reused = reusable(run_dir, a.attempts, a.tokens, a.seed) if a.reuse else None
        if reused:
            imp = reused
            print(f"reused: {imp['events']:,} events in {imp['parts']} parts ({imp['parquet_mib']:.0f} MiB), "
                  f"{'partitioned' if imp['partitioned'] else 'not partitioned'}", flush=True)
        else:
            imp = _child("import", "--run-dir", str(run_dir), "--attempts", str(a.attempts),
                         "--tokens", str(a.tokens), "--seed", str(a.seed))
            print(f"import: {imp['events']:,} events in {imp['parts']} parts ({imp['parquet_mib']:.0f} MiB); "
                  f"generate {imp['generate_s']:.2f} s, write {imp['write_s']:.2f} s", flush=True)
        partitioned = bool(reused and reused["partitioned"])
        rep = _child("repartition", "--run-dir", str(run_dir), "--buckets", str(a.buckets)) \
            if a.buckets and not partitioned else None
        if rep:
            print(f"repartition: {rep['partitions']} partitions in {rep['seconds']:.1f} s, peak {rep['peak_gib']:.2f} GiB",
                  flush=True)
        led = _child("ledger", "--run-dir", str(run_dir), "--engine", a.engine, "--workers", str(a.workers),
                     *(["--memory-limit", a.memory_limit] if a.memory_limit else []))
        if "worker_peak_gib" in led:
            print(f"ray: {led['shards']} shards ({led['shards_wall_s']} s in all), worker peaks "
                  f"{led['worker_peak_gib']} GiB, largest shard input {led['largest_shard_input_mib']} MiB", flush=True)
        print(f"ledger: {led['attempts']:,} attempts, ledger.duckdb {led['ledger_mib']:.0f} MiB, "
              f"{led['seconds']:.1f} s, peak {led['peak_gib']:.2f} GiB", flush=True)
        qry = _child("query", "--run-dir", str(run_dir))
        print(f"query: {qry['seconds']:.1f} s, peak {qry['peak_gib']:.2f} GiB ("
              + ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in qry["queries_s"].items()) + ")", flush=True)
        peer = None if a.no_peer else _child("peer", "--run-dir", str(run_dir), "--result", str(peer_file))
        stages = _child("stages", "--run-dir", str(run_dir)) if a.stages else None
        diffs, problems = compare(run_dir / "ledger.duckdb", peer_file) if peer else ({}, [])
    finally:
        if not a.out:
            shutil.rmtree(base, ignore_errors=True)

    n_events = imp["events"]
    ratio = peer["seconds"] / led["seconds"] if peer else None
    ran = [(label, r) for label, r in (("import", None if reused else imp), ("ledger", led), ("peer", peer)) if r]
    print()
    print(f"{'phase':<8} {'seconds':>9} {'cpu s':>8} {'peak GiB':>9} {'events/s':>12}")
    for label, r in ran:
        print(f"{label:<8} {r['seconds']:>9.2f} {r['cpu_s']:>8.2f} {r['peak_gib']:>9.2f} {n_events / r['seconds']:>12,.0f}")
    if not reused:
        print(f"  (import: generate {imp['generate_s']:.2f} s, Parquet write {imp['write_s']:.2f} s = "
              f"{n_events / imp['write_s']:,.0f} events/s)")
    if peer:
        print(f"peer_seconds / ledger_seconds = {ratio:.2f}   (load average now {os.getloadavg()[0]:.2f})")
        print()
        print("agreement, peer vs request_metrics (max abs diff, ms):")
        for c in COMPARED:
            print(f"  {c:<18} {diffs[c]:.3g}")
    print()
    peak_target = TARGET_BOUNDED_PEAK_GIB if a.memory_limit else TARGET_PEAK_GIB
    targets = [(f"ledger peak <= {peak_target:g} GiB", f"{led['peak_gib']:.2f} GiB", led["peak_gib"] <= peak_target)]
    if not a.memory_limit:
        targets.insert(0, (f"reconstruct <= {TARGET_RECONSTRUCT_S:g} s", f"{led['seconds']:.2f} s",
                           led["seconds"] <= TARGET_RECONSTRUCT_S))
    if peer:
        targets.append((f">= {TARGET_SPEEDUP:g}x faster than the loop", f"{ratio:.2f}x", ratio >= TARGET_SPEEDUP))
    print(f"{'target':<34} {'measured':>12}  met")
    for name, got, ok in targets:
        print(f"{name:<34} {got:>12}  {'yes' if ok else 'NO'}")
    per_stage: dict[str, float] = {}
    for s in (stages or {}).get("steps", []):
        per_stage[s["stage"]] = per_stage.get(s["stage"], 0.0) + s["seconds"]
    if stages:
        print()
        print(f"reconstruct step by step ({stages['seconds']:.2f} s in all, peak {stages['peak_gib']:.2f} GiB):")
        for stage, sec in per_stage.items():
            print(f"  {stage:<16} {sec:>7.2f} s")
            for s in stages["steps"]:
                if s["stage"] == stage and s["seconds"] >= 0.05:
                    print(f"      {s['step']:<48} {s['seconds']:>7.2f} s")
    elif not all(ok for name, _, ok in targets if "loop" not in name):
        print("\na ledger target is missed: rerun with --stages for the time of each SQL stage")
    phases = {label: {"wall_s": round(r["seconds"], 3), "cpu_s": round(r["cpu_s"], 3), "peak_gib": round(r["peak_gib"], 3),
                      "events_per_s": round(n_events / r["seconds"], 1)} for label, r in ran}
    if not reused:
        phases["import"].update(generate_s=round(imp["generate_s"], 3), write_s=round(imp["write_s"], 3))
    figures = {"attempts": a.attempts, "output_tokens": a.tokens, "events": n_events, "parts": imp["parts"],
               "parquet_mib": round(imp["parquet_mib"], 1), "ledger_mib": round(led["ledger_mib"], 1), "phases": phases,
               "memory_limit": a.memory_limit, "engine": a.engine,
               # the limit a build without --memory-limit is held to (ledger/memory.py: it depends on the host)
               "memory_limit_default": None if a.memory_limit else f"{default_memory_limit() / 2 ** 30:.2f}GiB",
               "workers": a.workers if a.engine == "ray" else None,
               "repartition": {"wall_s": round(rep["seconds"], 3), "cpu_s": round(rep["cpu_s"], 3),
                               "peak_gib": round(rep["peak_gib"], 3), "partitions": rep["partitions"],
                               "largest_partition_events": rep["largest_partition_events"]} if rep else None,
               "ray": {k: led[k] for k in ("shards", "worker_peak_gib", "largest_shard_input_mib", "shards_wall_s")
                       if k in led} or None,
               "query": {"wall_s": round(qry["seconds"], 3), "peak_gib": round(qry["peak_gib"], 3),
                         "queries_s": qry["queries_s"]},
               "loop_over_ledger_ratio": round(ratio, 3) if peer else None, "agree": not problems if peer else None,
               "max_abs_diff_ms": {c: diffs[c] for c in COMPARED} if peer else None,
               "targets": [{"target": name, "measured": got, "met": ok} for name, got, ok in targets],
               "stages": ([{"stage": st, "wall_s": round(sec, 3)} for st, sec in per_stage.items()] if stages else None)}
    print(f"\nresults: {rec.write(figures)}")
    if problems:
        print("\nDISAGREEMENT between the ledger and the per-request loop:")
        for p in problems:
            print(f"  {p}")
        return 1
    print("\nthe ledger and the per-request loop agree" if peer else "\n(no per-request loop: --no-peer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
