"""The engine on the real model: batching, chunking, caching, preemption and speculation change no
greedy token; cancellation and every other scenario leave no block behind; every event is valid."""
from __future__ import annotations

import asyncio

import pytest
from engine_checks import RecordingSink, assert_no_leak, attrs, check_events, reference_greedy

from inferledger.engine import LLM, AsyncEngine, EngineConfig, LLMEngine, SamplingParams

MAX = 10


@pytest.fixture(scope="module")
def prompts(bundle):
    tok = bundle.tokenizer

    def chat(q):
        return tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))

    return [chat("What is the capital of France?"), chat("Write a haiku about the sea."),
            tok.encode("The quick brown fox")]


@pytest.fixture(scope="module")
def refs(bundle, prompts):
    return [reference_greedy(bundle, p, MAX) for p in prompts]


def run(bundle, prompts, params, **cfg):
    sink = RecordingSink()
    llm = LLM(bundle=bundle, config=EngineConfig(**cfg), sink=sink)
    outs = llm.generate(prompts, params)
    assert_no_leak(llm.engine)
    return outs, sink, llm


def test_batched_greedy_equals_the_runner_alone(bundle, prompts, refs):
    outs, sink, _ = run(bundle, prompts, SamplingParams(max_tokens=MAX), num_blocks=64, chunked_prefill=False)
    assert [o.token_ids for o in outs] == refs
    by = check_events(sink, outs)
    first = next(r for r in sink.rows if r["name"] == "step.start")
    assert [b[1:] for b in attrs(first)["batch"]] == [["prefill", len(p), 0] for p in prompts]
    assert any(len(attrs(r)["batch"]) == 3 for r in sink.rows if r["name"] == "step.start"
               and all(b[1] == "decode" for b in attrs(r)["batch"]))
    for o in outs:
        assert o.text == bundle.tokenizer.decode(o.token_ids)
        names = [e["name"] for e in by[o.attempt_id]]
        assert names.index("engine.scheduled") < names.index("engine.prefill") < names.index("engine.token")
    assert outs[0].finish_reason == "stop" and outs[2].finish_reason == "length"


def test_chunked_prefill_equals_unchunked(bundle, prompts, refs):
    outs, sink, _ = run(bundle, prompts, SamplingParams(max_tokens=MAX), num_blocks=64,
                        max_num_batched_tokens=16, enable_prefix_caching=False)
    assert [o.token_ids for o in outs] == refs
    check_events(sink, outs)
    chunks = [r["value"] for r in sink.rows if r["name"] == "engine.prefill" and r["attempt_id"] == outs[1].attempt_id]
    assert len(chunks) > 1 and sum(chunks) == len(prompts[1]) and max(chunks) <= 16
    mixed = [attrs(r)["batch"] for r in sink.rows if r["name"] == "step.start"]
    assert any({b[1] for b in batch} == {"prefill", "decode"} for batch in mixed)
    assert all(sum(b[2] for b in batch) <= 16 for batch in mixed)
    done: dict[str, int] = {}  # without the prefix cache, a row's context is what its earlier rows computed
    for batch in mixed:
        for attempt, _, tokens, context_before in batch:
            assert context_before == done.get(attempt, 0)
            done[attempt] = context_before + tokens


def test_prefix_hit_gives_the_same_tokens_with_fewer_computed_prompt_tokens(bundle, prompts, refs):
    sink = RecordingSink()
    llm = LLM(bundle=bundle, config=EngineConfig(num_blocks=64), sink=sink)
    p = SamplingParams(max_tokens=3)
    cold = llm.generate([prompts[0]], p)[0]
    warm, other = llm.generate([prompts[0], prompts[1]], p)
    assert cold.token_ids == warm.token_ids == refs[0][:3] and other.token_ids == refs[1][:3]
    assert cold.cached_tokens == 0 and cold.computed_prompt_tokens == len(prompts[0])
    assert warm.cached_tokens == (len(prompts[0]) - 1) // 16 * 16 > 0
    assert warm.computed_prompt_tokens == len(prompts[0]) - warm.cached_tokens
    assert other.cached_tokens > 0  # the chat template's system prompt is a shared prefix
    by = check_events(sink, [cold, warm, other])
    hit = next(e for e in by[warm.attempt_id] if e["name"] == "kv.prefix_hit")
    assert attrs(hit)["tokens"] == warm.cached_tokens
    assert_no_leak(llm.engine)


