"""`reconstruct --follow`'s incremental refresh (ledger/incremental.py): after each refresh of a run written part
by part, every table equals a fresh whole build of the same parts (in-flight attempts included, while the
manifest says running); where it cannot be sure (a part rewritten or removed, the samples or the task
contracts changed, a changed engine step holding an attempt with no new event) it rebuilds the whole and
says why."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inferledger.ledger.incremental import refresh
from inferledger.ledger.incremental import shares as pick_shares
from inferledger.ledger.reconstruct import PUBLIC_TABLES, BuildOptions, reconstruct
from inferledger.probes.events import SAMPLE_SCHEMA, TASK_SCHEMA
from inferledger.probes.run_folder import Manifest
from scale_util import ledger_differences
from test_scale_memory import bench_module

LIVE = BuildOptions(live=True)
PARTS = 3


def _by_time(events: pa.Table) -> pa.Table:
    return events.sort_by([("ts_ns", "ascending"), ("event_id", "ascending")])


def _cut(events: pa.Table, n: int) -> list[pa.Table]:
    step = -(-events.num_rows // n)
    return [events.slice(i * step, step) for i in range(n)]


@pytest.fixture(autouse=True)
def two_shares(monkeypatch):
    """The shard of the touched tasks in two shares side by side, whatever the host's load (the refresh picks
    one share on a busy host); the test of every refresh below holds one share too."""
    from inferledger.ledger import incremental

    monkeypatch.setattr(incremental, "shares", lambda: 2)


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """The benchmark's synthetic run (client, engine and checker events of 40 attempts), as a capture would flush it."""
    src = tmp_path_factory.mktemp("incremental") / "src"
    bench_module().phase_import(src, 40, 16, 5)
    return src, _cut(_by_time(pq.read_table(src / "events")), PARTS)


def start(src: Path, run: Path) -> None:
    """A run folder as a capture leaves it after its start: its files but the events, the state running."""
    (run / "events").mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file() and p.suffix == ".parquet":
            shutil.copy(p, run / p.name)
    if (src / "samples").exists():
        shutil.copytree(src / "samples", run / "samples")
    Manifest({**Manifest.read(src).body, "state": "running"}).write(run)


def flush(run: Path, table: pa.Table, i: int) -> None:
    tmp = run / "events" / f".part-{i:05d}.parquet.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, run / "events" / f"part-{i:05d}.parquet")


def same_as_fresh(run: Path, tmp: Path) -> list[str]:
    fresh = reconstruct(run, LIVE, out=tmp / "fresh.duckdb")
    return ledger_differences(run / "ledger.duckdb", fresh.path, PUBLIC_TABLES)


@pytest.mark.slow  # a fresh whole build beside refresh after refresh: `make test` runs it
@pytest.mark.parametrize("n_shares", [1, 2])
def test_every_incremental_refresh_equals_a_fresh_whole_build_of_the_same_parts(bench_run, tmp_path, monkeypatch,
                                                                                n_shares):
    from inferledger.ledger import incremental

    monkeypatch.setattr(incremental, "shares", lambda: n_shares)
    src, parts = bench_run
    run = tmp_path / "run"
    start(src, run)
    state, hows, in_flight = None, [], []
    for i, part in enumerate(parts):
        flush(run, part, i)
        done = refresh(run, LIVE, state)
        state = done.state
        hows.append(done.how)
        assert same_as_fresh(run, tmp_path) == [], (i, done.how)
        import duckdb
        with duckdb.connect(str(run / "ledger.duckdb"), read_only=True) as con:
            in_flight.append(con.execute("SELECT count(*) FROM attempts WHERE client_status = 'in_flight'").fetchone()[0])
    assert hows[0] == "whole: the first refresh"
    assert all(h.startswith("incremental: 1 new part, ") for h in hows[1:]), hows
    assert all(h.endswith(" in 2 shares") == (n_shares == 2) for h in hows[1:]), hows
    assert in_flight[1] > 0 and in_flight[-1] == 0  # the middle refreshes hold attempts in flight, the last none
    # a refresh with no new part (the manifest rewritten): rollups only, still the same
    done = refresh(run, LIVE, state)
    assert done.how == "incremental: 0 new parts, 0 tasks rebuilt" and same_as_fresh(run, tmp_path) == []
    # the end: a whole rebuild, as a fresh reconstruct gives, and the state removed
    Manifest({**Manifest.read(run).body, "state": "complete"}).write(run)
    done = refresh(run, BuildOptions(), done.state)
    assert done.how == "whole: the run finished" and done.state is None
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]


