"""A refresh of `reconstruct --follow` that rebuilds only what the new parts touch.

A whole rebuild of a capture in progress reads every event at every refresh; most of them belong to
tasks that ended long ago and whose rows cannot change. An incremental refresh treats the run as the
sharded executor does (ledger/sharded.py): the tasks with events in the parts flushed since the last
refresh form one shard, the "shard of the touched tasks" (every event of those tasks, from every part,
plus the events of no task: the run's and the engines' own); the rest keep the rows the last refresh
computed for them. A task is keyed as a partition is (probes/run_dir.py KEY_SQL: its task, else its
request, else its attempt); a task whose contract (tasks.parquet) changed is touched too.

1. A copy of the last ledger is the new one's start (written beside it, renamed over it when whole).
2. The run-scope modules afresh over every part (`events` and `samples` the views over all the parts,
   each event once; the clocks and the contracts), as a whole build runs them.
3. The shard (`run_shard`, in this process: a DuckDB in memory whose rows come back as Arrow tables):
   the run-, engine- and task-scope modules over its events; where a core is free, as two shares side
   by side, the touched keys split by their hash (`shares`). Its task-scope rows replace the rows the
   shard owns in the last ledger's tables (the public ones in the copy, the TEMP ones the rollups read
   in a state file kept beside the ledger between refreshes), by the sharded executor's ownership rule
   (`owned_rows`): a row of an event, attempt or task of the shard, a row about one (`subject_id`), or
   a row of none of them. The engine-scope tables are the shard's whole: every engine event is in it,
   so a step whose events straddle two flushes comes out as a whole build computes it.
4. The rollup modules over the merged rows, as a whole build runs them.

What the incremental path cannot vouch for, it does not guess: a refresh is whole (and says why) when
there is no state from a refresh before, the ledger is not the last refresh's, a part read before is
gone or changed (the capture's compaction at its end), new samples of a metric task rows read per
attempt, the manifest's settings or the modules' code changed, the clock mappings changed, or an
engine step changed that holds an attempt with no event in the new parts (its rows read the step).
A final refresh (the run finished) is always whole, so the end state is a fresh `reconstruct`.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import duckdb

from inferledger.ledger.load import Checked, RunFiles
from inferledger.ledger.memory import bound, default_memory_limit, parse_size
from inferledger.ledger.modules import ledger_modules
from inferledger.ledger.query import LEDGER_FILE
from inferledger.ledger.reconstruct import (SUMMARY_COUNTS, BuildOptions, LedgerSummary, reconstruct, run_parts,
                                            run_variables)
from inferledger.ledger.sharded import owned_rows, run_shard
from inferledger.ledger.stages import RunDirError, run_modules, set_variables
from inferledger.ledger.tables import sql_string
from inferledger.probes.run_dir import KEY_JOINS, KEY_SQL, id_tables
from inferledger.probes.run_folder import Manifest, RunFolderError

# the run-level inputs a whole build reads that the shard also reads: a change of the clock mappings moves old
# rows; a changed task contract (tasks.parquet grows as tasks start) makes its task one the shard rebuilds
COMPARED = (("clock_conv", "the clock mappings"), ("task_contracts", "the task contracts (tasks.parquet)"))


# the sample metrics a task-scope module reads per attempt (slo_misses: the client loop's lag over each attempt's
# stretches), which a new sample can change for an attempt with no new event; every other sample a task module
# reads lands in a table of no attempt or task (reported_counters), which the shard rebuilds whole
# (tests/test_follow_incremental.py holds the modules that read samples to this)
PER_ATTEMPT_SAMPLES = ("client_loop_lag_ms",)
NO_KEY = "task_id IS NULL AND request_id IS NULL AND attempt_id IS NULL"  # an event of no task: the run's, an engine's


def shares() -> int:
    """How many shares the shard of the touched tasks runs as, side by side: two where a core is free (the
    1-minute load under the CPUs: most of a shard's statements are too small for DuckDB's threads, so one
    share leaves a core idle), else one (the shares each run the run- and engine-scope modules: more CPU).
    The shares split the touched keys by their hash, as the sharded executor splits a run into buckets (a
    task's rows depend on its own events, the run's and the engine tables); each reads every event of no
    key, the first owning their rows and handing over the engine tables. The ledger is the same either way."""
    cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this system: one share, the CPU it costs known
        return 1
    return 2 if cpus >= 2 and load < cpus else 1


class Whole(Exception):
    """Why this refresh rebuilds the whole ledger; the message says it."""


@dataclass(frozen=True)
class Tables:
    """The tables an incremental refresh carries over, by the modules' declared scopes."""
    task: tuple[str, ...]      # task-scope tables the ledger keeps or a rollup reads
    engine: tuple[str, ...]    # engine-scope tables the same way
    temp: frozenset[str]       # which of them are TEMP (kept in the state file between refreshes)
    step_read: tuple[str, ...]  # engine tables a task-scope module reads


