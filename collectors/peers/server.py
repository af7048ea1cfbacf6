"""The `--server` run of a load tool's import: read whole and checked before anything is written.

The server run is any run directory (ours from `serve --out` or capture, or vLLM's evidence imported
from OTLP): its server/engine events are keyed by attempt id. Everything the import copies or joins
on is checked here, so a bad manifest, a torn or foreign Parquet file, or an event the join cannot
read is refused by file (and event) with what to do, and never becomes a traceback or half a run.
"""
from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from inferledger.probes.run_dir import PartError, list_parts
from inferledger.probes.events import CLOCK_SCHEMA, EVENT_SCHEMA, GAP_SCHEMA, SAMPLE_SCHEMA, TASK_SCHEMA
from inferledger.probes.run_folder import Manifest, RunFolderError

SERVER_SOURCES = ("server", "engine")
OUTPUT_NAMES = ("server.write", "engine.token")


class ServerRunError(ValueError):
    """The --server folder is not a readable run directory; the message names the file."""


@dataclass
class ServerAttempt:
    attempt_id: str
    clock: str
    first_ns: int  # the earliest server/engine event: after the client sent
    first_write_ns: int | None = None  # the first server.write (else engine.token): before any client chunk
    writes: list[tuple[int, list[str]]] = field(default_factory=list)  # server.write (ts, kinds), in order
    tokens: int | None = None  # engine.token sum


@dataclass
class ServerRun:
    path: Path
    manifest: dict
    events: list  # pyarrow tables of events/part-*.parquet
    samples: list
    clocks: list[dict]
    tasks: list[dict]
    gaps: list[dict]
    attempts: dict[str, ServerAttempt]


def _read(path: Path, schema: pa.Schema) -> pa.Table:
    """A Parquet file of the run, with `schema`'s columns and types, or ServerRunError naming it."""
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise ServerRunError(f"{path}: not a readable Parquet file ({exc}): the --server run is torn or "
                             "foreign; pass a whole run directory") from None
    missing = [c for c in schema.names if c not in table.column_names]
    if missing:
        raise ServerRunError(f"{path}: a Parquet file of another kind (lacks column(s) {', '.join(missing)}); "
                             "pass a run directory written by inferledger")
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowException, ValueError) as exc:
        raise ServerRunError(f"{path}: column types differ from a run's ({exc}); pass a run directory written "
                             "by inferledger") from None


def _rows(path: Path, schema: pa.Schema) -> list[dict]:
    return _read(path, schema).to_pylist() if path.exists() else []


def _manifest(path: Path) -> dict:
    try:
        return Manifest.read(path).body
    except RunFolderError as exc:
        raise ServerRunError(f"{exc}; the --server run's manifest is damaged") from None


def _json_list(row: dict, col: str, where: str) -> None:
    if row.get(col) is None:
        return
    try:
        v = json.loads(row[col])
    except (ValueError, RecursionError):
        v = None
    if col == "required" and not (isinstance(v, list) and all(isinstance(x, str) for x in v)) or \
            col == "contract" and not isinstance(v, dict):
        raise ServerRunError(f"{where}: task {row['task_id']!r}: {col} is not a JSON "
                             f"{'list of request ids' if col == 'required' else 'object'}")


def load(path: Path) -> ServerRun:
    path = Path(path)
    if not path.is_dir():
        raise ServerRunError(f"{path}: not a run directory (no events/part-*.parquet); pass the folder given "
                             "to `inferledger serve --out` or a captured or imported run")
    try:
        parts = list_parts(path / "events", EVENT_SCHEMA) if (path / "events").is_dir() else []
        sample_parts = list_parts(path / "samples", SAMPLE_SCHEMA) if (path / "samples").is_dir() else []
    except PartError as exc:
        raise ServerRunError(f"--server run: {exc}") from None
    if not parts:
        raise ServerRunError(f"{path}: not a run directory (no events/part-*.parquet); pass the folder given "
                             "to `inferledger serve --out` or a captured or imported run")
    manifest = _manifest(path)
    events = [_read(p, EVENT_SCHEMA) for p in parts]
    samples = [_read(p, SAMPLE_SCHEMA) for p in sample_parts]
    tasks = _rows(path / "tasks.parquet", TASK_SCHEMA)
    for t in tasks:
        for col in ("required", "contract"):
            _json_list(t, col, str(path / "tasks.parquet"))
    clocks = _rows(path / "clocks.parquet", CLOCK_SCHEMA)
    for c in clocks:
        if c["from_clock"] is not None and (c["to_clock"] is None or c["offset_ns"] is None or c["epsilon_ns"] is None):
            raise ServerRunError(f"{path / 'clocks.parquet'}: the mapping from {c['from_clock']!r} lacks its "
                                 "to_clock, offset_ns or epsilon_ns")
    run = ServerRun(path, manifest, events, samples, clocks, tasks, _rows(path / "gaps.parquet", GAP_SCHEMA), {})
    run.attempts = _attempts(events, parts)
    return run


def _attempts(tables: list, parts: list[Path]) -> dict[str, ServerAttempt]:
    rows = defaultdict(list)
    for t, part in zip(tables, parts):
        cols = t.select(["event_id", "source", "name", "ts_ns", "seq", "clock", "attempt_id", "value", "attrs"])
        for r in cols.to_pylist():
            if r["attempt_id"] is None or r["source"] not in SERVER_SOURCES:
                continue
            if r["ts_ns"] is None or r["clock"] is None or r["name"] is None:
                raise ServerRunError(f"{part}: event {r['event_id']!r} has no ts_ns, clock or name")
            r["kinds"] = _kinds(r, part) if r["name"] == "server.write" else None
            if r["name"] == "engine.token" and r["value"] is not None and not math.isfinite(r["value"]):
                raise ServerRunError(f"{part}: event {r['event_id']!r}: engine.token value {r['value']} is no count")
            rows[r["attempt_id"]].append(r)
    out = {}
    for aid, evs in rows.items():
        clock = Counter(e["clock"] for e in evs).most_common(1)[0][0]
        evs = sorted((e for e in evs if e["clock"] == clock), key=lambda e: (e["ts_ns"], e["seq"] or 0))
        a = ServerAttempt(aid, clock, evs[0]["ts_ns"])
        a.writes = [(e["ts_ns"], e["kinds"]) for e in evs if e["name"] == "server.write"]
        toks = [e for e in evs if e["name"] == "engine.token"]
        first_out = [e["ts_ns"] for e in evs if e["name"] in OUTPUT_NAMES]
        a.first_write_ns = a.writes[0][0] if a.writes else (min(first_out) if first_out else None)
        a.tokens = int(sum(e["value"] or 0 for e in toks)) if toks else None
        out[aid] = a
    return out


def _kinds(r: dict, part: Path) -> list[str]:
    try:
        attrs = json.loads(r["attrs"] or "{}")
    except (ValueError, RecursionError):
        attrs = None
    kinds = attrs.get("kinds") if isinstance(attrs, dict) else None
    if attrs is None or not isinstance(attrs, dict) or kinds is not None and not (
            isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)):
        raise ServerRunError(f"{part}: event {r['event_id']!r} (server.write) has attrs that are not a JSON object "
                             "with a list of kinds")
    return kinds or []
