"""The event contract: docs/EVENTS.md lists exactly the vocabulary in code; probe rows fit the schema."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from inferledger.probes import EVENT_SCHEMA, EventIds, ListSink, Probe
from inferledger.probes.events import VOCABULARY, evidence_of, missing_requirements, render_evidence_markdown, render_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "EVENTS.md"


def test_events_doc_is_generated_from_the_vocabulary():
    assert DOC.read_text().endswith(render_markdown())


def test_probe_rows_fit_the_schema_and_are_sequenced():
    sink = ListSink()
    p = Probe(sink, "engine", run_id="r", host="h")
    p.emit("engine.enqueued", EventIds(task_id="T1", request_id="R1", attempt_id="A1"), value=12)
    p.emit("step.end", step_id=3, value=7, mode="eager")
    table = pa.Table.from_pylist(sink.rows, schema=EVENT_SCHEMA)
    assert table.num_rows == 2
    assert [r["seq"] for r in sink.rows] == [0, 1]
    assert [r["event_id"] for r in sink.rows] == ["engine:0", "engine:1"]
    assert all(r["clock"] == "mono:h" for r in sink.rows)
    assert all(missing_requirements(r) == [] for r in sink.rows)
    assert sink.rows[1]["attrs"] == '{"mode":"eager"}'
    ids = [(r["task_id"], r["session_id"], r["request_id"], r["attempt_id"], r["step_id"]) for r in sink.rows]
    assert ids == [("T1", None, "R1", "A1", None), (None, None, None, None, 3)]
    assert sink.rows[0]["attrs"] == "{}" and sink.rows[0]["value"] == 12.0


def test_disabled_probe_emits_nothing():
    sink = ListSink()
    Probe(sink, "engine", enabled=False).emit("engine.enqueued", EventIds(attempt_id="A1"))
    assert sink.rows == []


def test_requirements_name_what_is_missing():
    assert missing_requirements({"name": "attempt.sent"}) == ["attempt_id"]
    assert missing_requirements({"name": "span.start", "attrs": "{}"}) == ["attrs.span"]
    assert missing_requirements({"name": "clock.map", "attrs": {"from": "a", "to": "b", "offset_ns": 0}}) \
        == ["attrs.epsilon_ns"]
    assert set(VOCABULARY) >= {"attempt.chunk", "engine.token", "kv.free", "verdict"}


def test_evidence_strengths_are_documented_and_a_report_names_its_reporter():
    assert render_evidence_markdown() in DOC.read_text()
    assert evidence_of(None) == "observed" and evidence_of({"evidence": "reported"}) == "reported"
    row = {"name": "server.received", "attempt_id": "A1", "attrs": '{"evidence":"reported"}'}
    assert missing_requirements(row) == ["attrs.reporter"]
    row["attrs"] = '{"evidence":"reported","reporter":"vllm-0.32.0"}'
    assert missing_requirements(row) == []
