"""E0 archive import: every refusal reason, strict and lenient modes, filled-in ids, atomic files."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from inferledger.collectors.rundir.e0_import import ArchiveError, RunExistsError, import_archive

DECL = {"name": "clock.domain", "clock": "cm", "attrs": {"host": "c1", "kind": "monotonic"}}
DECL_S = {"name": "clock.domain", "clock": "sm", "attrs": {"host": "s1", "kind": "monotonic"}}


def ev(**kw) -> dict:
    row = {"name": "attempt.sent", "source": "client", "attempt_id": "A1", "ts_ns": 100, "clock": "cm"}
    row.update(kw)
    return {k: v for k, v in row.items() if v is not ...}  # `...` drops a default column


def cmap(src="sm", dst="cm", off=1_000, eps=10, method="round-trip") -> dict:
    return {"name": "clock.map", "attrs": {"from": src, "to": dst, "offset_ns": off, "epsilon_ns": eps, "method": method}}


def write(tmp_path: Path, *lines) -> Path:
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def refusals(tmp_path: Path, *lines) -> list[tuple[int, str]]:
    with pytest.raises(ArchiveError) as info:
        import_archive(write(tmp_path, *lines), tmp_path / "run")
    assert not (tmp_path / "run").exists(), "strict mode must write nothing"
    return info.value.refusals


CASES = {
    "not json": ([DECL, '{"name": "attempt.sent",'], 2, "not JSON"),
    "not an object": ([DECL, "[1, 2]"], 2, "not a JSON object"),
    "unknown name": ([DECL, ev(name="attempt.sendt")], 2, "unknown event name 'attempt.sendt'"),
    "missing name": ([DECL, ev(name=...)], 2, "missing `name`"),
    "missing id": ([DECL, ev(attempt_id=...)], 2, "missing attempt_id, required by attempt.sent"),
    "missing request id": ([DECL, ev(name="attempt.created")], 2, "missing request_id"),
    "missing attrs id": ([DECL, ev(name="span.start", attrs={"stream": "x"})], 2, "missing attrs.span"),
    "ts missing": ([DECL, ev(ts_ns=...)], 2, "ts_ns missing"),
    "ts null": ([DECL, ev(ts_ns=None)], 2, "ts_ns missing"),
    "ts float": ([DECL, ev(ts_ns=1.5)], 2, "ts_ns must be an integer"),
    "ts float whole": ([DECL, ev(ts_ns=1.0)], 2, "ts_ns must be an integer"),
    "ts string": ([DECL, ev(ts_ns="100")], 2, "ts_ns must be an integer"),
    "ts bool": ([DECL, ev(ts_ns=True)], 2, "ts_ns must be an integer"),
    "ts overflow": ([DECL, ev(ts_ns=2**64)], 2, "ts_ns must be an integer"),
    "undeclared clock": ([DECL, ev(clock="gpu0")], 2, "clock 'gpu0' is never declared"),
    "clock missing": ([DECL, ev(clock=...)], 2, "clock missing"),
    "source missing": ([DECL, ev(source=...)], 2, "source missing"),
    "duplicate event_id": ([DECL, ev(event_id="e1"), ev(event_id="e1", ts_ns=5)], 3, "duplicate event_id 'e1' (first on line 2)"),
    "duplicate filled id": ([DECL, ev(event_id="client:L3"), ev()], 3, "duplicate event_id 'client:L3'"),
    "map undeclared": ([DECL, cmap(src="nowhere")], 2, "clock.map references undeclared clock 'nowhere'"),
    "map to itself": ([DECL, cmap(src="cm")], 2, "from clock 'cm' to itself"),
    "map contradicts": ([DECL, DECL_S, cmap(off=1_000), cmap(off=1_100)], 4, "contradicts line 3"),
    "map reverse contradicts": ([DECL, DECL_S, cmap(off=1_000), cmap("cm", "sm", off=1_000)], 4, "contradicts the reverse mapping on line 3"),
    "map float offset": ([DECL, DECL_S, cmap(off=1.5)], 3, "attrs.offset_ns must be an integer"),
    "map missing epsilon": ([DECL, DECL_S, {"name": "clock.map", "attrs": {"from": "sm", "to": "cm", "offset_ns": 1}}], 3, "missing attrs.epsilon_ns"),
    "attrs list": ([DECL, ev(attrs=[1, 2])], 2, "attrs must be a JSON object, got a JSON array"),
    "attrs string": ([DECL, ev(attrs='{"a": 1}')], 2, "attrs must be a JSON object, got a JSON string"),
    "step_id string": ([DECL, ev(name="step.start", step_id="3")], 2, "step_id must be an integer"),
    "step_id float": ([DECL, ev(name="step.start", step_id=3.5)], 2, "step_id must be an integer"),
    "value string": ([DECL, ev(value="12")], 2, "value must be a number, got a JSON string"),
    "value bool": ([DECL, ev(value=True)], 2, "value must be a number, got a JSON boolean"),
    "id not string": ([DECL, ev(attempt_id=7)], 2, "attempt_id must be a string"),
    "unknown field": ([DECL, ev(atempt_id="A1")], 2, "unknown field 'atempt_id' (did you mean 'attempt_id'?)"),
    "run_id differs": ([DECL, ev(run_id="other")], 2, "run_id 'other' differs"),
    "verdict needs correct": ([DECL, ev(name="verdict", source="checker", attrs={})], 2, "verdict needs attrs.correct"),
    "bad contract": ([DECL, ev(name="task.start", task_id="T1", attrs={"on_missing": "maybe"})], 2, "attrs.on_missing must be"),
    "clock redeclared": ([DECL, dict(DECL, attrs={"host": "other"})], 2, "clock 'cm' already declared on line 1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_refusal_names_its_line_and_reason(tmp_path, case):
    lines, line_no, reason = CASES[case]
    got = refusals(tmp_path, *lines)
    assert [n for n, _ in got] == [line_no]
    assert reason in got[0][1]


def test_error_message_lists_every_refusal_as_archive_line_reason(tmp_path):
    path = write(tmp_path, DECL, ev(ts_ns=1.5), ev(), "nope")
    with pytest.raises(ArchiveError) as info:
        import_archive(path, tmp_path / "run")
    msg = str(info.value)
    assert f"{path}:2: ts_ns must be an integer" in msg
    assert f"{path}:4: not JSON" in msg
    assert "2 line(s) refused" in msg and "nothing was written" in msg


def test_a_refused_declaration_declares_nothing(tmp_path):
    got = refusals(tmp_path, ev(), dict(DECL, comment="x"))
    assert got == [(1, "clock 'cm' is never declared by a clock.domain line"), (2, "unknown field 'comment'")]


def test_non_utf8_line_and_a_capped_message(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(json.dumps(DECL).encode() + b"\n\xff\xfe\n" + b"[]\n" * 60)
    with pytest.raises(ArchiveError) as info:
        import_archive(path, tmp_path / "run")
    assert info.value.refusals[0] == (2, "not valid UTF-8") and len(info.value.refusals) == 61
    assert str(info.value).endswith("... and 11 more refused lines")


def test_declarations_may_follow_use_and_consistent_mappings_pass(tmp_path):
    path = write(tmp_path, cmap(off=1_000, eps=10), ev(), cmap(off=1_015, eps=10),
                 cmap("cm", "sm", off=-1_005, eps=1), ev(clock="sm", source="engine", name="engine.enqueued"), DECL, DECL_S)
    res = import_archive(path, tmp_path / "run")
    assert (res.lines, res.events, res.clocks, res.tasks, res.refused) == (7, 2, 5, 0, 0)
    clocks = pq.read_table(tmp_path / "run" / "clocks.parquet").to_pylist()
    assert [(c["from_clock"], c["to_clock"], c["offset_ns"]) for c in clocks if c["from_clock"]] == [
        ("sm", "cm", 1_000), ("sm", "cm", 1_015), ("cm", "sm", -1_005)]
    assert {(c["clock"], c["host"], c["kind"]) for c in clocks if c["clock"]} == {("cm", "c1", "monotonic"), ("sm", "s1", "monotonic")}


def read_events(run: Path) -> list[dict]:
    return pq.read_table(run / "events").to_pylist()


def test_filled_in_ids_seq_host_and_file_order(tmp_path):
    bare = {"name": "clock.domain", "clock": "bare"}
    path = write(tmp_path, DECL, ev(ts_ns=300), ev(name="attempt.first_byte", ts_ns=200),
                 ev(name="engine.enqueued", source="engine", clock="bare", value=12), bare,
                 ev(name="attempt.done", ts_ns=100, event_id="mine", seq=41, host="laptop"))
    res = import_archive(path, tmp_path / "r7", run_id="exp-1")
    rows = read_events(tmp_path / "r7")
    assert [(r["event_id"], r["seq"], r["host"], r["ts_ns"]) for r in rows] == [
        ("client:L2", 0, "c1", 300), ("client:L3", 1, "c1", 200), ("engine:L4", 0, "unknown", 100),
        ("mine", 41, "laptop", 100)]
    assert {r["run_id"] for r in rows} == {"exp-1"} and res.run_id == "exp-1"
    assert rows[2]["value"] == 12.0 and rows[0]["attrs"] == "{}"
    manifest = json.loads((tmp_path / "r7" / "manifest.json").read_text())
    assert manifest["source"] == "e0-import" and manifest["run_id"] == "exp-1"
    assert manifest["counts"] == {"lines": 6, "events": 4, "clocks": 2, "tasks": 0, "refused": 0}
    assert len(manifest["archive"]["sha256"]) == 64 and manifest["evidence"]["events"] == "declared"


def test_run_id_defaults_to_out_folder_name(tmp_path):
    import_archive(write(tmp_path, DECL, ev()), tmp_path / "my-run")
    assert read_events(tmp_path / "my-run")[0]["run_id"] == "my-run"


def test_task_contract_becomes_a_task_row_and_verdict_an_event(tmp_path):
    contract = {"deadline_ms": 500, "required": ["R1", "R2"], "on_missing": "partial_success",
                "max_attempts": 3, "expected": "42"}
    path = write(tmp_path, DECL, ev(name="task.start", task_id="T1", attrs=contract, attempt_id=...),
                 ev(name="verdict", source="checker", attrs={"correct": True}, ts_ns=900))
    res = import_archive(path, tmp_path / "run")
    assert (res.events, res.tasks) == (2, 1)
    task = pq.read_table(tmp_path / "run" / "tasks.parquet").to_pylist()[0]
    assert (task["task_id"], task["deadline_ms"], json.loads(task["required"]), task["on_missing"],
            task["max_attempts"], task["expected"]) == ("T1", 500.0, ["R1", "R2"], "partial_success", 3, "42")
    events = read_events(tmp_path / "run")
    assert [e["name"] for e in events] == ["task.start", "verdict"]
    assert json.loads(events[0]["attrs"]) == contract and events[1]["attrs"] == '{"correct":true}'


def test_lenient_writes_good_rows_and_one_gap_per_refused_line(tmp_path):
    long_line = json.dumps(ev(ts_ns=1.5, attrs={"pad": "x" * 900}))
    path = write(tmp_path, DECL, ev(), long_line, ev(name="bogus"), ev(ts_ns=400), "not json")
    res = import_archive(path, tmp_path / "run", lenient=True)
    assert (res.events, res.refused) == (2, 3)
    assert [n for n, _ in res.refusals] == [3, 4, 6]
    events = read_events(tmp_path / "run")
    # The refused client line 3 used up seq 1, so the lost event shows as a gap in seq.
    assert [(e["event_id"], e["seq"]) for e in events] == [("client:L2", 0), ("client:L5", 3)]
    gaps = pq.read_table(tmp_path / "run" / "gaps.parquet").to_pylist()
    assert [g["gap_id"] for g in gaps] == ["import:L3", "import:L4", "import:L6"]
    g = gaps[0]
    assert (g["scope"], g["subject_id"], g["run_id"]) == ("import", "line 3", "run")
    assert g["affects"] == "the event on that line and every figure that needs it"
    assert g["needs"].startswith("fix line 3: ts_ns must be an integer")
    assert g["detail"] == long_line[:500]
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["counts"]["refused"] == 3


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_existing_run_is_refused_and_left_byte_identical(tmp_path):
    path = write(tmp_path, DECL, ev())
    import_archive(path, tmp_path / "run")
    before = snapshot(tmp_path / "run")
    for lenient in (False, True):
        with pytest.raises(RunExistsError, match="already holds a run"):
            import_archive(path, tmp_path / "run", lenient=lenient)
    assert snapshot(tmp_path / "run") == before
    (tmp_path / "half" / "events").mkdir(parents=True)  # a run without a manifest yet
    with pytest.raises(RunExistsError):
        import_archive(path, tmp_path / "half")


def test_blank_lines_are_skipped_and_line_numbers_stay_physical(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(DECL) + "\n\n   \n" + json.dumps(ev(ts_ns="x")) + "\n")
    got = refusals(tmp_path, *path.read_text().split("\n")[:-1])
    assert got[0][0] == 4


def test_writer_parts_are_whole_even_when_the_writer_is_killed(tmp_path):
    run = tmp_path / "run"
    script = (
        "import sys\nfrom inferledger.collectors.rundir.writer import RunWriter\n"
        f"w = RunWriter({str(run)!r}, flush_rows=200)\n"
        "i = 0\nwhile True:\n"
        "    w.emit({'run_id': 'r', 'event_id': f'x:{i}', 'seq': i, 'source': 'x', 'host': 'h',"
        " 'name': 'attempt.sent', 'ts_ns': i, 'clock': 'c', 'attempt_id': 'A', 'attrs': 'x' * 200})\n"
        "    i += 1\n")
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while len(list((run / "events").glob("part-*.parquet"))) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    parts = sorted((run / "events").glob("part-*.parquet"))
    assert len(parts) >= 5
    for part in parts:  # every visible part is complete
        assert pq.read_table(part).num_rows == 200
    # A temporary file cut short by the kill is hidden (dot name) and never matches part-*.parquet.
    assert all(p.name.startswith(".") for p in (run / "events").iterdir() if p not in parts)


def test_a_normal_import_leaves_no_temporary_files(tmp_path):
    import_archive(write(tmp_path, DECL, *[ev(ts_ns=i, event_id=f"e{i}") for i in range(50)]), tmp_path / "run")
    assert not [p for p in (tmp_path / "run").rglob("*") if ".tmp" in p.name]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "clocks.parquet", "events", "gaps.parquet", "manifest.json", "tasks.parquet"]
    assert pq.read_table(tmp_path / "run" / "events").num_rows == 50


def test_a_failure_while_writing_leaves_nothing_at_out(tmp_path, monkeypatch):
    from inferledger.collectors.rundir import writer

    def full_disk(*_a, **_k):
        raise OSError(28, "No space left on device")

    path = write(tmp_path, DECL, ev())
    monkeypatch.setattr(writer.RunWriter, "write_manifest", full_disk)
    with pytest.raises(OSError, match="No space left"):
        import_archive(path, tmp_path / "runs" / "r1")
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []
    monkeypatch.undo()
    assert import_archive(path, tmp_path / "runs" / "r1").events == 1  # the same command, again