def tables() -> Tables:
    modules = ledger_modules()
    public = {t for m in modules for t in m.public}
    rollup_reads = {r for m in modules if m.scope == "rollup" for r in m.reads}
    task_reads = {r for m in modules if m.scope == "task" for r in m.reads}

    def kept(scope):
        return tuple(t for m in modules if m.scope == scope for t in m.creates if t in public or t in rollup_reads)
    task, engine = kept("task"), kept("engine")
    return Tables(task, engine, frozenset(t for t in task + engine if t not in public),
                  tuple(t for t in engine if t in task_reads))


@dataclass
class State:
    """What the last refresh left for the next: its state file (the TEMP tables the rollups read, the
    run-level inputs compared), the parts it read (path -> size, mtime), its SQL variables and the
    ledger it wrote (size, mtime)."""
    path: Path
    parts: dict = field(default_factory=dict)
    samples: dict = field(default_factory=dict)
    variables: str = ""
    ledger: tuple = ()


@dataclass(frozen=True)
class Outcome:
    """One refresh: the ledger's summary, the state for the next (None: the next is whole), how it was
    built ("incremental: ..." or "whole: why") and the seconds of each of its steps."""
    summary: LedgerSummary
    state: State | None
    how: str
    steps: dict


def _stat(path: Path) -> tuple:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def state_path(target: Path) -> Path:
    """The state file of this process's refreshes of the ledger `target`: hidden beside it."""
    return target.with_name(f".{target.name}.follow-{os.getpid()}")


def _save(con, run: RunFiles, path: Path) -> None:
    """The TEMP tables a later refresh reuses and the run-level inputs it compares, into a new state file."""
    path.unlink(missing_ok=True)
    con.execute(f"ATTACH {sql_string(str(path))} AS st")
    try:
        for t in sorted(tables().temp):
            con.execute(f"CREATE TABLE st.{t} AS SELECT * FROM {t}")
        for t, _what in COMPARED:
            con.execute(f"CREATE TABLE st._{t} AS SELECT * FROM {t}")
        # the hash of every event id read: a refresh checks its new parts' ids against these (ledger/load.py)
        con.execute("CREATE TABLE st._event_hash AS SELECT hash(event_id) AS h FROM events")
        _save_ids(con, run.event_parts)
    finally:
        con.execute("DETACH st")


def _save_ids(con, parts: list[Path]) -> None:
    """Each attempt's task and request and each request's task (the keys' tables, `id_tables`), and every task
    named, over the parts as read: kept in the state, where a refresh adds its new parts' ids."""
    id_tables(con, parts)
    con.execute("CREATE TABLE st._att AS SELECT * FROM att")
    con.execute("CREATE TABLE st._req AS SELECT * FROM req")
    con.execute("CREATE TABLE st._task AS SELECT DISTINCT task_id FROM read_parquet(?, union_by_name = true) "
                "WHERE task_id IS NOT NULL", [[str(p) for p in parts]])
    con.execute("CREATE TABLE st._id_parts (id VARCHAR, part VARCHAR)")
    con.execute("CREATE TABLE st._no_key_parts (part VARCHAR)")
    _add_id_parts(con, parts)
    con.execute("DROP TABLE att")
    con.execute("DROP TABLE req")


