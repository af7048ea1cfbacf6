"""A deployment's ledger built from events: per-replica accounts (`replicas`: attempts, busy time, queue, KV
use, prefix-cache hits, balance; a replica declared by URL and kind with what its own /metrics say and NULL
where its kind cannot say) and `run_diagnosis` naming the one replica that served most of the late attempts
(one slow replica), and none for a balanced pair."""
from __future__ import annotations

import pytest

from ledger_util import build_run, dict_rows, event as _e

ENG, SRV = {"source": "engine"}, {"source": "server"}


def _attempt(n: int, replica: str, queue_ms: float, work_ms: float, step_id: int, prefix_hit: bool = False) -> list[dict]:
    """Task T<n> (deadline 50 ms) at n x 100 ms: one attempt served by `replica`, queued `queue_ms`, prefilled
    and done in one step of `work_ms`."""
    t0, aid, task = n * 100.0, f"A{n}", f"T{n}"
    rep = {"replica_id": replica}
    t1, t2 = t0 + queue_ms, t0 + queue_ms + work_ms
    kv = [_e("kv.prefix_hit", t1, aid, attrs={"blocks": [n], **rep}, value=1, **ENG)] if prefix_hit else []
    return [
        _e("task.start", t0, task=task, attrs={"deadline_ms": 50}),
        _e("attempt.created", t0, aid, task=task), _e("attempt.sent", t0, aid, task=task),
        _e("server.received", t0, aid, attrs=rep, **SRV), _e("engine.enqueued", t0, aid, attrs=rep, **ENG),
        _e("engine.scheduled", t1, aid, attrs=rep, **ENG), *kv,
        _e("step.start", t1, step_id=step_id, source="engine", attrs={"batch": [[aid, "prefill", 10]], **rep}),
        _e("step.end", t2, step_id=step_id, source="engine", value=10, attrs=rep),
        _e("engine.token", t2, aid, step_id=step_id, value=1, attrs=rep, **ENG),
        _e("engine.finished", t2, aid, value=1, attrs={"reason": "stop", **rep}, **ENG),
        _e("server.done", t2, aid, attrs=rep, **SRV),
        _e("attempt.chunk", t2, aid, task=task, attrs={"kinds": ["content"]}),
        _e("attempt.done", t2, aid, task=task, attrs={"finish_reason": "stop"}),
    ]


def _deployment(plan: list[tuple[str, float, float]], **kw):
    """Events of one attempt per (replica, queue_ms, work_ms), in order, each its own step."""
    return [ev for n, (rep, q, w) in enumerate(plan) for ev in _attempt(n, rep, q, w, step_id=n + 1, **kw)]


# r1 is slow: every one of its 9 attempts waits 40 ms and works 30 ms (late at 70 ms against a 50 ms deadline);
# r2 serves 11 in 10 ms each, one of them queued 45 ms (late at 55 ms)
SLOW = [("r1", 40.0, 30.0)] * 9 + [("r2", 0.0, 10.0)] * 10 + [("r2", 45.0, 10.0)]
MANIFEST = {"deployment": {"router": "http://127.0.0.1:18200", "replicas": [
    {"replica_id": "r1", "kind": "ours"}, {"replica_id": "r2", "kind": "ours"},
    {"replica_id": "127.0.0.1:18113", "kind": "llamacpp", "url": "http://127.0.0.1:18113"},
    {"replica_id": "127.0.0.1:18114", "kind": "vllm", "url": "http://127.0.0.1:18114"}]}}
SAMPLES = [(0, "kv_blocks_used", 3.0, "blocks", "r1", "engine"), (500, "kv_blocks_used", 7.0, "blocks", "r1", "engine"),
           (0, "llamacpp:requests_deferred", 2.0, "count", "127.0.0.1:18113", "llamacpp-metrics"),
           (0, "llamacpp:prompt_tokens_cached_total", 100.0, "tokens", "127.0.0.1:18113", "llamacpp-metrics"),
           (900, "llamacpp:prompt_tokens_cached_total", 164.0, "tokens", "127.0.0.1:18113", "llamacpp-metrics"),
           (0, "vllm:num_requests_waiting", 4.0, "count", "127.0.0.1:18114", "vllm-metrics"),
           (0, "vllm:kv_cache_usage_perc", 0.25, "ratio", "127.0.0.1:18114", "vllm-metrics"),
           (900, "vllm:kv_cache_usage_perc", 0.5, "ratio", "127.0.0.1:18114", "vllm-metrics"),
           (0, "vllm:prefix_cache_hits_total", 32.0, "tokens", "127.0.0.1:18114", "vllm-metrics"),
           (900, "vllm:prefix_cache_hits_total", 16.0, "tokens", "127.0.0.1:18114", "vllm-metrics")]


