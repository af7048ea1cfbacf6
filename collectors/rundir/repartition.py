"""Rewrite a run's events into the partitioned layout (probes/run_dir.py), atomically, in one pass.

Every event goes to one partition: `bucket-NNNN/` by the stable bucket of its task (an attempt's
events without a task id inherit the attempt's task, else its request's task; with no task at all
the request id, else the attempt id, is the key), `engine-<id>/` for an event with `attrs.engine_id`
and neither task, request nor attempt (an engine instance's step events; in a deployment capture `<id>`
is the replica's, `attrs.replica_id`), `run/` for the rest.

Two reads of the run: the three id columns first (which task each attempt and request belongs to: a
table per attempt and per request, file-backed under a memory limit), then the events once, in the
order they are read everywhere (parts in flush order, rows in file order), a batch at a time: each
batch's partition per row is computed against those tables, the batch is split by partition keeping
its rows' order, and each piece is appended to its partition's Parquet writer. Within a partition
the events therefore keep their reading order, so "the earliest copy of an event wins" picks the
same copy as before; every row is kept, copies included. Memory holds one batch and the partitions'
rows not yet written as a row group (at most `_HELD_ROWS` in all); at most `_OPEN` writers are open at once (a
partition whose writer was closed goes on in its next part, `part-00001.parquet`, read after it).

The new layout is written whole beside the old one (`events.new/`, its layout record last), then
swapped in: `events/` -> `events.old/`, `events.new/` -> `events/`, `events.old/` removed. A kill at
any point loses nothing: before the swap the old layout is untouched; between the two renames
`repartition` run again finds `events.new/` complete and finishes the swap.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from inferledger.probes.events import EVENT_SCHEMA
from inferledger.probes.run_dir import KEY_JOINS, KEY_SQL, PartError, id_tables, layout_parts, list_parts, partition_name_sql
from inferledger.probes.run_folder import Layout, RunFolderError

DEFAULT_BUCKETS = 16
_BATCH_ROWS = 1 << 20  # events routed at a time
_GROUP_ROWS = 1 << 17  # a partition's rows gathered before they are written as one row group
_HELD_ROWS = 1 << 21  # rows held across all partitions before every partition writes what it holds
_OPEN = 256  # partition writers open at once (file handles)
# a partition's rows are in reading order, so its sequence numbers, times and event ids run nearly in order:
# delta-encoded they take about two thirds of the dictionary's size (a partition about as small as DuckDB writes it)
_DELTA = {"seq": "DELTA_BINARY_PACKED", "ts_ns": "DELTA_BINARY_PACKED", "event_id": "DELTA_BYTE_ARRAY"}
_WRITE = {"compression": "zstd", "use_dictionary": [n for n in EVENT_SCHEMA.names if n not in _DELTA],
          "column_encoding": _DELTA}


class RepartitionError(ValueError):
    """The run cannot be repartitioned as asked; the message names the folder or the parameter."""


def _finish_swap(run_dir: Path) -> bool:
    """Complete a swap a kill interrupted; True when there was one."""
    events, new, old = run_dir / "events", run_dir / "events.new", run_dir / "events.old"
    if not events.exists() and Layout.file(new).exists():
        os.rename(new, events)
    if events.exists() and old.exists():
        shutil.rmtree(old)
        return True
    return False


def partition_sql(buckets: int) -> str:
    """The partition folder of each row of `batch` (its id columns, `attrs` and its row number `rn`), with
    its `rn` (in no set order), given the TEMP tables `att` (attempt -> task, request) and `req` (request -> task)."""
    # an engine's steps: in a deployment, the folder of the replica it served (engine-<replica_id>); read
    # inline, so only the rows without a key parse their attrs
    engine_id = ("CASE WHEN json_extract_string(attrs, '$.engine_id') IS NOT NULL THEN "
                 "coalesce(json_extract_string(attrs, '$.replica_id'), json_extract_string(attrs, '$.engine_id')) END")
    return f"""
    WITH keyed AS (
      SELECT e.rn, e.attrs, {KEY_SQL} AS key
      FROM batch e {KEY_JOINS}
    )
    SELECT rn, {partition_name_sql("key", engine_id, buckets)} AS partition FROM keyed"""


class _Sinks:
    """One Parquet writer per partition folder of `root`, written a row group at a time."""

    def __init__(self, root: Path):
        self.root = root
        self.open: dict[str, pq.ParquetWriter] = {}  # least recently written first
        self.held: dict[str, list[pa.Table]] = {}
        self.next_part: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.held_by: dict[str, int] = {}  # each partition's rows held, not yet written
        self.held_rows = 0

    def append(self, name: str, rows: pa.Table) -> None:
        self.held.setdefault(name, []).append(rows)
        self.counts[name] = self.counts.get(name, 0) + rows.num_rows
        self.held_by[name] = self.held_by.get(name, 0) + rows.num_rows
        self.held_rows += rows.num_rows
        if self.held_by[name] >= _GROUP_ROWS:
            self._write(name)
        if self.held_rows >= _HELD_ROWS:
            for held in list(self.held):
                self._write(held)

    def _write(self, name: str) -> None:
        tables = self.held.pop(name, [])
        self.held_by.pop(name, None)
        if not tables:
            return
        writer = self.open.pop(name, None)
        if writer is None:
            if len(self.open) >= _OPEN:  # close the least recently written; its partition goes on in a next part
                self.open.pop(next(iter(self.open))).close()
            folder = self.root / name
            folder.mkdir(exist_ok=True)
            part = self.next_part.get(name, 0)
            self.next_part[name] = part + 1
            writer = pq.ParquetWriter(folder / f"part-{part:05d}.parquet", EVENT_SCHEMA, **_WRITE)
        self.open[name] = writer  # now the most recently written
        table = pa.concat_tables(tables)
        writer.write_table(table, row_group_size=table.num_rows)
        self.held_rows -= table.num_rows

    def close(self) -> None:
        for name in list(self.held):
            self._write(name)
        self.abort()

    def abort(self) -> None:
        """Close every open writer, writing nothing more (the folder is removed after)."""
        for writer in self.open.values():
            writer.close()
        self.open.clear()


def _route(con: duckdb.DuckDBPyConnection, part: Path, buckets: int, sinks: _Sinks) -> int:
    """Append every event of `part` to its partition's writer, in file order; the rows read."""
    read = 0
    query = partition_sql(buckets)
    for batch in pq.ParquetFile(part).iter_batches(batch_size=_BATCH_ROWS, columns=EVENT_SCHEMA.names):
        try:
            rows = pa.Table.from_batches([batch]).select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA)
        except (pa.ArrowException, ValueError) as exc:
            raise RepartitionError(f"{part}: its events do not read as the event schema ({exc}); the run is "
                                   "unchanged") from None
        ids = rows.select(["task_id", "request_id", "attempt_id", "attrs"]).append_column(
            "rn", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
        con.register("batch", ids)
        placed = con.sql(query).to_arrow_table()
        con.unregister("batch")
        names = placed.column("partition").combine_chunks().dictionary_encode()
        codes = np.full(rows.num_rows, -1, dtype=np.int64)  # each row's partition, put back in the batch's order
        codes[placed.column("rn").to_numpy()] = names.indices.to_numpy(zero_copy_only=False)
        if len(placed) != rows.num_rows or (codes < 0).any():  # every row placed once: nothing dropped, nothing doubled
            raise RepartitionError(f"{part}: repartition read {rows.num_rows} events of a batch but placed "
                                   f"{len(placed)}; the run is unchanged")
        order = np.argsort(codes, kind="stable")  # stable: within a partition, the rows keep their order
        rows, codes = rows.take(order), codes[order]
        starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if len(codes) else np.array([], dtype=int)
        for start, end in zip(starts, [*starts[1:], len(codes)]):
            sinks.append(names.dictionary[codes[start]].as_py(), rows.slice(start, end - start))
        read += rows.num_rows
    return read


def repartition(run_dir: str | os.PathLike, buckets: int = DEFAULT_BUCKETS, *, memory_limit: str = "1GB") -> dict:
    """Rewrite `run_dir/events` partitioned into `buckets` task buckets; {partition: events} written."""
    run_dir = Path(run_dir)
    if buckets < 1 or buckets > 9999:
        raise RepartitionError(f"--buckets {buckets}: expected a whole number from 1 to 9999")
    _finish_swap(run_dir)
    events = run_dir / "events"
    try:
        parts = list_parts(events, EVENT_SCHEMA)
        Layout.read(events)
    except (PartError, RunFolderError) as exc:
        raise RepartitionError(str(exc)) from None
    if not parts:
        raise RepartitionError(f"{events}: no event parts (part-*.parquet) to repartition")
    new = run_dir / "events.new"
    shutil.rmtree(new, ignore_errors=True)  # an unfinished earlier attempt: the old layout is whole
    new.mkdir()
    db = new / ".repartition.duckdb"
    con = duckdb.connect(str(db))
    sinks = _Sinks(new)
    try:
        con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute("SET temp_directory = ?", [str(new / ".spill")])
        id_tables(con, parts)
        read = sum(_route(con, part, buckets, sinks) for part in parts)
        sinks.close()
    except BaseException:
        sinks.abort()
        con.close()
        shutil.rmtree(new, ignore_errors=True)
        raise
    con.close()
    db.unlink(missing_ok=True)
    shutil.rmtree(new / ".spill", ignore_errors=True)
    Layout(buckets, read, layout_parts(new)).write(new)  # what was written, so a rebuild can hold the folders to it
    os.rename(events, run_dir / "events.old")
    os.rename(new, events)
    shutil.rmtree(run_dir / "events.old")
    return dict(sorted(sinks.counts.items()))  # every row placed once: _route checks each batch
