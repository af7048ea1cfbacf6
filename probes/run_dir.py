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
The layout record in `events/` (probes/run_folder.py `Layout`) holds the bucket count and, per
partition folder, each part written (name, rows, bytes, the sha256 of its Parquet footer):
`check_layout` holds the folders against it before a rebuild. Every reader lists the same parts: the
top level first, then `run/`, `engine-*/`, `bucket-*/`; a file there that is none of these (a part, the
layout record, a partition folder, a dot-named file being written) is refused by name.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from inferledger.probes.run_folder import LAYOUT_FILE, Layout, PartRecord

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


# an event's bucket key, over `e` joined as KEY_JOINS joins it to the TEMP tables `att` and `req` (`id_tables`):
# its task, else its attempt's or request's task, else its request, else its attempt; NULL for none of them
KEY_SQL = "coalesce(e.task_id, a.task_id, r.task_id, ra.task_id, e.request_id, a.request_id, e.attempt_id)"
KEY_JOINS = ("LEFT JOIN att a USING (attempt_id) LEFT JOIN req r ON r.request_id = e.request_id "
             "LEFT JOIN req ra ON ra.request_id = a.request_id")


def id_tables(con, parts: list[Path]) -> None:
    """TEMP tables `att` (each attempt's task and request) and `req` (each request's task) on the DuckDB
    connection `con`, from the id columns of the event parts alone: what KEY_SQL joins."""
    files = [str(p) for p in parts]
    con.execute("""CREATE TEMP TABLE att AS SELECT attempt_id, min(task_id) AS task_id, min(request_id) AS request_id
        FROM read_parquet(?, union_by_name = true) WHERE attempt_id IS NOT NULL GROUP BY attempt_id""", [files])
    con.execute("""CREATE TEMP TABLE req AS SELECT request_id, min(task_id) AS task_id
        FROM read_parquet(?, union_by_name = true) WHERE request_id IS NOT NULL GROUP BY request_id""", [files])


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
    Parquet holding `schema`'s columns; a file that is not a part is refused by name."""
    out = []
    for part_folder in (folder, *partitions(folder)):
        _no_strangers(part_folder, top=part_folder == folder)
        out += _checked(part_folder, schema)
    return out


def _no_strangers(folder: Path, top: bool) -> None:
    """PartError naming the first entry of `folder` that is not a part, a dot-named file being written,
    or (at the top) the layout record or a partition folder: its rows would be silently left out."""
    if not folder.is_dir():
        return
    for p in sorted(folder.iterdir()):
        known = p.name.startswith(".") or (p.is_file() and PART.match(p.name)) or (
            top and ((p.is_file() and p.name == LAYOUT_FILE) or (p.is_dir() and PARTITION.match(p.name))))
        if not known:
            raise PartError(f"{p}: not a part of the run (expected part-NNNNN.parquet or part-AAAAA-BBBBB.parquet"
                            f"{', ' + LAYOUT_FILE + ' or a partition folder' if top else ''}); its rows would not be "
                            "read: rename it as a part if it holds the run's events, else move it out, and rebuild")


def part_record(path: Path) -> PartRecord:
    """What the layout record keeps of a part: its name, rows, size and the sha256 of its footer."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(size - 8, 0))
        tail = f.read(8)
        length = int.from_bytes(tail[:4], "little") if len(tail) == 8 and tail[4:] == b"PAR1" else None
        if length is None or length + 8 > size:
            raise PartError(f"{path}: not a whole Parquet file (no footer); it is torn or foreign")
        f.seek(size - 8 - length)
        footer = f.read(length)
    return PartRecord(path.name, pq.ParquetFile(path).metadata.num_rows, size, hashlib.sha256(footer).hexdigest())


def check_layout(events: Path) -> list[str]:
    """The partition folders of `events/` held against its layout record: PartError for a recorded
    part that is missing, has other rows or was rewritten (its footer differs), or a recorded folder
    that is gone (a rebuild would quietly lose their rows); one line per part newer than the record (a
    capture killed between writing a part and recording it: rebuilt, with a gap). Nothing to hold for
    an unpartitioned run; partition folders with no record, or a record that did not keep its parts,
    are rebuilt with a line saying their parts were not held to one (a deleted part would not be seen)."""
    layout = Layout.read(events)
    folders = [p.name for p in partitions(events)]
    if layout is None:
        return [f"{events.name}: partition folders ({', '.join(folders[:3])}{', ...' if len(folders) > 3 else ''}) "
                f"but no {LAYOUT_FILE}: their parts are not held to a record of what was written (a deleted part "
                f"or bucket would not be seen); `inferledger repartition` writes one"] if folders else []
    for p in partitions(events):
        n = p.name.removeprefix(BUCKET_PREFIX)
        if partition_kind(p.name) == "bucket" and int(n) >= layout.buckets:
            raise PartError(f"{p}: bucket {int(n)} of a layout of {layout.buckets} buckets ({Layout.file(events)}): "
                            f"the folders are not the layout the record describes; run `inferledger repartition` "
                            "again from the run's events")
    if layout.parts is None:
        return [f"{events.name}/{LAYOUT_FILE}: a record that keeps no parts (format 1): the partition folders' "
                f"parts are not held to what was written (a deleted part would not be seen); `inferledger "
                f"repartition` writes one that does"] if folders else []
    on_disk = {p.name: {q.name: q for _span, q in _covering(p)} for p in partitions(events)}
    on_disk[""] = {q.name: q for _span, q in _covering(events)} if events.is_dir() else {}
    fix = "the run's parts no longer match what was written; restore the part (or rebuild the layout from " \
          "the run's source with `inferledger repartition`)"
    for folder, records in layout.parts.items():
        have = on_disk.get(folder, {})
        for r in records:
            p = have.pop(r.name, None)
            where = events / folder / r.name
            if p is None:
                raise PartError(f"{where}: recorded in {LAYOUT_FILE} ({r.rows} rows) but missing: {fix}")
            got = part_record(p)
            if got.rows != r.rows:
                raise PartError(f"{where}: {got.rows} rows, {LAYOUT_FILE} recorded {r.rows}: {fix}")
            if (got.bytes, got.footer_sha256) != (r.bytes, r.footer_sha256):
                raise PartError(f"{where}: rewritten since {LAYOUT_FILE} recorded it (its Parquet footer differs): {fix}")
    return [f"{(events / folder / name).relative_to(events.parent)}: a part newer than {LAYOUT_FILE} "
            f"({part_record(p).rows} rows, not recorded): rebuilt with it"
            for folder, rest in sorted(on_disk.items()) for name, p in sorted(rest.items())]


def layout_parts(events: Path) -> dict[str, tuple[PartRecord, ...]]:
    """The parts of each partition folder of `events/`, as the layout record keeps them."""
    return {p.name: tuple(part_record(q) for _span, q in _covering(p)) for p in partitions(events)}


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
