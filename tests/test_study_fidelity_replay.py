"""What the fidelity study replays of a real run, without a model: each attempt whole, until its
cancellation, or named with why not; arrivals from the run's first; prompts that share with each other
what the real engine's prefix cache shared."""
from __future__ import annotations

from pathlib import Path

import pytest
from ledger_util import build_run

from inferledger.collectors.sim.run import Follows, distinct_prompt
from inferledger.collectors.sim.runner import emitted_token
from inferledger.ledger.query import open_ledger
from inferledger.studies.fidelity import (causes, contention_sentence, host_replay, prefix_sources, replay_plan,
                                          replay_prompts)
from inferledger.studies.framework import StudyError


def _attempt(aid, rid, *, ns=None, reason="length", tokens=8, cancel=None, n=1, prompt=40, client="completed",
             server="completed", clock="c"):
    return {"attempt_id": aid, "request_id": rid, "client_status": client, "server_status": server,
            "finish_reason": reason, "n_tokens_engine": tokens, "prompt_tokens": prompt, "max_tokens": 16, "n": n,
            "enqueued_ns": ns, "clock": clock, "cancel_ns": cancel}


def test_each_attempt_is_replayed_whole_until_its_cancellation_or_named_with_why_not():
    attempts = [_attempt("r1:A1", "r1", ns=5_000_000, reason="cancelled", tokens=3, cancel=255_500_000,
                         client="timeout", server="cancelled"),
                _attempt("r1:A2", "r1", ns=300_000_000, tokens=16),
                _attempt("r2:A1", "r2", ns=1_000_000, reason="stop", tokens=5),
                _attempt("r3:A1", "r3", client="error", server="rejected"),  # never reached the engine
                _attempt("r4:A1", "r4", ns=9_000_000, n=2),
                _attempt("r5:A1", "r5", ns=9_500_000, reason=None, tokens=None, server="unterminated")]
    done, left = replay_plan(attempts)
    assert [(a["attempt_id"], a["replay"], a["arrival_ms"], a["cancel_at_ms"], a["tokens"]) for a in done] == [
        ("r1:A1", "until_cancel", 4.0, 254.5, 16),  # its max_tokens, aborted when the engine learned of it
        ("r1:A2", "whole", 299.0, None, 16), ("r2:A1", "whole", 0.0, None, 5)]
    assert [(a["attempt_id"], a["why"]) for a in left] == [
        ("r3:A1", "never reached the engine (client error, server rejected)"),
        ("r4:A1", "asked for 2 choices; the simulation replays one per attempt"),
        ("r5:A1", "the engine neither finished it with a token nor learned of a cancellation (server unterminated, "
                  "finish reason None)")]
    with pytest.raises(StudyError, match="on 2 clocks"):
        replay_plan([_attempt("a", "a", ns=1), _attempt("b", "b", ns=2, clock="d")])


def test_a_prefix_hit_is_traced_to_the_attempt_that_filled_its_last_block():
    kv = [("A", "kv.alloc", [0, 1, 2]), ("B", "kv.alloc", [3, 4]), ("C", "kv.prefix_hit", [0, 1]),
          ("C", "kv.alloc", [5]), ("D", "kv.alloc", [3, 6]),  # block 3 reallocated: B's content in it is gone
          ("E", "kv.prefix_hit", [3]), ("E", "kv.prefix_hit", [0]),  # only its first hit counts
          ("F", "kv.prefix_hit", [9]), ("B", "kv.prefix_hit", [4])]  # F: a block no attempt filled; B: its own
    assert prefix_sources(kv) == {"C": ("A", 2), "E": ("D", 1)}


