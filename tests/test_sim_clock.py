"""The simulated clock drives the real engine: arrivals and cancellations at their simulated times, each
step as long as the step model says, host time never in it; the run directory is a normal one whose
rows say simulated and whose client figures are absent with a gap."""
from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pytest

from inferledger.collectors.sim.clock import SimClock
from inferledger.collectors.sim.declared import QWEN3_8B
from inferledger.collectors.sim.run import Follows, HostReplay, SimRequest, distinct_prompt, simulate
from inferledger.collectors.sim.step_time import BookStepModel, causal_pairs
from inferledger.engine.params import EngineConfig
from inferledger.ledger.query import open_ledger
from inferledger.ledger.reconstruct import reconstruct

TEN_MS = BookStepModel(fixed_ms=10.0, per_token_us=0.0, per_pair_ns=0.0, source="a test's constant")
CFG = EngineConfig(block_size=16, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64)


def _requests(cancel_at_ms=None):
    return [SimRequest("a", 0.0, distinct_prompt(0, 20, QWEN3_8B.shape.vocab), 4),
            SimRequest("b", 15.0, distinct_prompt(1, 10, QWEN3_8B.shape.vocab), 6, cancel_at_ms=cancel_at_ms)]


def _events(run: Path) -> list[tuple]:
    return duckdb.sql(f"SELECT name, ts_ns, clock, request_id, step_id, value, attrs FROM "
                      f"read_parquet('{run}/events/*.parquet') ORDER BY ts_ns, seq").fetchall()


class SlowTenMs:
    """The same constant model, but each prediction takes 30 ms of host time."""
    name = "slow"

    def step_ns(self, rows):
        time.sleep(0.03)
        return TEN_MS.step_ns(rows)

    def describe(self):
        return {"name": self.name, "formula": "10 ms, after 30 ms of host sleep", "parameters": {}}


def test_actions_inside_a_step_run_at_their_own_time_and_idle_jumps_to_the_next():
    clock, seen = SimClock(), []
    clock.at(5, lambda: seen.append(("x", clock.now_ns())))
    clock.at(30, lambda: seen.append(("y", clock.now_ns())))
    clock.at(5, lambda: seen.append(("z", clock.now_ns())))
    clock.advance(10)
    assert seen == [("x", 5), ("z", 5)] and clock.now_ns() == 10
    clock.run_next()
    assert seen[-1] == ("y", 30) and clock.now_ns() == 30 and not clock.has_due()
    with pytest.raises(ValueError, match="more than 0 ns"):
        clock.advance(0)
    with pytest.raises(ValueError, match="already at 30 ns"):
        clock.at(29, lambda: None)


def test_the_books_step_model_counts_causal_pairs_per_chunk():
    assert causal_pairs(4, 0) == 10 and causal_pairs(4, 8) == 42  # the book's figs 8-8 and 8-9
    assert causal_pairs(512, 7680) == 4_063_488 and causal_pairs(512, 0) == 131_328
    from inferledger.collectors.sim.step_time import SimStepRow
    # one 2K prompt alone: 26.22 + 2048 × 0.0304 + 2048·2049/2 × 3e-6 ms = 94.773728 ms (the book's ~94.8)
    assert BookStepModel().step_ns([SimStepRow(0, 2048)]) == 94_773_728
    # its decode at 2048 + 1 positions: 26.22 + 0.0304 + 2049 × 3e-6 = 26.256547 ms (the book's 26.26)
    assert BookStepModel().step_ns([SimStepRow(2048, 1)]) == 26_256_547