TWO = {"deployment": {"replicas": [{"replica_id": "r1", "kind": "ours"}, {"replica_id": "r2", "kind": "ours"}]}}


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("slow") / "r", _deployment(SLOW), manifest=TWO)


def test_each_replica_has_its_own_account_and_null_where_its_kind_cannot_say(tmp_path):
    plan = [("r1", 40.0, 30.0)] * 3 + [("r2", 0.0, 10.0)] * 2
    events = [ev for n, (rep, q, w) in enumerate(plan)
              for ev in _attempt(n, rep, q, w, step_id=n + 1, prefix_hit=n in (1, 2, 4))]
    con = build_run(tmp_path / "r", events, manifest=MANIFEST, samples=SAMPLES)
    got = {r["replica_id"]: r for r in dict_rows(con, "SELECT * FROM replicas")}
    assert sorted(got) == ["127.0.0.1:18113", "127.0.0.1:18114", "r1", "r2"]
    r1, r2, llama, vllm = got["r1"], got["r2"], got["127.0.0.1:18113"], got["127.0.0.1:18114"]
    assert (r1["kind"], r1["attempts"], r1["busy_ms"], r1["queue_p50_ms"], r1["prefix_hit_blocks"],
            r1["prefix_hit_attempts"], r1["kv_blocks_used_max"]) == ("ours", 3, 90.0, 40.0, 2, 2, 7)
    assert (r2["attempts"], r2["busy_ms"], r2["queue_p99_ms"], r2["prefix_hit_blocks"], r2["kv_blocks_used_max"]) == \
        (2, 20.0, 0.0, 1, None)
    assert (llama["kind"], llama["attempts"], llama["busy_ms"], llama["waiting_max"], llama["prefix_hit_tokens"],
            llama["kv_usage_max"]) == ("llamacpp", None, None, 2, 64, None)
    # vLLM's prefix counter went down (a restart): its delta is unknown, never negative
    assert (vllm["kind"], vllm["waiting_max"], vllm["kv_usage_max"], vllm["prefix_hit_tokens"]) == \
        ("vllm", 4, 0.5, None)
    # a mean over some of the replicas is no mean of the deployment: every balance is NULL
    assert [r["balance"] for r in got.values()] == [None] * 4
    gaps = {r["subject_id"]: r for r in dict_rows(con, "SELECT * FROM gaps WHERE gap_id LIKE 'replicas:%' OR "
                                                       "affects LIKE 'replicas %'")}
    assert sorted(gaps) == ["127.0.0.1:18113", "127.0.0.1:18114", "r1", "r2"]
    assert gaps["r1"]["affects"] == "replicas prefix_hit_tokens, prefix_query_tokens, prefix_counter_agrees of r1"
    assert "kv_usage_max" in gaps["127.0.0.1:18113"]["affects"] and "queue" not in gaps["127.0.0.1:18113"]["affects"]
    assert "(llamacpp) is declared by URL" in gaps["127.0.0.1:18113"]["detail"]


def test_balance_is_busy_time_over_the_mean(slow):
    got = {r[0]: r[1:] for r in slow.execute("SELECT replica_id, attempts, busy_ms, balance FROM replicas").fetchall()}
    # r1 9 x 30 = 270 ms, r2 11 x 10 = 110 ms: the mean 190 ms
    assert got == {"r1": (9, 270.0, pytest.approx(270 / 190)), "r2": (11, 110.0, pytest.approx(110 / 190))}


def test_the_diagnosis_names_the_one_slow_replica(slow):
    row = dict_rows(slow, "SELECT * FROM run_diagnosis WHERE scope = 'run'")[0]
    assert (row["n_late"], row["replica_id"]) == (10, "r1")
    assert row["replica_balance"] == pytest.approx(270 / 190)
    assert row["evidence"].endswith("; replica r1 served 9 of the 10 late attempts (9 of the 20 attempts); "
                                    "its busy time 1.4× the mean")


