"""Each event once: an event part copied under a second number, or one event written twice, is counted
once with a gap naming the copies; a copy with other content is a gap of its own saying which copy
is kept and why."""
from __future__ import annotations

import shutil

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from inferledger.ledger.reconstruct import reconstruct
from ledger_util import build_run

ENG = {"source": "engine"}


def _events():
    ev = []
    for i in range(3):
        a = {"attempt_id": f"A{i}", "request_id": f"R{i}"}
        ev += [{"name": "attempt.sent", "ms": 100 * i, **a},
               {"name": "engine.enqueued", "ms": 100 * i + 1, **a, **ENG},
               {"name": "engine.token", "ms": 100 * i + 10, "value": 2, **a, **ENG},
               {"name": "engine.token", "ms": 100 * i + 20, "value": 2, **a, **ENG},
               {"name": "engine.finished", "ms": 100 * i + 21, **a, **ENG, "attrs": {"reason": "stop"}},
               {"name": "attempt.chunk", "ms": 100 * i + 12, **a, "attrs": {"kinds": ["content"]}},
               {"name": "attempt.done", "ms": 100 * i + 30, **a}]
    return ev


def _counts(con):
    return con.execute("SELECT (SELECT count(*) FROM events), (SELECT count(DISTINCT event_id) FROM events), "
                       "(SELECT sum(n_output_tokens) FROM attempts), (SELECT output_tokens FROM run_metrics)"
                       ).fetchone()


def test_a_part_copied_under_a_second_number_is_counted_once(tmp_path):
    run = tmp_path / "r"
    con = build_run(run, _events())
    before = _counts(con)
    con.close()
    (part,) = sorted((run / "events").glob("part-*.parquet"))
    shutil.copy(part, run / "events" / "part-00007.parquet")
    con = duckdb.connect(str(reconstruct(run).path), read_only=True)
    assert before == (21, 21, 12, 12)
    assert _counts(con) == before  # not 42 events and 24 tokens
    rows = con.execute("SELECT scope, subject_id, affects, detail FROM gaps WHERE scope = 'event'").fetchall()
    assert len(rows) == 1
    scope, subject, affects, detail = rows[0]
    assert subject == "events/part-00007.parquet" and affects == "events (each counted once)"
    assert f"21 event(s) of events/part-00007.parquet are identical copies of events in events/{part.name}" in detail


def test_a_copy_with_other_content_is_named_and_the_first_part_wins(tmp_path):
    run = tmp_path / "r"
    build_run(run, _events()).close()
    (part,) = sorted((run / "events").glob("part-*.parquet"))
    t = pq.read_table(part)
    rows = t.to_pylist()
    tok = next(r for r in rows if r["name"] == "engine.token")
    changed = dict(tok, value=50.0)  # same id, another count
    same = next(r for r in rows if r["name"] == "attempt.sent")
    pq.write_table(pa.Table.from_pylist([changed, same], schema=t.schema), run / "events" / "part-00003.parquet")
    con = duckdb.connect(str(reconstruct(run).path), read_only=True)
    assert _counts(con) == (21, 21, 12, 12)  # the earlier part's value 2 is kept, not 50
    gaps = dict(con.execute("SELECT subject_id, detail FROM gaps WHERE scope = 'event'").fetchall())
    assert set(gaps) == {tok["event_id"], "events/part-00003.parquet"}
    detail = gaps[tok["event_id"]]
    assert f"event {tok['event_id']} is twice in events/{part.name} and events/part-00003.parquet" in detail
    assert "different value" in detail and f"the copy in events/{part.name}" in detail and "flushed" in detail
    assert "1 event(s) of events/part-00003.parquet are identical copies" in gaps["events/part-00003.parquet"]


def test_a_run_without_copies_has_no_event_gap(tmp_path):
    con = build_run(tmp_path / "r", _events())
    assert con.execute("SELECT count(*) FROM gaps WHERE scope = 'event'").fetchone()[0] == 0
