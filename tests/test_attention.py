"""The attention kernels over the paged KV cache, without a model: whatever mix of chunks a step
holds and however the blocks are scattered, each query attends to exactly the keys a plain causal
attention over its whole sequence gives it."""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from inferledger.engine.attention import DecodeAttention, PagedAttention, decode_groups, width_groups

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


def _step(attn_cls, k_cache, v_cache, chunks, groups=None):
    """One step of chunks [(table, start, q, k, v)] through a kernel; -> its output [T, H, D]."""
    slots = torch.tensor([s for table, start, q, *_ in chunks for s in _slots(table, start, q.shape[0])])
    q, k, v = (torch.cat([c[i] for c in chunks]) for i in (2, 3, 4))
    if attn_cls is PagedAttention:
        seqs, q0 = [], 0
        for table, start, cq, *_ in chunks:
            seqs.append((q0, cq.shape[0], start, table[:-(-(start + cq.shape[0]) // BS)]))
            q0 += cq.shape[0]
        attn = PagedAttention(k_cache, v_cache, slots, seqs)
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


def test_a_mixed_step_attends_as_plain_causal_attention():
    # (context already cached, new tokens): a fresh prompt, a continued prefill, decodes of three
    # context widths (batched in groups) and a fresh single token
    plan = [(0, 5), (7, 4), (3, 1), (40, 1), (17, 1), (0, 1)]
    seqs = _sequences([c + n for c, n in plan])
    k_cache, v_cache = _cache()
    earlier = [(t, 0, q[:c], k[:c], v[:c]) for (c, _), (t, q, k, v) in zip(plan, seqs) if c]
    _step(PagedAttention, k_cache, v_cache, earlier)  # writes the cached context
    now = [(t, c, q[c:], k[c:], v[c:]) for (c, _), (t, q, k, v) in zip(plan, seqs)]
    out = _step(PagedAttention, k_cache, v_cache, now)
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