def test_a_balanced_pair_names_no_replica(tmp_path):
    # r1 and r2 alike: 10 attempts each, 5 of each late (queued 45 ms, done at 55 ms against 50 ms)
    plan = [(rep, 45.0 if n % 2 else 0.0, 10.0) for rep in ("r1", "r2") for n in range(10)]
    con = build_run(tmp_path / "r", _deployment(plan), manifest=TWO)
    row = dict_rows(con, "SELECT * FROM run_diagnosis WHERE scope = 'run'")[0]
    assert (row["n_late"], row["replica_id"], row["replica_balance"]) == (10, None, pytest.approx(1.0))
    assert "replica" not in row["evidence"]
    # 7 of 10 late on one replica is short of 3/4: still none named
    plan = [("r1", 45.0, 10.0)] * 7 + [("r2", 45.0, 10.0)] * 3 + [("r2", 0.0, 10.0)] * 10
    con = build_run(tmp_path / "r7", _deployment(plan), manifest=TWO)
    assert con.execute("SELECT n_late, replica_id FROM run_diagnosis WHERE scope = 'run'").fetchall() == [(10, None)]


def _llamacpp_answered(n: int) -> list[dict]:
    """Task T<n>: one attempt answered with llama.cpp's own timings (no server event of ours)."""
    t0, aid, task = n * 100.0, f"L{n}", f"T{n}"
    timings = {"cache_n": 0, "prompt_n": 8, "prompt_ms": 5.0, "predicted_n": 1, "predicted_ms": 2.0}
    return [_e("task.start", t0, task=task, attrs={"deadline_ms": 500}),
            _e("attempt.created", t0, aid, task=task), _e("attempt.sent", t0, aid, task=task),
            _e("attempt.chunk", t0 + 20, aid, task=task, attrs={"kinds": ["content"]}),
            _e("attempt.done", t0 + 20, aid, task=task, attrs={"finish_reason": "stop", "server_timings": timings,
                                                               "server_timings_evidence": "reported"})]


def test_an_attempt_answered_with_llamacpps_timings_is_the_one_llamacpp_replicas(tmp_path):
    events = _deployment([("r1", 0.0, 10.0)] * 2) + _llamacpp_answered(5) + _llamacpp_answered(6)
    one = {"deployment": {"replicas": [{"replica_id": "r1", "kind": "ours"},
                                       {"replica_id": "127.0.0.1:18113", "kind": "llamacpp"}]}}
    con = build_run(tmp_path / "one", events, manifest=one)
    assert con.execute("SELECT attempt_id, replica_id FROM attempts ORDER BY 1").fetchall() == \
        [("A0", "r1"), ("A1", "r1"), ("L5", "127.0.0.1:18113"), ("L6", "127.0.0.1:18113")]
    got = {r["replica_id"]: r for r in dict_rows(con, "SELECT * FROM replicas")}
    llama = got["127.0.0.1:18113"]
    # its attempts are known; its engine's steps and prefix blocks are not (NULL, never 0). Its busy time is what its
    # timings say: 5 + 2 ms ending at each done (520 and 620 ms), apart: 14 ms, reported; r1's 2 x 10 ms observed
    assert (llama["attempts"], llama["busy_ms"], llama["busy_evidence"], llama["prefix_hit_blocks"]) == \
        (2, 14.0, "reported", None)
    assert (got["r1"]["busy_ms"], got["r1"]["busy_evidence"]) == (20.0, "observed")
    assert [(r["balance"], r["balance_evidence"]) for r in got.values()] == \
        [(pytest.approx(14 / 17), "observed and reported"), (pytest.approx(20 / 17), "observed and reported")]
    detail = con.execute("SELECT affects, detail FROM gaps WHERE subject_id = '127.0.0.1:18113' "
                         "AND affects LIKE 'replicas %'").fetchall()
    assert detail == [("replicas queue_p50_ms, waiting_max, kv_blocks_used_max, kv_usage_max, prefix_hit_blocks, "
                       "prefix_hit_tokens of "
                       "127.0.0.1:18113",
                       "replica 127.0.0.1:18113 (llamacpp) is declared by URL: its engine's steps are not in the run "
                       "(its 2 attempt(s) are placed by the timings llama.cpp answered with); its /metrics have no "
                       "KV usage gauge; its busy_ms is the union of the prefill and decode its engine reported "
                       "(busy_evidence reported)")]
    # two llama.cpp replicas: the timings cannot say which one answered
    two = {"deployment": {"replicas": [*one["deployment"]["replicas"],
                                       {"replica_id": "127.0.0.1:18114", "kind": "llamacpp"}]}}
    con = build_run(tmp_path / "two", events, manifest=two)
    assert con.execute("SELECT count(*) FROM attempts WHERE replica_id IS NULL").fetchall() == [(2,)]