def _add_id_parts(con, parts: list[Path]) -> None:
    """Which parts name each task, request and attempt id (any of the three columns), and which hold an event of
    none: the parts a shard of some keys reads."""
    if parts:
        con.execute("""INSERT INTO st._id_parts SELECT DISTINCT id, filename FROM (
            SELECT unnest([task_id, request_id, attempt_id]) AS id, filename FROM read_parquet(?, union_by_name = true,
            filename = true)) WHERE id IS NOT NULL""", [[str(p) for p in parts]])
        con.execute(f"INSERT INTO st._no_key_parts SELECT DISTINCT filename FROM read_parquet(?, union_by_name = true, "
                    f"filename = true) WHERE {NO_KEY}", [[str(p) for p in parts]])


def whole(run_dir: Path, options: BuildOptions, why: str, *, out=None, keep: bool = True) -> Outcome:
    """A whole rebuild (`reconstruct`); with `keep`, its state saved for an incremental refresh after it."""
    target = Path(out) if out else run_dir / LEDGER_FILE
    path = state_path(target)
    path.unlink(missing_ok=True)
    parts, samples, _newer = run_parts(run_dir)
    stats = {str(p): _stat(p) for p in parts}, {str(p): _stat(p) for p in samples}
    t0 = time.perf_counter()
    summary = reconstruct(run_dir, options, out=out, on_built=(lambda con, run: _save(con, run, path)) if keep else None)
    steps = {"whole": time.perf_counter() - t0}
    if not keep:
        return Outcome(summary, None, f"whole: {why}", steps)
    state = State(path, *stats, json.dumps(run_variables(Manifest.read(run_dir), summary.run_id, options.live),
                                           default=str), _stat(summary.path))
    return Outcome(summary, state, f"whole: {why}", steps)


def refresh(run_dir: str | os.PathLike, options: BuildOptions, state: State | None, *, out=None) -> Outcome:
    """The next refresh of a run being followed: incremental where it can be sure (module docstring), else
    whole, saying why. The ledger is written beside its place and renamed in, whichever way."""
    run_dir = Path(run_dir)
    in_place = out is None or Path(out).resolve() == (run_dir / LEDGER_FILE).resolve()
    if not options.live or options.engine != "local" or not in_place:
        why = ("the run finished" if not options.live else "--out: a ledger outside the run folder"
               if not in_place else f"--engine {options.engine}")
        return whole(run_dir, options, why, out=out, keep=False)
    if state is None:
        return whole(run_dir, options, "the first refresh")
    try:
        return _incremental(run_dir, options, state)
    except Whole as exc:
        return whole(run_dir, options, str(exc))
    except BaseException:
        state.path.unlink(missing_ok=True)  # half edited: the next refresh is whole
        raise


def _check_files(run_dir: Path, state: State, parts, samples, target: Path) -> list[Path]:
    """The event parts new since the last refresh; Whole when the files moved otherwise."""
    if not state.path.exists() or not target.exists() or _stat(target) != state.ledger:
        raise Whole("the ledger is not the last refresh's")
    for read, listed in ((state.parts, parts), (state.samples, samples)):
        now = {str(p): _stat(p) for p in listed}
        gone = [p for p, st in read.items() if now.get(p) != st]
        if gone:
            raise Whole(f"{Path(gone[0]).relative_to(run_dir)} was rewritten or removed since the last refresh")
    fresh = [str(p) for p in samples if str(p) not in state.samples]
    if fresh and _count_per_attempt_samples(fresh):
        raise Whole(f"new samples of {', '.join(PER_ATTEMPT_SAMPLES)} (attempts' rows read them)")
    return [p for p in parts if str(p) not in state.parts]


def _count_per_attempt_samples(paths: list[str]) -> int:
    """Samples of a metric task rows read per attempt in these sample parts: on a connection of its own
    (duckdb's module-level one is the caller's, and a result left unread there breaks its next statement)."""
    with duckdb.connect() as con:
        return con.execute("SELECT count(*) FROM read_parquet(?, union_by_name = true) WHERE metric IN "
                           f"({', '.join(map(sql_string, PER_ATTEMPT_SAMPLES))})", [paths]).fetchone()[0]


def _drop_run_tables(con) -> None:
    """The run-scope tables of the last ledger, made afresh over every part."""
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    for m in ledger_modules():
        if m.scope == "run":
            for t in m.public:
                con.execute(f"DROP {'VIEW' if t in views else 'TABLE'} IF EXISTS {t}")


