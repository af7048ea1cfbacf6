"""Unknown is NULL plus a gap row, never 0, inf or NaN: expected values by hand."""
from __future__ import annotations

import pytest

from ledger_util import build_run

ENG, SRV = {"source": "engine"}, {"source": "server"}
CONTENT = {"attrs": {"kinds": ["content"]}}


def _engine_only():
    return [{"name": "engine.enqueued", "ms": 0, "value": 5, **ENG},
            {"name": "engine.scheduled", "ms": 1, **ENG},
            {"name": "engine.prefill", "ms": 10, "value": 5, **ENG},
            {"name": "engine.token", "ms": 20, "value": 1, **ENG},
            {"name": "engine.token", "ms": 30, "value": 1, **ENG},
            {"name": "engine.finished", "ms": 40, "value": 2, "attrs": {"reason": "stop"}, **ENG}]


CLIENT_FIGURES = ("n_good", "n_completed", "goodput_rps", "completed_rps", "output_tokens", "output_tok_s",
                  "arrival_rps", "mean_in_system", "prompt_tokens", "total_tok_s")


def test_a_run_without_client_events_reports_client_figures_unknown(tmp_path):
    con = build_run(tmp_path / "r", _engine_only())
    row = dict(zip(CLIENT_FIGURES, con.execute(f"SELECT {', '.join(CLIENT_FIGURES)} FROM run_metrics").fetchone()))
    assert row == {k: None for k in CLIENT_FIGURES}  # not 0: nobody watched the client side
    rec = con.execute("SELECT completed, cancelled, timed_out, errored, ghost_attempts, ghost_ms, ghost_tokens "
                      "FROM reconciliation").fetchone()
    assert rec == (None,) * 7
    (affects,) = con.execute("SELECT affects FROM gaps WHERE scope = 'run' AND detail = 'the run has no client events'"
                             ).fetchone()
    for figure in ("goodput_rps", "completed_rps", "output_tok_s", "arrival_rps", "ghost_ms"):
        assert figure in affects


def test_a_run_with_client_events_and_nothing_completed_counts_zero(tmp_path):
    ev = [{"name": "attempt.sent", "ms": 0}, {"name": "attempt.timeout", "ms": 100}]
    con = build_run(tmp_path / "r", ev)
    assert con.execute("SELECT n_completed, completed_rps, output_tokens FROM run_metrics").fetchone() == (0, 0.0, 0)


def test_black_box_prompt_tokens_come_from_usage(tmp_path):
    ev = [{"name": "attempt.sent", "ms": 0}, {"name": "attempt.chunk", "ms": 50, **CONTENT},
          {"name": "attempt.done", "ms": 100, "attrs": {"usage": {"prompt_tokens": 17, "completion_tokens": 4}}},
          {"name": "attempt.sent", "ms": 0, "attempt_id": "A2", "request_id": "R2"},
          {"name": "attempt.done", "ms": 200, "attempt_id": "A2", "request_id": "R2",
           "attrs": {"usage": {"prompt_tokens": 3, "completion_tokens": 6}}}]
    con = build_run(tmp_path / "r", ev)
    m = con.execute("SELECT prompt_tokens, output_tokens, total_tok_s, prompt_tokens_cached, "
                    "prefill_tokens_computed FROM run_metrics").fetchone()
    # window 0 .. 200 ms; cached and computed prompt tokens are the engine's to say: unknown
    assert m == (20, 10, pytest.approx(30 / 0.2), None, None)


def test_transport_is_unknown_when_the_client_e2e_is(tmp_path):
    ev = [{"name": "task.start", "ms": 0, "task_id": "T1", "attrs": {"deadline_ms": 50}},
          {"name": "attempt.sent", "ms": 0, "task_id": "T1"},
          {"name": "engine.enqueued", "ms": 1, **ENG}, {"name": "engine.scheduled", "ms": 2, **ENG},
          {"name": "engine.token", "ms": 20, "value": 1, **ENG},
          {"name": "engine.finished", "ms": 30, "value": 1, "attrs": {"reason": "stop"}, **ENG},
          {"name": "server.done", "ms": 31, **SRV},
          {"name": "attempt.timeout", "ms": 100, "task_id": "T1"}]
    con = build_run(tmp_path / "r", ev)
    assert con.execute("SELECT transport_ms FROM slo_misses").fetchone() == (None,)


def test_a_zero_length_window_gives_null_rates_and_a_gap(tmp_path):
    ev = [{"name": "attempt.sent", "ms": 5}, {"name": "attempt.done", "ms": 5,
                                               "attrs": {"usage": {"completion_tokens": 1}}},
          {"name": "verdict", "ms": 6, "source": "checker", "attrs": {"correct": True}}]
    con = build_run(tmp_path / "r", ev)
    cols = ("t_obs_s", "goodput_rps", "completed_rps", "output_tok_s", "arrival_rps", "mean_in_system")
    row = dict(zip(cols, con.execute(f"SELECT {', '.join(cols)} FROM run_metrics").fetchone()))
    assert row["t_obs_s"] == 0.0
    assert {k: v for k, v in row.items() if k != "t_obs_s"} == {k: None for k in cols[1:]}
    assert con.execute("SELECT count(*) FROM gaps WHERE scope = 'run' AND affects LIKE '%goodput_rps%' "
                       "AND detail LIKE '%zero length%'").fetchone()[0] == 1


