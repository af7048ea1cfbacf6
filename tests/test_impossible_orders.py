"""Impossible inputs are named (the ledger side): a figure that would come out negative
on one clock is NULL with a gap row naming the attempt and both events; conflicting client terminals
follow the earliest-terminal rule for every figure; two runs with one run_id are not mixed in a query."""
from __future__ import annotations

import duckdb
import pytest

from inferledger.ledger.query import LedgerError, open_ledger
from ledger_util import build_run

ENG = {"source": "engine"}
CONTENT = {"attrs": {"kinds": ["content"]}}


def _gap_details(con, subject):
    return [r for r in con.execute("SELECT affects, detail FROM gaps WHERE subject_id = ? ORDER BY affects",
                                   [subject]).fetchall()]


def test_a_chunk_and_done_before_sent_give_null_not_negative(tmp_path):
    ev = [{"name": "attempt.chunk", "ms": 40, **CONTENT},  # before the send: impossible on one clock
          {"name": "attempt.sent", "ms": 50},
          {"name": "attempt.done", "ms": 45, "attrs": {"usage": {"completion_tokens": 3}}}]
    con = build_run(tmp_path / "r", ev)
    row = con.execute("SELECT ttft_client_ms, ttft_first_byte_ms, e2e_client_ms, tpot_ms FROM request_metrics").fetchone()
    assert row == (None, None, None, None)
    gaps = _gap_details(con, "A1")
    by_figure = {a: d for a, d in gaps}
    for figure in ("ttft_client", "ttft_first_byte", "e2e_client"):
        assert figure in by_figure, gaps
    assert "client:0" in by_figure["ttft_client"] and "client:1" in by_figure["ttft_client"]  # both events named
    assert "attempt.chunk" in by_figure["ttft_client"] and "before" in by_figure["ttft_client"]


def test_a_token_before_enqueued_gives_null_server_figures(tmp_path):
    ev = [{"name": "engine.token", "ms": 5, "value": 1, **ENG},
          {"name": "engine.enqueued", "ms": 10, **ENG},
          {"name": "engine.scheduled", "ms": 12, **ENG},
          {"name": "engine.finished", "ms": 30, "attrs": {"reason": "stop"}, **ENG}]
    con = build_run(tmp_path / "r", ev)
    ttft, prefill, e2e = con.execute("SELECT ttft_server_ms, prefill_ms, e2e_server_ms FROM request_metrics").fetchone()
    assert (ttft, prefill, e2e) == (None, None, 20.0)  # e2e (30 − 10) is a possible order: kept
    assert {a for a, _ in _gap_details(con, "A1")} >= {"ttft_server", "prefill"}


def test_derived_differences_within_epsilon_are_kept(tmp_path):
    # the server's received maps to 0.5 ms before the send, within the mapping's ±1 ms: plausible, kept
    ev = [{"name": "attempt.sent", "ms": 10, "clock": "c"},
          {"name": "server.received", "ms": 9.5, "clock": "s", "source": "server"},
          {"name": "attempt.done", "ms": 30, "clock": "c"}]
    con = build_run(tmp_path / "r", ev, domains=("c", "s"), maps=[("s", "c", 0, 1_000_000, "round-trip")])
    assert con.execute("SELECT uplink_ms FROM request_metrics").fetchone()[0] == pytest.approx(-0.5)


def test_done_after_timeout_follows_the_earliest_terminal_for_every_figure(tmp_path):
    ev = [{"name": "task.start", "ms": 0, "task_id": "T1", "attrs": {"deadline_ms": 1000}},
          {"name": "attempt.sent", "ms": 0, "task_id": "T1"}, {"name": "attempt.chunk", "ms": 20, **CONTENT},
          {"name": "attempt.timeout", "ms": 100}, {"name": "attempt.done", "ms": 200,
                                                   "attrs": {"usage": {"completion_tokens": 5}}},
          {"name": "verdict", "ms": 201, "source": "checker", "attrs": {"correct": True}}]
    con = build_run(tmp_path / "r", ev)
    status, e2e, span, on_time, good = con.execute(
        "SELECT client_status, e2e_client_ms, client_span_ms, on_time, good FROM attempts JOIN request_metrics "
        "USING (attempt_id)").fetchone()
    assert (status, e2e, span, on_time, good) == ("timeout", None, 100.0, None, False)
    assert con.execute("SELECT outcome FROM tasks").fetchone()[0] == "failure"
    assert con.execute("SELECT n_completed FROM run_metrics").fetchone()[0] == 0
    (detail,) = con.execute("SELECT detail FROM gaps WHERE subject_id = 'A1' AND affects LIKE '%e2e_client_ms%'"
                            ).fetchone()
    assert "attempt.timeout" in detail and "attempt.done" in detail


def test_a_done_before_its_send_is_not_on_time_but_unknown(tmp_path):
    # the done (t = 40) precedes the send (t = 50): its E2E is impossible, so its time against the
    # deadline is unknown too, and good follows the rule for unknowns (NULL, the task unknown)
    ev = [{"name": "task.start", "ms": 0, "task_id": "T1", "attrs": {"deadline_ms": 1000}},
          {"name": "attempt.sent", "ms": 50, "task_id": "T1"},
          {"name": "attempt.done", "ms": 40, "task_id": "T1", "attrs": {"usage": {"completion_tokens": 3}}},
          {"name": "verdict", "ms": 60, "source": "checker", "attrs": {"correct": True}}]
    con = build_run(tmp_path / "r", ev)
    row = con.execute("SELECT client_status, e2e_client_ms, done_since_reference_ms, on_time, good "
                      "FROM attempts JOIN request_metrics USING (attempt_id)").fetchone()
    assert row == ("completed", None, 40.0, None, None)
    assert con.execute("SELECT outcome FROM tasks").fetchone()[0] == "unknown"
    assert con.execute("SELECT n_good, n_unjudged FROM run_metrics").fetchone() == (0, 1)
    assert con.execute("SELECT count(*) FROM slo_misses").fetchone()[0] == 0  # not a miss either


def _ledger(run, run_id):
    run.mkdir(parents=True)
    con = duckdb.connect(str(run / "ledger.duckdb"))
    con.execute("CREATE TABLE attempts AS SELECT ? AS run_id, 'A1' AS attempt_id", [run_id])
    con.close()


def test_two_runs_with_one_run_id_are_refused_in_a_multi_run_query(tmp_path):
    _ledger(tmp_path / "runs" / "a", "same")
    _ledger(tmp_path / "runs" / "b", "same")
    with pytest.raises(LedgerError, match=r"run_id 'same'.*runs/a.*runs/b|run_id 'same'.*runs/b.*runs/a"):
        open_ledger(str(tmp_path / "runs" / "*"))
    _ledger(tmp_path / "ok" / "c", "c")
    _ledger(tmp_path / "ok" / "d", "d")
    with open_ledger(str(tmp_path / "ok" / "*")) as led:
        assert led.sql("SELECT count(*) FROM attempts").fetchall() == [(2,)]
