"""run_diagnosis: the late attempts' cause times (slo_misses' definition) added up per cause, in time;
and Little's law from two independent measurements (run_metrics)."""
from __future__ import annotations

import pytest

from ledger_util import build_run, dict_rows, event as _e

CAUSES = ("server_queue", "client_queue", "prefill_interference", "preemption", "decode_stall", "host_contention",
          "transport", "client", "spec_rejected")


def _queued_then_interfered(chunk_ms=50, done_ms=70):
    """A1 (T1, deadline 50 ms): enqueued at 0, waits 40 ms in the queue, prefills 40 -> 50, then decodes
    in step 2 (50 -> 70) beside B1's prefill of one token: 10 ms of interference."""
    eng, srv, content = {"source": "engine"}, {"source": "server"}, {"attrs": {"kinds": ["content"]}}
    return [
        _e("task.start", 0, task="T1", attrs={"deadline_ms": 50}),
        _e("attempt.created", 0, "A1", task="T1"), _e("attempt.sent", 0, "A1", task="T1"),
        _e("server.received", 0, "A1", **srv), _e("engine.enqueued", 0, "A1", **eng),
        _e("engine.scheduled", 40, "A1", **eng),
        _e("step.start", 40, step_id=1, source="engine", attrs={"batch": [["A1", "prefill", 10]]}),
        _e("step.end", 50, step_id=1, source="engine", value=10),
        _e("engine.token", 50, "A1", step_id=1, value=1, **eng),
        _e("attempt.chunk", chunk_ms, "A1", task="T1", **content),
        _e("engine.enqueued", 45, "B1", **eng), _e("engine.scheduled", 50, "B1", **eng),
        _e("step.start", 50, step_id=2, source="engine", attrs={"batch": [["A1", "decode", 1], ["B1", "prefill", 1]]}),
        _e("step.end", 70, step_id=2, source="engine", value=2),
        _e("engine.token", 70, "A1", step_id=2, value=1, **eng), _e("engine.token", 70, "B1", step_id=2, value=1, **eng),
        _e("engine.finished", 70, "A1", value=2, attrs={"reason": "stop"}, **eng),
        _e("engine.finished", 70, "B1", value=1, attrs={"reason": "stop"}, **eng),
        _e("server.done", 70, "A1", **srv),
        _e("attempt.chunk", done_ms, "A1", task="T1", **content),
        _e("attempt.done", done_ms, "A1", task="T1", attrs={"finish_reason": "stop"}),
    ]


def _row(con, scope="run"):
    return dict_rows(con, "SELECT * FROM run_diagnosis WHERE scope = ?", scope)[0]


def test_shares_are_the_late_attempts_cause_times_in_ms(tmp_path):
    manifest = {"workload": {"arrivals": "poisson", "spec": {"arrivals": {"process": "poisson", "rate_rps": 2.5}}}}
    con = build_run(tmp_path / "r", _queued_then_interfered(), manifest=manifest)
    row = _row(con)
    # 40 ms queued + 10 ms of B1's prefill in A1's decode step = 50 ms of delay; no stall, no transport
    assert (row["diagnosed"], row["n_attempts"], row["n_late"]) == ("late", 1, 1)
    assert row["delay_ms"] == pytest.approx(50.0)
    assert row["server_queue_share"] == pytest.approx(0.8)
    assert row["prefill_interference_share"] == pytest.approx(0.2)
    assert [row[f"{c}_share"] for c in ("client_queue", "preemption", "decode_stall", "transport", "spec_rejected")] \
        == [0, 0, 0, 0, 0]
    # contention and the client's own delay are unknown here: NULL, with a gap row each, never 0
    assert row["host_contention_share"] is None and row["client_share"] is None
    assert (row["first_cause"], row["first_cause_share"]) == ("server_queue", pytest.approx(0.8))
    assert row["evidence"] == ("server_queue: 40.0 ms of the 50.0 ms of delay (80 %) over 1 late attempt; "
                               "unknown: host_contention, client")
    gaps = {r[0] for r in con.execute("SELECT affects FROM gaps WHERE affects LIKE '%_share'").fetchall()}
    assert gaps == {"host_contention_share", "client_share"}
    # the run is one load point: its offered rate, the same figures
    point = _row(con, "point")
    assert point["point"] == 2.5 and point["server_queue_share"] == pytest.approx(0.8)
    assert con.execute("SELECT offered_rps FROM run_metrics").fetchone()[0] == 2.5
    # one name for one cause: slo_misses' dominant cause is run_diagnosis' first
    assert con.execute("SELECT dominant_cause FROM slo_misses").fetchall() == [("server_queue",)]


