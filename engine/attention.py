"""Attention kernels over the paged KV cache, and the cache layout they read and write.

Layout: the K (or V) cache of one layer is [num_blocks, n_kv_heads, block_size, head_dim]; K/V of the
token at position p of a sequence go to block block_table[p // block_size], offset p % block_size.
Heads are outermost within a block, so gathering whole (block, head) rows yields each sequence's keys
per head contiguous, [KV, L, D], the layout attention reads without a transpose copy.

`PagedAttention` serves a step of arbitrary chunks (single-token decodes batched, every other chunk
attended on its own); `DecodeAttention` a step of single-token decodes only, its rows in consecutive
groups; both batch decodes through `BatchedDecode`, grouped by similar context length
(`width_groups`). A kernel is built once per step (its write and gather indices computed then, reused
by every layer) and called per layer with the model's attention signature, attn(layer, q [T, H, D],
k [T, KV, D], v [T, KV, D]) -> [T, H, D]; it holds no state across steps. Only tensor ops run inside
the call, so the decode kernels are what CUDA graphs capture. `causal_attention` is the plain
reference path over one contiguous sequence, with no cache.

Two ways to read the paged context. `paged=True` (the CPU, when the kernel of engine/cpu_kernels.py
is built): the C++ kernel reads each row's blocks in place, with no copy and no padding, so every
decode row, whatever its length, goes through one call per layer, and so does every chunk of at most
`PAGED_MAX_CHUNK` new tokens. `paged=False` (CUDA, or a CPU without the kernel): the blocks are
gathered into a contiguous copy that SDPA (or two batched matmuls) reads. Longer prefill chunks
gather on both: they are compute-bound, and SDPA's flash kernel (blocked GEMMs) is faster there than
the paged kernel's tiles (measured 1.5-1.7x at 64-512 new tokens), while their gather costs O(context)
against O(tokens x context) arithmetic.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu_kernels import paged_attention, paged_attention_write


# Decode rows x keys from which a reduced-precision decode group on the CPU attends through two batched
# matmuls rather than the flash kernel: measured (bf16, one core, 3 KV heads of 3 queries, head_dim 64)
# 2.6x faster at 16 rows x 128 keys, even at 4 x 128, slower below (the flash kernel's per-call cost is lower)
BMM_MIN_SCORES = 512
# The most new tokens of one chunk that the paged kernel attends; longer chunks gather (see above). Measured
# (benchmarks/paged_attention.py: fp32 and bf16, one core): the kernel 2.2-2.7x faster than gather + SDPA at
# 4 tokens, 1.0-1.2x at 16, 0.6-0.7x from 64 on
PAGED_MAX_CHUNK = 16


def _write_rows(slots: torch.Tensor, n_kv: int, block_size: int) -> torch.Tensor:
    """Rows [T * KV] of the cache viewed as [blocks * KV * block_size, D] that the K (or V) heads
    of the tokens at these slots go to, token-major as k.reshape(T * KV, D)."""
    heads = torch.arange(n_kv, device=slots.device)
    return ((slots[:, None] // block_size * n_kv + heads) * block_size + slots[:, None] % block_size).reshape(-1)


def _gather_rows(table: torch.Tensor, n_kv: int) -> torch.Tensor:
    """Rows of the cache viewed as [blocks * KV, block_size * D] holding the blocks of a table
    [..., W], ordered [..., KV, W]: gathered, they are [..., KV, W * block_size, D]."""
    heads = torch.arange(n_kv, device=table.device)
    return (table[..., None, :] * n_kv + heads[:, None]).reshape(-1)


def _write_kv(k_cache, v_cache, rows, k, v):
    D = k_cache.shape[-1]
    k_cache.view(-1, D).index_copy_(0, rows, k.reshape(-1, D).to(k_cache.dtype))
    v_cache.view(-1, D).index_copy_(0, rows, v.reshape(-1, D).to(v_cache.dtype))


def _gather(cache, rows, out=None):
    """cache [blocks, KV, bs, D] -> the rows' blocks, [len(rows), bs * D] (into out when given)."""
    flat = cache.view(-1, cache.shape[-2] * cache.shape[-1])
    return torch.index_select(flat, 0, rows) if out is None else torch.index_select(flat, 0, rows, out=out)