def test_preemption_by_recompute_gives_the_same_tokens(bundle, prompts, refs):
    # block_size 4: prompt 0 (37 tokens) takes 10 blocks, the short prompt 1; decoding needs more
    # than the 12 blocks there are, so the newest is preempted and recomputed later
    order = [prompts[0], prompts[2]]
    outs, sink, _ = run(bundle, order, SamplingParams(max_tokens=MAX), num_blocks=12, block_size=4,
                        admission="on_demand", enable_prefix_caching=False)
    assert [o.token_ids for o in outs] == [refs[0], refs[2]]
    assert sum(o.preemptions for o in outs) >= 1
    by = check_events(sink, outs)
    for o in outs:
        pre = [e for e in by[o.attempt_id] if e["name"] == "engine.preempted"]
        assert len(pre) == o.preemptions
        if pre:
            assert o.recomputed_tokens == sum(e["value"] for e in pre) > 0
            assert sum(1 for e in by[o.attempt_id] if e["name"] == "engine.scheduled") == 1 + len(pre)


def test_cancellation_under_load_releases_every_block(bundle, prompts, refs):
    sink = RecordingSink()
    engine = LLMEngine(bundle, EngineConfig(num_blocks=64, max_num_seqs=3), sink=sink)
    keep = engine.add_request(prompts[0], SamplingParams(max_tokens=MAX), request_id="keep")
    a = engine.add_request(prompts[1], SamplingParams(max_tokens=40), request_id="a")
    b = engine.add_request(prompts[2], SamplingParams(max_tokens=40), request_id="b", attempt_id="b-1")
    queued = engine.add_request(prompts[2], SamplingParams(max_tokens=40), request_id="q")  # waits: max_num_seqs
    tokens = {k: [] for k in (keep, a, b, queued)}
    outputs = {}
    for _ in range(3):
        for d in engine.step():
            tokens[d.attempt_id] += d.new_token_ids
    assert tokens[a] and tokens[b] and not tokens[queued]
    assert engine.abort("a") and engine.abort("b-1") and engine.abort("q")  # request id, attempt id
    assert not engine.abort("nope")
    while engine.has_unfinished():
        for d in engine.step():
            tokens[d.attempt_id] += d.new_token_ids
            if d.request_finished:
                outputs[d.attempt_id] = d.output
    assert_no_leak(engine)
    assert outputs[keep].token_ids == refs[0]
    for aid in (a, b, queued):
        assert outputs[aid].finish_reason == "cancelled"
        assert outputs[aid].token_ids == tokens[aid] and len(tokens[aid]) < 40
    by = check_events(sink, list(outputs.values()))
    for aid in (a, b):
        names = [e["name"] for e in by[aid]]
        assert names.index("engine.cancel_received") < names.index("engine.cancel_effective") \
            < names.index("kv.release") < names.index("kv.free") < names.index("engine.finished")
        assert attrs(by[aid][-1])["reason"] == "cancelled"
        free = next(e for e in by[aid] if e["name"] == "kv.free")
        cancel = next(e for e in by[aid] if e["name"] == "engine.cancel_received")
        assert free["ts_ns"] >= cancel["ts_ns"] and free["value"] > 0
    assert "engine.scheduled" not in [e["name"] for e in by[queued]]
    assert [(e["name"], e["value"]) for e in by[queued] if e["name"].startswith("kv.")] == \
        [("kv.release", 0), ("kv.free", 0)]  # held nothing: said so, not left unknown