def test_a_replicas_own_prefix_counter_is_set_beside_its_engines_events(tmp_path):
    # r1: 3 attempts, 16 + 32 tokens cached at first admission, and a recompute after a preemption that took 16
    # more (not counted, as the counter leaves it out); its counter's two scrapes: 48 hits of 120 queried. r2:
    # its events say 16, its counter 32 (another client's lookups between the scrapes). r3: never scraped.
    plan = [("r1", 0.0, 10.0)] * 3 + [("r2", 0.0, 10.0), ("r3", 0.0, 10.0)]
    cached = {0: 0, 1: 16, 2: 32, 3: 16, 4: 8}
    events = [ev for n, (rep, q, w) in enumerate(plan) for ev in _attempt(n, rep, q, w, step_id=n + 1)]
    events += [_e("engine.prefill", n * 100.0, f"A{n}", value=40 - c, step_id=n + 1, source="engine",
                  attrs={"cached_tokens": c, "recompute": False, "replica_id": plan[n][0]}) for n, c in cached.items()]
    events.append(_e("engine.prefill", 250.0, "A2", value=24, step_id=3, source="engine",
                     attrs={"cached_tokens": 16, "recompute": True, "replica_id": "r1"}))
    for e in events:  # every prompt is 40 tokens as the engine counts them
        if e["name"] == "engine.enqueued":
            e["value"] = 40
    own = "inferledger-metrics"
    samples = [(0, "vllm:prefix_cache_hits_total", 100.0, "tokens", "r1", own),
               (900, "vllm:prefix_cache_hits_total", 148.0, "tokens", "r1", own),
               (0, "vllm:prefix_cache_queries_total", 400.0, "tokens", "r1", own),
               (900, "vllm:prefix_cache_queries_total", 520.0, "tokens", "r1", own),
               (0, "vllm:prefix_cache_hits_total", 0.0, "tokens", "r2", own),
               (900, "vllm:prefix_cache_hits_total", 32.0, "tokens", "r2", own)]
    three = {"deployment": {"replicas": [{"replica_id": r, "kind": "ours"} for r in ("r1", "r2", "r3")]}}
    con = build_run(tmp_path / "r", events, manifest=three, samples=samples)
    got = con.execute("SELECT replica_id, prefix_hit_tokens, prefix_query_tokens, event_cached_tokens, "
                      "prefix_counter_agrees FROM replicas ORDER BY 1").fetchall()
    assert got == [("r1", 48, 120, 48, True), ("r2", 32, None, 16, False), ("r3", None, None, 8, None)]
    # the recompute's 16 cached tokens are A2's own blocks found again, not prompt tokens served a second time
    assert con.execute("SELECT prompt_tokens_cached FROM run_metrics").fetchall() == [(72,)]
    assert con.execute("SELECT attempt_id, prompt_tokens, prompt_tokens_cached, prefill_tokens_computed "
                       "FROM request_metrics ORDER BY 1").fetchall() == \
        [("A0", 40, 0, 40), ("A1", 40, 16, 24), ("A2", 40, 32, 8 + 24), ("A3", 40, 16, 24), ("A4", 40, 8, 32)]
    assert con.execute("SELECT replica_id, prompt_tokens, event_hit_rate FROM replicas ORDER BY 1").fetchall() == \
        [("r1", 120, 48 / 120), ("r2", 40, 16 / 40), ("r3", 40, 8 / 40)]
    gaps = dict_rows(con, "SELECT * FROM gaps WHERE affects LIKE 'replicas prefix_hit_tokens%'")
    assert [(g["subject_id"], g["affects"]) for g in gaps] == \
        [("r3", "replicas prefix_hit_tokens, prefix_query_tokens, prefix_counter_agrees of r3")]
    assert "8 cached prompt token(s) at first admission" in gaps[0]["detail"]