class BatchedDecode:
    """Attention of one new token per sequence, batched across sequences: block tables padded to
    one width [B, W], keys past each sequence's length masked by an additive bias. Query heads are
    grouped per KV head, q [B, KV, H/KV, D], so no K/V is repeated for grouped-query attention.
    Only tensor ops, so the same code is captured into CUDA graphs."""

    def __init__(self, cache_shape, table: torch.Tensor, ctx_lens: torch.Tensor, dtype, k_buf=None, v_buf=None,
                 paged: bool = False):
        _, self.n_kv, bs, self.head_dim = cache_shape
        self.paged = paged
        if paged:  # the kernel reads the table itself; rows need no padding bias
            self.table, self.ctx = table.long().contiguous(), ctx_lens.long().contiguous()
            self.seq = torch.arange(table.shape[0], device=table.device)
            return
        self.rows = _gather_rows(table, self.n_kv)
        n = self.rows.shape[0]
        self.k_buf = None if k_buf is None else k_buf[:n]
        self.v_buf = None if v_buf is None else v_buf[:n]
        key_pos = torch.arange(table.shape[1] * bs, device=table.device)
        bias = torch.zeros(key_pos.shape[0], dtype=dtype, device=table.device)
        self.bias = bias.masked_fill(key_pos[None, :] >= ctx_lens[:, None], float("-inf"))[:, None, None, :]

    def attend(self, k_cache, v_cache, q):
        """q [B, H, D] -> [B, H, D]."""
        B, H, D = q.shape
        if self.paged:
            return _in_place(q, k_cache, v_cache, self.table, self.seq, self.ctx)
        if self.bias.dtype != q.dtype:
            self.bias = self.bias.to(q.dtype)
        ks = _gather(k_cache, self.rows, self.k_buf).view(B, self.n_kv, -1, D).to(q.dtype)
        vs = _gather(v_cache, self.rows, self.v_buf).view(B, self.n_kv, -1, D).to(q.dtype)
        qg = q.reshape(B, self.n_kv, H // self.n_kv, D)
        if q.dtype == torch.float32 or q.device.type != "cpu" or B * ks.shape[2] < BMM_MIN_SCORES:
            o = F.scaled_dot_product_attention(qg, ks, vs, attn_mask=self.bias)
        else:  # two batched matmuls (fp32 accumulation, as HF's eager attention), softmax in fp32
            s = torch.matmul(qg, ks.transpose(-1, -2)).float().mul_(D ** -0.5).add_(self.bias)
            o = torch.matmul(torch.softmax(s, dim=-1).to(q.dtype), vs)
        return o.reshape(B, H, D)


def width_groups(widths: list[int], overhead_blocks: int = 16) -> list[list[int]]:
    """Split decode rows into groups attended separately, each padded to its own widest block
    table: the partition (of rows sorted by width) minimising padded blocks gathered plus
    `overhead_blocks` per group (each group costs a gather and an attention call per layer).
    Rows of mixed lengths then do not all pay for the longest one. Groups widest first."""
    distinct = sorted(set(widths), reverse=True)
    count = {w: 0 for w in distinct}
    for w in widths:
        count[w] += 1
    best, cut = [0] + [float("inf")] * len(distinct), [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):  # best[j]: cost of the j widest distinct widths
        rows = 0
        for i in range(j - 1, -1, -1):  # last group: distinct[i:j], padded to distinct[i]
            rows += count[distinct[i]]
            cost = best[i] + overhead_blocks + rows * distinct[i]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], len(distinct)
    while j:
        bounds.append((distinct[cut[j]], distinct[j - 1]))
        j = cut[j]
    order = sorted(range(len(widths)), key=lambda r: -widths[r])
    return [[r for r in order if lo <= widths[r] <= hi] for hi, lo in reversed(bounds)]


def _in_place(q, k_cache, v_cache, tables, q_seq, q_ctx):
    """The paged kernel over q [T, H, D] (computed in the cache's dtype, returned in q's)."""
    o = paged_attention(q.to(k_cache.dtype).contiguous(), k_cache, v_cache, tables, q_seq, q_ctx, q.shape[-1] ** -0.5)
    return o.to(q.dtype)


def _padded(tables: list[list[int]], device) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=device)


def decode_groups(tables: list[list[int]], ctx_lens: list[int], cache_shape, dtype, device,
                  bufs=(None, None), paged: bool = False) -> list[tuple[list[int], BatchedDecode]]:
    """Rows of single-token decodes (block tables covering exactly their context) in width groups,
    each with its BatchedDecode; all groups gather into the same buffers, one after the other.
    paged: one group of every row in order (the paged kernel pays nothing for mixed lengths)."""
    if paged:
        ctx = torch.tensor(ctx_lens, dtype=torch.long, device=device)
        return [(list(range(len(tables))), BatchedDecode(cache_shape, _padded(tables, device), ctx, dtype, paged=True))]
    groups = []
    for rows in width_groups([len(t) for t in tables]):
        width = len(tables[rows[0]])
        table = torch.tensor([tables[r] + [0] * (width - len(tables[r])) for r in rows], device=device)
        ctx = torch.tensor([ctx_lens[r] for r in rows], device=device)
        groups.append((rows, BatchedDecode(cache_shape, table, ctx, dtype, *bufs)))
    return groups


