"""slo_misses: the causes of a missed deadline, each 0 only where its layer could see the attempt."""
from __future__ import annotations

import pytest

from ledger_util import build_run, event as _e


def _events():
    eng, srv = {"source": "engine"}, {"source": "server"}
    content = {"attrs": {"kinds": ["content"]}}
    return [
        # A1 (T1, deadline 500 ms): queued 300 ms in the engine, decodes beside B1's prefill, done at 605
        _e("task.start", 0, task="T1", attrs={"deadline_ms": 500}),
        _e("attempt.created", 0, "A1", task="T1"), _e("attempt.sent", 0, "A1", task="T1"),
        _e("server.received", 1, "A1", **srv), _e("engine.enqueued", 2, "A1", **eng),
        _e("engine.scheduled", 302, "A1", **eng),
        _e("step.start", 302, step_id=1, source="engine", attrs={"batch": [["A1", "prefill", 10]]}),
        _e("step.end", 400, step_id=1, source="engine", value=10),
        _e("engine.enqueued", 390, "B1", **eng), _e("engine.scheduled", 400, "B1", **eng),
        _e("step.start", 400, step_id=2, source="engine", attrs={"batch": [["A1", "decode", 1], ["B1", "prefill", 3]]}),
        _e("engine.token", 400, "A1", value=1, **eng), _e("server.write", 400.5, "A1", value=1, **srv, **content),
        _e("attempt.chunk", 401, "A1", task="T1", **content),
        _e("step.end", 500, step_id=2, source="engine", value=4),
        _e("step.start", 500, step_id=3, source="engine", attrs={"batch": [["A1", "decode", 1]]}),
        _e("engine.token", 500, "A1", value=1, **eng), _e("server.write", 500.5, "A1", value=1, **srv, **content),
        _e("attempt.chunk", 501, "A1", task="T1", **content),
        _e("engine.token", 500, "B1", value=1, **eng),
        _e("engine.finished", 500, "B1", value=1, attrs={"reason": "stop"}, **eng),
        _e("step.end", 600, step_id=3, source="engine", value=1),
        _e("engine.token", 600, "A1", value=1, **eng), _e("server.write", 600.5, "A1", value=1, **srv, **content),
        _e("attempt.chunk", 601, "A1", task="T1", **content),
        _e("engine.finished", 600, "A1", value=3, attrs={"reason": "stop"}, **eng),
        _e("server.done", 601, "A1", **srv),
        _e("attempt.done", 605, "A1", task="T1", attrs={"finish_reason": "stop"}),
        # A2 (T2, deadline 100 ms): seen by the client only, late
        _e("task.start", 1000, task="T2", attrs={"deadline_ms": 100}),
        _e("attempt.created", 1000, "A2", task="T2"), _e("attempt.sent", 1000, "A2", task="T2"),
        _e("attempt.chunk", 1150, "A2", task="T2", **content),
        _e("attempt.done", 1200, "A2", task="T2", attrs={"finish_reason": "stop"}),
        # A3 (T3, deadline 1000 ms): the client times out, no server evidence
        _e("task.start", 2000, task="T3", attrs={"deadline_ms": 1000}),
        _e("attempt.created", 2000, "A3", task="T3"), _e("attempt.sent", 2000, "A3", task="T3"),
        _e("attempt.timeout", 2300, "A3", task="T3"),
    ]


