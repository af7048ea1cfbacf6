"""A run directory from any source never crashes the ledger: a torn clocks.parquet or tasks.parquet, or a
token count no integer column can hold, is refused with the file (and the event) named, exit 2 from
the CLI, and the previous ledger kept."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.ledger.reconstruct import RunDirError, reconstruct

LINES = [{"name": "clock.domain", "clock": "cm", "attrs": {"host": "c1"}},
         {"name": "task.start", "source": "client", "task_id": "T1", "ts_ns": 0, "clock": "cm",
          "attrs": {"deadline_ms": 100}}] + [
    {"name": n, "source": "client", "attempt_id": "A1", "request_id": "R1", "task_id": "T1", "ts_ns": t, "clock": "cm"}
    for n, t in (("attempt.sent", 20), ("attempt.done", 90))]


def _run(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(x) for x in LINES) + "\n")
    import_archive(tmp_path / "a.jsonl", tmp_path / "run")
    run = tmp_path / "run"
    reconstruct(run)
    return run


def _cli(run):
    res = CliRunner().invoke(app, ["reconstruct", str(run), "-q"], env={"COLUMNS": "400"})
    assert "Traceback" not in res.output
    return res


@pytest.mark.parametrize("name", ["clocks.parquet", "tasks.parquet"])
def test_a_torn_clocks_or_tasks_file_is_named(tmp_path, name):
    run = _run(tmp_path)
    assert (run / name).exists()
    ledger = (run / "ledger.duckdb").read_bytes()
    data = (run / name).read_bytes()
    (run / name).write_bytes(data[: len(data) // 2])  # a killed copy
    with pytest.raises(RunDirError, match=rf"^{name}: not a readable Parquet file"):
        reconstruct(run)
    res = _cli(run)
    assert res.exit_code == 2 and f"{name}: not a readable Parquet file" in res.output
    assert (run / "ledger.duckdb").read_bytes() == ledger  # the previous ledger is kept


def test_a_clocks_file_of_another_kind_is_named(tmp_path):
    run = _run(tmp_path)
    pq.write_table(pa.table({"run_id": ["r"], "clock": ["cm"]}), run / "clocks.parquet")
    with pytest.raises(RunDirError, match=r"clocks.parquet: a Parquet file of another kind \(lacks column\(s\) host"):
        reconstruct(run)


@pytest.mark.parametrize("value", [1e20, -5.0, 7.5, float("nan")])
def test_a_token_count_no_integer_holds_is_refused_naming_file_and_event(tmp_path, value):
    run = _run(tmp_path)
    part = sorted((run / "events").glob("part-*.parquet"))[0]
    t = pq.read_table(part)
    row = dict(t.to_pylist()[-1], event_id="engine:9", source="engine", name="engine.token", value=value,
               ts_ns=50, attrs="{}")
    pq.write_table(pa.Table.from_pylist([row], schema=t.schema), run / "events" / "part-00009.parquet")
    with pytest.raises(RunDirError, match=r"^events/part-00009.parquet row 0: event engine:9 \(engine.token\) "
                                          r"has value .* which is not a token count"):
        reconstruct(run)
    res = _cli(run)
    assert res.exit_code == 2 and "events/part-00009.parquet row 0: event engine:9" in res.output
