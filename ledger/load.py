"""The ledger's first stage: the run directory's Parquet files as tables, each event counted once.

Loads `events/` and `samples/` parts (already listed and checked whole by the caller), `clocks.parquet`,
`tasks.parquet` and `gaps.parquet`. A file DuckDB cannot read is refused with its name. An event id
found more than once is kept once: the copy in the earliest part (parts are numbered in the order
they were flushed, so it is the one recorded first), and a row in `load_gaps` names the copies; a
copy whose content differs is named on its own, with the columns that differ. A token count that is
not a whole number from 0 to 2^53 is refused naming the file and the event: the ledger sums and
casts these values, and a wrong one must not surface as a cast error far from its cause.

`events` and `samples` are read in place (`RunFiles.in_place`: a ledger written into its run folder):
each is a VIEW over the parts' absolute paths, `events` leaving out the copies `event_copies_left_out`
names by (part, row), and `ledger_parts` records every part read (its size and the sha256 of its
footer), which the query surface holds the folder to before it reads (ledger/query.py). Otherwise (a
ledger written elsewhere, a run staged from a URL) both are copied into the ledger as tables.

A refresh that adds parts to those an earlier build checked (`RunFiles.checked`, ledger/incremental.py)
checks the new parts only: their event ids against each other and against the hashes of the ids
already read, their token counts; should a new id's hash meet one already read (a copy, or two ids
that share a hash), every part is checked as a whole build checks them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from inferledger.ledger.tables import gap_table, sql_string
from inferledger.probes.events import (CLOCK_SCHEMA, COUNT_EVENTS, EVENT_SCHEMA, GAP_SCHEMA, MAX_COUNT, SAMPLE_SCHEMA,
                                       TASK_SCHEMA)
from inferledger.probes.run_dir import PartError, part_record
from inferledger.probes.run_folder import Manifest

READS: tuple[str, ...] = ()
CREATES = ("events", "samples", "clocks", "ledger_parts", "event_copies_left_out", "task_contracts", "gaps_file",
           "load_gaps")
PUBLIC = ("events", "samples", "clocks", "ledger_parts", "event_copies_left_out")
SCOPE = "run"  # every shard loads what it is handed; the final ledger loads the whole run
# @gaps: an event id found more than once in the run's parts (the first copy is kept), or a part newer
#   than the partition layout record (a capture killed between writing it and recording it: read all the same)
GAPS = gap_table("load")


class LoadError(Exception):
    """A file of the run directory cannot be loaded as what it claims to be; the message names it."""


@dataclass(frozen=True)
class Checked:
    """Event parts an earlier build of the same ledger loaded and checked, unchanged since (the caller compared
    them) and holding no copy `events` leaves out, and the table on the connection that holds `hash(event_id)`
    (column h) of every event in them."""
    parts: frozenset[Path]  # as RunFiles.event_parts lists them
    hashes: str


@dataclass
class RunFiles:
    run_dir: Path
    event_parts: list[Path]
    sample_parts: list[Path] = field(default_factory=list)
    manifest: Manifest = field(default_factory=Manifest)  # read once per rebuild, handed to every stage
    newer_parts: list[str] = field(default_factory=list)  # parts newer than the layout record (check_layout)
    # events and samples as views over the parts where they lie (a ledger inside its run folder), not copies
    in_place: bool = False
    checked: Checked | None = None  # parts an earlier build checked: only the others are (module docstring)

    def name(self, path: str | Path) -> str:
        """A file's name relative to the run directory, as messages give it."""
        p = Path(path)
        try:
            return str(p.relative_to(self.run_dir))
        except ValueError:
            return str(p)


def _sql_list(files: list[Path]) -> str:
    """The files as a SQL list literal: a view keeps its text, and a view takes no parameters."""
    return "[" + ", ".join(sql_string(str(p)) for p in files) + "]"


def _load(con, table: str, files: list[Path], schema: pa.Schema, temp: bool, run: RunFiles,
          in_place: bool = False) -> None:
    kind = "TEMP TABLE" if temp else "TABLE"
    if not files:
        con.register("_empty", schema.empty_table())
        con.execute(f"CREATE {kind} {table} AS SELECT * FROM _empty")
        con.unregister("_empty")
        return
    try:  # file order is kept (insertion order is preserved): the first copy of an event comes first
        if in_place:  # read where they lie at every query: absolute paths, as DuckDB resolves a view's
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({_sql_list(files)}, union_by_name = true)")
            con.execute(f"SELECT * FROM {table} LIMIT 0")  # bound now, so a foreign part is refused here
        else:
            con.execute(f"CREATE {kind} {table} AS SELECT * FROM read_parquet(?, union_by_name = true)",
                        [[str(p) for p in files]])
    except duckdb.Error as exc:
        what = run.name(files[0]) if len(files) == 1 else f"{run.name(files[0].parent)}/ (one of {len(files)} parts)"
        raise LoadError(f"{what}: not a readable Parquet file of its kind ({exc}); it is torn or foreign. "
                        "Move it out of the run directory and rebuild (or rewrite it from its source)") from None


