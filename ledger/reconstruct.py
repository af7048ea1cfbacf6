"""Build `ledger.duckdb` from a run directory with DuckDB SQL over its Parquet files.

The stages live in `ledger/NN_*.sql` (one definition per figure; docs/LEDGER.md explains each). The
ledger is written to a temporary file and renamed into place, so a failed rebuild never destroys the
previous ledger, and the raw files are only read.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import duckdb
import pyarrow as pa

from inferledger.probes.events import CLOCK_SCHEMA, EVENT_SCHEMA, GAP_SCHEMA, SAMPLE_SCHEMA, TASK_SCHEMA

STAGES = ("10_marks.sql", "20_attempts.sql", "30_figures.sql", "40_metrics.sql", "50_streams.sql",
          "60_tasks.sql", "70_gaps.sql")

PUBLIC_TABLES = ("events", "samples", "clocks", "attempts", "request_metrics", "intervals", "stream_checks",
                 "itl", "accounts", "tasks", "gaps")


class RunDirError(Exception):
    """The run directory is missing or unreadable; the message names the file."""


@dataclass
class LedgerSummary:
    path: Path
    run_id: str
    n_events: int
    n_attempts: int
    n_tasks: int
    n_gaps: int


def _stage_sql(name: str) -> str:
    return resources.files("inferledger.ledger").joinpath(name).read_text()


def _run_id(run_dir: Path) -> str:
    manifest = run_dir / "manifest.json"
    if manifest.exists():
        try:
            return json.loads(manifest.read_text()).get("run_id") or run_dir.name
        except ValueError as exc:
            raise RunDirError(f"{manifest}: not valid JSON ({exc})") from exc
    return run_dir.name


def _load(con: duckdb.DuckDBPyConnection, table: str, files: list[Path], schema: pa.Schema, temp: bool) -> None:
    kind = "TEMP TABLE" if temp else "TABLE"
    if files:
        paths = [str(p) for p in files]
        con.execute(f"CREATE {kind} {table} AS SELECT * FROM read_parquet(?, union_by_name = true)", [paths])
    else:
        empty = schema.empty_table()
        con.register("_empty", empty)
        con.execute(f"CREATE {kind} {table} AS SELECT * FROM _empty")
        con.unregister("_empty")


def reconstruct(run_dir: str | os.PathLike, *, out: str | os.PathLike | None = None) -> LedgerSummary:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    parts = sorted((run_dir / "events").glob("part-*.parquet"))
    if not parts:
        raise RunDirError(f"{run_dir}/events: no event parts (part-*.parquet); capture or import a run first")
    run_id = _run_id(run_dir)
    target = Path(out) if out else run_dir / "ledger.duckdb"
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    for stale in (tmp, Path(f"{tmp}.wal")):
        stale.unlink(missing_ok=True)

    con = duckdb.connect(str(tmp))
    try:
        con.execute("SET VARIABLE run_id = ?", [run_id])
        _load(con, "events_raw", parts, EVENT_SCHEMA, temp=True)
        con.execute("CREATE TABLE events AS SELECT * FROM events_raw ORDER BY clock, ts_ns, source, seq")
        con.execute("DROP TABLE events_raw")
        _load(con, "samples", sorted((run_dir / "samples").glob("part-*.parquet")), SAMPLE_SCHEMA, temp=False)
        for name, schema, table, temp in (("clocks.parquet", CLOCK_SCHEMA, "clocks", False),
                                          ("tasks.parquet", TASK_SCHEMA, "task_contracts", True),
                                          ("gaps.parquet", GAP_SCHEMA, "collector_gaps", True)):
            f = run_dir / name
            _load(con, table, [f] if f.exists() else [], schema, temp=temp)
        for stage in STAGES:
            try:
                con.execute(_stage_sql(stage))
            except duckdb.Error as exc:
                raise RuntimeError(f"ledger stage {stage} failed on {run_dir}: {exc}") from exc
        counts = con.execute(
            "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM attempts), "
            "(SELECT count(*) FROM tasks), (SELECT count(*) FROM gaps)").fetchone()
        con.execute("CHECKPOINT")
    except BaseException:
        con.close()
        tmp.unlink(missing_ok=True)
        raise
    con.close()
    os.replace(tmp, target)
    return LedgerSummary(target, run_id, *counts)