def test_prompt_lookup_equals_greedy_with_fewer_forward_passes(bundle):
    tok = bundle.tokenizer
    text = "Copy the following text word for word: The cat sat on the mat. The dog sat on the log."
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
    n = 16
    ref = reference_greedy(bundle, prompt, n)
    outs, sink, _ = run(bundle, [prompt], SamplingParams(max_tokens=n), num_blocks=64,
                        speculative={"k": 4, "ngram_max": 3, "ngram_min": 1})
    o = outs[0]
    assert o.token_ids == ref
    assert o.accepted_tokens > 0 and o.forward_passes < len(ref) // 2  # plain decoding: len(ref)
    by = check_events(sink, outs)
    rounds = [e for e in by[o.attempt_id] if e["name"] == "spec.round"]
    assert len(rounds) == o.spec_rounds and sum(attrs(e)["accepted"] for e in rounds) == o.accepted_tokens
    assert all(attrs(e)["forward_passes"] == 1 and e["value"] <= attrs(e)["accepted"] + 1 for e in rounds)
    assert any(e["value"] > 1 for e in by[o.attempt_id] if e["name"] == "engine.token")
    # sampled requests use exact rejection sampling: a seed still reproduces the output
    sp = SamplingParams(max_tokens=12, temperature=0.7, seed=11)
    again, _, _ = run(bundle, [prompt, prompt], sp, num_blocks=64, speculative={"k": 4})
    assert again[0].token_ids == again[1].token_ids and again[0].drafted_tokens > 0


def test_seed_reproduces_a_sampled_output(bundle, prompts):
    sp = lambda seed: SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95, top_k=100, seed=seed)
    outs, sink, llm = run(bundle, [prompts[2]] * 3, [sp(1), sp(1), sp(2)], num_blocks=64)
    assert outs[0].token_ids == outs[1].token_ids != outs[2].token_ids
    alone = llm.generate([prompts[2]], sp(1))[0]  # batch composition does not matter
    assert alone.token_ids == outs[0].token_ids
    check_events(sink, outs + [alone])


def test_parallel_samples_share_the_prompt_and_copy_on_write(bundle, prompts):
    sp = SamplingParams(max_tokens=6, temperature=1.0, seed=5, n=2)
    outs, sink, llm = run(bundle, [prompts[1]], sp, num_blocks=64)
    o = outs[0]
    assert [c.index for c in o.outputs] == [0, 1] and all(len(c.token_ids) == 6 for c in o.outputs)
    assert o.computed_prompt_tokens == len(prompts[1])  # the prompt was computed once
    by = check_events(sink, outs)
    allocs = [e for e in by[o.attempt_id] if e["name"] == "kv.alloc"]
    assert any("copy_on_write" in attrs(e) for e in allocs)
    n_prompt_blocks = -(-len(prompts[1]) // 16)
    assert sum(e["value"] for e in allocs) <= n_prompt_blocks + 2  # no second copy of the prompt
    assert [e["name"] for e in by[o.attempt_id]].count("engine.finished") == 1


@pytest.mark.parametrize("kwargs, name", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": 3.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"n": 0}, "n"), ({"n": 99}, "n"), ({"seed": -1}, "seed"), ({"stop": [""]}, "stop"),
    ({"stop_token_ids": [-3]}, "stop_token_ids"), ({"temperature": float("nan")}, "temperature"),
])
def test_out_of_range_params_are_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*must be"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    ({"graph_batch_sizes": (0, 4)}, "graph_batch_sizes"), ({"graph_batch_sizes": "yes"}, "graph_batch_sizes"),
    ({"graph_batch_sizes": (2.5,)}, "graph_batch_sizes"), ({"device_timing": "sometimes"}, "device_timing"),
])
def test_engine_config_refuses_bad_graph_and_timing_settings(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*must be"):
        EngineConfig(**kwargs)


def test_graph_buckets_resolve_per_device():
    assert EngineConfig(max_num_seqs=12).resolve_graph_batch_sizes("cuda") == (1, 2, 4, 8, 12)
    assert EngineConfig(max_num_seqs=8).resolve_graph_batch_sizes("cuda") == (1, 2, 4, 8)
    assert EngineConfig().resolve_graph_batch_sizes("cpu") == ()  # "auto": no padding on the CPU
    assert EngineConfig(graph_batch_sizes=[4, 2, 4]).resolve_graph_batch_sizes("cpu") == (2, 4)
    assert EngineConfig(graph_batch_sizes=None).resolve_graph_batch_sizes("cuda") == ()


def test_the_manifest_states_how_attention_reads_the_cache_and_why(bundle):
    from inferledger.engine import cpu_kernels

    ok, why = cpu_kernels.load()
    assert ok, why  # this machine has a compiler: the kernel builds or loads
    for choice, kernel, reason in (("auto", "paged", f"auto: {why}"),
                                   ("paged", "paged", f"paged (EngineConfig.attention): {why}"),
                                   ("gather", "gather", "gather (EngineConfig.attention)")):
        engine = LLMEngine(bundle, EngineConfig(attention=choice, num_blocks=8, probes=False))
        got = engine.manifest()["engine_config"]["resolved"]["attention"]
        assert (got["kernel"], got["resolved_by"]) == (kernel, reason)
        # seconds this process spent building it: none when it loaded an earlier build, never 0
        assert got["build_s"] is None or (kernel == "paged" and got["build_s"] > 0)
        assert engine.runner.paged is (kernel == "paged")


def test_engine_refuses_requests_it_can_never_serve(bundle):
    with pytest.raises(ValueError, match="admission"):
        EngineConfig(admission="greedy")
    with pytest.raises(ValueError, match="speculative.k"):
        EngineConfig(speculative={"k": 0})
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(max_num_seqs=8, max_num_batched_tokens=4)
    sink = RecordingSink()
    engine = LLMEngine(bundle, EngineConfig(num_blocks=4, max_num_seqs=2, probes=False), sink=sink)
    for ids, p, msg in [([], None, "empty"), ([1, 10**9], None, "outside"),
                        ([1] * 60, SamplingParams(max_tokens=8), "KV blocks"),
                        ([1], SamplingParams(max_tokens=9000), "max_model_len"),
                        ([1], SamplingParams(n=3), "max_num_seqs")]:
        with pytest.raises(ValueError, match=msg):
            engine.add_request(ids, p, request_id="x")
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2), request_id="ok")
    while engine.has_unfinished():
        engine.step()
    assert sink.rows == [] and sink.samples == []  # probes off: nothing emitted
    assert_no_leak(engine)