def _differs(con, a: str, b: str) -> bool:
    return con.execute(f"SELECT EXISTS (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b}) "
                       f"OR EXISTS (SELECT * FROM {b} EXCEPT ALL SELECT * FROM {a})").fetchone()[0]


def _shard_events(con, parts: list[Path], new: list[Path], contracts: list[str], folder: Path,
                  shares: int) -> tuple[int, list[dict]]:
    """The touched keys (those of the new parts' events, and the tasks whose contract changed), every event of
    theirs and of no key into files under `folder`; the TEMP tables of the ids the shard owns and of every
    attempt and task known. Returns the keys and, for each share of the shard run apart, its parts, the parts
    whose events it owns, the tasks it owns by name (their contract changed) and whether it is the first."""
    con.execute("CREATE TEMP TABLE _new_ids (task_id VARCHAR, request_id VARCHAR, attempt_id VARCHAR)")
    if new:
        con.execute("INSERT INTO _new_ids SELECT task_id, request_id, attempt_id FROM read_parquet(?, union_by_name = "
                    "true) WHERE coalesce(task_id, request_id, attempt_id) IS NOT NULL", [[str(p) for p in new]])
    # the keys' tables of the last refresh with the new parts' ids added (as id_tables over every part gives them)
    con.execute("""CREATE OR REPLACE TABLE st._att AS SELECT attempt_id, min(task_id) AS task_id,
        min(request_id) AS request_id FROM (SELECT * FROM st._att UNION ALL BY NAME
        SELECT attempt_id, task_id, request_id FROM _new_ids WHERE attempt_id IS NOT NULL) GROUP BY attempt_id""")
    con.execute("""CREATE OR REPLACE TABLE st._req AS SELECT request_id, min(task_id) AS task_id FROM (SELECT * FROM
        st._req UNION ALL BY NAME SELECT request_id, task_id FROM _new_ids WHERE request_id IS NOT NULL) GROUP BY request_id""")
    con.execute("""CREATE OR REPLACE TABLE st._task AS SELECT DISTINCT task_id FROM (SELECT task_id FROM st._task
        UNION ALL SELECT task_id FROM _new_ids WHERE task_id IS NOT NULL)""")
    con.execute("CREATE TEMP VIEW att AS SELECT * FROM st._att")
    con.execute("CREATE TEMP VIEW req AS SELECT * FROM st._req")
    con.execute(f"CREATE TEMP TABLE _touched AS SELECT DISTINCT {KEY_SQL} AS key FROM _new_ids e {KEY_JOINS} "
                "UNION SELECT unnest(?::VARCHAR[])", [contracts])
    # an event whose key is touched names a touched task, or an attempt or request keyed to one: those few
    # events are read, then held to their key exactly
    con.execute("""CREATE TEMP TABLE _touched_att AS SELECT a.attempt_id AS id FROM att a
        LEFT JOIN req r ON r.request_id = a.request_id, _touched k
        WHERE k.key IN (a.attempt_id, a.task_id, a.request_id, r.task_id)""")
    con.execute("CREATE TEMP TABLE _touched_req AS SELECT request_id AS id FROM req, _touched k "
                "WHERE k.key IN (request_id, task_id)")
    _add_id_parts(con, new)
    near = ("WHERE task_id IN (SELECT key FROM _touched) OR attempt_id IN (SELECT id FROM _touched_att) "
            "OR request_id IN (SELECT id FROM _touched_req)")
    if con.execute("SELECT count(*) FROM event_copies_left_out").fetchone()[0]:
        # a copy left out may sit in a part that names none of these ids: `events`, each event once, read whole
        near = f"SELECT * FROM events {near} OR {NO_KEY}"
    else:  # each event once in the parts as they lie: only the parts naming a touched id, or holding an event of
        # no key, are read
        order = {str(p): i for i, p in enumerate(parts)}

        def listed(sql):
            return "[" + ", ".join(map(sql_string, sorted((r[0] for r in con.execute(sql).fetchall()),
                                                          key=order.__getitem__))) + "]"
        read = listed("SELECT DISTINCT part FROM st._id_parts WHERE id IN (SELECT key FROM _touched UNION ALL "
                      "SELECT id FROM _touched_att UNION ALL SELECT id FROM _touched_req)")
        no_key = listed("SELECT DISTINCT part FROM st._no_key_parts")
        near = " UNION ALL BY NAME ".join(
            ([f"SELECT * FROM read_parquet({read}, union_by_name = true) {near}"] if read != "[]" else [])
            + ([f"SELECT * FROM read_parquet({no_key}, union_by_name = true) WHERE {NO_KEY}"] if no_key != "[]" else [])
            + ["SELECT * FROM events WHERE false"])  # every part's columns, as `events` has them
    # one pass over the shard's events: the events of no key into `folder/none`, each touched key's into the
    # folder of its share (`folder/0` ...), by the hash of the key
    con.execute(f"COPY (SELECT e.*, CASE WHEN {KEY_SQL} IS NULL THEN 'none' ELSE (hash({KEY_SQL}) % {shares})::VARCHAR "
                f"END AS _share FROM ({near}) e {KEY_JOINS} WHERE {KEY_SQL} IN (SELECT key FROM _touched) "
                f"OR {KEY_SQL} IS NULL) TO {sql_string(str(folder))} (FORMAT parquet, PARTITION_BY (_share))")
    files = {}
    folder.mkdir(exist_ok=True)  # (no event at all: no folder written)
    for sub in sorted(folder.iterdir()):  # `_share=0`: renamed, so that no reader takes the name for a column
        name = sub.name.split("=", 1)[1]
        sub.rename(folder / name)
        files[name] = sorted(str(f) for f in (folder / name).glob("*.parquet"))
    every = [f for fs in files.values() for f in fs]
    for name, col in (("_owned_ev", "event_id"), ("_owned_att", "attempt_id"), ("_owned_task", "task_id")):
        con.execute(f"CREATE TEMP TABLE {name} (id VARCHAR)")
        if every:
            con.execute(f"INSERT INTO {name} SELECT DISTINCT {col} FROM read_parquet(?, union_by_name = true) "
                        f"WHERE {col} IS NOT NULL", [every])
    con.execute("INSERT INTO _owned_task SELECT unnest(?::VARCHAR[]) EXCEPT SELECT id FROM _owned_task", [contracts])
    con.execute("CREATE TEMP VIEW _known_att AS SELECT attempt_id AS id FROM att")
    con.execute("CREATE TEMP VIEW _known_task AS SELECT task_id AS id FROM st._task")
    share_of = dict(con.execute(f"SELECT c, (hash(c) % {shares})::VARCHAR FROM unnest(?::VARCHAR[]) t(c)",
                                [contracts]).fetchall())
    none = files.get("none", [])
    out = [{"parts": files.get(str(i), []) + none, "owned_parts": files.get(str(i), []) + (none if i == 0 else []),
            "tasks": [c for c in contracts if share_of[c] == str(i)], "first": i == 0} for i in range(shares)]
    # the first share always runs (the engine tables and the rows of no key are its); another only with rows
    out = [o for o in out if o["first"] or o["owned_parts"] or o["tasks"]]
    if not out[0]["parts"]:  # no event of no key, none of the first share's keys: a part of no event
        out[0]["parts"] = out[0]["owned_parts"] = [_empty_part(con, folder)]
    return con.execute("SELECT count(*) FROM _touched").fetchall()[0][0], out