def test_a_client_that_reads_the_last_chunk_late_is_client_time(tmp_path):
    """The first chunk arrives on time (50 ms) but the client's loop is blocked 15 ms as the stream ends:
    it reads the end at 90 ms, 20 ms after server.done. The lag lies in the client's time outside the
    server's span (20 ms), so 15 ms is the client's; the TTFT difference is 0, so no transport."""
    con = build_run(tmp_path / "r", _queued_then_interfered(chunk_ms=50, done_ms=90),
                    samples=[(85, "client_loop_lag_ms", 15.0, "ms", None)],
                    manifest={"client": {"loop_lag_trace_every": 1}})
    got = dict_rows(con, "SELECT client_ms, transport_ms FROM slo_misses")[0]
    assert got == {"client_ms": pytest.approx(15.0), "transport_ms": pytest.approx(0.0)}


def test_a_short_prompt_prefilled_beside_a_long_one_waits_for_its_work(tmp_path):
    """One step (0 -> 40 ms) prefills A1's 1 prompt token beside B1's 3: A1's first token waited for B1's
    work, 3/4 of the step: 30 ms of interference. B1's share of A1's prefill (1/4: 10 ms) is the same
    for B1; A1's own token is never a cause."""
    eng = {"source": "engine"}
    events = [
        _e("engine.enqueued", 0, "A1", **eng), _e("engine.enqueued", 0, "B1", **eng),
        _e("engine.scheduled", 0, "A1", **eng), _e("engine.scheduled", 0, "B1", **eng),
        _e("step.start", 0, step_id=1, source="engine", attrs={"batch": [["A1", "prefill", 1], ["B1", "prefill", 3]]}),
        _e("step.end", 40, step_id=1, source="engine", value=4),
        _e("engine.token", 40, "A1", step_id=1, value=1, **eng), _e("engine.token", 40, "B1", step_id=1, value=1, **eng),
        _e("engine.finished", 40, "A1", value=1, attrs={"reason": "length"}, **eng),
        _e("engine.finished", 40, "B1", value=1, attrs={"reason": "length"}, **eng),
    ]
    con = build_run(tmp_path / "r", events)
    assert con.execute("SELECT attempt_id, prefill_interference_ms FROM attempt_causes ORDER BY 1").fetchall() == [
        ("A1", pytest.approx(30.0)), ("B1", pytest.approx(10.0))]


def test_a_send_the_clients_busy_loop_put_off_is_client_time_not_its_queue(tmp_path):
    """A1 is created at −10 ms and sent at 0: 10 ms in the client's own queue, in which the loop woke
    6 ms late (a lag sample stamped at −2 ms: its wake, late from −8). 6 ms of that wait is the client's
    overhead, 4 ms its queue. (A sample stamped at −5 would cover −11 to −5: 5 ms of the wait.)"""
    events = [dict(e, ms=-10) if e["name"] == "attempt.created" else e for e in _queued_then_interfered()]
    con = build_run(tmp_path / "r", events, samples=[(-2, "client_loop_lag_ms", 6.0, "ms", None)],
                    manifest={"client": {"loop_lag_trace_every": 1}})
    got = dict_rows(con, "SELECT client_queue_ms, client_ms, transport_ms FROM attempt_causes WHERE attempt_id = 'A1'")
    assert got == [{"client_queue_ms": pytest.approx(4.0), "client_ms": pytest.approx(6.0),
                    "transport_ms": pytest.approx(0.0)}]


def test_a_black_box_run_names_no_first_cause_where_the_engines_causes_are_unknown(tmp_path):
    """Only the client's events (a black box): the client queue is measured (0 ms) but the engine's queue,
    interference, preemption and stalls are not, and any of them could be the largest: no cause is named
    first, and the evidence says why and lists what is unknown."""
    events = [e for e in _queued_then_interfered() if e.get("source", "client") == "client"]
    con = build_run(tmp_path / "r", events)
    row = _row(con)
    assert (row["first_cause"], row["first_cause_share"]) == ("unknown", None)
    assert row["server_queue_share"] is None and row["prefill_interference_share"] is None
    assert row["evidence"].startswith("an engine cause is unknown, so none is named first")
    assert "unknown: server_queue, prefill_interference, preemption, decode_stall" in row["evidence"]


