"""ModelRunner: one engine step over a paged KV cache.

All chunks' tokens are flattened into one batch [T] for the embedding, projection and MLP matmuls;
only attention is done per sequence, or, for the sequences decoding one token, batched across
sequences in groups of similar context length (padding each group to its longest table). K/V of the token at position p of a sequence go to block block_table[p // block_size],
offset p % block_size, of the per-layer caches [num_blocks, n_kv_heads, block_size, head_dim]: heads
outermost within a block, so gathering whole (block, head) rows yields each sequence's keys per head
contiguous, [KV, L, D], the layout attention reads without a transpose copy. The gather index is
built once per step and reused by every layer; decode gathers into a workspace reused across layers.
Optional: pure decode batches replayed from CUDA graphs captured per (batch, table-width) bucket
(engine/cuda_graph.py); `close()` frees graphs and caches at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .cuda_graph import DecodeGraph, GraphCapture, device_guard, table_widths


@dataclass
class SeqChunk:
    token_ids: list[int]     # the new tokens to compute this step for one sequence
    start_pos: int           # tokens of this sequence already in the KV cache (= position of token_ids[0])
    block_table: list[int]   # physical block ids covering positions [0, start_pos + len(token_ids))
    logits: str = "last"     # "last": logits of the last token; "all": of every token; "none"


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

    def __init__(self, cache_shape, table: torch.Tensor, ctx_lens: torch.Tensor, dtype, k_buf=None, v_buf=None):
        _, self.n_kv, bs, self.head_dim = cache_shape
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
        if self.bias.dtype != q.dtype:
            self.bias = self.bias.to(q.dtype)
        ks = _gather(k_cache, self.rows, self.k_buf).view(B, self.n_kv, -1, D).to(q.dtype)
        vs = _gather(v_cache, self.rows, self.v_buf).view(B, self.n_kv, -1, D).to(q.dtype)
        o = F.scaled_dot_product_attention(q.reshape(B, self.n_kv, H // self.n_kv, D), ks, vs, attn_mask=self.bias)
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


def decode_groups(tables: list[list[int]], ctx_lens: list[int], cache_shape, dtype, device,
                  bufs=(None, None)) -> list[tuple[list[int], BatchedDecode]]:
    """Rows of single-token decodes (block tables covering exactly their context) in width groups,
    each with its BatchedDecode; all groups gather into the same buffers, one after the other."""
    groups = []
    for rows in width_groups([len(t) for t in tables]):
        width = len(tables[rows[0]])
        table = torch.tensor([tables[r] + [0] * (width - len(tables[r])) for r in rows], device=device)
        ctx = torch.tensor([ctx_lens[r] for r in rows], device=device)
        groups.append((rows, BatchedDecode(cache_shape, table, ctx, dtype, *bufs)))
    return groups


class PagedAttention:
    """Attention for a step of arbitrary chunks: writes the new K/V into the cache, then attends
    over each sequence's paged context: single-token decodes batched (in width groups), the other
    chunks one by one. Built per step; holds no state across steps."""

    def __init__(self, k_cache, v_cache, slots, seqs: list[tuple[int, int, int, list[int]]]):
        self.k_cache, self.v_cache = k_cache, v_cache
        _, _, n_kv, bs, _ = k_cache.shape
        dev = slots.device
        self.rows = _write_rows(slots, n_kv, bs)
        decodes = [(q0, blocks, start + 1) for q0, n, start, blocks in seqs if n == 1 and start > 0]
        self.decodes = []  # (query rows, BatchedDecode)
        if decodes:
            for rows, g in decode_groups([d[1] for d in decodes], [d[2] for d in decodes], k_cache.shape[1:],
                                         k_cache.dtype, dev):
                self.decodes.append((torch.tensor([decodes[r][0] for r in rows], device=dev), g))
        # the others: (offset in the flat batch, new tokens, start_pos, gather rows of the blocks or None)
        self.seqs = [(q0, n, start, _gather_rows(torch.tensor(blocks, device=dev), n_kv) if start else None)
                     for q0, n, start, blocks in seqs if not (n == 1 and start > 0)]

    def __call__(self, layer: int, q, k, v):
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        _write_kv(k_cache, v_cache, self.rows, k, v)
        _, n_kv, _, head_dim = k_cache.shape
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
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        _write_kv(k_cache, v_cache, self.rows, k, v)
        outs, a = [], 0
        for n, g in self.groups:
            outs.append(g.attend(k_cache, v_cache, q[a:a + n]))
            a += n
        return outs[0] if len(outs) == 1 else torch.cat(outs)


class ModelRunner:
    def __init__(self, model, config: ModelConfig, *, num_blocks: int, block_size: int = 16,
                 device="cpu", dtype=None, graph_batch_sizes: tuple[int, ...] | None = None):
        """graph_batch_sizes: pad pure decode batches up to these sizes and (on CUDA) replay them from
        captured CUDA graphs; None (default) runs every step eagerly."""
        self.model, self.config = model, config
        self.num_blocks, self.block_size = num_blocks, block_size
        self.device = torch.device(device)
        self.dtype = dtype or next(model.parameters()).dtype
        self.graph_batch_sizes = tuple(sorted(graph_batch_sizes or ()))
        model.fuse()
        # padded decode rows write into one extra scratch block no block table may name
        shape = (config.n_layers, num_blocks + bool(self.graph_batch_sizes), config.n_kv_heads,
                 block_size, config.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._workspace = torch.empty(0, dtype=self.dtype, device=self.device)  # eager decode gathers
        self._graphs: dict[tuple[int, int], DecodeGraph] = {}
        self._capture = GraphCapture(self.device)
        self.last_step = {"mode": "eager", "padded_batch": 0}  # for step events: graph or eager

    def kv_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    @torch.inference_mode()
    def copy_block(self, src: int, dst: int) -> None:
        self.k_cache[:, dst].copy_(self.k_cache[:, src])
        self.v_cache[:, dst].copy_(self.v_cache[:, src])

    def _check(self, c: SeqChunk) -> None:
        end = c.start_pos + len(c.token_ids)
        if not c.token_ids or c.start_pos < 0:
            raise ValueError(f"SeqChunk needs token_ids and start_pos >= 0 (got {len(c.token_ids)}, {c.start_pos})")
        if c.logits not in ("last", "all", "none"):
            raise ValueError(f"SeqChunk.logits must be 'last', 'all' or 'none', not {c.logits!r}")
        if end > self.config.max_position:
            raise ValueError(f"positions up to {end} exceed the model's max_position {self.config.max_position}")
        if len(c.block_table) * self.block_size < end:
            raise ValueError(f"block_table of {len(c.block_table)} blocks cannot hold positions [0, {end})")
        if any(not 0 <= b < self.num_blocks for b in c.block_table):
            raise ValueError(f"block_table {c.block_table} has ids outside [0, {self.num_blocks})")

    @torch.inference_mode()
    def forward(self, chunks: list[SeqChunk]) -> list[torch.Tensor | None]:
        """One engine step; per chunk fp32 logits [vocab] ("last"), [n, vocab] ("all") or None."""
        if not chunks:
            return []
        if self.k_cache is None:
            raise RuntimeError("ModelRunner.forward after close()")
        for c in chunks:
            self._check(c)
        bs, dev = self.block_size, self.device
        n_blocks = [-(-(c.start_pos + len(c.token_ids)) // bs) for c in chunks]
        if (len(chunks) > 1 or self.graph_batch_sizes) and all(len(c.token_ids) == 1 for c in chunks):
            return self._decode(chunks, n_blocks)
        self.last_step = {"mode": "eager", "padded_batch": 0}
        ids, positions, slots, seqs, rows = [], [], [], [], []
        for c, n in zip(chunks, n_blocks):
            q0, pos = len(ids), range(c.start_pos, c.start_pos + len(c.token_ids))
            ids += c.token_ids
            positions += pos
            slots += [c.block_table[p // bs] * bs + p % bs for p in pos]
            seqs.append((q0, len(c.token_ids), c.start_pos, c.block_table[:n]))
            rows += {"last": [len(ids) - 1], "all": list(range(q0, len(ids))), "none": []}[c.logits]
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=dev)
        hidden = self.model(as_long(ids), as_long(positions), PagedAttention(self.k_cache, self.v_cache, as_long(slots), seqs))
        logits = self.model.compute_logits(hidden[as_long(rows)]) if rows else None
        out, i = [], 0
        for c in chunks:
            n = {"last": 1, "all": len(c.token_ids), "none": 0}[c.logits]
            out.append(None if n == 0 else logits[i] if c.logits == "last" else logits[i:i + n])
            i += n
        return out

    def _decode(self, chunks: list[SeqChunk], n_blocks: list[int]) -> list[torch.Tensor | None]:
        bs, B, dev = self.block_size, len(chunks), self.device
        bucket = next((b for b in self.graph_batch_sizes if b >= B), None)
        if bucket is None:
            self.last_step = {"mode": "eager", "padded_batch": B}
            logits = self._decode_eager(chunks, n_blocks)
        else:
            width = max(n_blocks)
            table = torch.tensor([c.block_table[:n] + [0] * (width - n) for c, n in zip(chunks, n_blocks)])
            pos = torch.tensor([c.start_pos for c in chunks])
            ids = torch.tensor([c.token_ids[0] for c in chunks])
            slots = torch.tensor([c.block_table[c.start_pos // bs] * bs + c.start_pos % bs for c in chunks])
            key = (bucket, 1 << (width - 1).bit_length())  # table widths bucketed to powers of two
            # a step that captures is labelled so: it also ran the capture's warm-up steps
            mode = "graph" if self.device.type == "cuda" else "padded"
            if key not in self._graphs:
                mode = self._new_graph(*key) or mode
            self.last_step = {"mode": mode, "padded_batch": bucket}
            with device_guard(dev):
                logits = self._graphs[key].run(self._decode_step, ids, pos, slots, table, pos + 1)[:B]
        return [None if c.logits == "none" else logits[i] for i, c in enumerate(chunks)]

    def _decode_eager(self, chunks: list[SeqChunk], n_blocks: list[int]) -> torch.Tensor:
        """Rows reordered so that each width group is consecutive; logits back in chunk order."""
        bs, dev = self.block_size, self.device
        tables = [c.block_table[:n] for c, n in zip(chunks, n_blocks)]
        ctx = [c.start_pos + 1 for c in chunks]
        n_rows = max(len(t) for t in tables) * len(chunks) * self.config.n_kv_heads
        groups = decode_groups(tables, ctx, self.k_cache.shape[1:], self.dtype, dev, self.workspace(n_rows))
        order = [r for rows, _ in groups for r in rows]
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=dev)
        slots = as_long([chunks[r].block_table[chunks[r].start_pos // bs] * bs + chunks[r].start_pos % bs for r in order])
        attn = DecodeAttention(self.k_cache, self.v_cache, slots, [(len(rows), g) for rows, g in groups])
        hidden = self.model(as_long([chunks[r].token_ids[0] for r in order]), as_long([ctx[r] - 1 for r in order]), attn)
        logits = self.model.compute_logits(hidden)
        if order == sorted(order):
            return logits
        return logits.index_select(0, as_long(sorted(range(len(order)), key=order.__getitem__)))

    def workspace(self, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V gather buffers of n_rows (block, head) rows, grown as needed and kept."""
        row = self.block_size * self.config.head_dim
        if self._workspace.numel() < 2 * n_rows * row:
            self._workspace = torch.empty(2 * n_rows * row, dtype=self.dtype, device=self.device)
        ws = self._workspace[:2 * n_rows * row].view(2, n_rows, row)
        return ws[0], ws[1]

    def _decode_step(self, g: DecodeGraph):
        """The padded decode step of one bucket over its static buffers, as CUDA graphs capture it."""
        group = BatchedDecode(self.k_cache.shape[1:], g.table, g.ctx_lens, self.dtype, *g.bufs)
        attn = DecodeAttention(self.k_cache, self.v_cache, g.slots, [(g.ids.shape[0], group)])
        return self.model.compute_logits(self.model(g.ids, g.pos, attn))

    def _new_graph(self, batch: int, width: int) -> str | None:
        """Static buffers for a bucket and, on CUDA, its graph; -> "graph_capture" when it captured."""
        c = self.config
        g = self._graphs[(batch, width)] = DecodeGraph(
            batch, width, scratch_block=self.num_blocks, block_size=self.block_size, n_kv_heads=c.n_kv_heads,
            head_dim=c.head_dim, dtype=self.dtype, device=self.device)
        if self.device.type != "cuda":
            return None
        self._capture.capture(g, self._decode_step)
        return "graph_capture"

    @torch.inference_mode()
    def capture_graphs(self, max_context: int) -> int:
        """Build every bucket (each batch size, each power-of-two table width up to `max_context`
        tokens) now, before a measured run: -> how many were new. On CUDA each is a graph capture."""
        widths = table_widths(max_context, self.block_size)
        new = [(b, w) for b in self.graph_batch_sizes for w in widths if (b, w) not in self._graphs]
        for key in new:
            self._new_graph(*key)
        return len(new)

    def close(self) -> None:
        """Free the graphs, their pool and the KV cache now rather than when the collector runs
        (idempotent); the runner cannot step afterwards."""
        for g in self._graphs.values():
            g.close()
        self._graphs.clear()
        self._capture.close()
        self.k_cache = self.v_cache = self._workspace = None