def _empty_part(con, folder: Path) -> str:
    """A part of no event with every column `events` has: the first share's input when it has no event."""
    path = str(folder / "empty.parquet")
    con.execute(f"COPY (SELECT * FROM events WHERE false) TO {sql_string(path)} (FORMAT parquet)")
    return path


def _check_steps(con, t: Tables, shard: dict) -> None:
    """Whole unless every attempt a changed engine step holds is in the shard (its rows read the step)."""
    changed, holders = [], []
    for table in t.step_read:
        old = f"st.{table}" if table in t.temp else table
        new = shard[table][0]  # the first share's
        cols = [r[0] for r in con.execute(f"DESCRIBE {old}").fetchall()]
        if "step_id" not in cols:
            if _differs(con, old, new):
                raise Whole(f"{table} changed (an engine table task rows read)")
            continue
        changed.append(f"SELECT step_id FROM (SELECT * FROM {old} EXCEPT ALL SELECT * FROM {new}) UNION ALL "
                       f"SELECT step_id FROM (SELECT * FROM {new} EXCEPT ALL SELECT * FROM {old})")
        if "attempt_id" in cols:
            holders += [f"SELECT step_id, attempt_id FROM {old}", f"SELECT step_id, attempt_id FROM {new}"]
    if not changed:
        return
    con.execute(f"CREATE TEMP TABLE _steps_changed AS SELECT DISTINCT step_id FROM ({' UNION ALL '.join(changed)})")
    if not con.execute("SELECT count(*) FROM _steps_changed").fetchone()[0]:
        return
    if not holders:
        raise Whole("an engine step changed and no table says which attempts it holds")
    left = con.execute(f"SELECT attempt_id FROM ({' UNION ALL '.join(holders)}) SEMI JOIN _steps_changed "
                       "USING (step_id) WHERE attempt_id IS NOT NULL AND attempt_id NOT IN (SELECT id FROM _owned_att) "
                       "LIMIT 1").fetchall()
    if left:
        raise Whole(f"an engine step changed that holds attempt {left[0][0]}, which has no event in the new parts")


