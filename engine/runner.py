"""ModelRunner: one engine step over a paged KV cache.

All chunks' tokens are flattened into one batch [T] for the embedding, projection and MLP matmuls;
only attention is done per sequence (or, for a pure decode batch, across sequences with padding).
K/V of token at position p of a sequence go to slot block_table[p // block_size] * block_size +
p % block_size of the per-layer caches [num_blocks, block_size, n_kv_heads, head_dim].
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


@dataclass
class _SeqMeta:
    q_start: int              # offset of this chunk's first token in the flat batch
    n: int                    # new tokens
    start_pos: int            # tokens already cached
    blocks: torch.Tensor      # block ids covering [0, start_pos + n), on the cache's device


class PagedAttention:
    """The attention callable for one step: writes new K/V into the cache, attends over each
    sequence's paged context. Built per step by the runner; holds no state across steps."""

    def __init__(self, k_cache, v_cache, slot_mapping, seqs: list[_SeqMeta], block_size: int):
        self.k_cache, self.v_cache = k_cache, v_cache
        self.slot_mapping = slot_mapping
        self.seqs = seqs
        self.block_size = block_size
        self.decode_only = len(seqs) > 1 and all(s.n == 1 for s in seqs)
        if self.decode_only:
            self._prepare_decode_batch()

    def _prepare_decode_batch(self):
        # pad every block table to the longest; padded keys are masked out
        device = self.k_cache.device
        max_blocks = max(len(s.blocks) for s in self.seqs)
        table = torch.zeros(len(self.seqs), max_blocks, dtype=torch.long, device=device)
        for i, s in enumerate(self.seqs):
            table[i, : len(s.blocks)] = s.blocks
        ctx_lens = torch.tensor([s.start_pos + 1 for s in self.seqs], device=device)
        key_pos = torch.arange(max_blocks * self.block_size, device=device)
        self.decode_table = table
        self.decode_mask = (key_pos[None, :] < ctx_lens[:, None])[:, None, None, :]  # [B,1,1,L]

    def __call__(self, layer: int, q, k, v):
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        n_kv, head_dim = k_cache.shape[-2:]
        k_cache.view(-1, n_kv, head_dim)[self.slot_mapping] = k
        v_cache.view(-1, n_kv, head_dim)[self.slot_mapping] = v
        if self.decode_only:
            return self._decode_batch(q, k_cache, v_cache)
        out = torch.empty_like(q)
        for s in self.seqs:
            qs = q[s.q_start : s.q_start + s.n].transpose(0, 1)  # [H, n, D]
            if s.start_pos == 0:
                # fresh sequence: its whole context is this chunk, no gather needed
                ks = k[s.q_start : s.q_start + s.n].transpose(0, 1)
                vs = v[s.q_start : s.q_start + s.n].transpose(0, 1)
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=s.n > 1, enable_gqa=True)
            else:
                ctx = s.start_pos + s.n
                ks = k_cache[s.blocks].view(-1, n_kv, head_dim)[:ctx].transpose(0, 1)
                vs = v_cache[s.blocks].view(-1, n_kv, head_dim)[:ctx].transpose(0, 1)
                mask = None
                if s.n > 1:  # query i sits at position start_pos + i and sees keys 0..start_pos + i
                    q_pos = torch.arange(s.start_pos, ctx, device=q.device)
                    mask = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
            out[s.q_start : s.q_start + s.n] = o.transpose(0, 1)
        return out

    def _decode_batch(self, q, k_cache, v_cache):
        B, (n_kv, head_dim) = len(self.seqs), k_cache.shape[-2:]
        ks = k_cache[self.decode_table].view(B, -1, n_kv, head_dim).transpose(1, 2)  # [B, KV, L, D]
        vs = v_cache[self.decode_table].view(B, -1, n_kv, head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q[:, :, None, :], ks, vs, attn_mask=self.decode_mask, enable_gqa=True)
        return o[:, :, 0, :]


class ModelRunner:
    def __init__(self, model, config: ModelConfig, *, num_blocks: int, block_size: int = 16,
                 device="cpu", dtype=None):
        self.model, self.config = model, config
        self.num_blocks, self.block_size = num_blocks, block_size
        self.device = torch.device(device)
        self.dtype = dtype or next(model.parameters()).dtype
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)

    def kv_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    @torch.inference_mode()
    def copy_block(self, src: int, dst: int) -> None:
        self.k_cache[:, dst].copy_(self.k_cache[:, src])
        self.v_cache[:, dst].copy_(self.v_cache[:, src])

    def _check(self, c: SeqChunk) -> None:
        end = c.start_pos + len(c.token_ids)
        if not c.token_ids:
            raise ValueError("SeqChunk.token_ids is empty")
        if c.logits not in ("last", "all", "none"):
            raise ValueError(f"SeqChunk.logits must be 'last', 'all' or 'none', not {c.logits!r}")
        if len(c.block_table) * self.block_size < end:
            raise ValueError(f"block_table of {len(c.block_table)} blocks cannot hold positions [0, {end})")
        if any(not 0 <= b < self.num_blocks for b in c.block_table):
            raise ValueError(f"block_table {c.block_table} has ids outside [0, {self.num_blocks})")

    @torch.inference_mode()
    def forward(self, chunks: list[SeqChunk]) -> list[torch.Tensor | None]:
        """One engine step; per chunk fp32 logits [vocab] ("last"), [n, vocab] ("all") or None."""
        if not chunks:
            return []
        bs = self.block_size
        ids, positions, slots, seqs, rows = [], [], [], [], []
        for c in chunks:
            self._check(c)
            n, q_start = len(c.token_ids), len(ids)
            n_blocks = -(-(c.start_pos + n) // bs)
            ids.extend(c.token_ids)
            pos = range(c.start_pos, c.start_pos + n)
            positions.extend(pos)
            slots.extend(c.block_table[p // bs] * bs + p % bs for p in pos)
            blocks = torch.tensor(c.block_table[:n_blocks], dtype=torch.long, device=self.device)
            seqs.append(_SeqMeta(q_start, n, c.start_pos, blocks))
            rows.append({"last": [q_start + n - 1], "all": list(range(q_start, q_start + n)), "none": []}[c.logits])
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=self.device)
        attn = PagedAttention(self.k_cache, self.v_cache, as_long(slots), seqs, bs)
        hidden = self.model(as_long(ids), as_long(positions), attn)
        wanted = [r for rs in rows for r in rs]
        logits = self.model.compute_logits(hidden[as_long(wanted)]) if wanted else None
        out, i = [], 0
        for c, rs in zip(chunks, rows):
            if c.logits == "none":
                out.append(None)
            elif c.logits == "last":
                out.append(logits[i])
            else:
                out.append(logits[i : i + len(rs)])
            i += len(rs)
        return out
