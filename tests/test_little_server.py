"""Little's law at the server (run_metrics): the server's own in-system gauge, time-weighted over the
window, against the attempts it admitted per second × their mean time in it, two measurements that
share no span; and client L − server L, the attempts in the client and the transport."""
from __future__ import annotations

import pytest

from ledger_util import build_run, dict_rows, event as _e

COLUMNS = ("mean_in_system", "server_in_system", "server_in_system_source", "server_attempted_rps",
           "mean_time_in_server_s", "server_little_rel_err", "client_transport_in_system", "little_rel_err")


def _step(sid, start, end, batch, running, waiting):
    return [_e("step.start", start, step_id=sid, source="engine",
               attrs={"batch": [[a, k, 1, 0] for a, k in batch], "num_running": running, "num_waiting": waiting}),
            _e("step.end", end, step_id=sid, source="engine", value=len(batch))]


def _served(waiting_at_step_4=1):
    """A1: sent 0, enqueued 10, steps 1-3 (10-20, 20-30, 32-40: the gap 30-32 while it goes on), finished 40,
    done 45; the engine then idle 40-60. A2: sent 50, enqueued 55; A3: sent 56, enqueued 58. Step 4 (60-70)
    runs A2 with A3 waiting (num_running 1, num_waiting `waiting_at_step_4`), steps 5-6 (70-80, 80-90) both;
    A2 finishes at 90 (done 92), step 7 (90-95) A3, finished 95, done 100: the window is 0-100 ms."""
    eng, stop = {"source": "engine"}, {"attrs": {"finish_reason": "stop"}}
    ev = [_e("attempt.sent", 0, "A1"), _e("engine.enqueued", 10, "A1", **eng),
          _e("engine.finished", 40, "A1", **eng), _e("attempt.done", 45, "A1", **stop),
          _e("attempt.sent", 50, "A2"), _e("engine.enqueued", 55, "A2", **eng),
          _e("attempt.sent", 56, "A3"), _e("engine.enqueued", 58, "A3", **eng),
          _e("engine.finished", 90, "A2", **eng), _e("attempt.done", 92, "A2", **stop),
          _e("engine.finished", 95, "A3", **eng), _e("attempt.done", 100, "A3", **stop)]
    ev += _step(1, 10, 20, [("A1", "prefill")], 1, 0) + _step(2, 20, 30, [("A1", "decode")], 1, 0)
    ev += _step(3, 32, 40, [("A1", "decode")], 1, 0) + _step(4, 60, 70, [("A2", "prefill")], 1, waiting_at_step_4)
    ev += _step(5, 70, 80, [("A2", "decode"), ("A3", "prefill")], 2, 0)
    ev += _step(6, 80, 90, [("A2", "decode"), ("A3", "decode")], 2, 0) + _step(7, 90, 95, [("A3", "decode")], 1, 0)
    return ev


def _metrics(con) -> dict:
    return dict_rows(con, f"SELECT {', '.join(COLUMNS)} FROM run_metrics")[0]


def test_the_engines_gauge_against_its_admissions_and_spans(tmp_path):
    # gauge: 1 over 10-40 (the 2 ms gap held: A1 goes on), 0 while idle 40-60 (step 3 held every sequence and
    # none goes on), 2 over 60-90, 1 over 90-95, 0 after step 7 emptied the engine: 30 + 60 + 5 = 95 ms·req / 100 ms
    # λ_s = 3 admitted / 0.1 s; W_s = (30 + 35 + 37) / 3 ms: λW = 1.02. The 0.07 between them is A2's 55-60 and
    # A3's 58-60 in the engine's inbox, which the gauge, read at step starts, counts from the next step only.
    # Client: spans 45 + 42 + 44 = 131 ms over 100 ms: L = 1.31, so 0.36 attempts were in the client or transport
    m = _metrics(build_run(tmp_path / "r", _served()))
    assert m["server_in_system"] == pytest.approx(0.95) and m["server_in_system_source"] == "engine_steps"
    assert m["server_attempted_rps"] == pytest.approx(30.0)
    assert m["mean_time_in_server_s"] == pytest.approx(0.034)
    assert m["server_little_rel_err"] == pytest.approx(0.07 / 0.95)
    assert m["mean_in_system"] == pytest.approx(1.31) and m["little_rel_err"] == pytest.approx(0.0, abs=1e-12)
    assert m["client_transport_in_system"] == pytest.approx(1.31 - 0.95)