def test_a_shard_split_in_more_shares_than_it_has_keys_for_equals_a_fresh_build(bench_run, tmp_path, monkeypatch):
    """Shares with no touched key of theirs are not run, but the first, then over a part of no event: the rows
    are the same as a fresh build's."""
    from inferledger.ledger import incremental

    empty, empty_part = [], incremental._empty_part
    monkeypatch.setattr(incremental, "shares", lambda: 16)
    monkeypatch.setattr(incremental, "_empty_part", lambda con, folder: empty.append(folder) or empty_part(con, folder))
    src, parts = bench_run
    run = tmp_path / "run"
    start(src, run)
    flush(run, parts[0], 0)
    state = refresh(run, LIVE, None).state
    flush(run, parts[1].slice(0, 3), 1)  # a few events: few keys, most shares without one
    done = refresh(run, LIVE, state)
    # the one key touched falls in another share than the first, which has no event of no key either: the first
    # runs over a part of no event (its engine tables, the rows of no key), beside the share of the key
    assert done.how == "incremental: 1 new part, 1 task rebuilt in 2 shares" and len(empty) == 1
    assert same_as_fresh(run, tmp_path) == []


def test_a_copy_of_an_old_event_in_a_new_part_is_counted_once_as_a_whole_build_counts_it(bench_run, tmp_path):
    src, parts = bench_run
    run = tmp_path / "run"
    start(src, run)
    flush(run, parts[0], 0)
    state = refresh(run, LIVE, None).state
    # the next part carries an identical copy of an event of the first and a copy that differs in its value
    same, other = parts[0].slice(5, 1), parts[0].slice(9, 1)
    other = other.set_column(other.schema.get_field_index("value"), "value", pa.array([123.0]))
    flush(run, pa.concat_tables([parts[1], same, other]), 1)
    done = refresh(run, LIVE, state)
    assert done.how.startswith("incremental: ")
    assert same_as_fresh(run, tmp_path) == []


@pytest.mark.slow  # a fresh whole build beside refresh after refresh: `make test` runs it
def test_a_refresh_checks_the_new_parts_ids_only_unless_one_meets_another(bench_run, tmp_path, monkeypatch):
    """The duplicate check over every part runs at a refresh only when a new part's event id (its hash) meets
    another: one read before, or one of the new parts'; a copy left out before keeps it checking every part."""
    from inferledger.ledger import load

    checks = []  # the parts of the run folder each check reads (not the shard's own file)
    whole_check = load._dedupe

    def check(con, run, files):
        checks.extend([len(files)] if files[0].parent.name == "events" else [])
        return whole_check(con, run, files)
    monkeypatch.setattr(load, "_dedupe", check)
    src, parts = bench_run
    run = tmp_path / "run"
    start(src, run)
    flush(run, parts[0].slice(0, 40), 0)
    state = refresh(run, LIVE, None).state
    assert checks == [1]  # the whole build: every part
    flush(run, parts[0].slice(40), 1)
    state = refresh(run, LIVE, state).state
    assert checks == [1]  # a part of new ids only: its ids against those read before
    # a part holding the same event twice: every part checked, the event counted once
    twice = parts[1].slice(0, 30)
    flush(run, pa.concat_tables([twice, parts[1].slice(7, 1)]), 2)
    state = refresh(run, LIVE, state).state
    assert checks == [1, 3]
    checks.clear()
    # a part of new ids only, while the ledger leaves a copy out: every part checked again, the copy still out
    flush(run, parts[1].slice(30), 3)
    assert refresh(run, LIVE, state).how.startswith("incremental: 1 new part, ")
    assert checks == [4] and same_as_fresh(run, tmp_path) == []


def test_a_token_count_of_a_new_part_is_checked_at_a_refresh_naming_its_part_and_row(bench_run, tmp_path):
    from inferledger.ledger.stages import RunDirError

    src, parts = bench_run
    run = tmp_path / "run"
    start(src, run)
    flush(run, parts[0], 0)
    state = refresh(run, LIVE, None).state
    names, values = parts[1].column("name").to_pylist(), parts[1].column("value").to_pylist()
    row = names.index("engine.token")
    values[row] = 2.5
    flush(run, parts[1].set_column(parts[1].schema.get_field_index("value"), "value", pa.array(values)), 1)
    with pytest.raises(RunDirError, match=f"events/part-00001.parquet row {row}: event .* has value 2.5, which is not "
                                          "a token count"):
        refresh(run, LIVE, state)