def test_replayed_prompts_share_what_the_real_cache_shared_and_nothing_else():
    vocab, eos = 1000, {2}
    done = [{"attempt_id": "a1", "request_id": "a", "prompt_tokens": 40, "tokens": 8},
            {"attempt_id": "b1", "request_id": "b", "prompt_tokens": 70, "tokens": 4},
            {"attempt_id": "a2", "request_id": "a", "prompt_tokens": 40, "tokens": 8},  # a's retry
            {"attempt_id": "c1", "request_id": "c", "prompt_tokens": 60, "tokens": 4}]
    # b hit a1's first 2 blocks of 16; c hit 3 blocks of a1's sequence: its prompt (40) and 8 of its output
    prompts = replay_prompts(done, {"b1": ("a1", 2), "c1": ("a1", 3), "a2": ("a1", 2)}, 16, vocab, eos)
    a = distinct_prompt(0, 40, vocab)
    assert prompts["a1"] == prompts["a2"] == a  # a retry resends its request's prompt
    assert prompts["b1"] == a[:32] + distinct_prompt(1, 70, vocab)[32:]
    a_output = tuple(emitted_token(39 + j, vocab, eos) for j in range(8))
    assert prompts["c1"] == (a + a_output)[:48] + distinct_prompt(2, 60, vocab)[48:]
    assert {len(p) for p in prompts.values()} == {40, 70, 60}


def test_contention_is_named_measured_partly_measured_or_unknown_never_zero():
    c = {"n_steps": 10, "n_steps_known": 10, "contention_ms": 50.0, "step_ms": 400.0, "contention_share": 0.125,
         "blocked_ms": 8.0, "blocked_share": 0.02}
    assert contention_sentence(c) == ("run real waited 50.0 ms for a CPU over 400.0 ms of steps: 12.5 % of its step "
                                      "time; its steps slept 8.0 ms on a lock (the interpreter): 2.0 % of their time")
    assert contention_sentence({**c, "blocked_ms": None, "blocked_share": None}).endswith(
        "; its steps' sleep on a lock is unknown (they ran with intra-op workers)")
    assert "(the 4 of 10 steps whose wait is known)" in contention_sentence({**c, "n_steps_known": 4})
    unknown = {**c, "n_steps_known": 0, "contention_ms": None, "step_ms": None, "contention_share": None}
    assert contention_sentence(unknown).startswith("run real's contention is unknown (none of its 10 steps")


def _done(aid, task, *, enq, fin=None, planned="arrival", index=1, replay="whole"):
    return {"attempt_id": aid, "request_id": aid.rsplit(":", 1)[0], "task_id": task, "attempt_index": index,
            "enqueued_ns": enq, "finished_ns": fin, "planned": planned, "replay": replay}


def test_an_arrival_the_real_client_made_after_another_attempt_follows_it_in_the_simulation():
    ms = 1_000_000
    done = [_done("T1:R1:A1", "T1", enq=0, fin=100 * ms), _done("T2:R1:A1", "T2", enq=1 * ms, fin=300 * ms),
            # closed loop: T3 took the slot T1's end freed (T1 ended first), T4 the one T2's end freed
            _done("T3:R1:A1", "T3", enq=114 * ms, fin=400 * ms), _done("T4:R1:A1", "T4", enq=320 * ms, fin=450 * ms),
            # T4's session turn after its first request, and T3's retry 200 ms after its first attempt
            _done("T4:R2:A1", "T4", enq=800 * ms, fin=900 * ms, planned="turn"),
            _done("T3:R1:A2", "T3", enq=314 * ms, fin=700 * ms, planned="retry", index=2),
            # T5 took the slot of T6, whose only attempt was cancelled: its own time
            _done("T6:R1:A1", "T6", enq=2 * ms, replay="until_cancel"), _done("T5:R1:A1", "T5", enq=990 * ms)]
    tasks = [{"task_id": t, "process": "closed", "arrival_ns": a, "end_ns": e} for t, a, e in
             [("T1", 0, 101 * ms), ("T2", 0, 302 * ms), ("T6", 0, 980 * ms), ("T3", 110 * ms, 701 * ms),
              ("T4", 310 * ms, 901 * ms), ("T5", 985 * ms, None)]]
    assert causes(done, tasks) == {"T3:R1:A1": Follows("T1:R1:A1", 14.0), "T4:R1:A1": Follows("T2:R1:A1", 20.0),
                                   "T4:R2:A1": Follows("T4:R1:A1", 350.0),
                                   "T3:R1:A2": Follows("T3:R1:A1", 200.0, "arrival")}
    # an open loop's arrivals follow nothing
    assert causes(done[:2], [{**t, "process": "poisson"} for t in tasks]) == {}