def test_causes_are_measured_where_the_layers_exist_and_unknown_elsewhere(tmp_path):
    con = build_run(tmp_path / "r", _events())
    cols = ("client_queue_ms", "server_queue_ms", "prefill_interference_ms", "decode_stall_ms",
            "preemption_ms", "transport_ms", "dominant_cause")
    got = {r[0]: dict(zip(cols, r[1:])) for r in
           con.execute(f"SELECT attempt_id, {', '.join(cols)} FROM slo_misses ORDER BY attempt_id").fetchall()}
    assert set(got) == {"A1", "A2", "A3"}
    # A1: the server held it from its receipt at 1: front end 2 - 1, queue 302 - 2; B1's prefill share of
    # step 2 (3 of 4 tokens x 100 ms); engine gaps 100, 100 (no stall); no preemption; transport: client TTFT
    # 401 - server TTFT (400 - 2) = 3 (under client E2E 605 - server E2E (601 - 2) = 6) less the front end's 1
    assert got["A1"] == {"client_queue_ms": 0, "server_queue_ms": pytest.approx(301.0),
                         "prefill_interference_ms": pytest.approx(75.0), "decode_stall_ms": 0, "preemption_ms": 0,
                         "transport_ms": pytest.approx(2.0), "dominant_cause": "server_queue"}
    # A2: only the client saw it: every server-side cause is unknown, not 0, and so is the dominant one
    assert got["A2"] == {"client_queue_ms": 0, "server_queue_ms": None, "prefill_interference_ms": None,
                         "decode_stall_ms": None, "preemption_ms": None, "transport_ms": None,
                         "dominant_cause": "unknown"}
    # A3: a client timeout has no client E2E, so no transfer figure (NULL, not 0); the server side is unknown
    assert got["A3"]["transport_ms"] is None and got["A3"]["server_queue_ms"] is None
    assert got["A3"]["dominant_cause"] == "unknown"


def _preempted_and_interfered():
    """A1 (T1, deadline 200 ms) decodes, is preempted at 42 ms, recomputes 142 -> 152, and its step 7
    (162 -> 222) is shared 1:1 with B1's prefill. Engine gaps 10, 10, 10, 110, 10, 60, 10 ms."""
    eng, srv = {"source": "engine"}, {"source": "server"}
    ev = [_e("task.start", 0, task="T1", attrs={"deadline_ms": 200}),
          _e("attempt.created", 0, "A1", task="T1"), _e("attempt.sent", 0, "A1", task="T1"),
          _e("server.received", 1, "A1", **srv), _e("engine.enqueued", 2, "A1", **eng),
          _e("engine.scheduled", 2, "A1", **eng),
          _e("engine.preempted", 42, "A1", value=13, **eng), _e("engine.scheduled", 142, "A1", **eng),
          _e("engine.enqueued", 150, "B1", **eng), _e("engine.scheduled", 162, "B1", **eng)]
    steps = [(1, 2, 12, [["A1", "prefill", 10]]), (2, 12, 22, [["A1", "decode", 1]]), (3, 22, 32, [["A1", "decode", 1]]),
             (4, 32, 42, [["A1", "decode", 1]]), (5, 142, 152, [["A1", "prefill", 13]]),
             (6, 152, 162, [["A1", "decode", 1]]), (7, 162, 222, [["A1", "decode", 1], ["B1", "prefill", 1]]),
             (8, 222, 232, [["A1", "decode", 1]])]
    for sid, t0, t1, batch in steps:
        ev += [_e("step.start", t0, step_id=sid, source="engine", attrs={"batch": batch}),
               _e("step.end", t1, step_id=sid, source="engine", value=sum(b[2] for b in batch)),
               _e("engine.token", t1, "A1", step_id=sid, value=1, **eng)]
    ev += [_e("engine.finished", 232, "A1", value=8, attrs={"reason": "stop"}, **eng), _e("server.done", 233, "A1", **srv),
           _e("attempt.chunk", 234, "A1", task="T1", attrs={"kinds": ["content"]}),
           _e("attempt.done", 235, "A1", task="T1", attrs={"finish_reason": "stop"})]
    return ev


def test_causes_are_disjoint_a_preemption_gap_is_not_also_a_stall(tmp_path):
    con = build_run(tmp_path / "r", _preempted_and_interfered())
    cols = ("client_queue_ms", "server_queue_ms", "prefill_interference_ms", "decode_stall_ms", "preemption_ms",
            "transport_ms", "dominant_cause")
    row = dict(zip(cols, con.execute(f"SELECT {', '.join(cols)} FROM slo_misses WHERE attempt_id = 'A1'").fetchone()))
    # preemption: preempted 42 -> 142 and recompute 142 -> 152 = 110. Interference: B1's half of step 7 = 30.
    # Stalls (median gap 10, threshold 20): the 110 ms gap is all preemption -> 0; the 60 ms gap holds
    # 30 ms of interference -> 60 − 30 − 20 = 10. Transport: client TTFT 234 − server TTFT 10 = 224, but the
    # client's time outside the server's span is client E2E 235 − server E2E (233 − 2) = 4, less the front end
    # (received 1 -> enqueued 2), which is the server's: server_queue 1 (no wait in the engine's queue).
    assert row == {"client_queue_ms": 0, "server_queue_ms": pytest.approx(1.0), "prefill_interference_ms": pytest.approx(30.0),
                   "decode_stall_ms": pytest.approx(10.0), "preemption_ms": pytest.approx(110.0),
                   "transport_ms": pytest.approx(3.0), "dominant_cause": "preemption"}