def test_no_late_attempt_diagnoses_every_attempt(tmp_path):
    events = [dict(e, attrs={"deadline_ms": 500}) if e["name"] == "task.start" else e for e in _queued_then_interfered()]
    con = build_run(tmp_path / "r", events)
    row = _row(con)
    assert (row["diagnosed"], row["n_attempts"], row["n_late"]) == ("all", 2, 0)
    # B1 has no client events: its client queue is unknown, so that share is NULL
    assert row["client_queue_share"] is None
    # B1 queued 50 − 45 = 5 ms: 45 ms of 55 queued, 10 interfered
    assert row["server_queue_share"] == pytest.approx(45 / 55)
    assert row["evidence"].endswith("over 2 attempts (none was late); unknown: client_queue, host_contention, client")
    assert con.execute("SELECT count(*) FROM run_diagnosis WHERE scope = 'point'").fetchone()[0] == 0
    assert con.execute("SELECT offered_rps FROM run_metrics").fetchone()[0] is None


def test_the_clients_own_lag_is_client_time_and_the_rest_transport(tmp_path):
    # the first chunk reaches the client 10 ms after the first token (and the last 10 ms after server.done);
    # the client's loop lagged 4 + 3 ms while it held the attempt: 7 ms client, 3 ms transport
    con = build_run(tmp_path / "r", _queued_then_interfered(chunk_ms=60, done_ms=80),
                    samples=[(55, "client_loop_lag_ms", 4.0, "ms", None), (75, "client_loop_lag_ms", 3.0, "ms", None)],
                    manifest={"client": {"loop_lag_trace_every": 1}})
    got = dict_rows(con, "SELECT client_ms, transport_ms, dominant_cause FROM slo_misses")[0]
    assert got == {"client_ms": pytest.approx(7.0), "transport_ms": pytest.approx(3.0), "dominant_cause": "server_queue"}
    row = _row(con)
    assert row["delay_ms"] == pytest.approx(60.0)
    assert (row["client_share"], row["transport_share"]) == (pytest.approx(7 / 60), pytest.approx(3 / 60))


def test_littles_law_compares_two_measurements(tmp_path):
    # A1 is in the system 0 -> 100 ms; A2 is sent at 50 ms and never ends (in flight at the window's end).
    # L = (100 + 50) ms / 100 ms = 1.5; λ = 2 sent / 0.1 s = 20/s; W = A1's 0.1 s (the only one that ended)
    events = [_e("attempt.created", 0, "A1", task="T1"), _e("attempt.sent", 0, "A1", task="T1"),
              _e("attempt.done", 100, "A1", task="T1", attrs={"finish_reason": "stop"}),
              _e("attempt.created", 50, "A2", task="T2"), _e("attempt.sent", 50, "A2", task="T2")]
    con = build_run(tmp_path / "r", events)
    m = dict_rows(con, "SELECT mean_in_system, attempted_rps, arrival_rps, mean_time_in_system_s, little_rel_err "
                       "FROM run_metrics")[0]
    assert m["mean_in_system"] == pytest.approx(1.5)
    assert m["attempted_rps"] == m["arrival_rps"] == pytest.approx(20.0)
    assert m["mean_time_in_system_s"] == pytest.approx(0.1)
    assert m["little_rel_err"] == pytest.approx(0.5 / 1.5)