def test_steps_last_what_the_model_says_and_arrivals_land_at_their_time(tmp_path):
    res = simulate(tmp_path / "r", _requests(), engine_config=CFG, step_model=TEN_MS, run_id="r")
    reconstruct(res.run_dir)
    with open_ledger(res.run_dir) as led:
        rows = led.rows("SELECT attempt_id, ttft_server_ms, e2e_server_ms, queue_ms, itl_engine_max_ms, "
                        "server_evidence FROM request_metrics ORDER BY 1")[1]
        # a: prefill in [0, 10), then 3 decodes: tokens at 10, 20, 30, 40. b arrives at 15 (inside step 2),
        # is admitted at the boundary of 20 and prefills in [20, 30): tokens at 30 ... 80
        assert rows == [("a", 10.0, 40.0, 0.0, 10.0, "simulated"), ("b", 15.0, 65.0, 5.0, 10.0, "simulated")]
        assert led.rows("SELECT t_obs_s FROM run_metrics")[1] == [(0.08,)]
        assert led.rows("SELECT DISTINCT label FROM intervals")[1] == [("simulated",)]
        assert led.rows("SELECT ttft_client_ms, e2e_client_ms, tpot_ms, good, client_status FROM request_metrics "
                        "JOIN attempts USING (attempt_id) ORDER BY attempt_id")[1] == [(None, None, None, None, None)] * 2
        gap = led.rows("SELECT affects, needs FROM gaps WHERE gap_id = 'collector:simulated'")[1]
        assert gap and "ttft_client_ms" in gap[0][0]
        assert led.rows("SELECT clock, kind FROM clocks WHERE clock IS NOT NULL")[1] == [("sim:r", "simulated")]
    events = _events(res.run_dir)
    assert {e[2] for e in events} == {"sim:r"}
    assert all(json.loads(e[6])["evidence"] == "simulated" for e in events)
    assert [e[1] for e in events if e[0] == "engine.enqueued"] == [0, 15_000_000]
    manifest = json.loads((res.run_dir / "manifest.json").read_text())
    assert manifest["simulation"]["step_model"]["parameters"]["fixed_ms"]["value"] == 10.0
    assert manifest["engine_config"]["long_prefill_token_threshold"] is None
    assert manifest["model"]["kv_bytes_per_token"] == 2 * 36 * 8 * 128 * 2
    assert manifest["evidence"]["events"] == "simulated"


def test_a_planned_cancellation_is_received_mid_step_and_released_at_the_next_boundary(tmp_path):
    res = simulate(tmp_path / "r", _requests(cancel_at_ms=45.0), engine_config=CFG, step_model=TEN_MS)
    reconstruct(res.run_dir)
    with open_ledger(res.run_dir) as led:
        # b's cancel arrives at 45 ms, inside the step [40, 50); the boundary at 50 stops it and frees its blocks
        assert led.rows("SELECT release_after_cancel_ms, release_after_cancel_label, n_output_tokens FROM "
                        "request_metrics WHERE attempt_id = 'b'")[1] == [
            (5.0, "simulated", 2)]
        assert led.rows("SELECT server_status FROM attempts WHERE attempt_id = 'b'")[1] == [("cancelled",)]
    names = [(e[0], e[1]) for e in _events(res.run_dir) if e[3] == "b" and e[0].startswith(("engine.cancel", "kv.free"))]
    assert names == [("engine.cancel_received", 45_000_000), ("engine.cancel_effective", 50_000_000),
                     ("kv.free", 50_000_000)]


def test_host_time_never_enters_simulated_time(tmp_path):
    fast = simulate(tmp_path / "fast", _requests(cancel_at_ms=45.0), engine_config=CFG, step_model=TEN_MS, run_id="x")
    slow = simulate(tmp_path / "slow", _requests(cancel_at_ms=45.0), engine_config=CFG, step_model=SlowTenMs(),
                    run_id="x")
    assert slow.steps == fast.steps == 5  # each slow step slept 30 ms of host time
    assert _events(slow.run_dir) == _events(fast.run_dir)
    for run in (fast.run_dir, slow.run_dir):
        reconstruct(run)
    q = "SELECT * EXCLUDE (run_id) FROM request_metrics ORDER BY attempt_id"
    with open_ledger(fast.run_dir) as a, open_ledger(slow.run_dir) as b:
        assert a.rows(q)[1] == b.rows(q)[1]


def test_a_request_the_engine_would_refuse_is_named_and_nothing_is_written(tmp_path):
    short = EngineConfig(block_size=16, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=24)
    with pytest.raises(ValueError, match=r"request b: prompt \(30 tokens\) \+ max_tokens \(2\) = 32 exceeds max_model_len 24"):
        simulate(tmp_path / "r", [*_requests()[:1], SimRequest("b", 0.0, (1,) * 30, 2)], engine_config=short,
                 step_model=TEN_MS)
    assert not (tmp_path / "r").exists()