@pytest.mark.parametrize("change, why", [
    ("rewrite", "events/part-00000.parquet was rewritten or removed since the last refresh"),
    ("compact", "events/part-00000.parquet was rewritten or removed since the last refresh"),
    ("settings", "the manifest's settings or the ledger's modules changed"),
])
def test_what_the_incremental_path_cannot_vouch_for_is_rebuilt_whole_saying_why(bench_run, tmp_path, change, why):
    src, parts = bench_run
    run = tmp_path / "run"
    start(src, run)
    flush(run, parts[0], 0)
    flush(run, parts[1], 1)
    state = refresh(run, LIVE, None).state
    if change == "rewrite":  # the same rows written again under the same name
        flush(run, pq.read_table(run / "events" / "part-00000.parquet"), 0)
    elif change == "compact":  # the capture's end: parts merged into one
        merged = pa.concat_tables([parts[0], parts[1]])
        for p in (run / "events").glob("part-*.parquet"):
            p.unlink()
        flush(run, merged, 5)
    elif change == "settings":
        Manifest({**Manifest.read(run).body, "slo": {"ttft_ms": 5.0}}).write(run)
    if change != "compact":
        flush(run, parts[2], 2)
    done = refresh(run, LIVE, state)
    assert done.how == f"whole: {why}"  # a whole refresh is a plain reconstruct
    if change == "compact":  # and the next is incremental again, from the files as they are now
        flush(run, parts[2], 6)
        assert refresh(run, LIVE, done.state).how.startswith("incremental: 1 new part, ")
        assert same_as_fresh(run, tmp_path) == []


def test_tasks_whose_contract_changed_are_rebuilt_with_those_of_the_new_part(bench_run, tmp_path):
    """A capture's tasks.parquet grows as its tasks start: a task whose contract changed (one with events flushed
    before, one with no event yet) is rebuilt in the shard, and the ledger equals a fresh build."""
    src, parts = bench_run
    run = tmp_path / "run"
    start(src, run)
    flush(run, parts[0], 0)
    state = refresh(run, LIVE, None).state
    pq.write_table(pa.Table.from_pylist([{"run_id": run.name, "task_id": "T0", "deadline_ms": 1.0},
                                         {"run_id": run.name, "task_id": "T-next", "deadline_ms": 5000.0}],
                                        schema=TASK_SCHEMA), run / "tasks.parquet")
    flush(run, parts[1], 1)
    done = refresh(run, LIVE, state)
    assert done.how.startswith("incremental: 1 new part, ")
    assert same_as_fresh(run, tmp_path) == []


def test_a_ledger_replaced_by_another_build_or_a_lost_state_means_a_whole_refresh(bench_run, tmp_path):
    src, parts = bench_run
    run = tmp_path / "run"
    start(src, run)
    flush(run, parts[0], 0)
    state = refresh(run, LIVE, None).state
    reconstruct(run, LIVE)  # a plain reconstruct in another terminal
    flush(run, parts[1], 1)
    assert refresh(run, LIVE, state).how == "whole: the ledger is not the last refresh's"


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    """The simulator's engine run (steps, KV blocks, a small pool, a cancel): its events in time order."""
    from inferledger.collectors.sim.declared import QWEN3_8B
    from inferledger.collectors.sim.run import SimRequest, distinct_prompt, simulate
    from inferledger.collectors.sim.step_time import BookStepModel
    from inferledger.engine.params import EngineConfig

    vocab = QWEN3_8B.shape.vocab
    requests = [SimRequest(f"q{i}", 40.0 * i, distinct_prompt(i, 8 + i, vocab), 6 + i % 5,
                           cancel_at_ms=150.0 if i == 3 else None) for i in range(12)]
    cfg = EngineConfig(block_size=16, num_blocks=24, max_num_seqs=4, max_num_batched_tokens=64)
    src = simulate(tmp_path_factory.mktemp("sim") / "sim", requests, engine_config=cfg, step_model=BookStepModel(),
                   run_id="sim").run_dir
    return src, _by_time(pa.concat_tables([pq.read_table(p) for p in sorted((src / "events").rglob("part-*.parquet"))]))