def test_the_summary_opens_with_the_verdict(tmp_path):
    import json

    from typer.testing import CliRunner

    from inferledger.cli.app import app
    from inferledger.report.tables import against_range

    run = tmp_path / "r"
    build_run(run, _queued_then_interfered()).close()
    res = CliRunner().invoke(app, ["summary", str(run), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert list(out)[:3] == ["verdict_time", "verdict_prediction", "verdict_cause"]
    # one completed request with a client E2E (70 ms): it is the p50 and the p99 request; queue 40 (client
    # queue 0), prefill 50 − 40, decode 70 − 50 less B1's 10 ms of interference beside it, contention and the
    # client's delay unknown, no stall, transport 0
    assert out["verdict_time"] == [
        {"request": q, "attempt_id": "A1", "e2e_layer": "client", "e2e_ms": 70.0, "held_ms": 70.0, "queue_ms": 40.0,
         "prefill_ms": 10.0,
         "decode_ms": 10.0, "interference_ms": 10.0, "contention_ms": None, "stalls_ms": 0.0, "transport_ms": 0.0,
         "client_ms": None, "asleep_ms": None} for q in ("p50", "p99")]
    assert out["verdict_prediction"] == []  # nothing registered
    # the next cause: B1's 10 ms of prefill beside A1's decode, of the 50 ms whose cause is known (contention and
    # the client's delay unknown: their shares NULL, never a next cause)
    assert out["verdict_cause"] == {"diagnosed": "late", "n_attempts": 1, "n_late": 1, "first_cause": "server_queue",
                                    "first_cause_share": pytest.approx(0.8), "evidence": _row_evidence(run),
                                    "what": "first cause of SLO misses", "next_cause": "prefill_interference",
                                    "next_cause_share": pytest.approx(0.2)}
    res = CliRunner().invoke(app, ["summary", str(run)], env={"COLUMNS": "200"})
    first = res.output.splitlines()
    assert first[0].startswith("Verdict: where the time went")
    # (the line may wrap at the terminal's width: its start, then the evidence in the words that follow)
    at = [i for i, ln in enumerate(first)
          if ln.startswith("first cause of SLO misses: server_queue 80%, then prefill_interference 20%")]
    assert len(at) == 1
    assert " ".join(" ".join(first[at[0]:at[0] + 3]).split()).split(" — ", 1)[1].startswith("server_queue: 40.0 ms")
    # the prediction's verdict: inside the range is met; outside, by how much past the edge it passed
    assert against_range(12.0, 5.0, 10.0) == ("missed: above", pytest.approx(20.0))
    assert against_range(4.0, 5.0, 10.0) == ("missed: below", pytest.approx(-20.0))
    assert against_range(7.0, 5.0, 10.0) == ("met", 0.0)
    assert against_range(None, 5.0, 10.0) == ("unknown", None)


def _row_evidence(run) -> str:
    import duckdb

    with duckdb.connect(str(run / "ledger.duckdb"), read_only=True) as con:
        return con.execute("SELECT evidence FROM run_diagnosis WHERE scope = 'run'").fetchone()[0]


def _spec_round_events() -> list[dict]:
    eng, content = {"source": "engine"}, {"attrs": {"kinds": ["content"]}}
    return [
        _e("task.start", 0, task="T1", attrs={"deadline_ms": 20}),
        _e("attempt.created", 0, "A1", task="T1"), _e("attempt.sent", 0, "A1", task="T1"),
        _e("engine.enqueued", 0, "A1", **eng), _e("engine.scheduled", 0, "A1", **eng),
        _e("step.start", 0, step_id=1, source="engine", attrs={"batch": [["A1", "prefill", 10]]}),
        _e("step.end", 10, step_id=1, source="engine", value=10),
        _e("engine.token", 10, "A1", step_id=1, value=1, **eng),
        _e("attempt.chunk", 11, "A1", task="T1", **content),
        _e("step.start", 10, step_id=2, source="engine", attrs={"batch": [["A1", "decode", 5]]}),
        _e("step.end", 30, step_id=2, source="engine", value=5),
        _e("spec.round", 30, "A1", step_id=2, attrs={"drafted": 4, "accepted": 1, "forward_passes": 1}, **eng),
        _e("engine.token", 30, "A1", step_id=2, value=2, **eng),
        _e("engine.finished", 30, "A1", value=3, attrs={"reason": "stop"}, **eng),
        _e("attempt.chunk", 31, "A1", task="T1", **content),
        _e("attempt.done", 31, "A1", task="T1", attrs={"finish_reason": "stop"}),
    ]


def test_rejected_drafts_are_time_in_the_verify_step(tmp_path):
    """A1 (deadline 20 ms): prefill 0 -> 10, then one speculative round (4 drafted, 1 accepted) verified in
    step 2 (10 -> 30, 5 tokens: the drafts and one more). 3 of its 5 tokens were thrown away: 12 of 20 ms."""
    con = build_run(tmp_path / "r", _spec_round_events())
    got = dict_rows(con, "SELECT spec_rejected_ms, transport_ms, dominant_cause FROM slo_misses")[0]
    # transport: client TTFT 11 − server TTFT 10 = 1 ms (client E2E 31 − server E2E 30 = 1 ms)
    assert got == {"spec_rejected_ms": pytest.approx(12.0), "transport_ms": pytest.approx(1.0),
                   "dominant_cause": "spec_rejected"}
    row = _row(con)
    assert (row["first_cause"], row["spec_rejected_share"], row["transport_share"]) == \
        ("spec_rejected", pytest.approx(12 / 13), pytest.approx(1 / 13))


def test_rejected_drafts_are_on_cpu_time_beside_the_steps_cpu_wait(tmp_path):
    """The verify step of the case above (10 -> 30) waited 10 ms for a CPU and ran 10: the rejected drafts
    took 3/5 of the 10 ms on a CPU (6 ms); the 10 ms wait is host contention, so the two never exceed the
    step (counted on wall time, 12 + 10 would be 22 ms of a 20 ms step)."""
    waits = {1: (10_000_000, 0), 2: (10_000_000, 10_000_000)}
    events = [dict(e, attrs={"cpu_ns": waits[e["step_id"]][0], "wait_ns": waits[e["step_id"]][1]})
              if e["name"] == "step.end" else e for e in _spec_round_events()]
    con = build_run(tmp_path / "r", events)
    got = dict_rows(con, "SELECT spec_rejected_ms, host_contention_ms FROM attempt_causes")[0]
    assert got == {"spec_rejected_ms": pytest.approx(6.0), "host_contention_ms": pytest.approx(10.0)}


def test_a_declared_slo_threshold_makes_an_attempt_late_without_a_deadline(tmp_path):
    events = [e for e in _queued_then_interfered() if e["name"] != "task.start"]  # no task, no deadline
    con = build_run(tmp_path / "r", events, manifest={"slo": {"e2e_ms": 60}})
    # client E2E 70 ms > 60 ms: late by the SLO alone, and diagnosed as in the deadline case
    assert dict_rows(con, "SELECT attempt_id, missed, deadline_ms, dominant_cause FROM slo_misses") == \
        [{"attempt_id": "A1", "missed": "slo_e2e", "deadline_ms": None, "dominant_cause": "server_queue"}]
    row = _row(con)
    assert (row["diagnosed"], row["n_late"], row["server_queue_share"]) == ("late", 1, pytest.approx(0.8))


def test_host_contention_is_each_holding_steps_whole_cpu_wait_and_interference_the_on_cpu_rest(tmp_path):
    """The steps record their CPU wait (step.end cpu_ns / wait_ns): step 1 (A1 alone, 10 ms) waited 2 ms,
    step 2 (A1's decode beside B1's prefill, one token each, 20 ms) 5 ms. A1 waited out both waits whole:
    2 + 5 = 7 ms of host contention. Of step 2's 15 ms on a CPU, B1's prefill took its token share, half:
    7.5 ms of interference (the wait is not B1's). Beside its 40 ms of queue: 54.5 ms, as without waits."""
    waits = {1: (8_000_000, 2_000_000), 2: (15_000_000, 5_000_000)}
    events = [dict(e, attrs={"cpu_ns": waits[e["step_id"]][0], "wait_ns": waits[e["step_id"]][1]})
              if e["name"] == "step.end" else e for e in _queued_then_interfered()]
    con = build_run(tmp_path / "r", events)
    assert con.execute("SELECT step_id, contention_ms, cpu_ms FROM step_model ORDER BY step_id").fetchall() == [
        (1, 2.0, 8.0), (2, 5.0, 15.0)]
    a1 = dict_rows(con, "SELECT * FROM attempt_causes WHERE attempt_id = 'A1'")[0]
    assert a1["host_contention_ms"] == pytest.approx(7.0)
    assert a1["prefill_interference_ms"] == pytest.approx(7.5)
    # its own work, the phases less the causes inside them: prefill 10 ms less step 1's 2 ms wait; decode
    # 20 ms less step 2's 5 ms wait and B1's 7.5 ms; so queue + work + causes = its 70 ms at the engine
    assert (a1["prefill_work_ms"], a1["decode_work_ms"]) == (pytest.approx(8.0), pytest.approx(7.5))
    assert 40 + 8 + 7.5 + 7 + 7.5 == 70
    row = _row(con)
    assert row["delay_ms"] == pytest.approx(54.5)
    assert row["host_contention_share"] == pytest.approx(7 / 54.5)
    assert row["prefill_interference_share"] == pytest.approx(7.5 / 54.5)
    assert row["server_queue_share"] == pytest.approx(40 / 54.5)
    assert row["first_cause"] == "server_queue"



def test_the_steps_sleep_on_a_lock_is_shown_inside_the_work_never_a_cause(tmp_path):
    """Both steps ran on their thread alone (workers 0): step 1 (10 ms) on a CPU 6 ms, waiting 1 ms, asleep 3 ms;
    step 2 (20 ms) on a CPU 12 ms, waiting 2 ms, asleep 6 ms (the interpreter held by the front end or a full
    collection). A1 slept in both: 9 ms, shown beside its stretches, inside its own work: no prompt's prefill
    interferes by sleeping, so B1's share is of step 2's 12 ms on a CPU; the verdict's request shows it as asleep."""
    figures = {1: (6_000_000, 1_000_000), 2: (12_000_000, 2_000_000)}
    events = [dict(e, attrs={"cpu_ns": figures[e["step_id"]][0], "wait_ns": figures[e["step_id"]][1], "workers": 0})
              if e["name"] == "step.end" else e for e in _queued_then_interfered()]
    run = tmp_path / "r"
    con = build_run(run, events)
    assert con.execute("SELECT step_id, contention_ms, cpu_ms, blocked_ms FROM step_model ORDER BY step_id").fetchall() \
        == [(1, 1.0, 9.0, 3.0), (2, 2.0, 18.0, 6.0)]
    a1 = dict_rows(con, "SELECT * FROM attempt_causes WHERE attempt_id = 'A1'")[0]
    # every attempt of a step slept all of its sleep: 3 + 6; B1 was in step 2 only
    assert a1["blocked_ms"] == pytest.approx(9.0)
    assert dict_rows(con, "SELECT blocked_ms FROM attempt_causes WHERE attempt_id = 'B1'")[0]["blocked_ms"] \
        == pytest.approx(6.0)
    # contention 1 + 2; B1's token share (half) of step 2's 12 ms on a CPU, not of its 18 ms of cpu_ms (18 − 6 asleep)
    assert (a1["host_contention_ms"], a1["prefill_interference_ms"]) == (pytest.approx(3.0), pytest.approx(6.0))
    # its own work holds its sleep: prefill 10 less 1 ms of wait (3 asleep in it), decode 20 less 2 + 6 (6 asleep)
    assert (a1["prefill_work_ms"], a1["decode_work_ms"]) == (pytest.approx(9.0), pytest.approx(12.0))
    con.close()
    import json

    from typer.testing import CliRunner

    from inferledger.cli.app import app
    res = CliRunner().invoke(app, ["summary", str(run), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert [r["asleep_ms"] for r in json.loads(res.output)["verdict_time"]] == [pytest.approx(9.0)] * 2

def test_a_step_mostly_waiting_for_a_cpu_is_host_contention_not_interference(tmp_path):
    """The busy-host case: step 2 (A1's decode beside B1's prefill, 20 ms) waited 16 ms for a CPU and ran 4.
    A1's delay in it: the 16 ms wait (host contention) and B1's half of the 4 ms on a CPU (2 ms of
    interference). Counted on wall time, interference would have been 10 ms and contention 8."""
    waits = {1: (10_000_000, 0), 2: (4_000_000, 16_000_000)}
    events = [dict(e, attrs={"cpu_ns": waits[e["step_id"]][0], "wait_ns": waits[e["step_id"]][1]})
              if e["name"] == "step.end" else e for e in _queued_then_interfered()]
    con = build_run(tmp_path / "r", events)
    a1 = dict_rows(con, "SELECT host_contention_ms, prefill_interference_ms FROM attempt_causes "
                        "WHERE attempt_id = 'A1'")[0]
    assert a1 == {"host_contention_ms": pytest.approx(16.0), "prefill_interference_ms": pytest.approx(2.0)}


def test_an_attempt_whose_own_cause_is_unknown_leaves_the_runs_first_cause_unknown(tmp_path):
    """The engine's events alone (`serve --out` without the client's): each attempt's client queue is
    unknown, so slo_misses' rule makes its dominant cause unknown; the run's first cause is the same
    answer, not the largest of the causes known (the client queue could be the largest)."""
    events = [e for e in _queued_then_interfered() if e.get("source", "client") != "client"]
    con = build_run(tmp_path / "r", events)
    assert con.execute("SELECT attempt_id, client_queue_ms, dominant_cause FROM attempt_causes ORDER BY 1").fetchall() \
        == [("A1", None, "unknown"), ("B1", None, "unknown")]
    row = _row(con)
    assert (row["diagnosed"], row["n_attempts"], row["first_cause"], row["first_cause_share"]) == \
        ("all", 2, "unknown", None)
    # A1 queued 40 ms and B1 5 ms, A1 interfered 10 ms: the known causes are still shared out
    assert row["server_queue_share"] == pytest.approx(45 / 55) and row["client_queue_share"] is None
    assert row["evidence"] == ("a diagnosed attempt's own cause is unknown (its client queue, transport or rejected "
                               "drafts), so none is named first; the largest known, server_queue: 45.0 ms of the "
                               "55.0 ms known over 2 attempts (none was late); unknown: client_queue, host_contention")


def test_an_attempt_the_client_let_go_of_is_delayed_only_while_the_client_held_it(tmp_path):
    """A1's client times out at 60 ms, halfway through step 2 (50 -> 70 ms), and the engine goes on with it
    to 70 ms (an abandoned stream). The delay is the client's: 40 ms queued, step 1's 2 ms wait, and of step
    2 the half the client held it through (its 5 ms wait and B1's 7.5 ms on a CPU, halved); its decode work
    is the 10 ms of decode to 60 ms less those. Queue, work and causes add up to the client's 60 ms, not
    the engine's 70: the 10 ms after the client left delay nobody."""
    waits = {1: (8_000_000, 2_000_000), 2: (15_000_000, 5_000_000)}
    events = [dict(e, attrs={"cpu_ns": waits[e["step_id"]][0], "wait_ns": waits[e["step_id"]][1]})
              if e["name"] == "step.end" else e for e in _queued_then_interfered(done_ms=70)
              if not (e["name"] in ("attempt.chunk", "attempt.done") and e["ms"] == 70)]
    events.append(_e("attempt.timeout", 60, "A1", task="T1"))
    con = build_run(tmp_path / "r", events)
    a1 = dict_rows(con, "SELECT c.*, r.client_span_ms FROM attempt_causes c JOIN request_metrics r "
                        "USING (attempt_id) WHERE attempt_id = 'A1'")[0]
    assert (a1["client_status"], a1["missed"], a1["client_span_ms"]) == ("timeout", "timeout", 60.0)
    assert a1["server_queue_ms"] == pytest.approx(40.0)
    assert a1["host_contention_ms"] == pytest.approx(2.0 + 5.0 / 2)
    assert a1["prefill_interference_ms"] == pytest.approx(7.5 / 2)
    assert (a1["prefill_work_ms"], a1["decode_work_ms"]) == (pytest.approx(8.0), pytest.approx(10 - 2.5 - 3.75))
    assert 40 + 8 + 3.75 + 4.5 + 3.75 == 60.0
    row = _row(con)
    assert row["delay_ms"] == pytest.approx(40 + 4.5 + 3.75)
    assert row["host_contention_share"] == pytest.approx(4.5 / 48.25)


def test_an_attempt_cut_before_its_first_token_has_unknown_work_not_zero(tmp_path):
    """C1 is scheduled at 10 and prefills in step 1 (10 -> 60), but the engine finishes it (an abort) at 60
    before any token: its prefill phase (to a first token) does not exist, so its own prefill and decode
    work are unknown, never 0 ms."""
    eng = {"source": "engine"}
    con = build_run(tmp_path / "r", [
        _e("engine.enqueued", 0, "C1", **eng), _e("engine.scheduled", 10, "C1", **eng),
        _e("step.start", 10, step_id=1, source="engine", attrs={"batch": [["C1", "prefill", 8]]}),
        _e("step.end", 60, step_id=1, source="engine", value=8),
        _e("engine.finished", 60, "C1", value=0, attrs={"reason": "abort"}, **eng),
    ])
    (row,) = dict_rows(con, "SELECT prefill_ms, prefill_work_ms, decode_ms, decode_work_ms FROM attempt_causes")
    assert row == {"prefill_ms": None, "prefill_work_ms": None, "decode_ms": None, "decode_work_ms": None}
