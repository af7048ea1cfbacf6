"""The attention kernels over the paged KV cache, without a model: whatever mix of chunks a step
holds and however the blocks are scattered, each query attends to exactly the keys a plain causal
attention over its whole sequence gives it."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from inferledger.engine import cpu_kernels
from inferledger.engine.attention import PAGED_MAX_CHUNK, DecodeAttention, PagedAttention, decode_groups, width_groups

KV, H, D, BS, BLOCKS = 2, 6, 8, 4, 48


def _cache(blocks=BLOCKS, dtype=torch.float32):
    return torch.zeros(1, blocks, KV, BS, D, dtype=dtype), torch.zeros(1, blocks, KV, BS, D, dtype=dtype)


def _slots(table, start, n):
    return [table[p // BS] * BS + p % BS for p in range(start, start + n)]


def _reference(q, k, v, start):
    """Queries at positions start.. over keys 0..their own position, from contiguous K/V [L, KV, D]."""
    n, ctx = q.shape[0], k.shape[0]
    mask = torch.arange(ctx)[None, :] <= torch.arange(start, start + n)[:, None]
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       attn_mask=mask, enable_gqa=True)
    return o[0].transpose(0, 1)


@pytest.fixture(scope="module")
def kernel():
    """The paged kernel, built (or loaded) as the engine does; this machine has a compiler, so it must load."""
    ok, why = cpu_kernels.load()
    assert ok, why


def _step(attn_cls, k_cache, v_cache, chunks, groups=None, paged=False):
    """One step of chunks [(table, start, q, k, v)] through a kernel; -> its output [T, H, D]."""
    slots = torch.tensor([s for table, start, q, *_ in chunks for s in _slots(table, start, q.shape[0])])
    q, k, v = (torch.cat([c[i] for c in chunks]) for i in (2, 3, 4))
    if attn_cls is PagedAttention:
        seqs, q0 = [], 0
        for table, start, cq, *_ in chunks:
            seqs.append((q0, cq.shape[0], start, table[:-(-(start + cq.shape[0]) // BS)]))
            q0 += cq.shape[0]
        attn = PagedAttention(k_cache, v_cache, slots, seqs, paged)
    else:
        attn = DecodeAttention(k_cache, v_cache, slots, groups)
    return attn(0, q, k, v)


def _sequences(lengths, seed=0, blocks=BLOCKS):
    """Per sequence: a shuffled, disjoint block table and random q/k/v for every position."""
    gen = torch.Generator().manual_seed(seed)
    pool = list(range(blocks))
    random.Random(seed).shuffle(pool)
    seqs, at = [], 0
    for n in lengths:
        width = -(-n // BS)
        seqs.append((pool[at:at + width], torch.randn(n, H, D, generator=gen), torch.randn(n, KV, D, generator=gen),
                     torch.randn(n, KV, D, generator=gen)))
        at += width
    return seqs


@pytest.mark.parametrize("paged", [False, True], ids=["gather", "paged"])
def test_a_mixed_step_attends_as_plain_causal_attention(paged, request):
    # (context already cached, new tokens): a fresh prompt, a continued prefill short enough for the
    # paged kernel and one too long for it, decodes of three context widths (batched in groups when
    # gathered) and a fresh single token
    if paged:
        request.getfixturevalue("kernel")
    plan = [(0, 5), (7, 4), (3, 1), (40, 1), (17, 1), (0, 1), (9, PAGED_MAX_CHUNK + 3)]
    seqs = _sequences([c + n for c, n in plan])
    k_cache, v_cache = _cache()
    earlier = [(t, 0, q[:c], k[:c], v[:c]) for (c, _), (t, q, k, v) in zip(plan, seqs) if c]
    _step(PagedAttention, k_cache, v_cache, earlier)  # writes the cached context
    now = [(t, c, q[c:], k[c:], v[c:]) for (c, _), (t, q, k, v) in zip(plan, seqs)]
    out = _step(PagedAttention, k_cache, v_cache, now, paged=paged)
    want = torch.cat([_reference(q[c:], k, v, c) for (c, _), (t, q, k, v) in zip(plan, seqs)])
    assert out.shape == (sum(n for _, n in plan), H, D)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)


def test_grouped_decodes_attend_as_plain_causal_attention():
    lengths = [4, 41, 18, 2, 33, 9]  # the new token is each sequence's last
    seqs = _sequences(lengths, seed=1)
    k_cache, v_cache = _cache()
    _step(PagedAttention, k_cache, v_cache, [(t, 0, q[:-1], k[:-1], v[:-1]) for t, q, k, v in seqs])
    tables = [t for t, *_ in seqs]
    groups = decode_groups(tables, lengths, k_cache.shape[1:], torch.float32, "cpu")
    assert len(groups) > 1  # these widths are attended in more than one group
    order = [r for rows, _ in groups for r in rows]
    chunks = [(tables[r], lengths[r] - 1, *(x[-1:] for x in seqs[r][1:])) for r in order]
    out = _step(DecodeAttention, k_cache, v_cache, chunks, [(len(rows), g) for rows, g in groups])
    want = torch.cat([_reference(q[-1:], k, v, n - 1) for n, (_, q, k, v) in ((lengths[r], seqs[r]) for r in order)])
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)


def test_paged_decodes_attend_in_place_as_plain_causal_attention(kernel):
    # one group of every row, in order, whatever the widths: nothing is gathered or padded
    lengths = [4, 41, 18, 2, 33, 9, 1]
    seqs = _sequences(lengths, seed=1)
    k_cache, v_cache = _cache()
    _step(PagedAttention, k_cache, v_cache, [(t, 0, q[:-1], k[:-1], v[:-1]) for t, q, k, v in seqs if q.shape[0] > 1])
    tables = [t for t, *_ in seqs]
    groups = decode_groups(tables, lengths, k_cache.shape[1:], torch.float32, "cpu", paged=True)
    assert [rows for rows, _ in groups] == [list(range(len(lengths)))]
    chunks = [(tables[r], lengths[r] - 1, *(x[-1:] for x in seqs[r][1:])) for r in range(len(lengths))]
    out = _step(DecodeAttention, k_cache, v_cache, chunks, [(len(lengths), groups[0][1])])
    want = torch.cat([_reference(q[-1:], k, v, n - 1) for n, (_, q, k, v) in zip(lengths, seqs)])
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("paged", [False, True], ids=["gather", "paged"])
def test_bf16_paged_step_attends_as_fp32_causal_attention(paged, request):
    # bf16 cache: the paged kernel computes in fp32 and rounds once; the gather path within bf16 bounds
    if paged:
        request.getfixturevalue("kernel")
    plan = [(70, 1), (12, 3), (0, 4), (33, 1)]
    seqs = _sequences([c + n for c, n in plan], seed=4, blocks=100)
    k_cache, v_cache = _cache(100, torch.bfloat16)
    bf = lambda x: x.bfloat16()  # noqa: E731
    _step(PagedAttention, k_cache, v_cache, [(t, 0, bf(q[:c]), bf(k[:c]), bf(v[:c]))
                                             for (c, _), (t, q, k, v) in zip(plan, seqs) if c])
    out = _step(PagedAttention, k_cache, v_cache, [(t, c, bf(q[c:]), bf(k[c:]), bf(v[c:]))
                                                   for (c, _), (t, q, k, v) in zip(plan, seqs)], paged=paged)
    r32 = lambda x: x.bfloat16().float()  # noqa: E731
    want = torch.cat([_reference(r32(q[c:]), r32(k), r32(v), c) for (c, _), (t, q, k, v) in zip(plan, seqs)])
    assert out.dtype == torch.bfloat16
    # the paged kernel's only rounding is the output's (half a bf16 ulp); the gather path rounds scores too
    bound = 2 ** -8 if paged else 2e-2
    torch.testing.assert_close(out.float(), want, atol=bound, rtol=bound)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_chunks_in_tiles_attend_as_plain_causal_attention(kernel, dtype):
    # the engine's shape (blocks of 16, heads of 64, 9 over 3): a chunk's rows share each block in
    # tiles of up to 8 rows; chunks of 2, 9 and PAGED_MAX_CHUNK tokens over cached contexts of 5 to 100,
    # beside a decode and a fresh prompt
    kv, h, d, bs, blocks = 3, 9, 64, 16, 64
    plan = [(5, 2), (40, 9), (100, PAGED_MAX_CHUNK), (70, 1), (0, 6)]
    gen = torch.Generator().manual_seed(11)
    pool = torch.randperm(blocks, generator=gen).tolist()
    seqs, at = [], 0
    for c, n in plan:
        width = -(-(c + n) // bs)
        seqs.append((pool[at:at + width], *(torch.randn(c + n, heads, d, generator=gen).to(dtype) for heads in (h, kv, kv))))
        at += width
    k_cache = torch.zeros(1, blocks, kv, bs, d, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)

    def step(chunks, paged):
        slots = torch.tensor([t[p // bs] * bs + p % bs for t, start, q, *_ in chunks for p in range(start, start + q.shape[0])])
        meta, q0 = [], 0
        for t, start, q, *_ in chunks:
            meta.append((q0, q.shape[0], start, t[:-(-(start + q.shape[0]) // bs)]))
            q0 += q.shape[0]
        return PagedAttention(k_cache, v_cache, slots, meta, paged)(0, *(torch.cat([c[i] for c in chunks]) for i in (2, 3, 4)))

    step([(t, 0, q[:c], k[:c], v[:c]) for (c, _), (t, q, k, v) in zip(plan, seqs) if c], False)
    out = step([(t, c, q[c:], k[c:], v[c:]) for (c, _), (t, q, k, v) in zip(plan, seqs)], True)
    f = lambda x: x.float()  # noqa: E731
    want = torch.cat([_reference(f(q[c:]), f(k), f(v), c) for (c, _), (t, q, k, v) in zip(plan, seqs)])
    bound = 1e-5 if dtype == torch.float32 else 2 ** -8
    torch.testing.assert_close(out.float(), want, atol=bound, rtol=bound)


@pytest.mark.parametrize("d", [64, 128])
def test_bf16_decodes_through_the_kernel_attend_as_fp32_attention_at_block_edges(kernel, d):
    # a bf16 decode goes through the registers' path where the CPU has AVX-512 BF16 (its probabilities
    # rounded to bf16 before they weight V) or through the transposed block: either way within 2^-8 of fp32
    # attention over the same bf16 values, for contexts that end on, just past and just before a block's
    # edge, a lone key and a long context
    kv, h, bs, blocks = 3, 9, 16, 64
    contexts = [1, 15, 16, 17, 33, 300]
    gen = torch.Generator().manual_seed(5)
    pool = torch.randperm(blocks, generator=gen).tolist()
    k_cache = torch.randn(blocks, kv, bs, d, generator=gen).bfloat16()
    v_cache = torch.randn(blocks, kv, bs, d, generator=gen).bfloat16()
    width = -(-max(contexts) // bs)
    tables = torch.tensor([pool[i:i + width] for i in range(len(contexts))])  # overlapping tables: blocks shared
    q = torch.randn(len(contexts), h, d, generator=gen).bfloat16()
    out = torch.ops.inferledger_cpu.paged_attention(q, k_cache, v_cache, tables, torch.arange(len(contexts)),
                                                    torch.tensor(contexts), d ** -0.5)
    assert out.dtype == torch.bfloat16
    for r, ctx in enumerate(contexts):
        rows = torch.cat([torch.arange(b * bs, b * bs + bs) for b in tables[r].tolist()])[:ctx]
        k = k_cache.permute(0, 2, 1, 3).reshape(-1, kv, d)[rows].float()
        v = v_cache.permute(0, 2, 1, 3).reshape(-1, kv, d)[rows].float()
        want = _reference(q[r:r + 1].float(), k, v, ctx - 1)
        torch.testing.assert_close(out[r:r + 1].float(), want, atol=2 ** -8, rtol=2 ** -8)


@pytest.mark.parametrize("rows", [1, 16, 64])
@pytest.mark.parametrize("kv,h,d", [(3, 9, 64), (2, 8, 128), (4, 4, 64), (2, 4, 64), (1, 6, 64)],
                         ids=["9-over-3", "8-over-2-d128", "4-over-4", "4-over-2", "6-over-1"])
def test_bf16_decode_batches_attend_as_fp32_attention_whatever_lies_past_their_keys(kernel, kv, h, d, rows):
    # decode batches of 1, 16 and 64 rows, query groups of 3, 4, 1, 2 (the registers' path where the CPU has
    # AVX-512 BF16) and 6 (the transposed tiles), contexts on, across and short of block edges; each row's
    # blocks its own, the slots past its context NaN (a cache's never-written rows hold anything): none is read
    bs = 16
    contexts = [[1, 15, 16, 17, 31, 33, 100, 250][i % 8] for i in range(rows)]
    widths = [-(-c // bs) for c in contexts]
    gen = torch.Generator().manual_seed(rows + h)
    pool = torch.randperm(sum(widths), generator=gen).tolist()
    k_cache = torch.randn(sum(widths), kv, bs, d, generator=gen).bfloat16()
    v_cache = torch.randn(sum(widths), kv, bs, d, generator=gen).bfloat16()
    tables = torch.zeros(rows, max(widths), dtype=torch.long)
    at = 0
    for r, (ctx, w) in enumerate(zip(contexts, widths)):
        tables[r, :w] = torch.tensor(pool[at:at + w])
        at += w
        for cache in (k_cache, v_cache):
            cache[tables[r, w - 1], :, (ctx - 1) % bs + 1:] = float("nan")
    q = torch.randn(rows, h, d, generator=gen).bfloat16()
    out = cpu_kernels.paged_attention(q, k_cache, v_cache, tables, torch.arange(rows), torch.tensor(contexts), d ** -0.5)
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    for r, ctx in enumerate(contexts):
        slots = torch.cat([torch.arange(b * bs, b * bs + bs) for b in tables[r, :widths[r]].tolist()])[:ctx]
        k, v = (c.permute(0, 2, 1, 3).reshape(-1, kv, d)[slots].float() for c in (k_cache, v_cache))
        torch.testing.assert_close(out[r:r + 1].float(), _reference(q[r:r + 1].float(), k, v, ctx - 1), atol=2 ** -8,
                                   rtol=2 ** -8)


def test_the_paged_kernel_refuses_a_row_it_cannot_read(kernel):
    k_cache, v_cache = (c[0] for c in _cache())
    q = torch.zeros(2, H, D)
    tables = torch.tensor([[0, 1], [2, 47]])
    ok = cpu_kernels.paged_attention(q, k_cache, v_cache, tables, torch.tensor([0, 1]), torch.tensor([8, 5]), 1.0)
    assert ok.shape == (2, H, D)
    for seq, ctx, words in (([0, 2], [3, 3], "q_seq[1] = 2 is not a row of tables"),
                            ([0, 1], [3, 9], "q_ctx[1] = 9 is outside [1, 8]"),
                            ([0, 1], [0, 3], "q_ctx[0] = 0 is outside [1, 8]")):
        with pytest.raises(RuntimeError, match=words.replace("[", r"\[").replace("]", r"\]")):
            cpu_kernels.paged_attention(q, k_cache, v_cache, tables, torch.tensor(seq), torch.tensor(ctx), 1.0)
    with pytest.raises(RuntimeError, match=r"block 48 of row 1 is outside \[0, 48\)"):
        cpu_kernels.paged_attention(q, k_cache, v_cache, torch.tensor([[0, 1], [2, 48]]), torch.tensor([0, 1]),
                                     torch.tensor([3, 5]), 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_write_and_the_kernel_in_one_call_equal_them_apart(kernel, dtype):
    # layer 1 of two: the new rows land where index_copy_ puts them, layer 0 is untouched, and the
    # output is the kernel's over the written cache, bit for bit
    gen = torch.Generator().manual_seed(5)
    caches = [torch.randn(2, BLOCKS, KV, BS, D, generator=gen).to(dtype) for _ in range(2)]
    fused = [c.clone() for c in caches]
    q, k, v = torch.randn(3, H, D, generator=gen), torch.randn(3, KV, D, generator=gen), torch.randn(3, KV, D, generator=gen)
    rows = torch.tensor([5, 6, 40, 41, 90, 91])  # of layer 1 viewed as [BLOCKS * KV * BS, D]
    tables, q_seq, q_ctx = torch.tensor([[0, 3, 7], [11, 5, 0]]), torch.tensor([0, 0, 1]), torch.tensor([9, 10, 6])
    for c, x in zip(caches, (k, v)):
        c[1].view(-1, D).index_copy_(0, rows, x.reshape(-1, D).to(dtype))
    want = cpu_kernels.paged_attention(q.to(dtype), caches[0][1], caches[1][1], tables, q_seq, q_ctx, 0.3).to(q.dtype)
    got = cpu_kernels.paged_attention_write(q, k, v, *fused, 1, rows, tables, q_seq, q_ctx, 0.3)
    assert got.dtype == q.dtype and torch.equal(got, want)
    assert torch.equal(fused[0], caches[0]) and torch.equal(fused[1], caches[1])
    with pytest.raises(RuntimeError, match=r"rows\[5\] = 384 is outside \[0, 384\)"):
        cpu_kernels.paged_attention_write(q, k + 1, v + 1, *fused, 1, torch.tensor([5, 6, 40, 41, 90, 384]), tables,
                                          q_seq, q_ctx, 0.3)
    assert torch.equal(fused[0], caches[0]) and torch.equal(fused[1], caches[1])  # nothing written by the refused call
    with pytest.raises(RuntimeError, match=r"rows must be a contiguous int64 \[6\]"):
        cpu_kernels.paged_attention_write(q, k, v, *fused, 1, rows[:4], tables, q_seq, q_ctx, 0.3)
    with pytest.raises(RuntimeError, match="and a layer of them"):
        cpu_kernels.paged_attention_write(q, k, v, *fused, 2, rows, tables, q_seq, q_ctx, 0.3)


def test_without_a_compiler_the_engine_gathers_and_says_why(monkeypatch, tmp_path):
    from inferledger.engine import EngineConfig

    monkeypatch.setenv("CXX", "no-such-compiler-here")
    monkeypatch.setattr(cpu_kernels, "_STATE", {})  # as in a fresh process
    assert EngineConfig(attention="paged").resolve_attention("cpu", torch.float32) == (
        False, "gather: no C++ compiler (no-such-compiler-here) to build the CPU kernels")
    assert EngineConfig().resolve_attention("cuda", torch.bfloat16)[0] is False
    assert EngineConfig(attention="gather").resolve_attention("cpu", torch.float32) == (
        False, "gather (EngineConfig.attention)")
    with pytest.raises(ValueError, match="attention='fast'"):
        EngineConfig(attention="fast")
    monkeypatch.delenv("CXX")  # a compiler, but nowhere to keep its build: gather, and the reason names the folder
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(cpu_kernels, "_STATE", {})
    paged, why = EngineConfig().resolve_attention("cpu", torch.float32)
    assert not paged and why.startswith(f"gather: the CPU kernels' cache {blocked}/inferledger/kernels is not writable")
    monkeypatch.setenv("INFERLEDGER_ATTENTION", "gather")
    assert EngineConfig().resolve_attention("cpu", torch.float32) == (False, "gather ($INFERLEDGER_ATTENTION)")
    monkeypatch.setenv("INFERLEDGER_ATTENTION", "fast")
    with pytest.raises(ValueError, match=r"\$INFERLEDGER_ATTENTION='fast': use auto, paged or gather"):
        EngineConfig().resolve_attention("cpu", torch.float32)


def test_bf16_decode_groups_attend_as_fp32_causal_attention():
    # 8 rows x 80 keys is past BMM_MIN_SCORES (two batched matmuls); one row of 3 keys is below it (flash kernel)
    from inferledger.engine.attention import BMM_MIN_SCORES

    lengths = [80, 77, 79, 74, 78, 76, 80, 75, 3]
    seqs = _sequences(lengths, seed=6, blocks=200)
    k_cache, v_cache = _cache(200, torch.bfloat16)
    _step(PagedAttention, k_cache, v_cache, [(t, 0, q[:-1].bfloat16(), k[:-1].bfloat16(), v[:-1].bfloat16())
                                             for t, q, k, v in seqs])
    tables = [t for t, *_ in seqs]
    groups = decode_groups(tables, lengths, k_cache.shape[1:], torch.bfloat16, "cpu")
    assert sorted(len(rows) * len(tables[rows[0]]) * BS >= BMM_MIN_SCORES for rows, _ in groups) == [False, True]
    order = [r for rows, _ in groups for r in rows]
    chunks = [(tables[r], lengths[r] - 1, *(x[-1:].bfloat16() for x in seqs[r][1:])) for r in order]
    out = _step(DecodeAttention, k_cache, v_cache, chunks, [(len(rows), g) for rows, g in groups])
    # the reference: fp32 over the same bf16-rounded inputs
    r32 = lambda x: x.bfloat16().float()  # noqa: E731
    want = torch.cat([_reference(r32(q[-1:]), r32(k), r32(v), n - 1) for n, (_, q, k, v) in
                      ((lengths[r], seqs[r]) for r in order)])
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_width_groups_cover_every_row_once_widest_first():
    widths = [1, 9, 2, 9, 30, 1, 3, 28]
    for overhead, n_groups in ((0, 6), (16, 3), (10_000, 1)):  # 0: one group per distinct width
        groups = width_groups(widths, overhead)
        assert sorted(r for g in groups for r in g) == list(range(len(widths)))
        assert len(groups) == n_groups
        tops = [max(widths[r] for r in g) for g in groups]
        assert tops == sorted(tops, reverse=True)
        for g in groups:  # rows of a group are contiguous in width order: no narrower group holds a wider row
            assert widths[g[0]] == max(widths[r] for r in g)
    assert width_groups(widths, 16) == [[4, 7], [1, 3], [6, 2, 0, 5]]
