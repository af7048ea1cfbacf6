"""Scheduler timelines without a model: fixed batch, continuous batching, chunked prefill,
reservation vs on-demand admission with preemption by recompute, and removal (cancellation)."""
from __future__ import annotations

from inferledger.engine.block_manager import BlockManager
from inferledger.engine.params import EngineConfig, SamplingParams
from inferledger.engine.scheduler import Scheduler
from inferledger.engine.sequence import Sequence, SequenceStatus


def make(num_blocks=64, block_size=4, **cfg):
    config = EngineConfig(block_size=block_size, num_blocks=num_blocks, **cfg)
    bm = BlockManager(num_blocks, block_size, config.enable_prefix_caching)
    return Scheduler(config, bm), bm


def seq(name, prompt_len, max_tokens=4, base=0):
    return Sequence(list(range(base, base + prompt_len)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    request_id=name)


def run_step(sched, bm):
    """schedule, then pretend the forward ran: mark KV computed, append a token where sampled,
    finish sequences at max_tokens. Returns [(name, kind, tokens)] of the step."""
    out = sched.schedule()
    for item in out.scheduled:
        s = item.seq
        s.mark_computed(item.start_pos, item.num_tokens - len(item.draft_token_ids))
        bm.cache_full_blocks(s)
        if item.samples:
            s.append_token(1000 + s.num_output_tokens)
            if s.num_output_tokens >= s.params.max_tokens:
                s.status = SequenceStatus.FINISHED
                sched.remove(s)
    return [(i.seq.request_id, i.kind, i.num_tokens) for i in out.scheduled], out


def drain(sched, bm, limit=200):
    steps = []
    while sched.has_unfinished() and len(steps) < limit:
        batch, _ = run_step(sched, bm)
        steps.append(batch)
    assert not sched.has_unfinished()
    assert bm.check_integrity() and bm.num_used_blocks == 0
    return steps


def test_continuous_runs_decodes_first_then_admits_within_budget():
    sched, bm = make(max_num_batched_tokens=16)
    a, b = seq("a", 6, max_tokens=3), seq("b", 12, base=100)
    sched.add(a)
    assert run_step(sched, bm)[0] == [("a", "prefill", 6)]
    sched.add(b)
    # a decodes (1 token) first; b's 12-token prompt takes the rest of the budget (15) whole
    assert run_step(sched, bm)[0] == [("a", "decode", 1), ("b", "prefill", 12)]
    assert run_step(sched, bm)[0] == [("a", "decode", 1), ("b", "decode", 1)]
    drain(sched, bm)


def test_chunked_prefill_splits_a_long_prompt_and_keeps_decodes_going():
    sched, bm = make(max_num_batched_tokens=8, max_num_seqs=4)
    a, b = seq("a", 3, max_tokens=6), seq("b", 20)
    sched.add(a)
    run_step(sched, bm)
    sched.add(b)
    assert run_step(sched, bm)[0] == [("a", "decode", 1), ("b", "prefill", 7)]
    assert run_step(sched, bm)[0] == [("a", "decode", 1), ("b", "prefill", 7)]
    assert run_step(sched, bm)[0] == [("a", "decode", 1), ("b", "prefill", 6)]
    assert run_step(sched, bm)[0] == [("a", "decode", 1), ("b", "decode", 1)]
    drain(sched, bm)


def test_long_prefill_token_threshold_caps_each_chunk_below_the_budget():
    sched, bm = make(max_num_batched_tokens=16, max_num_seqs=4, long_prefill_token_threshold=5)
    a, b = seq("a", 3, max_tokens=6), seq("b", 12)
    sched.add(a)
    assert run_step(sched, bm)[0] == [("a", "prefill", 3)]
    sched.add(b)
    # the budget left (15) would take b's 12 tokens whole; the cap takes 5 a step, decodes first
    assert run_step(sched, bm)[0] == [("a", "decode", 1), ("b", "prefill", 5)]
    assert run_step(sched, bm)[0] == [("a", "decode", 1), ("b", "prefill", 5)]
    assert run_step(sched, bm)[0] == [("a", "decode", 1), ("b", "prefill", 2)]
    assert run_step(sched, bm)[0] == [("a", "decode", 1), ("b", "decode", 1)]
    drain(sched, bm)


def test_two_capped_prefills_share_one_step_when_the_budget_holds_both():
    sched, bm = make(max_num_batched_tokens=8, max_num_seqs=4, long_prefill_token_threshold=4)
    a, b = seq("a", 6, max_tokens=2), seq("b", 6, max_tokens=2, base=100)
    sched.add(a)
    sched.add(b)
    assert run_step(sched, bm)[0] == [("a", "prefill", 4), ("b", "prefill", 4)]
    assert run_step(sched, bm)[0] == [("a", "prefill", 2), ("b", "prefill", 2)]
    drain(sched, bm)


def test_the_chunk_cap_is_refused_without_chunked_prefill_and_below_one():
    import pytest

    with pytest.raises(ValueError, match="long_prefill_token_threshold=4 .*chunked_prefill=False"):
        EngineConfig(chunked_prefill=False, long_prefill_token_threshold=4)
    with pytest.raises(ValueError, match="long_prefill_token_threshold=0 is out of range"):
        EngineConfig(long_prefill_token_threshold=0)


def test_unchunked_prefill_waits_for_room_or_runs_alone():
    sched, bm = make(max_num_batched_tokens=8, max_num_seqs=4, chunked_prefill=False)
    a, b = seq("a", 3, max_tokens=3), seq("b", 20)
    sched.add(a)
    run_step(sched, bm)
    sched.add(b)
    # b (20 tokens) never shares a step with a's decodes and is never split
    steps = drain(sched, bm)
    assert steps[0] == [("a", "decode", 1)]
    assert ("b", "prefill", 20) in [x for st in steps for x in st]
    assert [("b", "prefill", 20)] in steps


def test_fixed_batch_admits_only_after_the_whole_batch_finished():
    sched, bm = make(max_num_batched_tokens=64, batching="fixed", max_num_seqs=2)
    a, b, c = seq("a", 4, max_tokens=2), seq("b", 4, max_tokens=5), seq("c", 4, max_tokens=2)
    for s in (a, b, c):
        sched.add(s)
    steps = drain(sched, bm)
    assert steps[0] == [("a", "prefill", 4), ("b", "prefill", 4)]
    c_first = next(i for i, st in enumerate(steps) if any(x[0] == "c" for x in st))
    b_last = max(i for i, st in enumerate(steps) if any(x[0] == "b" for x in st))
    assert c_first == b_last + 1  # c waited although a finished early


def test_max_num_seqs_caps_the_batch():
    sched, bm = make(max_num_batched_tokens=64, max_num_seqs=2)
    for i in range(3):
        sched.add(seq(f"s{i}", 4))
    batch, _ = run_step(sched, bm)
    assert [x[0] for x in batch] == ["s0", "s1"]
    drain(sched, bm)


def test_on_demand_preempts_the_newest_and_recomputes_it():
    sched, bm = make(num_blocks=6, block_size=4, max_num_batched_tokens=64, admission="on_demand",
                     enable_prefix_caching=False)
    a, b = seq("a", 8, max_tokens=8, base=0), seq("b", 8, max_tokens=8, base=100)
    sched.add(a)
    sched.add(b)
    preempted = []
    for _ in range(100):
        if not sched.has_unfinished():
            break
        _, out = run_step(sched, bm)
        preempted += [(p.seq.request_id, p.recompute_tokens) for p in out.preempted]
        assert bm.check_integrity()
    assert preempted and preempted[0][0] == "b"  # newest first
    assert b.preemptions >= 1 and b.recomputed_tokens >= preempted[0][1] > 0
    assert a.preemptions == 0 and a.recomputed_tokens == 0
    assert a.num_output_tokens == b.num_output_tokens == 8
    assert bm.num_used_blocks == 0


def test_reserve_admission_never_preempts():
    sched, bm = make(num_blocks=6, block_size=4, max_num_batched_tokens=64, admission="reserve")
    a, b = seq("a", 8, max_tokens=8), seq("b", 8, max_tokens=8, base=100)
    sched.add(a)
    sched.add(b)
    batch, _ = run_step(sched, bm)
    assert [x[0] for x in batch] == ["a"]  # b's worst case (4 blocks) does not fit beside a's
    preemptions = 0
    while sched.has_unfinished():
        _, out = run_step(sched, bm)
        preemptions += len(out.preempted)
    assert preemptions == 0 and a.preemptions == b.preemptions == 0
    assert bm.check_integrity() and bm.num_used_blocks == 0


def test_prefix_hit_skips_cached_blocks_at_admission():
    sched, bm = make(max_num_batched_tokens=64)
    a = seq("a", 10, max_tokens=1)
    sched.add(a)
    drain(sched, bm)
    b = seq("b", 10, max_tokens=1)
    sched.add(b)
    _, out = run_step(sched, bm)
    item = out.scheduled[0]
    assert item.cached_tokens == 8 and item.num_tokens == 2 and len(item.prefix_hit_blocks) == 2
    assert b.num_cached_tokens == 8
    drain(sched, bm)


def test_removing_a_request_releases_its_blocks_wherever_it_is():
    sched, bm = make(max_num_batched_tokens=8, max_num_seqs=4)
    a, b = seq("a", 6, max_tokens=8), seq("b", 30)
    sched.add(a)
    sched.add(b)
    run_step(sched, bm)  # a prefilled, b partially
    assert b.block_table
    sched.remove(b)  # mid-prefill
    c = seq("c", 4)
    sched.add(c)
    sched.remove(c)  # still waiting
    run_step(sched, bm)
    sched.remove(a)  # mid-decode
    assert not sched.has_unfinished()
    assert bm.check_integrity() and bm.num_used_blocks == 0


def test_speculative_drafts_are_scheduled_as_verify():
    config = EngineConfig(block_size=4, num_blocks=32, speculative={"k": 3})
    bm = BlockManager(32, 4)
    sched = Scheduler(config, bm, propose=lambda s, k: [7, 8, 9, 10][:k])
    a = seq("a", 5, max_tokens=3)
    sched.add(a)
    run_step(sched, bm)
    out = sched.schedule()
    item = out.scheduled[0]
    # drafts are capped so that at most max_tokens outputs can be committed
    assert item.kind == "verify" and item.draft_token_ids == [7] and item.num_tokens == 2
    assert len(a.block_table) == bm.blocks_for(a.num_tokens + 1)


def test_drafts_leave_budget_for_every_decode():
    config = EngineConfig(block_size=4, num_blocks=32, max_num_seqs=2, max_num_batched_tokens=3,
                          speculative={"k": 4})
    bm = BlockManager(32, 4)
    sched = Scheduler(config, bm, propose=lambda s, k: [7, 8, 9, 10][:k])
    a, b = seq("a", 2, max_tokens=8), seq("b", 1, max_tokens=8, base=50)
    sched.add(a)
    sched.add(b)
    run_step(sched, bm)
    out = sched.schedule()
    assert [(i.seq.request_id, i.kind, i.num_tokens) for i in out.scheduled] == [("a", "verify", 2), ("b", "decode", 1)]


def test_prefix_cache_counters_count_each_first_admission_once():
    # a chunked prompt is looked up once; b, preempted, recomputes from its own cached blocks: not counted
    sched, bm = make(num_blocks=6, block_size=4, max_num_batched_tokens=64, admission="on_demand")
    a, b = seq("a", 8, max_tokens=8, base=0), seq("b", 8, max_tokens=8, base=100)
    sched.add(a)
    sched.add(b)
    drain(sched, bm)
    assert b.preemptions >= 1 and b.num_cached_tokens > 0  # its recompute took cached blocks
    assert (sched.prefix_cache_queries, sched.prefix_cache_hits) == (16, 0)
    c = seq("c", 10, max_tokens=1)  # a's first 2 blocks cached, the rest one token per step
    sched.config.max_num_batched_tokens = 1
    sched.add(c)
    steps = drain(sched, bm)
    assert [s[0][2] for s in steps] == [1, 1]  # 8 cached, 2 computed one per step
    assert (sched.prefix_cache_queries, sched.prefix_cache_hits) == (26, 8)
