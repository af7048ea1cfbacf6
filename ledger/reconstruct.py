"""Build `ledger.duckdb` from a run directory with DuckDB SQL over its Parquet files.

The stages live in `ledger/NN_*.sql` (one definition per figure; docs/LEDGER.md explains each). The
ledger is written to a temporary file and renamed into place, so a failed rebuild never destroys the
previous ledger, and the raw files are only read.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import duckdb
import pyarrow as pa

from inferledger.probes.run_dir import PartError, list_parts
from inferledger.ledger import critical_path
from inferledger.probes.events import CLOCK_SCHEMA, EVENT_SCHEMA, GAP_SCHEMA, SAMPLE_SCHEMA, TASK_SCHEMA

STAGES = ("10_marks.sql", "20_attempts.sql", "30_figures.sql", "40_metrics.sql", "45_reported.sql", "50_streams.sql",
          "60_tasks.sql", "80_diagnosis.sql", "85_peers.sql", "90_gaps.sql", "95_reported.sql")

PUBLIC_TABLES = ("events", "samples", "clocks", "attempts", "request_metrics", "choice_metrics", "intervals", "stream_checks",
                 "itl", "accounts", "tasks", "reconciliation", "step_attribution", "slo_misses", "run_metrics",
                 "energy_shares", "peer_views", "peer_comparison", "critical_path", "critical_path_edges", "gaps",
                 "reported_spans", "reported_counters", "request_path")


class RunDirError(Exception):
    """The run directory is missing or unreadable; the message names the file."""


class StageError(RunDirError):
    """A ledger stage failed on this run's data; the message names the stage and the run."""


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


def _manifest(run_dir: Path) -> dict:
    manifest = run_dir / "manifest.json"
    if not manifest.exists():
        return {}
    try:
        return json.loads(manifest.read_text())
    except ValueError as exc:
        raise RunDirError(f"{manifest}: not valid JSON ({exc})") from exc


def _run_id(run_dir: Path) -> str:
    return _manifest(run_dir).get("run_id") or run_dir.name


def _kv_block_bytes(manifest: dict) -> int | None:
    """Bytes of one KV block, declared by the engine's manifest (None when the run does not say)."""
    per_token = (manifest.get("model") or {}).get("kv_bytes_per_token")
    block = (manifest.get("engine_config") or {}).get("block_size")
    return int(per_token) * int(block) if per_token and block else None


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


def _execute(con, sql: str, stage: str, profile: list | None) -> None:
    if profile is None:
        con.execute(sql)
        return
    for statement in con.extract_statements(sql):  # timed one by one
        text = " ".join(ln for ln in statement.query.splitlines() if not ln.strip().startswith("--"))
        label = " ".join(text.split()).split(" AS ")[0].replace("CREATE OR REPLACE ", "")[:48]
        t0 = time.perf_counter()
        con.execute(statement)
        profile.append((stage, label, time.perf_counter() - t0))


def _slo(manifest: dict) -> dict:
    """vLLM-style SLO thresholds, from the manifest's `slo` or its workload's `[slo]` section."""
    return manifest.get("slo") or ((manifest.get("workload") or {}).get("spec") or {}).get("slo") or {}


def reconstruct(run_dir: str | os.PathLike, *, out: str | os.PathLike | None = None,
                profile: list | None = None) -> LedgerSummary:
    """Build the ledger; with `profile` (a list), append (stage, statement, seconds) for every step."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    try:  # every part checked whole and of our schema, merged ranges over their leftovers
        parts = list_parts(run_dir / "events", EVENT_SCHEMA)
        sample_parts = list_parts(run_dir / "samples", SAMPLE_SCHEMA)
    except PartError as exc:
        raise RunDirError(str(exc)) from None
    if not parts:
        raise RunDirError(f"{run_dir}/events: no event parts (part-*.parquet); capture or import a run first")
    run_id = _run_id(run_dir)
    target = Path(out) if out else run_dir / "ledger.duckdb"
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    for stale in (tmp, Path(f"{tmp}.wal")):
        stale.unlink(missing_ok=True)

    con = duckdb.connect(str(tmp))
    try:
        con.execute("SET enable_progress_bar = false")
        con.execute("SET VARIABLE run_id = ?", [run_id])
        manifest = _manifest(run_dir)
        con.execute("SET VARIABLE kv_block_bytes = ?", [_kv_block_bytes(manifest)])
        slo = _slo(manifest)
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            con.execute(f"SET VARIABLE slo_{key} = ?::DOUBLE", [slo.get(key)])
        t0 = time.perf_counter()
        # file order is deterministic (insertion order is preserved), so no sort is needed
        _load(con, "events", parts, EVENT_SCHEMA, temp=False)
        _load(con, "samples", sample_parts, SAMPLE_SCHEMA, temp=False)
        for name, schema, table, temp in (("clocks.parquet", CLOCK_SCHEMA, "clocks", False),
                                          ("tasks.parquet", TASK_SCHEMA, "task_contracts", True),
                                          ("gaps.parquet", GAP_SCHEMA, "collector_gaps", True)):
            f = run_dir / name
            _load(con, table, [f] if f.exists() else [], schema, temp=temp)
        if profile is not None:
            profile.append(("load", "events, samples, clocks, tasks, gaps", time.perf_counter() - t0))
        for stage in STAGES:
            if stage == "90_gaps.sql":  # the critical paths (Python: DAG validation and longest path)
                t0 = time.perf_counter()
                try:
                    problems = critical_path.build(con)
                except duckdb.Error as exc:
                    raise StageError(f"ledger stage critical_path failed on {run_dir}: {exc}") from exc
                con.execute("CREATE OR REPLACE TEMP TABLE dag_problems (scope VARCHAR, subject_id VARCHAR, detail VARCHAR)")
                if problems:
                    con.executemany("INSERT INTO dag_problems VALUES (?, ?, ?)", problems)
                if profile is not None:
                    profile.append(("critical_path", "critical_path, critical_path_edges", time.perf_counter() - t0))
            try:
                _execute(con, _stage_sql(stage), stage, profile)
            except duckdb.Error as exc:
                raise StageError(f"ledger stage {stage} failed on {run_dir}: {exc}") from exc
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
