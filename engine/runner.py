"""ModelRunner: one engine step over a paged KV cache.

All chunks' tokens are flattened into one batch [T] for the embedding, projection and MLP matmuls;
only attention is done per sequence, or, for a pure decode batch, across sequences with padding.
K/V of the token at position p of a sequence go to slot block_table[p // block_size] * block_size +
p % block_size of the per-layer caches [num_blocks, block_size, n_kv_heads, head_dim].
Optional: pure decode batches replayed from CUDA graphs captured per (batch, table-width) bucket.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import ModelConfig


@dataclass
class SeqChunk:
    token_ids: list[int]     # the new tokens to compute this step for one sequence
    start_pos: int           # tokens of this sequence already in the KV cache (= position of token_ids[0])
    block_table: list[int]   # physical block ids covering positions [0, start_pos + len(token_ids))
    logits: str = "last"     # "last": logits of the last token; "all": of every token; "none"


def _write_kv(k_cache, v_cache, slots, k, v):
    n_kv, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, n_kv, head_dim).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, n_kv, head_dim).index_copy_(0, slots, v.to(v_cache.dtype))


class PagedAttention:
    """Attention for a step of arbitrary chunks: writes the new K/V into the cache, then attends per
    sequence over its paged context. Built per step; holds no state across steps."""

    def __init__(self, k_cache, v_cache, slots, seqs: list[tuple[int, int, int, torch.Tensor]]):
        self.k_cache, self.v_cache, self.slots = k_cache, v_cache, slots
        self.seqs = seqs  # (offset in the flat batch, new tokens, start_pos, block ids)

    def __call__(self, layer: int, q, k, v):
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        _write_kv(k_cache, v_cache, self.slots, k, v)
        n_kv, head_dim = k_cache.shape[-2:]
        out = torch.empty_like(q)
        for q0, n, start, blocks in self.seqs:
            qs = q[q0:q0 + n].transpose(0, 1)  # [H, n, D]
            if start == 0:  # fresh sequence: its whole context is this chunk, no gather needed
                ks, vs = k[q0:q0 + n].transpose(0, 1), v[q0:q0 + n].transpose(0, 1)
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=n > 1, enable_gqa=True)
            else:
                ctx = start + n
                ks = k_cache[blocks].view(-1, n_kv, head_dim)[:ctx].transpose(0, 1).to(q.dtype)
                vs = v_cache[blocks].view(-1, n_kv, head_dim)[:ctx].transpose(0, 1).to(q.dtype)
                mask = None
                if n > 1:  # query i sits at position start + i and sees keys 0..start + i
                    q_pos = torch.arange(start, ctx, device=q.device)
                    mask = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
            out[q0:q0 + n] = o.transpose(0, 1)
        return out


class DecodeAttention:
    """Attention for a batch of one new token per sequence, batched across sequences: block tables
    padded to one width [B, W], keys past each sequence's length masked. Only tensor ops, so the
    same code is captured into CUDA graphs."""

    def __init__(self, k_cache, v_cache, slots, table, ctx_lens):
        self.k_cache, self.v_cache, self.slots, self.table = k_cache, v_cache, slots, table
        key_pos = torch.arange(table.shape[1] * k_cache.shape[2], device=table.device)
        self.mask = (key_pos[None, :] < ctx_lens[:, None])[:, None, None, :]  # [B, 1, 1, L]

    def __call__(self, layer: int, q, k, v):
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        _write_kv(k_cache, v_cache, self.slots, k, v)
        B, (n_kv, head_dim) = q.shape[0], k_cache.shape[-2:]
        ks = k_cache[self.table].view(B, -1, n_kv, head_dim).transpose(1, 2).to(q.dtype)  # [B, KV, L, D]
        vs = v_cache[self.table].view(B, -1, n_kv, head_dim).transpose(1, 2).to(q.dtype)
        o = F.scaled_dot_product_attention(q[:, :, None, :], ks, vs, attn_mask=self.mask, enable_gqa=True)
        return o[:, :, 0, :]


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
        # padded decode rows write into one extra scratch block no block table may name
        shape = (config.n_layers, num_blocks + bool(self.graph_batch_sizes), block_size,
                 config.n_kv_heads, config.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._graphs: dict[tuple[int, int], _DecodeGraph] = {}
        self._graph_pool = None
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
        for c in chunks:
            self._check(c)
        bs, dev = self.block_size, self.device
        n_blocks = [-(-(c.start_pos + len(c.token_ids)) // bs) for c in chunks]
        width = max(n_blocks)
        table = torch.tensor([c.block_table[:n] + [0] * (width - n) for c, n in zip(chunks, n_blocks)])
        if len(chunks) > 1 and all(len(c.token_ids) == 1 for c in chunks):
            return self._decode(chunks, table)
        self.last_step = {"mode": "eager", "padded_batch": 0}
        ids, positions, slots, seqs, rows = [], [], [], [], []
        table = table.to(dev)
        for i, (c, n) in enumerate(zip(chunks, n_blocks)):
            q0, pos = len(ids), range(c.start_pos, c.start_pos + len(c.token_ids))
            ids += c.token_ids
            positions += pos
            slots += [c.block_table[p // bs] * bs + p % bs for p in pos]
            seqs.append((q0, len(c.token_ids), c.start_pos, table[i, :n]))
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

    def _decode(self, chunks: list[SeqChunk], table: torch.Tensor) -> list[torch.Tensor | None]:
        bs, B = self.block_size, len(chunks)
        pos = [c.start_pos for c in chunks]
        ids = torch.tensor([c.token_ids[0] for c in chunks])
        slots = torch.tensor([c.block_table[p // bs] * bs + p % bs for c, p in zip(chunks, pos)])
        ctx_lens = torch.tensor(pos) + 1
        bucket = next((b for b in self.graph_batch_sizes if b >= B), None)
        if bucket is None:
            self.last_step = {"mode": "eager", "padded_batch": B}
            logits = self._decode_step(*(t.to(self.device) for t in (ids, torch.tensor(pos), slots, table, ctx_lens)))
        else:
            width = 1 << (table.shape[1] - 1).bit_length()  # table widths bucketed to powers of two
            key = (bucket, width)
            if key not in self._graphs:
                self._graphs[key] = _DecodeGraph(self, bucket, width)
            self.last_step = {"mode": "graph" if self.device.type == "cuda" else "padded", "padded_batch": bucket}
            logits = self._graphs[key].run(ids, torch.tensor(pos), slots, table, ctx_lens)[:B]
        return [None if c.logits == "none" else logits[i] for i, c in enumerate(chunks)]

    def _decode_step(self, ids, positions, slots, table, ctx_lens):
        attn = DecodeAttention(self.k_cache, self.v_cache, slots, table, ctx_lens)
        return self.model.compute_logits(self.model(ids, positions, attn))


class _DecodeGraph:
    """Static input buffers for a decode bucket (batch B, table width W) and, on CUDA, the graph
    captured over them. Padding rows point at the scratch block. On the CPU `run` executes the
    same padded step eagerly, which is how tests check the padding without a GPU."""

    def __init__(self, runner: ModelRunner, batch: int, width: int):
        self.runner, dev, scratch = runner, runner.device, runner.num_blocks
        long = dict(dtype=torch.long, device=dev)
        self.ids, self.pos = torch.zeros(batch, **long), torch.zeros(batch, **long)
        self.slots = torch.full((batch,), scratch * runner.block_size, **long)
        self.table = torch.full((batch, width), scratch, **long)
        self.ctx_lens = torch.ones(batch, **long)
        self.graph = self.logits = None
        if dev.type == "cuda":
            self._capture()

    def _step(self):
        return self.runner._decode_step(self.ids, self.pos, self.slots, self.table, self.ctx_lens)

    def _capture(self):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph; writes only the scratch block
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        if self.runner._graph_pool is None:
            self.runner._graph_pool = torch.cuda.graph_pool_handle()
        # one memory pool for all buckets: graphs replay one at a time and outputs are cloned at once
        with torch.cuda.graph(self.graph, pool=self.runner._graph_pool):
            self.logits = self._step()

    def run(self, ids, pos, slots, table, ctx_lens) -> torch.Tensor:
        B, W = table.shape
        scratch = self.runner.num_blocks
        for buf, val, pad in ((self.ids, ids, 0), (self.pos, pos, 0), (self.slots, slots, scratch * self.runner.block_size),
                              (self.ctx_lens, ctx_lens, 1)):
            buf[B:].fill_(pad)
            buf[:B].copy_(val, non_blocking=True)
        self.table.fill_(scratch)
        self.table[:B, :W].copy_(table, non_blocking=True)
        if self.graph is None:
            return self._step()
        self.graph.replay()
        return self.logits.clone()