def _check_counts(con, run: RunFiles, new: list[Path] | None) -> None:
    """Every event's token count (`new`: only those of these parts, the others checked before)."""
    if new == []:
        return
    events = "events" if new is None else f"read_parquet({_sql_list(new)}, union_by_name = true)"
    bad = con.execute(
        f"SELECT event_id, name, value FROM {events} WHERE name IN {COUNT_EVENTS} AND value IS NOT NULL "
        "AND (NOT isfinite(value) OR value < 0 OR value > ? OR value <> floor(value)) "
        "ORDER BY event_id LIMIT 1", [MAX_COUNT]).fetchall()
    if not bad:
        return
    event_id, name, value = bad[0]
    part = con.execute("SELECT filename, file_row_number FROM read_parquet(?, filename = true, file_row_number = true) "
                       "WHERE event_id = ? LIMIT 1", [[str(p) for p in run.event_parts], event_id]).fetchall()
    where = f"{run.name(part[0][0])} row {part[0][1]}" if part else "events/"
    raise LoadError(f"{where}: event {event_id} ({name}) has value {value!r}, which is not a token count "
                    f"(a whole number from 0 to {MAX_COUNT}); fix or re-import the source that wrote it")


def _view_without_copies(con, run: RunFiles, files: list[Path]) -> None:
    """`events` as every part's rows less the copies `event_copies_left_out` names by (file, row): the parts
    that hold none are read as they are, only those that hold one pay for the file and row columns."""
    root = sql_string(str(_root(run)))
    holding = {r[0] for r in con.execute("SELECT DISTINCT part FROM event_copies_left_out").fetchall()}
    dirty = [f for f, p in zip(files, run.event_parts) if run.name(p) in holding]
    clean = [f for f in files if f not in dirty]
    sql = (f"SELECT * EXCLUDE (filename, file_row_number) FROM read_parquet({_sql_list(dirty)}, union_by_name = true, "
           "filename = true, file_row_number = true) "
           f"ANTI JOIN (SELECT {root} || '/' || part AS filename, file_row_number FROM event_copies_left_out) "
           "USING (filename, file_row_number)")
    if clean:
        sql = f"SELECT * FROM read_parquet({_sql_list(clean)}, union_by_name = true) UNION ALL BY NAME {sql}"
    con.execute(f"CREATE OR REPLACE VIEW events AS {sql}")


def _no_copies(con) -> None:
    con.execute("CREATE TABLE event_copies_left_out (run_id VARCHAR, part VARCHAR, file_row_number BIGINT, "
                "event_id VARCHAR)")


def _new_parts(con, run: RunFiles, files: list[Path]) -> list[Path] | None:
    """The parts (as `events` reads them) an earlier build did not check, when none of their event ids' hashes
    meets another's (theirs or one read before: `events` then holds each id once); None otherwise."""
    if run.checked is None:
        return None
    new = [f for f, p in zip(files, run.event_parts) if p not in run.checked.parts]
    if not new:
        return new
    met = con.execute(f"""
        WITH n AS (SELECT hash(event_id) AS h FROM read_parquet({_sql_list(new)}, union_by_name = true))
        SELECT EXISTS (SELECT h FROM n GROUP BY h HAVING count(*) > 1)
            OR EXISTS (SELECT h FROM n SEMI JOIN {run.checked.hashes} USING (h))""").fetchone()[0]
    return None if met else new