def test_the_causes_of_a_miss_never_add_up_to_more_than_its_span(tmp_path):
    con = build_run(tmp_path / "r", _preempted_and_interfered())
    rows = con.execute("SELECT s.attempt_id, client_queue_ms + server_queue_ms + prefill_interference_ms "
                       "+ decode_stall_ms + preemption_ms + transport_ms, r.client_span_ms "
                       "FROM slo_misses s JOIN request_metrics r USING (attempt_id)").fetchall()
    known = [(aid, total, span) for aid, total, span in rows if total is not None]
    assert known and all(total <= span for _, total, span in known), known


def _queued_run_preempted(requeued: bool):
    """A1 queues 2 -> 12 (Q = 10), prefills (step 1), decodes (step 2), is preempted at 40, waits until
    140 (W = 100; `requeued`: the trace puts it back in the waiting queue at 41, as an engine that
    re-enqueues a preempted request does), recomputes in step 3 (140 -> 160, 12 ms of CPU wait) and
    decodes in step 4 (160 -> 170, 2 ms of CPU wait). Every step says its CPU wait (step.end wait_ns)."""
    eng, srv = {"source": "engine"}, {"source": "server"}
    ev = [_e("task.start", 0, task="T1", attrs={"deadline_ms": 100}),
          _e("attempt.created", 0, "A1", task="T1"), _e("attempt.sent", 0, "A1", task="T1"),
          _e("server.received", 1, "A1", **srv), _e("engine.enqueued", 2, "A1", value=10, **eng),
          _e("engine.scheduled", 12, "A1", **eng),
          _e("engine.preempted", 40, "A1", value=12, **eng), _e("engine.scheduled", 140, "A1", **eng)]
    if requeued:
        ev.append(_e("engine.enqueued", 41, "A1", value=10, **eng))
    steps = [(1, 12, 22, "prefill", 10, 0), (2, 22, 32, "decode", 10, 0), (3, 140, 160, "prefill", 8, 12),
             (4, 160, 170, "decode", 8, 2)]
    for sid, t0, t1, kind, cpu, wait in steps:
        ev += [_e("step.start", t0, step_id=sid, source="engine", attrs={"batch": [["A1", kind, 1]]}),
               _e("step.end", t1, step_id=sid, source="engine", value=1,
                  attrs={"cpu_ns": cpu * 1_000_000, "wait_ns": wait * 1_000_000}),
               _e("engine.token", t1, "A1", step_id=sid, value=1, **eng)]
    ev += [_e("engine.finished", 170, "A1", value=3, attrs={"reason": "stop"}, **eng), _e("server.done", 171, "A1", **srv),
           _e("attempt.chunk", 172, "A1", task="T1", attrs={"kinds": ["content"]}),
           _e("attempt.done", 173, "A1", task="T1", attrs={"finish_reason": "stop"})]
    return ev