def _vllm_answered(aid: str, scheduled_ms: float, prefill_ms: float, decode_ms: float,
                   replica: str | None = "127.0.0.1:18114") -> list[dict]:
    """Attempt `aid` answered by a vLLM replica whose span (reported) says prefill and decode, scheduled at
    `scheduled_ms` (its first token at scheduled + prefill); `replica` None: a span that names no replica."""
    task, t0 = "T" + aid, scheduled_ms - 1.0
    first, last = scheduled_ms + prefill_ms, scheduled_ms + prefill_ms + decode_ms
    rep = {"evidence": "reported", **({"replica_id": replica} if replica else {})}
    otel = {"gen_ai.latency.time_in_model_prefill": prefill_ms / 1e3, "gen_ai.latency.time_in_model_decode": decode_ms / 1e3}
    return [_e("task.start", t0, task=task, attrs={"deadline_ms": 500}),
            _e("attempt.created", t0, aid, task=task), _e("attempt.sent", t0, aid, task=task),
            _e("server.received", t0, aid, attrs={**rep, "otel_span": "llm_request", "otel": otel}, **SRV),
            _e("engine.scheduled", scheduled_ms, aid, attrs=rep, **ENG),
            _e("engine.token", first, aid, value=1, attrs=rep, **ENG),
            _e("engine.finished", last + 2.0, aid, value=1, attrs={"reason": "stop", **rep}, **ENG),
            _e("attempt.chunk", first + 1, aid, task=task, attrs={"kinds": ["content"]}),
            _e("attempt.done", last + 3.0, aid, task=task, attrs={"finish_reason": "stop"})]


def test_a_vllm_replicas_busy_time_is_the_union_of_its_spans_prefill_and_decode(tmp_path):
    """V1 [100, 125] ms (prefill 5 + decode 20 from its engine.scheduled), V2 [110, 120] inside it, V3 [300, 310]:
    the union is 25 + 10 = 35 ms, reported (engine.finished, 2 ms after the last token, is not the end). A span
    that names no replica leaves an attempt the vLLM replica may have served: its busy time is unknown."""
    manifest = {"deployment": {"replicas": [{"replica_id": "r1", "kind": "ours"},
                                            {"replica_id": "127.0.0.1:18114", "kind": "vllm"}]}}
    vllm = _vllm_answered("V1", 100.0, 5.0, 20.0) + _vllm_answered("V2", 110.0, 5.0, 5.0) + \
        _vllm_answered("V3", 300.0, 4.0, 6.0)
    con = build_run(tmp_path / "v", _deployment([("r1", 0.0, 10.0)] * 2) + vllm, manifest=manifest)
    got = {r[0]: r[1:] for r in con.execute("SELECT replica_id, attempts, busy_ms, busy_evidence, balance, "
                                            "balance_evidence FROM replicas").fetchall()}
    assert got == {"127.0.0.1:18114": (3, 35.0, "reported", pytest.approx(35 / 27.5), "observed and reported"),
                   "r1": (2, 20.0, "observed", pytest.approx(20 / 27.5), "observed and reported")}
    con = build_run(tmp_path / "u", _deployment([("r1", 0.0, 10.0)] * 2) + vllm
                    + _vllm_answered("V4", 400.0, 4.0, 6.0, replica=None), manifest=manifest)
    got = {r[0]: r[1:] for r in con.execute("SELECT replica_id, busy_ms, busy_evidence, balance FROM replicas").fetchall()}
    assert got == {"127.0.0.1:18114": (None, None, None), "r1": (20.0, "observed", None)}
    (detail,), = con.execute("SELECT detail FROM gaps WHERE subject_id = '127.0.0.1:18114' "
                             "AND affects LIKE 'replicas busy_ms%'").fetchall()
    assert detail.endswith("(its 3 attempt(s) are placed by its own spans); its busy time is unknown: the run may lack "
                           "attempts it served (the router's count does not agree, or attempts of the run name no replica)")