def test_the_hosts_wake_ups_and_contention_come_from_the_real_runs_own_steps(tmp_path):
    def step(sid, start, end, batch, wait_ms):
        return [{"name": "step.start", "ms": start, "step_id": sid, "source": "engine", "attrs": {"batch": batch}},
                {"name": "step.end", "ms": end, "step_id": sid, "source": "engine",
                 "attrs": {"mode": "eager", "cpu_ns": round((end - start - wait_ms) * 1e6),
                           "wait_ns": round(wait_ms * 1e6), "workers": 0}}]

    def enq(aid, ms):
        return {"name": "engine.enqueued", "ms": ms, "attempt_id": aid, "request_id": aid, "source": "server",
                "value": 8, "attrs": {"max_tokens": 2, "n": 1}}

    events = [enq("a", 10.0), enq("b", 11.0), *step(1, 13.0, 23.0, [["a", "prefill", 8, 0], ["b", "prefill", 8, 0]], 5.0),
              *step(2, 23.5, 33.5, [["a", "decode", 1, 8], ["b", "decode", 1, 8]], 0.0),  # busy: not a wake-up
              enq("c", 100.0), *step(3, 100.5, 110.5, [["c", "prefill", 8, 0]], 1.0),
              enq("d", 200.0), *step(4, 200.25, 210.25, [["d", "prefill", 8, 0]], 0.0),
              enq("e", 300.0), *step(5, 301.0, 311.0, [["e", "prefill", 8, 0]], 0.0)]
    build_run(tmp_path / "r", events, manifest={"run_id": "r"}).close()
    with open_ledger(tmp_path / "r") as led:
        host = host_replay(led, [{"enqueued_ns": 10_000_000}])
    # the first wake-up: a's arrival to step 1 (3 ms); the others: median of 0.5, 0.25 and 1.0
    assert (host.first_wake_ms, host.wake_ms) == (3.0, 0.5)
    assert host.contention[:3] == ((3.0, 13.0, 0.5), (13.5, 23.5, 0.0), (90.5, 100.5, 0.1))
    # the gaps the engine worked across: after step 1 only (the others were followed by an idle wait)
    assert host.gap_ms == 0.5


def test_a_fit_run_without_steps_is_a_study_error_naming_it(tmp_path):
    """A kept fit run that has no engine step (here a black box's, imported) cannot train the simulated clock:
    the study stops naming the run and why, as a StudyError (exit 2), not a FitError traceback."""
    from inferledger.collectors.rundir.e0_import import import_archive
    from inferledger.ledger.reconstruct import reconstruct
    from inferledger.studies.fidelity import _simulate
    runs = tmp_path / "runs"
    runs.mkdir()
    import_archive(Path(__file__).resolve().parent.parent / "samples" / "e0" / "black_box" / "archive.jsonl",
                   runs / "fit")
    reconstruct(runs / "fit")
    with pytest.raises(StudyError) as err:
        _simulate(runs / "sim", "fidelity.sim", bundle=None)
    assert str(err.value).startswith(f"run fit ({runs / 'fit'}): no step fit to simulate with: step fit: 0 training "
                                     "steps (of 0); at least 3 are needed")
    assert not (runs / "sim").exists()


def test_the_hosts_drift_between_the_fit_and_the_real_run_is_named_past_three_percent():
    from inferledger.studies.fidelity import drift_sentence

    assert drift_sentence(1.096).startswith("run real's decode steps took 9.6% more time than the fit (trained on run "
                                            "fit) predicts, so the simulated TPOT comes out short by about as much")
    assert drift_sentence(0.81).startswith("run real's decode steps took 19.0% less time than the fit (trained on "
                                           "run fit) predicts, so the simulated TPOT comes out long")
    assert drift_sentence(1.029) == drift_sentence(0.971) == ""  # within 3 %: not named
    assert drift_sentence(None) == ""  # no decode step to hold the fit to: nothing said, nothing guessed