@pytest.mark.parametrize("requeued", [False, True], ids=["resumed", "requeued"])
def test_the_wait_after_a_preemption_and_the_recompute_are_the_preemption_s_whole(tmp_path, requeued):
    con = build_run(tmp_path / "r", _queued_run_preempted(requeued))
    cols = ("server_queue_ms", "preemption_ms", "host_contention_ms", "decode_stall_ms", "transport_ms",
            "prefill_work_ms", "decode_work_ms", "dominant_cause")
    row = dict(zip(cols, con.execute(f"SELECT {', '.join(cols)} FROM attempt_causes WHERE attempt_id = 'A1'").fetchone()))
    # server queue: enqueued 2 -> first scheduled 12 = Q = 10, the wait before the first admission only.
    # preemption: preempted 40 -> scheduled again 140 (W = 100, re-enqueued or not) + recompute 140 -> 160 = 120.
    # host contention: the CPU wait of steps 1, 2 and 4 = 0 + 0 + 2; step 3's 12 ms lie in the recompute,
    # which the preemption holds whole. Stall: the gap 32 -> 160 (128) less its overlap with the preemption
    # (40 -> 160 = 120) is under twice the median gap (10). Transport: client E2E 173 − server E2E (171 − 2)
    # less the front end (received 1 -> enqueued 2), which server_queue holds with the queue 2 -> 12.
    # Own work: prefill 12 -> 22 (10, no wait); decode 22 -> 170 (148) less preemption 120 and wait 2 = 26.
    assert row == {"server_queue_ms": pytest.approx(11.0), "preemption_ms": pytest.approx(120.0),
                   "host_contention_ms": pytest.approx(2.0), "decode_stall_ms": 0, "transport_ms": pytest.approx(3.0),
                   "prefill_work_ms": pytest.approx(10.0), "decode_work_ms": pytest.approx(26.0),
                   "dominant_cause": "preemption"}
    # every millisecond once: the causes, the own work and the server's finalize (170 -> 171) are the
    # client's span (created 0 -> done 173)
    total, span = con.execute(
        "SELECT server_queue_ms + preemption_ms + host_contention_ms + decode_stall_ms + transport_ms + prefill_work_ms "
        "+ decode_work_ms + 1, r.client_span_ms FROM attempt_causes JOIN request_metrics r USING (attempt_id)").fetchone()
    assert total == pytest.approx(173.0) and span == pytest.approx(173.0)
    run = con.execute("SELECT first_cause, server_queue_share, preemption_share, host_contention_share, "
                      "transport_share FROM run_diagnosis WHERE scope = 'run'").fetchone()
    assert run == ("preemption", pytest.approx(11 / 136), pytest.approx(120 / 136), pytest.approx(2 / 136),
                   pytest.approx(3 / 136))


def test_a_preemption_before_the_first_token_is_taken_from_the_prefill_not_the_decode(tmp_path):
    # A1 is scheduled at 12, prefills a first chunk (step 1, 12 -> 22), is preempted at 30 before any
    # token, is scheduled again at 100, recomputes (step 2, 100 -> 120: its first token) and decodes once
    eng = {"source": "engine"}
    ev = [_e("engine.enqueued", 2, "A1", value=10, **eng), _e("engine.scheduled", 12, "A1", **eng),
          _e("engine.preempted", 30, "A1", value=8, **eng), _e("engine.scheduled", 100, "A1", **eng)]
    for sid, t0, t1, kind in [(1, 12, 22, "prefill"), (2, 100, 120, "prefill"), (3, 120, 130, "decode")]:
        ev += [_e("step.start", t0, step_id=sid, source="engine", attrs={"batch": [["A1", kind, 1]]}),
               _e("step.end", t1, step_id=sid, source="engine", value=1, attrs={"cpu_ns": 5_000_000, "wait_ns": 0})]
        if sid > 1:
            ev.append(_e("engine.token", t1, "A1", step_id=sid, value=1, **eng))
    ev.append(_e("engine.finished", 130, "A1", value=2, attrs={"reason": "stop"}, **eng))
    con = build_run(tmp_path / "r", ev)
    row = con.execute("SELECT server_queue_ms, preemption_ms, prefill_ms, prefill_work_ms, decode_ms, decode_work_ms "
                      "FROM attempt_causes WHERE attempt_id = 'A1'").fetchone()
    # queue 2 -> 12; preemption 30 -> 100 -> 120 = 90, all inside prefill_ms (12 -> 120 = 108): its own
    # prefill work is 108 − 90 = 18 (step 1 and the 8 ms before the preemption); decode 120 -> 130, all work
    assert row == pytest.approx((10.0, 90.0, 108.0, 18.0, 10.0, 10.0))