class PagedAttention:
    """Attention for a step of arbitrary chunks: writes the new K/V into the cache, then attends
    over each sequence's paged context. paged=False: single-token decodes batched (in width groups),
    the other chunks one by one. paged=True: every query row of a decode or of a chunk of at most
    PAGED_MAX_CHUNK tokens in one kernel call, longer chunks one by one. Built per step; holds no
    state across steps."""

    def __init__(self, k_cache, v_cache, slots, seqs: list[tuple[int, int, int, list[int]]], paged: bool = False):
        self.k_cache, self.v_cache = k_cache, v_cache
        _, _, n_kv, bs, _ = k_cache.shape
        dev = slots.device
        self.rows = _write_rows(slots, n_kv, bs)
        self.decodes = []  # (query rows, BatchedDecode)
        self.in_place = None  # paged: (query rows or None for all of them, tables, q_seq, q_ctx)
        if paged:
            kernel = [s for s in seqs if s[2] > 0 and s[1] <= PAGED_MAX_CHUNK]
            seqs = [s for s in seqs if not (s[2] > 0 and s[1] <= PAGED_MAX_CHUNK)]
            if kernel:
                idx = [q0 + i for q0, n, _, _ in kernel for i in range(n)]
                as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=dev)  # noqa: E731
                self.in_place = (None if idx == list(range(slots.shape[0])) else as_long(idx),
                                 _padded([blocks for *_, blocks in kernel], dev),
                                 as_long([j for j, (_, n, _, _) in enumerate(kernel) for _ in range(n)]),
                                 as_long([start + i + 1 for _, n, start, _ in kernel for i in range(n)]))
        else:
            decodes = [(q0, blocks, start + 1) for q0, n, start, blocks in seqs if n == 1 and start > 0]
            if decodes:
                for rows, g in decode_groups([d[1] for d in decodes], [d[2] for d in decodes], k_cache.shape[1:],
                                             k_cache.dtype, dev):
                    self.decodes.append((torch.tensor([decodes[r][0] for r in rows], device=dev), g))
            seqs = [s for s in seqs if not (s[1] == 1 and s[2] > 0)]
        # the others: (offset in the flat batch, new tokens, start_pos, gather rows of the blocks or None)
        self.seqs = [(q0, n, start, _gather_rows(torch.tensor(blocks, device=dev), n_kv) if start else None)
                     for q0, n, start, blocks in seqs]

    def __call__(self, layer: int, q, k, v):
        if self.in_place is not None and self.in_place[0] is None and not self.decodes and not self.seqs:
            _, tables, q_seq, q_ctx = self.in_place  # every row in the kernel: the cache write and it in one call
            return paged_attention_write(q, k, v, self.k_cache, self.v_cache, layer, self.rows, tables, q_seq, q_ctx,
                                         q.shape[-1] ** -0.5)
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        _write_kv(k_cache, v_cache, self.rows, k, v)
        _, n_kv, _, head_dim = k_cache.shape
        if self.in_place is not None:
            idx, tables, q_seq, q_ctx = self.in_place
            o = _in_place(q if idx is None else q.index_select(0, idx), k_cache, v_cache, tables, q_seq, q_ctx)
            if idx is None:
                return o
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            out.index_copy_(0, idx, o)
        else:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        for idx, g in self.decodes:
            out.index_copy_(0, idx, g.attend(k_cache, v_cache, q.index_select(0, idx)))
        for q0, n, start, rows in self.seqs:
            # 4-D [1, heads, n, D]: the CPU flash kernel takes grouped-query 4-D input (3-D falls back to math)
            qs = q[q0:q0 + n].transpose(0, 1)[None]
            if rows is None:  # fresh sequence: its whole context is this chunk, no gather needed
                ks, vs = k[q0:q0 + n].transpose(0, 1)[None], v[q0:q0 + n].transpose(0, 1)[None]
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=n > 1, enable_gqa=True)
            else:
                ctx = start + n
                ks = _gather(k_cache, rows).view(1, n_kv, -1, head_dim)[:, :, :ctx].to(q.dtype)
                vs = _gather(v_cache, rows).view(1, n_kv, -1, head_dim)[:, :, :ctx].to(q.dtype)
                mask = None
                if n > 1:  # query i sits at position start + i and sees keys 0..start + i
                    q_pos = torch.arange(start, ctx, device=q.device)
                    mask = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
            out[q0:q0 + n] = o[0].transpose(0, 1)
        return out


class DecodeAttention:
    """Attention for a batch of one new token per sequence, whose rows come in consecutive groups
    [(number of rows, BatchedDecode)] (a single group on the padded / CUDA-graph path)."""

    def __init__(self, k_cache, v_cache, slots, groups: list[tuple[int, BatchedDecode]]):
        self.k_cache, self.v_cache, self.groups = k_cache, v_cache, groups
        _, _, n_kv, bs, _ = k_cache.shape
        self.rows = _write_rows(slots, n_kv, bs)

    def __call__(self, layer: int, q, k, v):
        if len(self.groups) == 1 and self.groups[0][1].paged:  # the cache write and the kernel in one call
            g = self.groups[0][1]
            return paged_attention_write(q, k, v, self.k_cache, self.v_cache, layer, self.rows, g.table, g.seq, g.ctx,
                                         q.shape[-1] ** -0.5)
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        _write_kv(k_cache, v_cache, self.rows, k, v)
        outs, a = [], 0
        for n, g in self.groups:
            outs.append(g.attend(k_cache, v_cache, q[a:a + n]))
            a += n
        return outs[0] if len(outs) == 1 else torch.cat(outs)


def causal_attention(layer_idx: int, q, k, v):
    """Attention for one whole sequence held in q/k/v (no cache): the plain reference path."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return out.transpose(0, 1)
