"""The partitioned run layout: where each event goes, the same ledger, an atomic rewrite, URLs."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import duckdb
import fsspec
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.collectors.rundir.repartition import RepartitionError, repartition
from inferledger.collectors.rundir.writer import RunWriter
from inferledger.ledger.reconstruct import reconstruct
from inferledger.probes.events import EVENT_SCHEMA
from inferledger.probes.run_dir import list_parts
from scale_util import ledger_differences

pytestmark = pytest.mark.slow  # synthetic runs partitioned, rebuilt several ways

E0 = Path(__file__).resolve().parent.parent / "samples" / "e0"


def md5_bucket(key: str, n: int) -> int:  # the rule written out: first 32 bits of the MD5, modulo n
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big") % n


def _emit(w: RunWriter, rows: list[dict]) -> None:
    for i, r in enumerate(rows):
        w.emit({"run_id": "r", "event_id": f"e:{i}", "seq": i, "source": r.get("source", "client"), "host": "h",
                "name": r["name"], "ts_ns": 1000 * (i + 1), "clock": "c", "task_id": r.get("task_id"),
                "session_id": None, "request_id": r.get("request_id"), "attempt_id": r.get("attempt_id"),
                "step_id": r.get("step_id"), "value": r.get("value"), "attrs": json.dumps(r.get("attrs", {}))})


ROWS = [
    {"name": "task.start", "task_id": "T1"},
    {"name": "attempt.created", "task_id": "T1", "request_id": "R1", "attempt_id": "A1"},
    {"name": "attempt.sent", "task_id": "T1", "request_id": "R1", "attempt_id": "A1"},
    {"name": "engine.enqueued", "source": "engine", "request_id": "R1", "attempt_id": "A1", "value": 5},  # no task id
    {"name": "attempt.created", "task_id": "T2", "request_id": "R2", "attempt_id": "A2"},
    {"name": "engine.scheduled", "source": "engine", "request_id": "R2", "attempt_id": "A2b"},  # a retry: via R2
    {"name": "attempt.created", "request_id": "R3", "attempt_id": "A3"},  # no task anywhere: keyed by R3
    {"name": "step.start", "source": "engine", "step_id": 1, "attrs": {"engine_id": "h-1-0", "batch": [["A1", "prefill", 5]]}},
    {"name": "step.end", "source": "engine", "step_id": 1, "attrs": {"engine_id": "h-1-0"}, "value": 5},
    {"name": "mem.returned", "source": "engine", "value": 4096},  # neither: the run's own
]


def _placed(run: Path) -> dict[str, list[str]]:
    out = {}
    for p in sorted((run / "events").glob("*/part-*.parquet")):
        out.setdefault(p.parent.name, []).extend(pq.read_table(p).column("event_id").to_pylist())
    return out


def test_each_event_goes_to_its_tasks_bucket_its_engine_or_the_run(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run, "r") as w:
        w.clock_domain("c", host="h", kind="monotonic")
        _emit(w, ROWS)
    before = reconstruct(run, out=tmp_path / "before.duckdb")
    counts = repartition(run, 8)
    b = {k: f"bucket-{md5_bucket(k, 8):04d}" for k in ("T1", "T2", "R3")}
    want: dict[str, list[str]] = {}
    for event_id, part in (("e:0", b["T1"]), ("e:1", b["T1"]), ("e:2", b["T1"]), ("e:3", b["T1"]),
                           ("e:4", b["T2"]), ("e:5", b["T2"]), ("e:6", b["R3"]),
                           ("e:7", "engine-h-1-0"), ("e:8", "engine-h-1-0"), ("e:9", "run")):
        want.setdefault(part, []).append(event_id)
    assert _placed(run) == {k: sorted(v, key=lambda e: int(e[2:])) for k, v in want.items()}
    assert counts == {k: len(v) for k, v in want.items()}
    record = json.loads((run / "events" / "layout.json").read_text())
    assert {k: record[k] for k in ("format", "buckets", "events")} == {"format": 2, "buckets": 8, "events": 10}
    assert {folder: [(r["name"], r["rows"]) for r in parts] for folder, parts in record["parts"].items()} == \
        {k: [("part-00000.parquet", len(v))] for k, v in want.items()}
    assert not list((run / "events").glob("part-*.parquet")) and not (run / "events.new").exists()
    assert len(list_parts(run / "events", EVENT_SCHEMA)) == len(want)
    after = reconstruct(run, out=tmp_path / "after.duckdb")
    assert after.n_events == 10 and ledger_differences(before.path, after.path) == []


def test_a_sample_run_repartitioned_keeps_its_ledger_and_a_kill_mid_swap_loses_nothing(tmp_path):
    run = tmp_path / "run"
    import_archive(E0 / "parallel_partial" / "archive.jsonl", run)
    before = reconstruct(run, out=tmp_path / "before.duckdb")
    repartition(run, 4)
    # a kill between the two renames: events/ gone, the new layout complete beside it
    os.rename(run / "events", run / "events.new")
    shutil.copytree(run / "events.new", run / "events.old")
    repartition(run, 2)  # finishes the swap, then rewrites into 2 buckets
    assert not (run / "events.old").exists() and not (run / "events.new").exists()
    after = reconstruct(run, out=tmp_path / "after.duckdb")
    assert after.n_events == before.n_events and ledger_differences(before.path, after.path) == []


def test_one_pass_in_small_batches_and_many_parts_keeps_the_earliest_copy_and_the_ledger(tmp_path, monkeypatch):
    from inferledger.collectors.rundir import repartition as rp

    run = tmp_path / "run"
    with RunWriter(run, "r", flush_rows=3) as w:  # four parts; the last holds a copy of e:3 with another value
        w.clock_domain("c", host="h", kind="monotonic")
        _emit(w, ROWS)
        w.emit({"run_id": "r", "event_id": "e:3", "seq": 3, "source": "engine", "host": "h", "name": "engine.enqueued",
                "ts_ns": 4000, "clock": "c", "task_id": None, "session_id": None, "request_id": "R1",
                "attempt_id": "A1", "step_id": None, "value": 7, "attrs": "{}"})
    before = reconstruct(run, out=tmp_path / "before.duckdb")
    # batches of 2 rows, a row group per row, one writer open: partitions go on in part-00001, part-00002, ...
    monkeypatch.setattr(rp, "_BATCH_ROWS", 2)
    monkeypatch.setattr(rp, "_GROUP_ROWS", 1)
    monkeypatch.setattr(rp, "_OPEN", 1)
    counts = repartition(run, 8)
    placed = {name: [e for p in sorted((run / "events" / name).glob("part-*.parquet"))
                     for e in pq.read_table(p).column("event_id").to_pylist()] for name in counts}
    bucket = {k: f"bucket-{md5_bucket(k, 8):04d}" for k in ("T1", "T2", "R3")}
    want = [e for e, k in (("e:0", "T1"), ("e:1", "T1"), ("e:2", "T1"), ("e:3", "T1"), ("e:4", "T2"), ("e:5", "T2"),
                           ("e:6", "R3"), ("e:3", "T1")) if bucket[k] == bucket["T1"]]
    assert placed[bucket["T1"]] == want and want[-1] == "e:3"  # reading order: the copy after the first
    record = json.loads((run / "events" / "layout.json").read_text())
    names = [r["name"] for r in record["parts"][bucket["T1"]]]
    assert len(names) >= 2 and names == [f"part-{i:05d}.parquet" for i in range(len(names))]
    assert record["events"] == 11 and sum(counts.values()) == 11
    after = reconstruct(run, out=tmp_path / "after.duckdb")
    con = duckdb.connect(str(after.path), read_only=True)
    assert con.execute("SELECT value FROM events WHERE event_id = 'e:3'").fetchall() == [(5.0,)]  # the earliest copy
    con.close()
    assert ledger_differences(before.path, after.path, tables=("events", "attempts", "request_metrics")) == []


def test_a_writer_with_buckets_ends_a_clean_run_partitioned(tmp_path):
    run = tmp_path / "run"
    w = RunWriter(run, "r", buckets=4, flush_rows=3)
    w.clock_domain("c", host="h", kind="monotonic")
    _emit(w, ROWS)
    w.close(compact_parts=True)
    assert sum(len(v) for v in _placed(run).values()) == len(ROWS)
    assert json.loads((run / "events" / "layout.json").read_text())["buckets"] == 4


def test_a_run_at_a_url_builds_the_same_ledger(tmp_path):
    run = tmp_path / "run"
    import_archive(E0 / "r2_timeout_retry" / "archive.jsonl", run)
    repartition(run, 3)
    local = reconstruct(run, out=tmp_path / "local.duckdb")
    fs = fsspec.filesystem("memory")
    fs.put(str(run), "/runs/run", recursive=True)
    for url in (run.as_uri(), "memory:///runs/run"):
        remote = reconstruct(url, out=tmp_path / "remote.duckdb")
        assert remote.run_id == local.run_id and ledger_differences(local.path, remote.path) == []
        assert not list(tmp_path.glob(".remote.duckdb.run-*"))
        with duckdb.connect(str(remote.path), read_only=True) as con:  # its own copy: the staged run is gone
            assert not con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()


def test_repartition_refuses_what_it_cannot_do_and_the_cli_says_so(tmp_path):
    with pytest.raises(RepartitionError, match="no event parts"):
        (tmp_path / "empty" / "events").mkdir(parents=True)
        repartition(tmp_path / "empty", 4)
    run = tmp_path / "run"
    import_archive(E0 / "r1_sample_b0" / "archive.jsonl", run)
    res = CliRunner().invoke(app, ["repartition", str(run), "--buckets", "0"])
    assert res.exit_code == 2 and "--buckets 0" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["repartition", str(run), "--buckets", "2", "--format", "json"])
    assert res.exit_code == 0 and sum(r["events"] for r in json.loads(res.output)) == 625


# ---- a run checked as a whole against its layout record --------------------------------------------------

def _partitioned(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    with RunWriter(run, "r") as w:
        w.clock_domain("c", host="h", kind="monotonic")
        _emit(w, ROWS)
    repartition(run, 8)
    return run


def _bucket_of(run: Path, task: str) -> Path:
    return run / "events" / f"bucket-{md5_bucket(task, 8):04d}"


def test_a_deleted_bucket_part_is_refused_not_a_smaller_ledger(tmp_path):
    from inferledger.ledger.reconstruct import RunDirError

    run = _partitioned(tmp_path)
    (_bucket_of(run, "T2") / "part-00000.parquet").unlink()
    with pytest.raises(RunDirError, match=r"part-00000\.parquet: recorded in layout.json \(\d+ rows\) but missing"):
        reconstruct(run)
    res = CliRunner().invoke(app, ["reconstruct", str(run)])
    assert res.exit_code == 2 and "recorded in layout.json" in res.output


def test_a_part_with_other_rows_or_rewritten_is_refused(tmp_path):
    from inferledger.ledger.reconstruct import RunDirError

    run = _partitioned(tmp_path)
    part = _bucket_of(run, "T1") / "part-00000.parquet"
    table = pq.read_table(part)
    pq.write_table(table.slice(0, 2), part)
    with pytest.raises(RunDirError, match=rf"part-00000\.parquet: 2 rows, layout.json recorded {table.num_rows}"):
        reconstruct(run)
    pq.write_table(table, part, compression="gzip")  # the same rows, written again
    with pytest.raises(RunDirError, match=r"rewritten since layout.json recorded it"):
        reconstruct(run)


def test_a_part_newer_than_the_record_is_rebuilt_with_a_named_gap(tmp_path):
    import duckdb

    run = _partitioned(tmp_path)
    folder = _bucket_of(run, "T1")
    shutil.copy(folder / "part-00000.parquet", tmp_path / "keep.parquet")
    table = pq.read_table(folder / "part-00000.parquet")
    rows = table.to_pylist()[:1]
    rows[0]["event_id"] = "e:late"
    pq.write_table(pq.read_table(folder / "part-00000.parquet").from_pylist(rows, schema=table.schema),
                   folder / "part-00001.parquet")
    summary = reconstruct(run)
    assert summary.n_events == 11
    with duckdb.connect(str(summary.path), read_only=True) as con:
        gaps = con.execute("SELECT detail FROM gaps WHERE detail LIKE '%newer than layout.json%'").fetchall()
    assert gaps == [(f"events/{folder.name}/part-00001.parquet: a part newer than layout.json (1 rows, not "
                     f"recorded): rebuilt with it",)]


def test_a_bucket_folder_past_the_layouts_count_is_refused(tmp_path):
    from inferledger.ledger.reconstruct import RunDirError

    run = _partitioned(tmp_path)
    shutil.copytree(_bucket_of(run, "T1"), run / "events" / "bucket-0008")
    with pytest.raises(RunDirError, match=r"bucket-0008: bucket 8 of a layout of 8 buckets"):
        reconstruct(run)


def test_a_file_in_events_that_is_not_a_part_is_refused_by_name(tmp_path):
    from inferledger.ledger.reconstruct import RunDirError

    run = tmp_path / "run"
    with RunWriter(run, "r") as w:
        w.clock_domain("c", host="h", kind="monotonic")
        _emit(w, ROWS)
    shutil.copy(next((run / "events").glob("part-*.parquet")), run / "events" / "extra.parquet")
    with pytest.raises(RunDirError, match=r"events/extra\.parquet: not a part of the run"):
        reconstruct(run)
    (run / "events" / "extra.parquet").unlink()
    (run / "events" / ".part-00009.parquet.tmp-123").write_bytes(b"")  # a part being written: not read, not refused
    assert reconstruct(run).n_events == 10


def test_partition_folders_with_no_record_of_their_parts_are_rebuilt_with_a_gap_saying_so(tmp_path):
    """Without layout.json (or with a format-1 record that kept no parts) nothing can tell a deleted
    bucket part: the rebuild says so in a gap row instead of passing as a checked run."""
    import duckdb

    run = _partitioned(tmp_path)
    (run / "events" / "layout.json").unlink()
    (_bucket_of(run, "T2") / "part-00000.parquet").unlink()
    summary = reconstruct(run)
    with duckdb.connect(str(summary.path), read_only=True) as con:
        gaps = con.execute("SELECT subject_id, detail FROM gaps "
                           "WHERE affects LIKE 'events (rows no layout%'").fetchall()
    assert gaps == [("events", "events: partition folders (run, engine-h-1-0, bucket-0000, ...) but no layout.json: "
                     "their parts are not held to a record of what was written (a deleted part or bucket would not be "
                     "seen); `inferledger repartition` writes one")]
    (run / "events" / "layout.json").write_text('{"format": 1, "buckets": 8}')
    with duckdb.connect(str(reconstruct(run).path), read_only=True) as con:
        assert con.execute("SELECT detail FROM gaps WHERE affects LIKE 'events (rows no layout%'").fetchall() == [
            ("events/layout.json: a record that keeps no parts (format 1): the partition folders' parts are not "
             "held to what was written (a deleted part would not be seen); `inferledger repartition` writes one "
             "that does",)]