def test_stop_strings_min_tokens_ignore_eos_and_max_tokens(bundle, prompts, refs):
    ref, eos = refs[0], bundle.config.eos_ids
    assert ref[-1] in eos and len(ref) < MAX  # the reference answer ends with EOS
    full = bundle.tokenizer.decode(ref)
    stop = full[len(full) // 2: len(full) // 2 + 3]
    cut = ref[3]
    cases = {
        "len": SamplingParams(max_tokens=4),
        "eos": SamplingParams(max_tokens=MAX),
        "ignore": SamplingParams(max_tokens=len(ref) + 2, ignore_eos=True),
        "min": SamplingParams(max_tokens=len(ref) + 2, min_tokens=len(ref) + 1),
        "str": SamplingParams(max_tokens=MAX, stop=[stop]),
        "tok": SamplingParams(max_tokens=MAX, stop_token_ids=[cut]),
    }
    sink = RecordingSink()
    engine = LLMEngine(bundle, EngineConfig(num_blocks=64), sink=sink)
    for name, p in cases.items():
        engine.add_request(prompts[0], p, request_id=name)
    streamed, out = {k: "" for k in cases}, {}
    while engine.has_unfinished():
        for d in engine.step():
            streamed[d.request_id] += d.text
            if d.request_finished:
                out[d.request_id] = d.output
    assert_no_leak(engine)
    check_events(sink, list(out.values()))
    assert all(streamed[k] == out[k].text for k in cases)  # streamed text adds up to the final text
    assert (out["len"].token_ids, out["len"].finish_reason) == (ref[:4], "length")
    assert (out["eos"].token_ids, out["eos"].finish_reason) == (ref, "stop")
    assert "<|" not in out["eos"].text and out["eos"].text == full
    assert out["ignore"].token_ids[:len(ref)] == ref and out["ignore"].finish_reason == "length"
    assert len(out["ignore"].token_ids) == len(ref) + 2
    m = out["min"].token_ids
    assert len(m) >= len(ref) + 1 and m[:len(ref) - 1] == ref[:-1] and m[len(ref) - 1] not in eos
    assert out["str"].finish_reason == "stop" and out["str"].text == full[:full.index(stop)]
    k = ref.index(cut) + 1
    assert (out["tok"].token_ids, out["tok"].finish_reason) == (ref[:k], "stop")


def test_async_engine_streams_and_cancelling_the_consumer_aborts(bundle, prompts, refs):
    sink = RecordingSink()
    engine = LLMEngine(bundle, EngineConfig(num_blocks=64), sink=sink)

    async def consume(rid, prompt, max_tokens, stop_after=None):
        got = []
        async for d in aeng.generate(prompt, SamplingParams(max_tokens=max_tokens), request_id=rid):
            got += d.new_token_ids
            if stop_after and len(got) >= stop_after:
                await asyncio.sleep(3600)  # a stuck client: the task gets cancelled here
        return got

    async def main():
        full = asyncio.create_task(consume("full", prompts[0], MAX))
        early = asyncio.create_task(consume("early", prompts[1], 40, stop_after=2))
        while sum(1 for r in sink.rows if r["name"] == "engine.token" and r["request_id"] == "early") < 2:
            await asyncio.sleep(0.01)
        early.cancel()
        with pytest.raises(asyncio.CancelledError):
            await early
        return await full

    aeng = AsyncEngine(engine)
    try:
        assert asyncio.run(main()) == refs[0]
        for _ in range(500):
            if not engine.has_unfinished():
                break
            asyncio.run(asyncio.sleep(0.01))
    finally:
        aeng.close()
    assert_no_leak(engine)
    by = check_events(sink)
    assert attrs(by["early"][-1])["reason"] == "cancelled"
    assert "engine.cancel_effective" in [e["name"] for e in by["early"]]


# -- model-free pieces: drafting, exact acceptance, filters --------------------------------------

def test_prompt_lookup_drafts_continue_the_latest_earlier_match():
    from inferledger.engine.spec_decode import propose_ngram

    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert propose_ngram(toks, 2, 3, 1) == [7, 8]  # longest suffix n-gram, most recent occurrence
    assert propose_ngram(toks + [4], 3, 3, 1) == []  # 3-gram [2, 3, 4] and shorter never seen before
    assert propose_ngram([5, 6, 5], 4, 2, 1) == [6, 5]
    assert propose_ngram([1, 2], 0, 3, 1) == []


def test_rejection_sampling_keeps_the_target_distribution():
    import torch

    from inferledger.engine.sampler import Sampler
    from inferledger.engine.sequence import Sequence
    from inferledger.engine.spec_decode import verify

    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    p = torch.softmax(logits[0], -1)
    seq = Sequence([0, 1], SamplingParams(max_tokens=4, temperature=1.0, seed=0), request_id="r")
    sampler, trials = Sampler([]), 20000
    counts = torch.zeros(5)
    for draft in (1, 3):  # a likely and an unlikely draft token
        counts.zero_()
        accepted = 0
        for _ in range(trials):
            out, n_acc = verify(sampler, seq, logits, [draft])
            counts[out[0]] += 1
            accepted += n_acc
        assert torch.allclose(counts / trials, p, atol=0.015), (draft, counts / trials, p)
        assert abs(accepted / trials - p[draft].item()) < 0.015


def test_top_k_and_top_p_filter_the_distribution():
    import torch

    from inferledger.engine.sampler import Sampler
    from inferledger.engine.sequence import Sequence

    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    mk = lambda **kw: Sequence([0], SamplingParams(temperature=1.0, **kw), request_id="r")  # noqa: E731
    s = Sampler([3])
    assert torch.allclose(s.probs(logits, mk(top_k=2)), torch.tensor([0.625, 0.375, 0, 0]))
    assert torch.allclose(s.probs(logits, mk(top_p=0.8)), torch.tensor([0.625, 0.375, 0, 0]))
    assert torch.allclose(s.probs(logits, mk(top_p=0.81)), torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95)
    # before min_tokens, EOS (id 3) can never be drawn
    assert s.probs(logits, mk(min_tokens=2, max_tokens=4))[3] == 0


def test_top_p_over_a_large_vocabulary_keeps_the_smallest_set_reaching_it():
    import torch

    from inferledger.engine.sampler import Sampler
    from inferledger.engine.sequence import Sequence

    V = 5000  # three tokens hold 0.9 of the mass, the other 4,997 share 0.1 evenly
    weights = torch.full((V,), 0.1 / (V - 3))
    weights[[7, 4000, 123]] = torch.tensor([0.4, 0.3, 0.2])
    mk = lambda top_p: Sequence([0], SamplingParams(temperature=1.0, top_p=top_p), request_id="r")  # noqa: E731
    s = Sampler([])
    p = s.probs(torch.log(weights), mk(0.85))
    assert torch.nonzero(p).flatten().tolist() == [7, 123, 4000]
    assert torch.allclose(p[[7, 4000, 123]], torch.tensor([0.4, 0.3, 0.2]) / 0.9)
    # 0.95 needs about 2,500 of the even tokens (more than the candidates looked at first)
    p = s.probs(torch.log(weights), mk(0.95))
    kept = int((p > 0).sum())
    assert abs(kept - (3 + 2499)) <= 1 and abs(float(p.sum()) - 1.0) < 1e-5
    assert abs(float(p[7]) - 0.4 / (0.9 + (kept - 3) * 0.1 / (V - 3))) < 1e-5


def test_plain_sampled_rows_are_drawn_in_one_kernel_call_from_their_tempered_distribution(monkeypatch):
    import torch

    from inferledger.engine import cpu_kernels
    from inferledger.engine.sampler import Sampler
    from inferledger.engine.sequence import Sequence

    ok, why = cpu_kernels.load()
    assert ok, why
    inf = float("inf")
    x = torch.tensor([[-inf, 0.0, 1.0, -inf, 2.0, 0.5, -inf]])  # zero weights first, between and last
    want = torch.softmax(x[0] / 0.5, -1)
    g, trials = torch.Generator().manual_seed(3), 20000
    us = torch.rand(trials, generator=g, dtype=torch.float64)
    tokens = [int(cpu_kernels.sample_rows(x, torch.tensor([2.0]), us[i:i + 1])) for i in range(trials)]
    counts = torch.bincount(torch.tensor(tokens), minlength=7) / trials
    assert counts[0] == counts[3] == counts[6] == 0
    assert torch.allclose(counts, want, atol=0.015), counts
    # u at its ends: the first and the last token with weight, never a zero-weight neighbour
    ends = cpu_kernels.sample_rows(x.repeat(2, 1), torch.tensor([2.0, 2.0]), torch.tensor([0.0, 1.0 - 2 ** -53],
                                                                                          dtype=torch.float64))
    assert ends.tolist() == [1, 5]
    # past one block of the kernel's sums (a vocabulary of 49,159): one dominant token, and a NaN row refused
    big = torch.full((2, 49159), -30.0)
    big[0, 40000] = 10.0
    big[1, 7] = float("nan")
    assert cpu_kernels.sample_rows(big, torch.ones(2), torch.tensor([0.5, 0.5], dtype=torch.float64)).tolist() == [40000, -1]
    # through the sampler: the plain rows in one call, top-k, a masked row and greedy rows as before
    calls = []
    real = cpu_kernels.sample_rows
    monkeypatch.setattr(cpu_kernels, "sample_rows", lambda *a: calls.append(a[0].shape) or real(*a))
    logits = torch.randn(5, 50, generator=g)
    rows = list(logits)

    def seq(seed, **kw):
        return Sequence([1], SamplingParams(max_tokens=4, seed=seed, **kw), request_id="r")
    seqs = [seq(1, temperature=1.0), seq(2, temperature=0.7, top_k=5), seq(1, temperature=1.0),
            seq(4, temperature=1.0, min_tokens=1), seq(5)]
    s = Sampler(eos_ids=[3])
    s.prepare([r if q.params.greedy else None for r, q in zip(rows, seqs)])
    s.prepare_draws([None if q.params.greedy else r for r, q in zip(rows, seqs)], seqs)
    assert calls == [torch.Size([2, 50])]  # rows 0 and 2, stacked (not back to back)
    got = [s.sample(r, q) for r, q in zip(rows, seqs)]
    assert got[4] == int(torch.argmax(logits[4])) and got[3] != 3  # greedy; EOS masked before min_tokens
    again = seq(1, temperature=1.0)  # one seed, one draw, whatever else shares the batch
    s.prepare_draws([rows[0]], [again])
    assert s.sample(rows[0], again) == got[0] and len(calls) == 2
    nan_row, bad = torch.full((50,), float("nan")), seq(6, temperature=1.0)
    s.prepare_draws([nan_row], [bad])
    with pytest.raises(ValueError, match="cannot draw a token"):
        s.sample(nan_row, bad)
    # what the engine's manifest records: the kernel drew rows 0 and 2 and `again`; top-k and the masked row went
    # to torch; the lone greedy row took its own argmax, two greedy rows of a step take the batch's
    greedy = [seq(7), seq(8)]
    s.prepare(rows[:2])
    assert [s.sample(r, q) for r, q in zip(rows[:2], greedy)] == torch.argmax(logits[:2], -1).tolist()
    assert s.manifest() == {"kernel": "loaded", "tokens": {"argmax_kernel": 2, "argmax_batch": 0, "argmax_row": 1,
                                                           "kernel_draw": 3, "torch_draw": 2}}


def test_the_argmax_kernel_chooses_as_torch_argmax_does():
    import torch

    from inferledger.engine import cpu_kernels

    ok, why = cpu_kernels.load()
    assert ok, why
    inf, nan = float("inf"), float("nan")
    rows = torch.randn(6, 49159, generator=torch.Generator().manual_seed(5))  # 16 lanes and a tail of 7
    rows[1, [100, 20000, 49158]] = 9.0  # equal maxima, one in the tail: the first wins
    rows[2, [3, 40000]] = nan  # NaNs: the first NaN
    rows[3] = -inf  # nothing above -inf: index 0
    rows[4, 49158] = 50.0  # the maximum in the tail
    rows[5, [17, 33]] = 7.0  # equal maxima in one lane
    want = [int(torch.argmax(rows[0])), 100, 3, 0, 49158, 17]
    assert cpu_kernels.argmax_rows(rows).tolist() == torch.argmax(rows, -1).tolist() == want
    short = torch.tensor([[1.0, 3.0, 3.0], [nan, 1.0, nan], [1.0, 2.0, nan]])  # fewer values than lanes
    assert cpu_kernels.argmax_rows(short).tolist() == torch.argmax(short, -1).tolist() == [1, 0, 2]


def test_a_step_hands_its_deltas_to_each_event_loop_in_one_call():
    from inferledger.engine.outputs import RequestDelta

    class Loop:  # records what the step thread hands over
        def __init__(self):
            self.calls = []

        def call_soon_threadsafe(self, fn, *args):
            self.calls.append((fn, args))

    ae, loops = AsyncEngine(engine=None), [Loop(), Loop()]
    queues = {f"a{i}": asyncio.Queue() for i in range(17)}
    for i, (aid, q) in enumerate(queues.items()):
        ae._streams[aid] = (loops[i % 2], q)
    deltas = [RequestDelta(f"r{i}", aid, 0, [i], str(i)) for i, aid in enumerate(queues)]
    deltas += [RequestDelta("r0", "a0", 0, [99], "x", finished=True), RequestDelta("gone", "gone", 0, [1], "")]
    ae._dispatch(deltas)
    assert [len(loop.calls) for loop in loops] == [1, 1]  # one per loop, not one per delta (18 before)
    for loop in loops:
        fn, args = loop.calls[0]
        fn(*args)
    got = {aid: [q.get_nowait().new_token_ids for _ in range(q.qsize())] for aid, q in queues.items()}
    assert got["a0"] == [[0], [99]] and got["a16"] == [[16]] and all(len(v) == 1 for k, v in got.items() if k != "a0")



def test_serving_freezes_the_startup_objects_out_of_the_collector_until_the_last_engine_stops():
    """A full collection over the startup objects (the model, the compiled graphs) held the interpreter for
    hundreds of ms while steps slept behind it: while engines serve they are frozen; the last one to stop
    thaws them, so a process that serves no more collects them again."""
    import gc

    class Idle:  # an engine with nothing to do
        def place_step_thread(self):
            pass

        def has_unfinished(self):
            return False

        def close(self):
            pass

    from inferledger.engine import async_engine

    assert not async_engine._RUNNING  # every engine an earlier test started was closed
    gc.unfreeze()
    startup = [[i] for i in range(1000)]  # tracked by the collector
    a, b = AsyncEngine(Idle(), idle_wait_s=0.001), AsyncEngine(Idle(), idle_wait_s=0.001)
    try:
        a.start()
        frozen = gc.get_freeze_count()
        assert frozen >= len(startup)
        b.start()  # a second engine of the process: nothing more to freeze than what was alive at the first
        assert gc.get_freeze_count() == frozen
        a.close()
        assert gc.get_freeze_count() == frozen  # b still serves
    finally:
        b.close()
        a.close()
    assert gc.get_freeze_count() == 0

def test_a_draw_follows_the_distribution_and_never_picks_a_zero_weight_token():
    import torch

    from inferledger.engine.sampler import draw

    weights = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0])  # zeros first, between and last
    g, trials = torch.Generator().manual_seed(3), 20000
    counts = torch.zeros(6)
    for _ in range(trials):
        counts[draw(weights * 7.0, g)] += 1  # unnormalised weights: the same distribution
    assert counts[0] == counts[2] == counts[5] == 0
    assert torch.allclose(counts / trials, weights, atol=0.015), counts / trials
    # a seed reproduces the draws; a one-hot distribution always gives its token
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert [draw(weights, g1) for _ in range(50)] == [draw(weights, g2) for _ in range(50)]
    assert {draw(torch.tensor([0.0, 0.0, 1.0]), g) for _ in range(100)} == {2}
    # NaN, negative or all-zero weights are refused, never turned into a plausible token
    for bad in ([0.5, float("nan")], [0.0, 0.0], [0.7, -0.2], [float("inf"), 1.0]):
        with pytest.raises(ValueError, match="cannot draw a token"):
            draw(torch.tensor(bad), g)