def _dedupe(con, run: RunFiles, files: list[Path]) -> list[tuple]:
    """Keep one copy of every event id (`files`: the event parts as `events` reads them); record the copies
    left out in `event_copies_left_out`; return the gap rows (scope, subject_id, affects, needs, detail)."""
    # a 64-bit hash of every id first (no string copied), the hashes met twice found by sorting them (a sort
    # of integers, cheaper than a hash table with a group per event), then the few candidates checked on the
    # ids themselves: a hash collision between two distinct ids is not a duplicate
    con.execute("""
        CREATE OR REPLACE TEMP TABLE event_dups AS
        WITH candidates AS (
          SELECT DISTINCT h FROM (SELECT h, lag(h) OVER (ORDER BY h) AS prev FROM (SELECT hash(event_id) AS h FROM events))
          WHERE h = prev)
        SELECT event_id FROM events SEMI JOIN candidates ON hash(event_id) = candidates.h
        GROUP BY event_id HAVING count(*) > 1""")
    if not con.execute("SELECT count(*) FROM event_dups").fetchall()[0][0]:
        con.execute("DROP TABLE event_dups")
        _no_copies(con)
        return []
    order = pa.table({"filename": [str(p) for p in files], "part": [run.name(p) for p in run.event_parts],
                      "part_index": list(range(len(files)))})
    con.register("_part_order", order)
    cols = [c for c in EVENT_SCHEMA.names]
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE event_copy_rows AS
        SELECT r.*, o.part, o.part_index,
               row_number() OVER (PARTITION BY r.event_id ORDER BY o.part_index, r.file_row_number) AS k
        FROM read_parquet(?, union_by_name = true, filename = true, file_row_number = true) r
        JOIN _part_order o USING (filename) SEMI JOIN event_dups USING (event_id)""", [[str(p) for p in files]])
    con.unregister("_part_order")
    # @table event_copies_left_out: one row per copy of an event that `events` leaves out: a second copy of an
    #   event id (the earliest part's copy is kept; `gaps` scope event says so)
    # @column part: the part holding the copy, relative to the run folder (ledger_parts.part)
    # @column file_row_number: the copy's row in that part, from 0
    # @column event_id: the event's id, as in events
    con.execute("""
        CREATE TABLE event_copies_left_out AS SELECT getvariable('run_id') AS run_id, part, file_row_number, event_id
        FROM event_copy_rows WHERE k > 1 ORDER BY part_index, file_row_number""")
    differs = " || ".join(f"CASE WHEN c.{c} IS DISTINCT FROM w.{c} THEN ['{c}'] ELSE [] END" for c in cols)
    rows = con.execute(f"""
        SELECT c.event_id, c.part, w.part, {differs} AS differs
        FROM event_copy_rows c JOIN event_copy_rows w ON w.event_id = c.event_id AND w.k = 1
        WHERE c.k > 1 ORDER BY c.part_index, c.file_row_number""").fetchall()
    if rows and run.in_place:
        _view_without_copies(con, run, files)
    elif rows:
        con.execute("DELETE FROM events WHERE event_id IN (SELECT event_id FROM event_dups)")
        con.execute(f"INSERT INTO events BY NAME SELECT {', '.join(cols)} FROM event_copy_rows WHERE k = 1")
    con.execute("DROP TABLE event_copy_rows")
    con.execute("DROP TABLE event_dups")
    gaps, same = [], {}
    for event_id, copy_name, kept_name, differs in rows:
        if differs:
            where = "the same part" if copy_name == kept_name else f"{kept_name} and {copy_name}"
            gaps.append(("event", event_id, "events and every figure that reads this event",
                         "a distinct event_id for each distinct event",
                         f"event {event_id} is twice in {where} with different {', '.join(differs)}: the copy in "
                         f"{kept_name} that comes first (parts are numbered in the order they were flushed) is "
                         "kept, the other is left out"))
        else:
            same.setdefault((copy_name, kept_name), []).append(event_id)
    for (copy_name, kept_name), ids in same.items():
        gaps.append(("event", copy_name, "events (each counted once)",
                     "each event once in the run directory (a part copied under a second number, or an event "
                     "written twice)",
                     f"{len(ids)} event(s) of {copy_name} are identical copies of events in {kept_name} "
                     f"(first: {ids[0]}): each counted once"))
    return gaps


def _root(run: RunFiles) -> Path:
    """The run folder as an absolute path: a view resolves a relative one against the reader's directory."""
    return run.run_dir.resolve()


def _located(run: RunFiles, files: list[Path]) -> list[Path]:
    """The parts as `events` / `samples` read them: absolute paths when in place, else as listed. In place, a
    part is one file: its rows are told apart by (file, row), so it must not be listed twice."""
    if not run.in_place:
        return files
    if len(set(files)) != len(files):
        raise LoadError(f"{run.run_dir}: a part is listed twice for one ledger ({len(files)} parts, "
                        f"{len(set(files))} distinct); each is read once")
    root = _root(run)
    return [root / p.relative_to(run.run_dir) if p.is_relative_to(run.run_dir) else p.resolve() for p in files]


# @table ledger_parts: one row per Parquet part of events/ and samples/ the ledger was built from; a ledger
#   whose `events` and `samples` are views reads them there at every query, and is refused (the part named)
#   once one is missing, resized or rewritten (docs/LEDGER.md "Events read in place")
# @column run_dir: the run folder the parts were read from, an absolute path (a run read from a URL: the
#   local copy it was staged to, removed after the build)
# @column part: the part's path relative to the run folder (events/part-00001.parquet)
# @column table_name: the table it holds rows of: events or samples
# @column rows: its rows (duplicate copies included)
# @column bytes: its size in bytes
# @column footer_sha256: the sha256 of its Parquet footer (which holds its row groups' offsets and
#   statistics): a part rewritten under the same name has another
def _record_parts(con, run: RunFiles) -> None:
    root = str(_root(run))
    try:
        records = [(table, p, part_record(p)) for table, files in (("events", run.event_parts),
                                                                  ("samples", run.sample_parts)) for p in files]
    except PartError as exc:
        raise LoadError(str(exc)) from None
    rows = pa.table({"run_dir": [root] * len(records), "part": [run.name(p) for _t, p, _r in records],
                     "table_name": [t for t, _p, _r in records], "rows": [r.rows for _t, _p, r in records],
                     "bytes": [r.bytes for _t, _p, r in records],
                     "footer_sha256": [r.footer_sha256 for _t, _p, r in records]})
    con.register("_parts", rows)
    con.execute("CREATE TABLE ledger_parts AS SELECT getvariable('run_id') AS run_id, * FROM _parts")
    con.unregister("_parts")


