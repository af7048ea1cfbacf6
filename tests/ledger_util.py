"""Build small run directories from event dicts and reconstruct them (test helper)."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb

from inferledger.collectors.rundir.writer import RunWriter
from inferledger.ledger.reconstruct import BuildOptions, reconstruct


def build_run(run_dir: Path, events: list[dict], *, domains=("c",), maps=(), samples=(),
              manifest: dict | None = None, live: bool = False, on_built=None) -> duckdb.DuckDBPyConnection:
    """events: dicts with name, ms (float) or ts_ns, and optional clock/source/ids/value/attrs;
    samples: (ms, metric, value, unit, device[, source]) on the first domain (source: probe unless given);
    live: rebuilt as `reconstruct --follow` rebuilds a run it watches record; on_built: reconstruct's hook
    (con, run) once the stages ran, where the build's temporary tables can still be read."""
    w = RunWriter(run_dir, run_dir.name)
    for d in domains:
        w.clock_domain(d, host="h", kind="monotonic")
    for m in maps:
        w.clock_map(*m)
    seqs: dict[str, int] = {}
    for e in events:
        src = e.get("source", "client")
        seq = seqs.get(src, 0)
        seqs[src] = seq + 1
        ts = e["ts_ns"] if "ts_ns" in e else int(round(e["ms"] * 1_000_000))
        w.emit({"run_id": run_dir.name, "event_id": f"{src}:{seq}", "seq": seq, "source": src, "host": "h",
                "name": e["name"], "ts_ns": ts, "clock": e.get("clock", domains[0]),
                "task_id": e.get("task_id"), "session_id": e.get("session_id"),
                "request_id": e.get("request_id", "R1"), "attempt_id": e.get("attempt_id", "A1"),
                "step_id": e.get("step_id"), "value": e.get("value"), "attrs": json.dumps(e.get("attrs", {}))})
    for ms, metric, value, unit, device, *source in samples:
        w.sample(ts_ns=int(round(ms * 1_000_000)), clock=domains[0], source=source[0] if source else "probe", host="h",
                 metric=metric, value=value, unit=unit, device=device)
    if manifest is not None:
        w.write_manifest(manifest)
    w.close()
    summary = reconstruct(run_dir, BuildOptions(live=live), on_built=on_built)
    return duckdb.connect(str(summary.path), read_only=True)


def event(name: str, ms: float, aid: str | None = None, source: str = "client", task: str | None = None, **kw) -> dict:
    """One event for build_run: at `ms` on the first domain, of attempt `aid` (its request R<aid>) and task."""
    ev = {"name": name, "ms": ms, "source": source, "task_id": task, "attempt_id": aid,
          "request_id": None if aid is None else "R" + aid}
    ev.update(kw)
    return ev


def dict_rows(con, sql: str, *args) -> list[dict]:
    """The rows of `sql` (with its ? parameters) as dicts by column name."""
    cur = con.execute(sql, list(args))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]