@pytest.mark.slow  # a fresh whole build beside refresh after refresh: `make test` runs it
def test_an_engine_run_with_steps_straddling_flushes_equals_a_fresh_build_at_every_refresh(engine_run, tmp_path):
    """Its events cut into parts by time, so steps and attempts straddle the flushes: every refresh after the
    first incremental, each equal to a fresh build."""
    src, events = engine_run
    run = tmp_path / "run"
    start(src, run)
    state, hows = None, []
    for i, part in enumerate(_cut(events, 3)):
        flush(run, part, i)
        done = refresh(run, LIVE, state)
        state = done.state
        hows.append(done.how)
        assert same_as_fresh(run, tmp_path) == [], (i, done.how)
    assert all(h.startswith("incremental: 1 new part, ") for h in hows[1:]), hows


def test_a_changed_step_holding_an_attempt_with_no_new_event_is_rebuilt_whole(engine_run, tmp_path):
    """A new part that changes an old step (a second end of it, under another event id) while the attempts
    that step holds have no event in the part: their rows read the step, so the refresh is whole."""
    src, events = engine_run
    parts = _cut(events, 3)
    run = tmp_path / "run"
    start(src, run)
    flush(run, parts[0], 0)
    flush(run, parts[1], 1)
    state = refresh(run, LIVE, None).state
    names = parts[0].column("name").to_pylist()
    end = parts[0].slice(names.index("step.end"), 1)
    end = end.set_column(end.schema.get_field_index("event_id"), "event_id", pa.array(["engine:late-end"]))
    end = end.set_column(end.schema.get_field_index("value"), "value", pa.array([999.0]))
    flush(run, end, 2)
    done = refresh(run, LIVE, state)
    assert done.how.startswith("whole: an engine step changed that holds attempt "), done.how
    assert done.how.endswith(", which has no event in the new parts")
    assert same_as_fresh(run, tmp_path) == []


def _samples(run: Path, i: int, metric: str, ts_ns: list[int]) -> None:
    (run / "samples").mkdir(exist_ok=True)
    rows = [{"run_id": run.name, "ts_ns": t, "clock": "mono:bench", "source": "probe", "host": "bench", "metric": metric,
             "value": 3.0, "unit": "ms" if metric.endswith("_ms") else "blocks"} for t in ts_ns]
    pq.write_table(pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA), run / "samples" / f"part-{i:05d}.parquet")


def test_new_samples_keep_the_refresh_incremental_unless_attempts_rows_read_them(bench_run, tmp_path):
    """A probe's samples (KV blocks here) land in every flush: read by no attempt's row, the refresh stays
    incremental and equal; the client loop's lag traced over every wake is read per attempt: whole."""
    src, parts = bench_run
    run = tmp_path / "run"
    start(src, run)
    Manifest({**Manifest.read(run).body, "client": {"loop_lag_trace_every": 1}}).write(run)
    t0 = parts[0].column("ts_ns").to_pylist()
    _samples(run, 0, "kv_blocks_used", t0[:3])
    flush(run, parts[0], 0)
    state = refresh(run, LIVE, None).state
    _samples(run, 1, "kv_blocks_used", t0[3:6])
    flush(run, parts[1], 1)
    done = refresh(run, LIVE, state)
    assert done.how.startswith("incremental: 1 new part, ") and same_as_fresh(run, tmp_path) == []
    _samples(run, 2, "client_loop_lag_ms", t0[10:20])  # inside the first attempts' stretches on the client
    flush(run, parts[2], 2)
    assert refresh(run, LIVE, done.state).how == "whole: new samples of client_loop_lag_ms (attempts' rows read them)"
    # the look at the new samples left duckdb's module-level connection as it found it (a result left unread
    # there broke the next statement of whoever used it, in another test of the same process)
    import duckdb

    assert duckdb.sql("SELECT 42").fetchall() == [(42,)]


def test_the_task_modules_reading_samples_are_those_the_incremental_rule_knows():
    """ledger/incremental.py PER_ATTEMPT_SAMPLES names what slo_misses reads per attempt, and reported's samples land
    in a table of no attempt; a new task module reading samples needs its own look at that rule."""
    from inferledger.ledger.modules import ledger_modules

    readers = sorted(m.name for m in ledger_modules() if m.scope == "task" and "samples" in m.reads)
    assert readers == ["reported", "slo_misses"], (
        f"task modules reading samples: {readers}; tell ledger/incremental.py PER_ATTEMPT_SAMPLES what they read per "
        "attempt (a new sample can change an attempt's row with no new event)")