def test_events_and_kv_samples_land_in_a_run_directory(bundle, prompts, tmp_path):
    import pyarrow.parquet as pq

    from inferledger.collectors.rundir.writer import RunWriter

    with RunWriter(tmp_path / "r1") as writer:
        llm = LLM(bundle=bundle, config=EngineConfig(num_blocks=32), sink=writer, run_id="r1")
        out = llm.generate([prompts[2]], SamplingParams(max_tokens=3))[0]
    events = pq.read_table(tmp_path / "r1" / "events").to_pylist()
    samples = pq.read_table(tmp_path / "r1" / "samples").to_pylist()
    assert {e["run_id"] for e in events} == {"r1"}
    assert [e["value"] for e in events if e["name"] == "engine.token"] == [1, 1, 1] == [1] * len(out.token_ids)
    assert {s["metric"] for s in samples} == {"kv_blocks_used", "kv_blocks_cached", "kv_blocks_free"}
    last = {s["metric"]: s["value"] for s in samples[-3:]}
    assert last["kv_blocks_used"] == 0 and sum(last.values()) == 32


def test_a_kv_pool_larger_than_the_memory_there_is_refused_before_it_is_allocated(bundle):
    """10^13 blocks of 16 tokens: refused by name with the sizes, not an allocation traceback (or a kill)."""
    with pytest.raises(ValueError, match=r"num_blocks=10000000000000: the KV cache would take .* GiB but .* GiB is "
                                         r"available on cpu; give fewer blocks \(--num-gpu-blocks-override\)"):
        LLMEngine(bundle, EngineConfig(num_blocks=10**13))


def test_the_kv_pool_check_compares_the_pool_with_what_is_available():
    import torch

    from inferledger.engine.llm_engine import _check_kv_fits

    _check_kv_fits(2**30, 64, torch.device("cpu"), available=2**30)  # exactly fits
    with pytest.raises(ValueError, match="would take 1 GiB but 0.5 GiB is available on cpu"):
        _check_kv_fits(2**30, 64, torch.device("cpu"), available=2**29)