# @column *.run_id: the run's id (the manifest's run_id, else the run folder's name); every table has it
# @column *.attempt_id: the attempt (events' attempt_id); an attempt is one try of a request
#
# @table events: one row per event, as recorded (docs/EVENTS.md), each event_id once
# @column event_id: unique within the run (e.g. source:seq); a copy under the same id is counted once
#   (gaps scope event)
# @column seq: the emitter's sequence number; a jump in it reveals lost events
# @column source: the emitter: client, server, engine, device, probe, checker, or an importing tool's name
# @column host: the emitter's host
# @column name: what happened, from the vocabulary of docs/EVENTS.md
# @column ts_ns: when, in ns on `clock`
# @column clock: the clock domain of ts_ns (docs/LEDGER.md "Clock rule")
# @column task_id: the task the event belongs to (NULL when none)
# @column session_id: the session, a context container shared by a task's turns (NULL when none)
# @column request_id: the request; retries of one request share it (NULL when none)
# @column step_id: the engine iteration (NULL outside engine steps)
# @column value: the event's number: tokens for engine.token / prefill / enqueued / preempted, blocks,
#   bytes, or a device time in ms (NULL when the event has none)
# @column attrs: everything else, as a JSON object
#
# @table samples: one row per sample of a time series: counters and gauges (energy, power, KV blocks, memory)
# @column ts_ns: when it was read, in ns on `clock`
# @column clock: the clock domain of ts_ns
# @column source: the sampler (probe, vllm-metrics, ...)
# @column host: the host it was read on
# @column device: the device or zone read (a GPU index, a RAPL zone), NULL for the host itself
# @column metric: what was read (gpu_energy_mj, cpu_package_energy_uj, kv_blocks_used, vllm:...)
# @column value: the reading as the source gave it: counters raw (the ledger unwraps them)
# @column unit: the value's unit
#
# @table clocks: one row per clock domain or mapping between two domains (docs/LEDGER.md "Clock rule")
# @column clock: the domain a row declares (NULL on a mapping row)
# @column host: the domain's host
# @column kind: the domain's kind (monotonic, wall, cuda, ...)
# @column from_clock: a mapping's source domain (NULL on a domain row)
# @column to_clock: a mapping's target domain: t_to = t_from + offset_ns
# @column offset_ns: the mapping's offset, ns
# @column epsilon_ns: the mapping's uncertainty, ± ns: a difference across it is derived ± epsilon
# @column method: how the mapping was found (round-trip, cuda-anchor, ...)
def build(con, run: RunFiles) -> None:
    """events, samples, clocks, the parts read and the copies left out (public) and the task contracts, the
    collectors' gap rows (gaps_file) and the load gaps (internal)."""
    event_parts, sample_parts = _located(run, run.event_parts), _located(run, run.sample_parts)
    _load(con, "events", event_parts, EVENT_SCHEMA, False, run, run.in_place)
    _load(con, "samples", sample_parts, SAMPLE_SCHEMA, False, run, run.in_place)
    _record_parts(con, run)
    for name, schema, table, temp in (("clocks.parquet", CLOCK_SCHEMA, "clocks", False),
                                      ("tasks.parquet", TASK_SCHEMA, "task_contracts", True),
                                      ("gaps.parquet", GAP_SCHEMA, "gaps_file", True)):
        f = run.run_dir / name
        _load(con, table, [f] if f.exists() else [], schema, temp, run)
        have = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
        missing = [c for c in schema.names if c not in have]
        if missing:
            raise LoadError(f"{name}: a Parquet file of another kind (lacks column(s) {', '.join(missing)}); "
                            "move it out of the run directory and rebuild")
    new = _new_parts(con, run, event_parts)
    if new is None:
        gaps = _dedupe(con, run, event_parts)
    else:  # no id of the new parts is another's: nothing to leave out
        gaps = []
        _no_copies(con)
    _check_counts(con, run, new)
    GAPS.store(con, gaps + [("run", line.split(":", 1)[0], "events (rows no layout record vouches for)",
                             "the partition layout record of every part", line) for line in run.newer_parts])