def test_each_attempt_of_a_request_is_its_own_arrival_and_a_cancel_aborts_that_attempt_alone(tmp_path):
    prompt = distinct_prompt(0, 20, QWEN3_8B.shape.vocab)
    plan = [SimRequest("a", 0.0, prompt, 6, cancel_at_ms=25.0, attempt_id="a#1"),  # gives up mid-decode
            SimRequest("a", 30.0, prompt, 4, attempt_id="a#2"),  # its retry, the same prompt
            SimRequest("b", 5.0, distinct_prompt(1, 10, QWEN3_8B.shape.vocab), 3)]
    res = simulate(tmp_path / "r", plan, engine_config=CFG, step_model=TEN_MS)
    reconstruct(res.run_dir)
    with open_ledger(res.run_dir) as led:
        assert led.rows("SELECT attempt_id, request_id, attempt_index, server_status, n_output_tokens FROM attempts "
                        "ORDER BY 1")[1] == [("a#1", "a", 1, "cancelled", 2), ("a#2", "a", 2, "completed", 4),
                                             ("b", "b", 1, "completed", 3)]
    assert [e[1] for e in _events(res.run_dir) if e[0] == "engine.enqueued"] == [0, 5_000_000, 30_000_000]
    assert [p["attempt_id"] for p in res.manifest["workload"]["plan"]] == ["a#1", "a#2", "b"]
    with pytest.raises(ValueError, match=r"attempt ids must be distinct \(a retry is its own attempt\)"):
        simulate(tmp_path / "s", [plan[0], SimRequest("c", 1.0, prompt, 2, attempt_id="a#1")], engine_config=CFG,
                 step_model=TEN_MS)


def _enqueued_and_starts(run: Path) -> tuple[list[tuple], list[tuple]]:
    ev = _events(run)
    starts = [(e[1], [b[0] for b in json.loads(e[6])["batch"]]) for e in ev if e[0] == "step.start"]
    return [(e[3], e[1]) for e in ev if e[0] == "engine.enqueued"], starts


def test_an_idle_engine_starts_its_step_after_the_hosts_wake_up_and_a_burst_meets_one_step(tmp_path):
    vocab = QWEN3_8B.shape.vocab
    plan = [SimRequest("a", 0.0, distinct_prompt(0, 8, vocab), 1), SimRequest("b", 2.0, distinct_prompt(1, 8, vocab), 1),
            SimRequest("c", 100.0, distinct_prompt(2, 8, vocab), 1),
            SimRequest("d", 100.25, distinct_prompt(3, 8, vocab), 1)]
    res = simulate(tmp_path / "r", plan, engine_config=CFG, step_model=TEN_MS,
                   host=HostReplay(first_wake_ms=3.0, wake_ms=0.5))
    enq, starts = _enqueued_and_starts(res.run_dir)
    assert enq == [("a", 0), ("b", 2_000_000), ("c", 100_000_000), ("d", 100_250_000)]
    # the first wake-up (3 ms) lets b join a's step; a later one (0.5 ms) lets d, 0.25 ms behind c, join c's
    assert starts == [(3_000_000, ["a", "b"]), (100_500_000, ["c", "d"])]
    assert res.manifest["simulation"]["host_replay"]["first_wake_ms"] == 3.0
    bare = simulate(tmp_path / "s", plan, engine_config=CFG, step_model=TEN_MS)
    assert _enqueued_and_starts(bare.run_dir)[1] == [(0, ["a"]), (10_000_000, ["b"]), (100_000_000, ["c"]),
                                                     (110_000_000, ["d"])]