def test_an_engine_that_leaves_its_queue_out_of_the_gauge_shows_in_the_error(tmp_path):
    # the same run, but step 4 reports A3 nowhere (num_waiting 0): 10 ms·req fewer, L_s = 0.85 against λW = 1.02
    con = build_run(tmp_path / "r", _served(waiting_at_step_4=0))
    m = _metrics(con)
    assert m["server_in_system"] == pytest.approx(0.85)
    assert m["server_little_rel_err"] == pytest.approx(0.17 / 0.85)
    assert m["mean_time_in_server_s"] == pytest.approx(0.034)  # the spans do not change
    assert con.execute("SELECT count(*) FROM gaps WHERE affects LIKE 'server_in_system%'").fetchone()[0] == 0


def test_vllms_scraped_gauges_are_its_server_l_and_none_is_null_with_a_gap(tmp_path):
    # client only, vLLM's /metrics scraped at 0, 20, 50 and 80 ms (running + waiting 0, 2, 2, 0; held until the
    # next scrape): (2 × 30 + 2 × 30) ms·req / 100 ms = 1.2. No engine.enqueued: the server's λ and W are unknown
    events = [_e("attempt.sent", 0, "A1"), _e("attempt.done", 100, "A1", attrs={"finish_reason": "stop"})]
    scraped = [(ms, metric, value, "count", None, "vllm-metrics")
               for ms, running, waiting in ((0, 0, 0), (20, 1, 1), (50, 2, 0), (80, 0, 0))
               for metric, value in (("vllm:num_requests_running", running), ("vllm:num_requests_waiting", waiting))]
    con = build_run(tmp_path / "v", events, samples=scraped)
    m = _metrics(con)
    assert m["server_in_system"] == pytest.approx(1.2) and m["server_in_system_source"] == "vllm_metrics"
    assert m["client_transport_in_system"] == pytest.approx(1.0 - 1.2)
    assert m["server_attempted_rps"] is None and m["server_little_rel_err"] is None
    assert con.execute("SELECT count(*) FROM gaps WHERE affects LIKE 'server_attempted_rps%'").fetchone()[0] == 1
    # scrapes that begin after the window's start do not say what the server held before them: unknown
    con = build_run(tmp_path / "late", events, samples=scraped[2:])
    assert _metrics(con)["server_in_system"] is None
    assert con.execute("SELECT count(*) FROM gaps WHERE affects LIKE 'server_in_system%' "
                       "AND detail LIKE '%first scraped after%'").fetchone()[0] == 1
    con = build_run(tmp_path / "none", events)
    m = _metrics(con)
    assert m["server_in_system"] is None and m["server_in_system_source"] is None
    assert m["client_transport_in_system"] is None
    assert con.execute("SELECT count(*) FROM gaps WHERE affects LIKE 'server_in_system%' "
                       "AND detail LIKE '%neither engine steps nor%'").fetchone()[0] == 1


def test_a_deployments_gauges_add_up_and_a_replica_without_one_leaves_it_unknown(tmp_path):
    # replica v (vLLM: running + waiting 1 from 0 ms, 3 from 40 ms) and replica l (llama.cpp: processing +
    # deferred 2 throughout): (1 × 40 + 3 × 60 + 2 × 100) ms·req / 100 ms = 4.2
    events = [_e("attempt.sent", 0, "A1"), _e("attempt.done", 100, "A1", attrs={"finish_reason": "stop"})]
    scraped = [(0, "vllm:num_requests_running", 1, "count", "v", "vllm-metrics"),
               (0, "vllm:num_requests_waiting", 0, "count", "v", "vllm-metrics"),
               (40, "vllm:num_requests_running", 2, "count", "v", "vllm-metrics"),
               (40, "vllm:num_requests_waiting", 1, "count", "v", "vllm-metrics"),
               (0, "llamacpp:requests_processing", 1, "count", "l", "llamacpp-metrics"),
               (0, "llamacpp:requests_deferred", 1, "count", "l", "llamacpp-metrics")]
    replicas = [{"replica_id": "v", "kind": "vllm"}, {"replica_id": "l", "kind": "llamacpp"}]
    con = build_run(tmp_path / "d", events, samples=scraped, manifest={"deployment": {"replicas": replicas}})
    m = _metrics(con)
    assert m["server_in_system"] == pytest.approx(4.2)
    assert m["server_in_system_source"] == "llamacpp_metrics+vllm_metrics"
    # a third replica, black-box, reports no gauge: the deployment's sum is unknown, not the other two's
    replicas.append({"replica_id": "b", "kind": "blackbox"})
    con = build_run(tmp_path / "b", events, samples=scraped, manifest={"deployment": {"replicas": replicas}})
    assert _metrics(con)["server_in_system"] is None
    assert con.execute("SELECT count(*) FROM gaps WHERE affects LIKE 'server_in_system%' "
                       "AND detail LIKE '%declared replica with neither%'").fetchone()[0] == 1
