"""Rewrite a run's events into the partitioned layout (probes/run_dir.py), atomically.

Every event goes to one partition: `bucket-NNNN/` by the stable bucket of its task (an attempt's
events without a task id inherit the attempt's task, else its request's task; with no task at all
the request id, else the attempt id, is the key), `engine-<id>/` for an event with `attrs.engine_id`
and neither task, request nor attempt (an engine instance's step events; in a deployment capture `<id>`
is the replica's, `attrs.replica_id`), `run/` for the rest.
Within a partition the events keep the order they were read in (parts in flush order, rows in file
order), so "the earliest copy of an event wins" picks the same copy as before; every row is kept,
copies included.

The new layout is written whole beside the old one (`events.new/`, its layout record last), then
swapped in: `events/` -> `events.old/`, `events.new/` -> `events/`, `events.old/` removed. A kill at
any point loses nothing: before the swap the old layout is untouched; between the two renames
`repartition` run again finds `events.new/` complete and finishes the swap. DuckDB does the work in
a file-backed database under a memory limit, so a run of any size fits.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb

from inferledger.probes.events import EVENT_SCHEMA
from inferledger.probes.run_dir import PartError, layout_parts, list_parts, partition_name_sql
from inferledger.probes.run_folder import Layout, RunFolderError

DEFAULT_BUCKETS = 16


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
    """`events` with a `partition` column (the folder each event goes to) and its reading order `k`."""
    return f"""
    WITH att AS (
      SELECT attempt_id, min(task_id) AS task_id, min(request_id) AS request_id
      FROM events WHERE attempt_id IS NOT NULL GROUP BY attempt_id
    ), req AS (
      SELECT request_id, min(task_id) AS task_id FROM events WHERE request_id IS NOT NULL GROUP BY request_id
    ), keyed AS (
      SELECT e.*, coalesce(e.task_id, a.task_id, r.task_id, ra.task_id, e.request_id, a.request_id, e.attempt_id) AS key,
             -- an engine's steps: in a deployment, the folder of the replica it served (engine-<replica_id>)
             CASE WHEN json_extract_string(e.attrs, '$.engine_id') IS NOT NULL
                  THEN coalesce(json_extract_string(e.attrs, '$.replica_id'), json_extract_string(e.attrs, '$.engine_id'))
             END AS engine_id
      FROM events e LEFT JOIN att a USING (attempt_id) LEFT JOIN req r ON r.request_id = e.request_id
           LEFT JOIN req ra ON ra.request_id = a.request_id
    )
    SELECT * EXCLUDE (key, engine_id), {partition_name_sql("key", "engine_id", buckets)} AS partition
    FROM keyed"""


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
    try:
        con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute("SET temp_directory = ?", [str(new / ".spill")])
        order = ", ".join(f"({i}, '{str(p).replace(chr(39), chr(39) * 2)}')" for i, p in enumerate(parts))
        con.execute(f"""CREATE TEMP TABLE events AS
            SELECT r.* EXCLUDE (filename, file_row_number), o.i AS part_index, r.file_row_number AS row_index
            FROM read_parquet(?, union_by_name = true, filename = true, file_row_number = true) r
            JOIN (VALUES {order}) o(i, filename) USING (filename)""", [[str(p) for p in parts]])
        con.execute(f"CREATE TEMP TABLE placed AS {partition_sql(buckets)}")
        counts = dict(con.execute("SELECT partition, count(*) FROM placed GROUP BY ALL ORDER BY 1").fetchall())
        read = con.execute("SELECT count(*) FROM events").fetchone()[0]
        if sum(counts.values()) != read:  # every row placed once: nothing dropped, nothing doubled
            raise RepartitionError(f"{events}: repartition read {read} events but placed {sum(counts.values())}; "
                                   "the run is unchanged")
        cols = ", ".join(EVENT_SCHEMA.names)
        for name in counts:
            folder = new / name
            folder.mkdir()
            con.execute(f"COPY (SELECT {cols} FROM placed WHERE partition = ? ORDER BY part_index, row_index) "
                        f"TO '{folder / 'part-00000.parquet'}' (FORMAT parquet, COMPRESSION zstd)", [name])
    except BaseException:
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
    return counts