def test_an_arrival_that_follows_another_attempt_moves_with_its_simulated_end_or_arrival(tmp_path):
    vocab = QWEN3_8B.shape.vocab
    plan = [SimRequest("a", 0.0, distinct_prompt(0, 8, vocab), 4),  # tokens at 10, 20, 30, 40: ends at 40
            # a closed loop's next request: 5 ms after a's end, whatever its own recorded arrival (500)
            SimRequest("b", 500.0, distinct_prompt(1, 8, vocab), 2, follows=Follows("a", 5.0)),
            # b's retry, 30 ms after b's arrival, with its cancellation 12 ms after its own arrival
            SimRequest("b", 530.0, distinct_prompt(1, 8, vocab), 3, cancel_at_ms=542.0, attempt_id="b#2",
                       follows=Follows("b", 30.0, "arrival")),
            # it follows an attempt that is not in the plan: its own time
            SimRequest("c", 200.0, distinct_prompt(2, 8, vocab), 1, follows=Follows("gone", 1.0))]
    res = simulate(tmp_path / "r", plan, engine_config=CFG, step_model=TEN_MS)
    enq, _ = _enqueued_and_starts(res.run_dir)
    assert enq == [("a", 0), ("b", 45_000_000), ("b", 75_000_000), ("c", 200_000_000)]
    cancels = [(e[3], e[1]) for e in _events(res.run_dir) if e[0] == "engine.cancel_received"]
    assert cancels == [("b", 87_000_000)]
    assert res.manifest["workload"]["plan"][1]["follows"] == {"attempt": "a", "delay_ms": 5.0, "on": "end"}


def test_a_step_waits_for_a_cpu_as_the_real_host_did_at_that_time(tmp_path):
    plan = [SimRequest("a", 0.0, distinct_prompt(0, 8, QWEN3_8B.shape.vocab), 4)]
    # the real steps waited half their time from 0 ms, a fifth from 45 ms (the real engine's idle gap [25, 45)
    # holds the share it last measured): a step's 10 ms of work over [0, 10] or [20, 30] lasts 10 / (1 − 0.5);
    # over [40, 50], half at 0.5 and half at 0.2, 10 / (1 − 0.35); then 10 / (1 − 0.2)
    host = HostReplay(contention=((0.0, 25.0, 0.5), (45.0, 70.0, 0.2)))
    res = simulate(tmp_path / "r", plan, engine_config=CFG, step_model=TEN_MS, host=host)
    _, starts = _enqueued_and_starts(res.run_dir)
    assert [s[0] for s in starts] == [0, 20_000_000, 40_000_000, 55_384_615]
    assert res.end_ms == 67.884615
    assert host.share_over(40.0, 50.0) == pytest.approx(0.35) and host.share_over(30.0, 40.0) == 0.5
    assert HostReplay(contention=((5.0, 6.0, 0.25),)).share_at(1.0) == 0.25  # before the first: the first's
    assert host.describe()["contention_share"] == pytest.approx((25 * 0.5 + 25 * 0.2) / 50)


class WorkAndGap:
    """10 ms of work and 2 ms of host time after it (a fitted model tells them apart)."""
    name = "work-and-gap"

    def work_ms(self, rows):
        return 10.0

    def gap_ms(self, rows):
        return 2.0

    def step_ns(self, rows):
        return 12_000_000

    def describe(self):
        return {"name": self.name, "formula": "10 ms + 2 ms", "parameters": {}}


def test_only_a_steps_work_waits_for_a_cpu_and_the_real_hosts_gap_replaces_the_models(tmp_path):
    plan = [SimRequest("a", 0.0, distinct_prompt(0, 8, QWEN3_8B.shape.vocab), 2)]
    host = HostReplay(contention=((0.0, 100.0, 0.5),), gap_ms=1.0)
    res = simulate(tmp_path / "r", plan, engine_config=CFG, step_model=WorkAndGap(), host=host)
    assert res.end_ms == 2 * (10 / 0.5 + 1)  # the gap measured on the real host already holds its waits
    res = simulate(tmp_path / "s", plan, engine_config=CFG, step_model=WorkAndGap(),
                   host=HostReplay(contention=((0.0, 100.0, 0.5),)))
    assert res.end_ms == 2 * (10 / 0.5 + 2)  # no gap measured: the model's
    assert res.manifest["simulation"]["host_replay"]["gap_ms"] is None