def test_one_ownership_rule_picks_a_shards_output_and_the_rows_it_replaces_in_the_last_ledger():
    """`owned_rows`, the sharded executor's rule the refresh also deletes by: a row of an owned event, attempt
    or task is the shard's; a row about a subject the build knows is its owner's (a bucket shard knows its
    own ids, the refresh every id of the run); a row of none of them is the first shard's."""
    import duckdb

    from inferledger.ledger.sharded import owned_rows

    con = duckdb.connect()
    con.execute("CREATE TABLE f (event_id VARCHAR, attempt_id VARCHAR, task_id VARCHAR, scope VARCHAR, "
                "scope_id VARCHAR, subject_id VARCHAR, n INT)")
    con.execute("""INSERT INTO f VALUES ('e1', 'a9', NULL, NULL, NULL, NULL, 1), ('e2', 'a1', NULL, NULL, NULL, NULL, 2),
        (NULL, 'a1', 't9', NULL, NULL, NULL, 3), (NULL, 'a2', NULL, NULL, NULL, NULL, 4),
        (NULL, NULL, 't1', NULL, NULL, NULL, 5), (NULL, NULL, 't2', NULL, NULL, NULL, 6),
        (NULL, NULL, NULL, 'attempt', 'a1', NULL, 7), (NULL, NULL, NULL, 'task', 't2', NULL, 8),
        (NULL, NULL, NULL, NULL, NULL, 'a1#1', 9), (NULL, NULL, NULL, NULL, NULL, 'a2', 10),
        (NULL, NULL, NULL, NULL, NULL, 't1', 11), (NULL, NULL, NULL, NULL, NULL, 'engine-0', 12),
        (NULL, NULL, NULL, NULL, NULL, NULL, 13)""")
    con.execute("CREATE TABLE _owned_ev AS SELECT 'e1' AS id")
    con.execute("CREATE TABLE _owned_att AS SELECT 'a1' AS id")
    con.execute("CREATE TABLE _owned_task AS SELECT 't1' AS id")

    def picked(first, known_att, known_task):
        con.execute(f"CREATE OR REPLACE TABLE _known_att AS SELECT unnest({known_att}::VARCHAR[]) AS id")
        con.execute(f"CREATE OR REPLACE TABLE _known_task AS SELECT unnest({known_task}::VARCHAR[]) AS id")
        cols = [c[0] for c in con.execute("DESCRIBE f").fetchall()]
        return [r[0] for r in con.execute(f"SELECT n FROM ({owned_rows('f', cols, first=first)}) ORDER BY n").fetchall()]

    # the refresh's shard (the first) knowing the run's attempts a1, a2 and tasks t1, t2: a row about a2 stays
    # another's; about engine-0 (no attempt or task) and of nothing at all, the shard's
    assert picked(True, ["a1", "a2"], ["t1", "t2"]) == [1, 3, 5, 7, 9, 11, 12, 13]
    # a bucket shard knows its own ids: the first takes the rows about ids it does not know, another does not
    assert picked(True, ["a1"], ["t1"]) == [1, 3, 5, 7, 9, 10, 11, 12, 13]
    assert picked(False, ["a1"], ["t1"]) == [1, 3, 5, 7, 9, 11]
    # a bucket shard owns a task by its bucket: of one bucket, every task
    by_bucket = owned_rows("f", ["task_id"], first=False, bucket=0, buckets=1)
    assert [r[0] for r in con.execute(f"SELECT n FROM ({by_bucket}) WHERE task_id IS NOT NULL ORDER BY n").fetchall()] \
        == [3, 5, 6]


def test_two_shares_only_where_the_load_leaves_a_core_free(monkeypatch):
    """The refresh's own pick (the tests above force theirs): two shares while the 1-minute load is under the
    CPUs, else one; one on a single CPU or where the system keeps no load average."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for load, n in ((0.0, 2), (1.9, 2), (2.0, 1), (7.5, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert pick_shares() == n, load
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert pick_shares() == 1

    def no_load():
        raise OSError("no load average")
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "getloadavg", no_load)
    assert pick_shares() == 1