def test_zero_step_time_gives_null_shares_not_nan(tmp_path):
    ev = [{"name": "attempt.sent", "ms": 0}, {"name": "attempt.done", "ms": 100},
          {"name": "step.start", "ms": 50, "source": "engine", "step_id": 1, "attempt_id": None,
           "attrs": {"batch": [["A1", "decode", 0]]}},
          {"name": "step.end", "ms": 50, "source": "engine", "step_id": 1, "attempt_id": None}]
    samples = [(ms, "gpu_energy_mj", ms * 10.0, "mJ", "gpu0") for ms in range(0, 101, 50)]
    con = build_run(tmp_path / "r", ev, samples=samples)
    shares = con.execute("SELECT share_ms FROM step_attribution").fetchall()
    assert shares == [(None,)]  # 0 tokens of 0: no share, not NaN
    assert con.execute("SELECT fraction, gpu_j FROM energy_shares").fetchall() == [(None, None)]  # not NaN
    assert con.execute("SELECT count(*) FROM gaps WHERE scope = 'step' AND subject_id = '1'").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM gaps WHERE affects LIKE 'energy_shares fraction%'").fetchone()[0] == 1


def test_a_missing_verdict_leaves_good_and_the_task_outcome_both_unknown(tmp_path):
    ev = [{"name": "task.start", "ms": 0, "task_id": "T1", "attrs": {"deadline_ms": 500, "task_class": "chat"}},
          {"name": "attempt.sent", "ms": 0, "task_id": "T1"}, {"name": "attempt.chunk", "ms": 50, **CONTENT},
          {"name": "attempt.done", "ms": 100, "task_id": "T1"},
          # T2 has no deadline: correct and completed is good, and its task succeeded
          {"name": "task.start", "ms": 0, "task_id": "T2"},
          {"name": "attempt.sent", "ms": 0, "task_id": "T2", "attempt_id": "A2", "request_id": "R2"},
          {"name": "attempt.done", "ms": 100, "task_id": "T2", "attempt_id": "A2", "request_id": "R2"},
          {"name": "verdict", "ms": 101, "source": "checker", "attempt_id": "A2", "request_id": "R2",
           "attrs": {"correct": True}}]
    con = build_run(tmp_path / "r", ev)
    good = dict(con.execute("SELECT attempt_id, good FROM request_metrics").fetchall())
    outcome = dict(con.execute("SELECT task_id, outcome FROM tasks").fetchall())
    assert good == {"A1": None, "A2": True}
    assert outcome == {"T1": "unknown", "T2": "success"}
    # the class the client dealt a task is kept; a task.start without one says none (NULL, not a guess)
    assert con.execute("SELECT task_id, task_class FROM tasks ORDER BY 1").fetchall() == [("T1", "chat"), ("T2", None)]


def test_a_window_without_a_start_event_is_unknown_with_a_gap(tmp_path):
    # chunks and a done, but no created / sent / planned arrival: when the window opened is unknown
    ev = [{"name": "attempt.chunk", "ms": 10, **CONTENT}, {"name": "attempt.done", "ms": 20},
          {"name": "engine.enqueued", "ms": 1, **ENG}]
    con = build_run(tmp_path / "r", ev)
    assert con.execute("SELECT t_obs_s, completed_rps FROM run_metrics").fetchone() == (None, None)
    assert con.execute("SELECT count(*) FROM gaps WHERE detail = 'the observation window has no start event'"
                       ).fetchone()[0] == 1


@pytest.mark.parametrize("raw", [1e30, 7.5, "many"])
def test_an_unreadable_usage_count_is_named_in_its_gap_not_said_missing(tmp_path, raw):
    ev = [{"name": "attempt.sent", "ms": 0}, {"name": "attempt.chunk", "ms": 50, **CONTENT},
          {"name": "attempt.done", "ms": 100, "attrs": {"usage": {"completion_tokens": raw}}}]
    con = build_run(tmp_path / "r", ev)
    assert con.execute("SELECT n_output_tokens FROM attempts").fetchone() == (None,)
    (detail,) = con.execute("SELECT detail FROM gaps WHERE affects LIKE 'n_output_tokens%'").fetchone()
    assert detail.startswith("usage.completion_tokens in attempt.done is ") and "not a whole token count" in detail


def test_an_absent_usage_count_is_said_missing(tmp_path):
    ev = [{"name": "attempt.sent", "ms": 0}, {"name": "attempt.chunk", "ms": 50, **CONTENT},
          {"name": "attempt.done", "ms": 100}]
    con = build_run(tmp_path / "r", ev)
    (detail,) = con.execute("SELECT detail FROM gaps WHERE affects LIKE 'n_output_tokens%'").fetchone()
    assert detail == "the server reported no token count"