def _merge(con, t: Tables, shard: dict, sizes: dict) -> None:
    """The shard's rows (`shard`: each table's registered name, `sizes` its rows) in place of those it owns;
    the engine tables the shard's whole; the TEMP tables as views over the state file, for the rollups. A
    table with no row before or none from the shard costs no statement (most of a small run's are empty)."""
    here = con.execute("SELECT current_database()").fetchall()[0][0]
    cols, rows = {}, {}
    for db, table, col in con.execute("SELECT database_name, table_name, column_name FROM duckdb_columns() "
                                      "WHERE database_name IN (?, 'st') ORDER BY column_index", [here]).fetchall():
        cols.setdefault((db == "st", table), []).append(col)
    for db, table, n in con.execute("SELECT database_name, table_name, estimated_size FROM duckdb_tables() "
                                    "WHERE database_name IN (?, 'st')", [here]).fetchall():
        rows[(db == "st", table)] = n
    for table in t.task:
        key = (table in t.temp, table)
        where = f"st.{table}" if table in t.temp else table
        if rows[key]:  # the rows the shard owns, by the sharded executor's rule (it knows every attempt and task)
            con.execute(f"DELETE FROM {where} WHERE rowid IN "
                        f"({owned_rows(where, cols[key], first=True, select='t.rowid')})")
        if sizes.get(table):
            rows_in = " UNION ALL BY NAME ".join(f"SELECT * FROM {name}" for name in shard[table])
            con.execute(f"INSERT INTO {where} BY NAME {rows_in}")
    for table in t.engine:
        where = f"st.{table}" if table in t.temp else table
        con.execute(f"CREATE OR REPLACE TABLE {where} AS SELECT * FROM {shard[table][0]}")
    for table in sorted(t.temp):
        con.execute(f"CREATE TEMP VIEW {table} AS SELECT * FROM st.{table}")


