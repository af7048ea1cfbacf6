"""Clear errors, never tracebacks, on the run-directory paths users get wrong: a torn or foreign Parquet
part (named, with what to do), parts left by an interrupted compaction (read once), a bad --out for
capture and serve (like import), a failed ledger stage (a RunDirError naming the stage)."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.probes.run_dir import compact
from inferledger.ledger.reconstruct import RunDirError, StageError, reconstruct
from inferledger.probes.events import CLOCK_SCHEMA, EVENT_SCHEMA

LINES = [{"name": "clock.domain", "clock": "cm", "attrs": {"host": "c1"}}] + [
    {"name": n, "source": "client", "attempt_id": "A1", "request_id": "R1", "task_id": "T1", "ts_ns": t, "clock": "cm"}
    for n, t in (("attempt.created", 10), ("attempt.sent", 20), ("attempt.first_byte", 30), ("attempt.done", 90))]


def _run(tmp_path: Path) -> Path:
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(x) for x in LINES) + "\n")
    import_archive(tmp_path / "a.jsonl", tmp_path / "run")
    return tmp_path / "run"


def _reconstruct_cli(run: Path):
    res = CliRunner().invoke(app, ["reconstruct", str(run), "-q"], env={"COLUMNS": "400"})
    assert "Traceback" not in res.output
    return res


def test_a_torn_part_is_named_with_what_to_do(tmp_path):
    run = _run(tmp_path)
    whole = (run / "events" / "part-00000.parquet").read_bytes()
    (run / "events" / "part-00001.parquet").write_bytes(whole[: len(whole) // 2])  # a killed copy
    with pytest.raises(RunDirError, match=r"part-00001\.parquet: not a readable Parquet file .* Move it out"):
        reconstruct(run)
    res = _reconstruct_cli(run)
    assert res.exit_code == 2 and "part-00001.parquet" in res.stderr


def test_a_foreign_part_is_named(tmp_path):
    run = _run(tmp_path)
    pq.write_table(pa.table({"x": [1, 2]}), run / "events" / "part-00007.parquet")
    (run / "samples").mkdir()
    (run / "samples" / "notes.parquet").write_text("x")
    with pytest.raises(RunDirError, match=r"part-00007\.parquet: a Parquet file of another kind \(lacks column\(s\) run_id"):
        reconstruct(run)
    (run / "events" / "part-00007.parquet").unlink()
    (run / "events" / "part-x.parquet").write_bytes(b"")
    with pytest.raises(RunDirError, match=r"part-x\.parquet: not a part of the run"):
        reconstruct(run)


def test_parts_left_by_an_interrupted_compaction_are_read_once(tmp_path):
    run = _run(tmp_path)
    one = pq.read_table(run / "events" / "part-00000.parquet")
    second = one.set_column(one.schema.get_field_index("event_id"), "event_id",
                            pa.array([f"{e}-b" for e in one.column("event_id").to_pylist()]))
    pq.write_table(second, run / "events" / "part-00001.parquet")
    merged = compact(run / "events", EVENT_SCHEMA)
    assert merged.name == "part-00000-00001.parquet" and [p.name for p in (run / "events").iterdir()] == [merged.name]
    pq.write_table(one, run / "events" / "part-00000.parquet")  # as if killed before the old parts were removed
    assert reconstruct(run).n_events == 2 * one.num_rows  # 8 events, not 12


def test_a_failed_stage_is_a_run_dir_error_naming_the_stage(tmp_path):
    run = _run(tmp_path)
    (run / "clocks.parquet").unlink()
    cols = {c: [None] for c in CLOCK_SCHEMA.names}  # every column, but an offset that is text
    pq.write_table(pa.table({**cols, "run_id": ["r"], "from_clock": ["a"], "to_clock": ["b"], "offset_ns": ["x"]}),
                   run / "clocks.parquet")
    with pytest.raises(StageError, match=r"ledger stage \S+ failed on "):
        reconstruct(run)
    res = _reconstruct_cli(run)
    assert res.exit_code == 2 and "ledger stage" in res.stderr


@pytest.mark.parametrize("command", [["capture", "-w", "samples/workloads/cpu_demo.toml"], ["serve"]])
def test_capture_and_serve_refuse_a_bad_out_before_loading_anything(tmp_path, command):
    (tmp_path / "file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.txt").write_text("x")
    for out, words in ((tmp_path / "file", "is a file"), (tmp_path / "other", "not a run"),
                       (tmp_path / "file" / "sub", "cannot create or write")):
        res = CliRunner().invoke(app, command + ["--out", str(out)], env={"COLUMNS": "300"})
        assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output, res.output


@pytest.mark.parametrize("target, words", [
    ("http://", "'http://' is not an http(s):// URL with a host"),
    ("http://:8000", "'http://:8000' is not an http(s):// URL with a host"),
    ("http://127.0.0.1:99999", "'http://127.0.0.1:99999' is not a URL (Port out of range 0-65535)"),
    ("ftp://h", "'ftp://h' is not an http(s):// URL with a host"),
])
def test_a_target_that_is_no_servers_url_is_refused_before_a_run_folder_exists(tmp_path, target, words):
    """A URL with no host reached the server's first request, and the run folder was left behind."""
    res = CliRunner().invoke(app, ["capture", "-w", "samples/workloads/cpu_demo.toml", "--target", target,
                                   "--out", str(tmp_path / "run")], env={"COLUMNS": "300"})
    assert res.exit_code == 2 and words in res.output and not (tmp_path / "run").exists(), res.output
    res = CliRunner().invoke(app, ["study", "load", "--set", f"target={target}", "-o", str(tmp_path / "s")],
                             env={"COLUMNS": "300"})
    assert res.exit_code == 2 and words in res.output and not (tmp_path / "s").exists(), res.output
