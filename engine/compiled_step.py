"""The compiled CPU step: every decoder layer through one inductor-compiled function, attention in place.

`fused_layer` (engine/model.py) with `inplace_attention` (engine/attention.py) is compiled once, as a
function of tensors only (the layer's weights, the whole K/V cache, the layer's block offset as a 0-d
tensor), so the same compiled code serves all layers; the Python loop over layers, the embedding,
RoPE tables and the logits stay eager. It is compiled once, with the token count and the
block-table width marked dynamic, so it does not recompile as batches, chunks and contexts change:
one bucket covers decode batches and mixed steps with prefill chunks alike. A dimension of 1 would be
specialised (and compiled a second time), so a step has at least `MIN_ROWS` tokens (a batch-1 decode
gets one padding token, which writes to the runner's scratch block and attends to it alone) and its
tables at least `MIN_ROWS` blocks. The compile happens in `warm_up` (on the scratch block; `LLMEngine` calls it at
construction with the step thread's intra-op thread count, which inductor's kernels are built for)
or else at the first step.

A step is compiled when its tokens x context keys fit `MAX_SCORES` (the in-place kernel computes
every score, where the eager flash kernel skips the causal half: long prefills stay eager). A
failure to compile, or in a compiled step, turns compilation off for this runner (`disabled_reason`)
and the step runs eagerly. Inductor's caches live in `cache_dir()` (kept across starts).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from .attention import _write_rows, inplace_attention
from .model import fused_layer, rope_tables

MIN_ROWS = 2  # tokens and table blocks: a dynamic dimension of size 1 would be specialised by the compiler
MAX_SCORES = 1 << 17  # tokens x keys of a step compiled; beyond, the eager flash kernel is faster


def cache_dir() -> Path:
    """Where inductor keeps compiled kernels and graphs: $TORCHINDUCTOR_CACHE_DIR when the user set it
    (torch sets it to its own default in /tmp once it has looked: that value does not count), else
    $XDG_CACHE_HOME (or ~/.cache) /inferledger/inductor."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env and env != default_cache_dir():
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "inferledger" / "inductor"


def _layer(h, cos, sin, w, k_flat, v_flat, layer_blocks, write_rows, tables, pos, heads, eps, block_size):
    attn = lambda q, k, v: inplace_attention(q, k, v, k_flat, v_flat, layer_blocks, write_rows, tables, pos, block_size)
    return fused_layer(h, cos, sin, w, attn, heads, eps)


_compiled = None


def _compiled_layer():
    global _compiled
    if _compiled is None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir())  # torch may have set its default meanwhile
        _compiled = torch.compile(_layer, fullgraph=True, dynamic=False)
    return _compiled


class CompiledStep:
    """The runner's compiled forward; `run(chunks)` -> logits rows as the eager step returns them, or
    None when this step is not one it compiles."""

    def __init__(self, runner) -> None:
        self.runner = runner
        model, c = runner.model, runner.config
        self.layers = [layer.tensors() for layer in model.layers]
        self.heads, self.eps = (c.n_heads, c.n_kv_heads, c.head_dim), model.layers[0].input_layernorm.eps
        nb = runner.k_cache.shape[1]
        self.layer_blocks = [torch.tensor(i * nb) for i in range(c.n_layers)]
        self.disabled_reason: str | None = None
        self.steps = 0  # steps that ran compiled
        self.warm_up_s: float | None = None  # how long warm_up() took (None: not called)
        if any(w is None for w in self.layers):
            self.disabled_reason = "the model runs unfused"

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Compile both buckets now on the scratch block (cached kernels load instead): -> seconds.
        A failure turns compilation off (`disabled_reason`)."""
        t0 = time.perf_counter()
        s = self.runner.num_blocks * self.runner.block_size  # the scratch block's first slot
        try:
            if self.enabled:
                self._forward([0], [0], [s], [[self.runner.num_blocks]])
        except Exception as exc:  # noqa: BLE001 (any compiler failure): the runner steps eagerly
            self.disabled_reason = f"compiling failed: {exc!r}"[:500]
        self.warm_up_s = time.perf_counter() - t0
        return self.warm_up_s

    def run(self, ids, positions, slots, tables) -> torch.Tensor | None:
        """hidden states [T, d_model] of a step given per token its id, position, write slot and
        block table; None when the step is too large to compile or compilation is off."""
        width = max(MIN_ROWS, max(len(t) for t in tables))
        if not self.enabled or len(ids) * width * self.runner.block_size > MAX_SCORES:
            return None
        try:
            h = self._forward(ids, positions, slots, tables)
        except Exception as exc:  # noqa: BLE001 (any compiler failure): eager from here on
            self.disabled_reason = f"compiled step failed: {exc!r}"[:500]
            return None
        self.steps += 1
        return h

    def _forward(self, ids, positions, slots, tables):
        r, dev, n = self.runner, self.runner.device, len(ids)
        width = max(MIN_ROWS, max(len(t) for t in tables))
        pad = r.num_blocks  # the scratch block: table entries past a sequence's own are masked anyway
        if n < MIN_ROWS:  # padding tokens at position 0 of the scratch block
            k = MIN_ROWS - n
            ids, positions, slots, tables = ids + [0] * k, positions + [0] * k, slots + [pad * r.block_size] * k, tables + [[pad]] * k
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=dev)
        table = as_long([t + [pad] * (width - len(t)) for t in tables])
        pos = as_long(positions)
        write = _write_rows(as_long(slots), self.heads[1], r.block_size)
        h = r.model.embed_tokens(as_long(ids))
        cos, sin = rope_tables(pos, self.heads[2], r.config.rope_base, h.dtype)
        k_flat, v_flat = r.k_cache.view(-1, self.heads[2]), r.v_cache.view(-1, self.heads[2])
        dyn = torch._dynamo.mark_dynamic
        for t in (k_flat, v_flat):
            dyn(t, 0)
        for t in (h, cos, sin, write, table, pos):
            dyn(t, 0)
        dyn(table, 1)
        fn = _compiled_layer()
        for w, lb in zip(self.layers, self.layer_blocks):
            h = fn(h, cos, sin, w, k_flat, v_flat, lb, write, table, pos, self.heads, self.eps, r.block_size)
        return h[:n]