def _incremental(run_dir: Path, options: BuildOptions, state: State) -> Outcome:
    steps: dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(name):
        now = time.perf_counter()
        steps[name] = steps.get(name, 0.0) + now - clock[0]
        clock[0] = now

    target = run_dir / LEDGER_FILE
    parts, samples, newer = run_parts(run_dir)
    new = _check_files(run_dir, state, parts, samples, target)
    try:
        manifest = Manifest.read(run_dir)
    except RunFolderError as exc:
        raise RunDirError(str(exc)) from None
    run_id = manifest.run_id or run_dir.name
    variables = run_variables(manifest, run_id, options.live)
    if json.dumps(variables, default=str) != state.variables:
        raise Whole("the manifest's settings or the ledger's modules changed")
    t = tables()
    modules = ledger_modules()
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    work = target.with_name(f".{target.name}.refresh-{os.getpid()}")
    for stale in (tmp, Path(f"{tmp}.wal")):
        stale.unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    limit = parse_size(options.memory_limit) if options.memory_limit is not None else default_memory_limit()
    shutil.copyfile(target, tmp)
    lap("copy")
    con = duckdb.connect(str(tmp))
    try:
        bound(con, limit, Path(options.temp_directory) if options.temp_directory else work / "spill")
        con.execute("SET fsync_mode = 'NONE'")
        set_variables(con, variables)
        # the parts read before are checked again only if one held a copy left out (the rule of ledger/load.py)
        copies = con.execute("SELECT count(*) FROM event_copies_left_out").fetchone()[0]
        _drop_run_tables(con)
        con.execute(f"ATTACH {sql_string(str(state.path))} AS st")
        checked = None if copies else Checked(frozenset(p for p in parts if str(p) in state.parts), "st._event_hash")
        run = RunFiles(run_dir, parts, samples, manifest, newer, in_place=True, checked=checked)
        run_modules(con, [m for m in modules if m.scope == "run"], run)
        if new:
            con.execute("INSERT INTO st._event_hash SELECT hash(event_id) FROM read_parquet(?, union_by_name = true)",
                        [[str(p) for p in new]])
        if _differs(con, "clock_conv", "st._clock_conv"):
            raise Whole("the clock mappings changed")
        contracts = [r[0] for r in con.execute(
            "SELECT DISTINCT task_id FROM ((SELECT * FROM task_contracts EXCEPT ALL SELECT * FROM st._task_contracts) "
            "UNION ALL (SELECT * FROM st._task_contracts EXCEPT ALL SELECT * FROM task_contracts)) ORDER BY 1").fetchall()]
        con.execute("CREATE OR REPLACE TABLE st._task_contracts AS SELECT * FROM task_contracts")
        lap("run scope")
        keys, split = _shard_events(con, parts, new, contracts, work / "events", shares())
        lap("touched")
        base = {"run_dir": str(run_dir), "manifest": manifest.body, "variables": variables,
                "samples": [str(p) for p in samples], "limit_bytes": limit // len(split),
                "threads": max(1, 2 // len(split)), "buckets": None, "bucket": -1, "kind": "task", "only": False,
                "handed": {}, "modules": [m.name for m in modules if m.scope != "rollup"], "in_process": True}
        # the first share's engine tables are the run's (every share reads every event of no key); the others
        # hand over their task rows only
        specs = [{**base, **share, "out": str(work / f"shard-{i}"), "whole": list(t.engine) if share["first"] else [],
                  "outputs": list(t.task + t.engine) if share["first"] else list(t.task)}
                 for i, share in enumerate(split)]
        if len(specs) > 1:  # each share a DuckDB of its own, side by side (DuckDB lets go of the GIL)
            with ThreadPoolExecutor(len(specs)) as pool:
                results = list(pool.map(run_shard, specs))
        else:
            results = [run_shard(specs[0])]
        shard, sizes = {}, {}
        for i, result in enumerate(results):  # Arrow tables, handed over in this process
            for table, rows in result["tables"].items():
                name = f"_shard{i}_{table}"
                con.register(name, rows)
                shard.setdefault(table, []).append(name)
                sizes[table] = sizes.get(table, 0) + rows.num_rows
        lap("shard")
        _check_steps(con, t, shard)
        _merge(con, t, shard, sizes)
        lap("merge")
        run_modules(con, [m for m in modules if m.scope == "rollup"], run)
        lap("rollups")
        counts = con.execute(SUMMARY_COUNTS).fetchone()
        con.execute("DETACH st")
        con.execute("SET fsync_mode = 'STANDARD'")
        con.execute("CHECKPOINT")
        lap("write")
    except BaseException:
        con.close()
        tmp.unlink(missing_ok=True)
        raise
    finally:
        con.close()
        shutil.rmtree(work, ignore_errors=True)
    os.replace(tmp, target)
    n_new = len(new)
    how = (f"incremental: {n_new} new part{'s' if n_new != 1 else ''}, {keys} task{'s' if keys != 1 else ''} rebuilt"
           + (f" in {len(split)} shares" if len(split) > 1 else ""))
    return Outcome(LedgerSummary(target, run_id, *counts),
                   replace(state, parts={str(p): _stat(p) for p in parts}, samples={str(p): _stat(p) for p in samples},
                           ledger=_stat(target)), how, steps)
