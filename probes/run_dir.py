"""The Parquet parts of a run directory's `events/` and `samples/`: naming, listing, checking, compacting.

A part is `part-NNNNN.parquet` (one flush) or `part-AAAAA-BBBBB.parquet` (parts A..B merged into one at
the end of a clean run). Compaction writes the merged part whole under a temporary name, renames it in,
and only then deletes the parts it covers; a part whose number lies inside a merged range is therefore a
leftover of an interrupted compaction and is skipped when listing, so no row is ever read twice.

`list_parts` also opens every part's footer: a torn file (a killed copy, a full disk) or a foreign one
(another schema) is named, with what to do, instead of failing deep inside the ledger's SQL.

Partitioned layout (large runs, docs/SCALE.md): `events/` may hold partition folders, each numbered
and compacted like `events/` itself: `bucket-NNNN/` for the events of the tasks whose stable bucket
(`bucket_of`: the first 32 bits of the MD5 of the task id, modulo the bucket count) is NNNN (an
attempt's events without a task id go with the attempt's task, else with its request's, else they
are keyed by the request or attempt id), `engine-<id>/` for the step events of one engine instance
(`attrs.engine_id`), and `run/` for events with neither (`partition_name_sql` names them, the one rule).
The layout record in `events/` (probes/run_folder.py `Layout`) holds the bucket count. Every reader lists the same parts: the top level first, then `run/`, `engine-*/`, `bucket-*/`.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PART = re.compile(r"^part-(\d+)(?:-(\d+))?\.parquet$")
# the partition folders: their kinds, in reading order, and how each is named
RUN_PARTITION, ENGINE_PREFIX, BUCKET_PREFIX = "run", "engine-", "bucket-"
BUCKET_DIGITS = 4
_UNSAFE = "[^A-Za-z0-9_.:-]"  # what an engine id may not bring into a folder name
PARTITION = re.compile(rf"^({RUN_PARTITION}|{ENGINE_PREFIX}[A-Za-z0-9_.:-]+|{BUCKET_PREFIX}\d{{{BUCKET_DIGITS}}})$")
# a run's registered prediction: the bytes of the prediction file a capture registered before its load
# (its sha256 and registration time are in the manifest under `prediction`; docs/MODEL.md "Registration")
PREDICTION_FILE = "prediction.json"


class PartError(ValueError):
    """A part of the run directory cannot be read as what it claims to be; the message names the file."""


def part_span(path: Path) -> tuple[int, int] | None:
    """The flush numbers a part covers (first, last), or None when the name is not a part's."""
    m = PART.match(path.name)
    if not m:
        return None
    first = int(m.group(1))
    return first, int(m.group(2)) if m.group(2) is not None else first


def next_part_number(folder: Path) -> int:
    spans = [s for s in (part_span(p) for p in folder.glob("part-*.parquet")) if s]
    return max((last for _, last in spans), default=-1) + 1


def _covering(folder: Path) -> list[tuple[tuple[int, int], Path]]:
    """The parts to read, in flush order: merged ranges win over the single parts they cover."""
    spans = []
    for p in folder.glob("part-*.parquet"):
        s = part_span(p)
        if s is None:
            raise PartError(f"{p}: not a part name (expected part-NNNNN.parquet or part-AAAAA-BBBBB.parquet); "
                            "move this file out of the run directory and rebuild")
        spans.append((s, p))
    spans.sort(key=lambda sp: (sp[0][0], -sp[0][1]))
    kept: list[tuple[tuple[int, int], Path]] = []
    for (first, last), p in spans:
        if kept and first <= kept[-1][0][1]:
            if last <= kept[-1][0][1]:
                continue  # inside a merged range: a leftover of an interrupted compaction
            raise PartError(f"{p}: overlaps {kept[-1][1].name} (parts {first}..{last} against "
                            f"{kept[-1][0][0]}..{kept[-1][0][1]}); keep one of the two and rebuild")
        kept.append(((first, last), p))
    return kept


def bucket_of(key: str, buckets: int) -> int:
    """The stable bucket of a task (or request / attempt) id: the same in every process and version."""
    return int(hashlib.md5(key.encode()).hexdigest()[:8], 16) % buckets


BUCKET_SQL = "((('0x' || substr(md5({key}), 1, 8))::BIGINT) % {buckets})"  # bucket_of in DuckDB


def partition_name_sql(key: str, engine_id: str, buckets: int) -> str:
    """The partition folder an event goes to, as a DuckDB expression over its bucket key and engine id
    (both SQL expressions): the key's bucket, else the engine's folder, else `run`."""
    bucket = BUCKET_SQL.format(key=key, buckets=buckets)
    return (f"CASE WHEN {key} IS NOT NULL THEN '{BUCKET_PREFIX}' || lpad(CAST({bucket} AS VARCHAR), {BUCKET_DIGITS}, '0') "
            f"WHEN {engine_id} IS NOT NULL THEN '{ENGINE_PREFIX}' || regexp_replace({engine_id}, '{_UNSAFE}', '_', 'g') "
            f"ELSE '{RUN_PARTITION}' END")


def partition_kind(name: str) -> str:
    """`run`, `engine` or `bucket`: the kind of a partition folder's name."""
    return RUN_PARTITION if name == RUN_PARTITION else name.split("-", 1)[0]


def partitions(events: Path) -> list[Path]:
    """The partition folders of `events/`, in reading order: run, engine-*, bucket-*."""
    if not events.is_dir():
        return []
    found = [p for p in events.iterdir() if p.is_dir() and PARTITION.match(p.name)]
    rank = {RUN_PARTITION: 0, "engine": 1, "bucket": 2}
    return sorted(found, key=lambda p: (rank[partition_kind(p.name)], p.name))


def list_parts(folder: Path, schema: pa.Schema) -> list[Path]:
    """Every part of `folder` (and of its partition folders) to read, each checked to be whole
    Parquet holding `schema`'s columns."""
    out = []
    for part_folder in (folder, *partitions(folder)):
        out += _checked(part_folder, schema)
    return out


def _checked(folder: Path, schema: pa.Schema) -> list[Path]:
    out = []
    for _span, p in _covering(folder):
        try:
            names = set(pq.read_schema(p).names)
        except (pa.ArrowException, OSError) as exc:
            raise PartError(f"{p}: not a readable Parquet file ({exc}); it is torn or foreign. Move it out of "
                            "the run directory (the other parts are whole) and rebuild: its rows are lost, "
                            "the ledger shows what they would have closed as unterminated") from None
        missing = [c for c in schema.names if c not in names]
        if missing:
            raise PartError(f"{p}: a Parquet file of another kind (lacks column(s) {', '.join(missing)}); "
                            "move it out of the run directory and rebuild")
        out.append(p)
    return out


def compact(folder: Path, schema: pa.Schema) -> Path | None:
    """Merge every part of `folder` into one `part-AAAAA-BBBBB.parquet`; None when there is nothing to do."""
    if not folder.is_dir():
        return None
    parts = _covering(folder)
    if len(parts) < 2:
        return None
    table = pa.concat_tables([pq.read_table(p, schema=schema) for _span, p in parts])
    target = folder / f"part-{parts[0][0][0]:05d}-{parts[-1][0][1]:05d}.parquet"
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, target)  # from here the merged part is what is read; the old ones are leftovers
    for _span, p in parts:
        p.unlink(missing_ok=True)
    for p in folder.glob("part-*.parquet"):  # leftovers of an earlier interrupted compaction
        s = part_span(p)
        if p != target and s and parts[0][0][0] <= s[0] and s[1] <= parts[-1][0][1]:
            p.unlink(missing_ok=True)
    return target
