"""The sharded reconstruct: engine and task-bucket stages as Ray tasks, the run-level tables after.

A partitioned run (probes/run_dir.py) is rebuilt in three steps, each the ledger's own modules
(`ledger/modules.py`) chosen by their declared scope:

1. one Ray task per engine instance (`engine-<id>/`, the first with `run/` too; `run/` alone when the
   run has no engine partition): a DuckDB over those parts runs the run-scope modules, the task-scope
   ones the engine modules read, and the engine modules; it writes the engine modules' tables.
2. one Ray task per task bucket (`bucket-NNNN/` with `run/`; the first bucket also gets the engine
   partitions, so the run's own events are kept once): the run-scope modules over those parts, the
   engine tables handed in, the task-scope modules; it writes each task-scope table the rollup reads
   or the ledger keeps, only the rows it owns: a row of an event, attempt or task in its bucket (the
   event's or attempt's partition, the task's bucket `bucket_of`; a row with a subject_id, a figure or
   a gap, the attempt or task it is about); a row of none of them is the first bucket's.
3. the final ledger: the run-scope modules over the whole run (so `events` is whole: a view over the
   run's parts when the ledger is written inside its run folder, as on one node), the engine and
   task tables read back from the shards' Parquet, then the rollup modules: run metrics, quantiles,
   reconciliation, peer views and gaps computed from the per-attempt rows exactly as the single-node
   path computes them.

Ray is optional (`pip install 'inferledger[ray]'`): imported only here, only when asked for.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from inferledger.ledger.load import RunFiles
from inferledger.ledger.modules import Module, ledger_modules
from inferledger.probes.events import EVENT_SCHEMA
from inferledger.probes.run_dir import BUCKET_SQL, RUN_PARTITION, PartError, list_parts, partition_kind, partitions
from inferledger.probes.run_folder import LAYOUT_FILE, Layout, Manifest, RunFolderError


class ShardError(Exception):
    """The run cannot be sharded as it is (layout, Ray); the message says what to do."""


def _closure(modules: tuple[Module, ...], wanted: set[str], skip: set[str]) -> list[Module]:
    """`wanted` modules and every module they read from (transitively), minus `skip`, in module order."""
    creator = {t: m.name for m in modules for t in m.creates}
    need, todo = set(), list(wanted)
    while todo:
        name = todo.pop()
        if name in need or name in skip:
            continue
        need.add(name)
        todo += [creator[r] for r in next(m for m in modules if m.name == name).reads]
    return [m for m in modules if m.name in need]


def owned_rows(table: str, cols: list[str], *, first: bool, bucket: int = -1, buckets: int | None = None,
               select: str = "t.*") -> str:
    """The rows of a task-scope table a shard owns (see the module docstring), as a SELECT of `select` over
    `table` aliased `t`: by hash joins against the shard's own event, attempt and task ids (`_owned_ev`,
    `_owned_att`, `_owned_task`) and the attempts and tasks the build knows (`_known_att`, `_known_task`).

    A row of an event owns by its event, else of an attempt by its attempt, else of a task by its task (its
    bucket, BUCKET_SQL, where `buckets` is given; else the task among `_owned_task`), else a figure or gap
    with a scope by the attempt or task of its scope; a row about a subject (`subject_id`: an attempt,
    attempt#choice or task) the build knows is its owner's; a row of none of them is the first shard's.
    A bucket shard knows the ids of its own events (every other id is another bucket's: rows about it
    cannot come out of this shard); the shard of the touched tasks (ledger/incremental.py) knows every
    attempt and task of the run, since its rule also picks the rows of the last ledger it replaces."""
    task = f"{BUCKET_SQL.format(key='{}', buckets=buckets)} = {bucket}" if buckets else None
    joins, cases = [], []
    if "event_id" in cols:
        joins.append("LEFT JOIN _owned_ev oe ON oe.id = t.event_id")
        cases.append("WHEN t.event_id IS NOT NULL THEN oe.id IS NOT NULL")
    if "attempt_id" in cols:
        joins.append("LEFT JOIN _owned_att oa ON oa.id = t.attempt_id")
        cases.append("WHEN t.attempt_id IS NOT NULL THEN oa.id IS NOT NULL")
    if "task_id" in cols:
        if task is None:
            joins.append("LEFT JOIN _owned_task ot ON ot.id = t.task_id")
        cases.append(f"WHEN t.task_id IS NOT NULL THEN {task.format('t.task_id') if task else 'ot.id IS NOT NULL'}")
    if "scope" in cols and "scope_id" in cols:
        joins.append("LEFT JOIN _owned_att os ON os.id = t.scope_id AND t.scope = 'attempt'")
        cases.append("WHEN t.scope = 'attempt' THEN os.id IS NOT NULL")
        if task is None:
            joins.append("LEFT JOIN _owned_task ost ON ost.id = t.scope_id AND t.scope = 'task'")
        cases.append(f"WHEN t.scope = 'task' THEN {task.format('t.scope_id') if task else 'ost.id IS NOT NULL'}")
    if "subject_id" in cols:  # figures, a module's gaps: the attempt, attempt#choice or task it is about
        joins.append("LEFT JOIN _owned_att sa ON sa.id = split_part(t.subject_id, '#', 1)")
        joins.append("LEFT JOIN _owned_task stk ON stk.id = t.subject_id")
        joins.append("LEFT JOIN _known_att ka ON ka.id = split_part(t.subject_id, '#', 1)")
        joins.append("LEFT JOIN _known_task kt ON kt.id = t.subject_id")
        cases.append("WHEN ka.id IS NOT NULL OR kt.id IS NOT NULL THEN sa.id IS NOT NULL OR stk.id IS NOT NULL")
    where = f"CASE {' '.join(cases)} ELSE {str(first).lower()} END" if cases else str(first).lower()
    return f"SELECT {select} FROM {table} t {' '.join(joins)} WHERE {where}"


def run_shard(spec: dict) -> dict[str, str]:
    """One shard (a Ray task, or called directly): its modules over its parts; {table: Parquet file}, or
    with `in_process` {table: Arrow table}, a task table with no row left out."""
    import resource
    import time

    import duckdb

    from inferledger.ledger.memory import bound
    from inferledger.ledger.stages import run_modules, set_variables

    t0 = time.perf_counter()
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    # in_process (the follow refresh, in its own process): a DuckDB in memory, its rows handed back as Arrow tables
    in_process = spec.get("in_process", False)
    con = duckdb.connect(":memory:" if in_process else str(out / "shard.duckdb"))
    try:
        bound(con, spec["limit_bytes"], out / "spill")
        con.execute(f"SET threads = {spec['threads']}")
        set_variables(con, spec["variables"])
        for table, (files, temp) in spec["handed"].items():
            con.execute(f"CREATE {'TEMP ' if temp else ''}TABLE {table} AS SELECT * FROM read_parquet(?)", [files])
        names = set(spec["modules"])
        # the shard's events read where they lie, as the final ledger's are (its file is removed after)
        run = RunFiles(Path(spec["run_dir"]), [Path(p) for p in spec["parts"]], [Path(p) for p in spec["samples"]],
                       Manifest(spec["manifest"]), in_place=True)
        run_modules(con, [m for m in ledger_modules() if m.name in names], run)
        sharded = spec["kind"] == "task" and not spec["only"]
        if sharded:
            con.execute("CREATE TEMP TABLE _owned_ev AS SELECT DISTINCT event_id AS id FROM read_parquet(?)",
                        [spec["owned_parts"]])
            con.execute("CREATE TEMP TABLE _owned_att AS SELECT DISTINCT attempt_id AS id FROM read_parquet(?) "
                        "WHERE attempt_id IS NOT NULL", [spec["owned_parts"]])
            con.execute("CREATE TEMP TABLE _owned_task AS SELECT DISTINCT task_id AS id FROM read_parquet(?) "
                        "WHERE task_id IS NOT NULL UNION SELECT unnest(?::VARCHAR[])",
                        [spec["owned_parts"], spec.get("tasks", [])])  # and tasks handed by name (contracts alone)
            con.execute("CREATE TEMP VIEW _known_att AS SELECT id FROM _owned_att")
            con.execute("CREATE TEMP VIEW _known_task AS SELECT id FROM _owned_task")
        written, cols = {}, {}
        for table, col in con.execute("SELECT table_name, column_name FROM duckdb_columns() WHERE table_name IN (SELECT "
                                      "unnest(?::VARCHAR[])) ORDER BY column_index", [spec["outputs"]]).fetchall():
            cols.setdefault(table, []).append(col)
        # in process, a task table with no row is not handed over (the caller reads a table not handed as empty)
        empty = set() if not in_process else {
            r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE estimated_size = 0").fetchall()}
        for table in spec["outputs"]:
            if table in empty and table not in spec.get("whole", ()):
                continue
            rows = owned_rows(table, cols[table], first=spec["first"], bucket=spec["bucket"], buckets=spec["buckets"]) \
                if sharded and table not in spec.get("whole", ()) else f"SELECT * FROM {table}"
            if in_process:
                written[table] = con.sql(rows).to_arrow_table()
                continue
            path = out / f"{table}.parquet"
            con.execute(f"COPY ({rows}) TO '{path}' (FORMAT parquet)")
            written[table] = str(path)
    finally:
        con.close()
    (out / "shard.duckdb").unlink(missing_ok=True)
    shutil.rmtree(out / "spill", ignore_errors=True)
    # the worker's peak resident memory so far (a Ray worker process runs shard after shard)
    stats = {"seconds": time.perf_counter() - t0, "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
             "pid": os.getpid(), "parts_bytes": sum(os.path.getsize(p) for p in spec["parts"])}
    return {"tables": written, "stats": stats}


def _plan(run: RunFiles) -> tuple[int, list[list[str]], dict[str, list[str]], list[str]]:
    """(buckets, engine part lists, {bucket folder: parts}, run parts) of a partitioned run; ShardError
    otherwise."""
    events = run.run_dir / "events"
    try:
        layout = Layout.read(events)
    except (PartError, RunFolderError) as exc:
        raise ShardError(str(exc)) from None
    loose = list(events.glob("part-*.parquet"))
    if layout is None or loose:
        raise ShardError(f"{events}: not in the partitioned layout ({'parts outside the partition folders' if layout else f'no {LAYOUT_FILE}'}); "
                         f"run `inferledger repartition {run.run_dir}` first (the ledger is the same either way)")
    by_folder = {p.name: [str(x) for x in list_parts(p, EVENT_SCHEMA)] for p in partitions(events)}
    engines = [parts for name, parts in by_folder.items() if partition_kind(name) == "engine"]
    buckets = {name: parts for name, parts in by_folder.items() if partition_kind(name) == "bucket" and parts}
    _check_buckets(events, layout.buckets, buckets)
    return layout.buckets, engines, buckets, by_folder.get(RUN_PARTITION, [])


def _check_buckets(events: Path, n: int, buckets: dict[str, list[str]]) -> None:
    """ShardError unless every task's events sit in the folder of the task's bucket under the record's
    count: a shard owns only its bucket's tasks, so folders of another count would lose rows silently."""
    import duckdb

    with duckdb.connect() as con:
        for name, parts in buckets.items():
            got = con.execute(f"SELECT task_id, {BUCKET_SQL.format(key='task_id', buckets=n)} AS b FROM "
                              f"read_parquet(?) WHERE task_id IS NOT NULL AND b <> {int(name.split('-', 1)[1])} "
                              "LIMIT 1", [parts]).fetchall()
            if got:
                raise ShardError(f"{events / name}: task {got[0][0]!r} belongs to bucket {got[0][1]} of the {n} "
                                 f"buckets {LAYOUT_FILE} records: the folders were written for another bucket count; "
                                 f"run `inferledger repartition` again (a sharded rebuild would lose its rows)")


def _ray(address: str | None, workers: int):
    try:
        import ray
    except ImportError:
        raise ShardError("--engine ray needs Ray, an optional extra: pip install 'inferledger[ray]' "
                         "(or leave --engine out: the single-node ledger is the same)") from None
    started = False
    if not ray.is_initialized():
        ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR")
        started = True
    return ray, started


def _collect(ray, shard, specs: list[dict], stats: list | None) -> list[dict]:
    results = ray.get([shard.remote(s) for s in specs])
    if stats is not None:
        stats += [{"shard": Path(s["out"]).name, **r["stats"]} for s, r in zip(specs, results)]
    return results


def build_sharded(con, run: RunFiles, variables: dict, *, work: Path, limit_bytes: int,
                  address: str | None = None, workers: int = 2, stats: list | None = None) -> None:
    """Build the ledger into `con` from Ray shards of `run` (see the module docstring); `stats` gets
    one dict per shard (name, seconds, its worker's pid and peak RSS, the bytes of its parts)."""
    from inferledger.ledger.stages import RunDirError, run_modules

    try:
        buckets, engines, task_parts, run_parts = _plan(run)
    except ShardError as exc:
        raise RunDirError(str(exc)) from None
    modules = ledger_modules()
    by_scope = {s: {m.name for m in modules if m.scope == s} for s in ("run", "engine", "task", "rollup")}
    creates = {m.name: m for m in modules}
    engine_tables = [t for n in sorted(by_scope["engine"]) for t in creates[n].creates if not t.startswith("_")]
    rollup_reads = {r for n in by_scope["rollup"] for r in creates[n].reads}
    public = {t for m in modules for t in m.public}
    task_tables = [t for m in modules if m.scope == "task" for t in m.creates
                   if t in public or t in rollup_reads]
    temp = {t: t not in public for t in engine_tables + task_tables}
    samples = [str(p) for p in run.sample_parts]
    per_worker = max(limit_bytes // max(workers, 1), 128 * 2 ** 20)
    base = {"run_dir": str(run.run_dir), "manifest": run.manifest.body, "variables": variables, "samples": samples, "limit_bytes": per_worker,
            "threads": 1, "buckets": buckets}
    engine_specs = [{**base, "kind": "engine", "parts": parts + (run_parts if i == 0 else []), "owned_parts": parts,
                     "first": i == 0, "only": True, "bucket": -1, "handed": {}, "out": str(work / f"engine-{i}"),
                     "modules": [m.name for m in _closure(modules, by_scope["engine"], by_scope["rollup"])],
                     "outputs": engine_tables} for i, parts in enumerate(engines or [[]])]
    all_engine = [p for parts in engines for p in parts]
    try:
        ray, started = _ray(address, workers)
    except ShardError as exc:
        raise RunDirError(str(exc)) from None
    try:
        shard = ray.remote(num_cpus=1)(run_shard)
        engine_out = [r["tables"] for r in _collect(ray, shard, engine_specs, stats)]
        handed = {t: ([o[t] for o in engine_out], temp[t]) for t in engine_tables}
        task_modules = [m.name for m in modules if m.scope in ("run", "task")]
        task_specs = []
        for i, (name, parts) in enumerate(sorted(task_parts.items()) or [("bucket--1", [])]):
            first = i == 0  # a run without task events: one shard over the run's own events, owning all
            task_specs.append({**base, "kind": "task", "first": first, "only": len(task_parts) <= 1,
                               "bucket": int(name.split("-", 1)[1]),
                               "parts": parts + run_parts + (all_engine if first else []),
                               "owned_parts": parts + ((run_parts + all_engine) if first else []),
                               "handed": handed, "out": str(work / name), "modules": task_modules,
                               "outputs": task_tables})
        task_out = [r["tables"] for r in _collect(ray, shard, task_specs, stats)]
    except Exception as exc:  # a shard's refusal (a torn part, a failed stage) as the single-node path says it
        cause = getattr(exc, "cause", None)
        if isinstance(cause, RunDirError):
            raise cause from None
        raise
    finally:
        if started:
            ray.shutdown()
    try:
        run_modules(con, [m for m in modules if m.scope == "run"], run)
        for table in engine_tables + task_tables:
            files = [o[table] for o in (engine_out if table in engine_tables else task_out)]
            con.execute(f"CREATE {'TEMP ' if temp[table] else ''}TABLE {table} AS "
                        "SELECT * FROM read_parquet(?, union_by_name = true)", [files])
        run_modules(con, [m for m in modules if m.scope == "rollup"], run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
