"""The compiled CPU step: the decoder stack as one inductor-compiled graph, attention left to the step's kernel.

Everything from the embedding to the last layer's output (`fused_layer` for every layer: norms,
RoPE, residual adds, SiLU and the prepacked linears, engine/cpu_linear.py) is one graph, so a step
costs one call instead of some 1,300 small operator dispatches. Attention is the one part the graph
does not see: each layer calls the operator `inferledger::step_attention`, which hands q, k, v to
the attention kernel the runner built for this step (`PagedAttention` for a step of arbitrary
chunks, `DecodeAttention` for a batch of decodes, engine/attention.py): the same kernels, the same
cache writes and reads (in place or gathered) as the eager step. The graph is compiled once, with the token count
unbacked (no specialisation on 1), so one compiled graph serves lone decodes, decode batches and
mixed steps with prefill chunks alike, and does not recompile as batches and contexts change. The
logits (final norm and lm_head) stay eager, since the runner picks the rows that need them.

The compile happens in `warm_up` (a one-token step on the runner's scratch block; `LLMEngine`
calls it at construction with the step thread's intra-op thread count, which inductor's kernels are
built for) or else at the first step. A failure to compile, or in a compiled step, turns
compilation off for this runner (`disabled_reason`) and the step runs eagerly (a step that failed
half-way is run again eagerly; its cache writes are the same rows with the same values). A step that
compiled the graph it ran — the first one when `warm_up` was not called, or one at another intra-op
thread count than the compile's, which dynamo recompiles for — is labelled `compiling` rather than
`compiled`: its time holds the compile. Inductor's caches live in `cache_dir()` (kept across starts).
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .attention import PagedAttention
from .cpu_linear import _LIB
from .model import fused_layer, rope_tables

_STEP = threading.local()  # the attention kernel of the step running in this thread


def cache_dir() -> Path:
    """Where inductor keeps compiled kernels and graphs: $TORCHINDUCTOR_CACHE_DIR when the user set it
    (torch sets it to its own default in /tmp once it has looked: that value does not count), else
    $XDG_CACHE_HOME (or ~/.cache) /inferledger/inductor."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env and env != default_cache_dir():
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "inferledger" / "inductor"


def _step_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """attn(layer, q, k, v) of the step running in this thread (it also writes k, v into the cache)."""
    return _STEP.attn(layer, q, k, v)


_LIB.define("step_attention(Tensor q, Tensor k, Tensor v, int layer) -> Tensor")  # the library of cpu_linear.py
_LIB.impl("step_attention", _step_attention, "CPU")


@torch.library.register_fake("inferledger::step_attention")
def _(q, k, v, layer):
    return q.new_empty(q.shape)


step_attention = torch.ops.inferledger.step_attention


def _stack(ids, positions, embed, layers, heads, eps, rope_base):
    h = F.embedding(ids, embed)
    cos, sin = rope_tables(positions, heads[2], rope_base, h.dtype)
    for i, w in enumerate(layers):
        h = fused_layer(h, cos, sin, w, lambda q, k, v, i=i: step_attention(q, k, v, i), heads, eps)
    return h


def _graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process (a first compile, or a recompile when a guard failed:
    inductor's kernels are built for the intra-op thread count, so a step at another count recompiles)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


_compiled = None


def _compiled_stack():
    global _compiled
    if _compiled is None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir())  # torch may have set its default meanwhile
        _compiled = torch.compile(_stack, fullgraph=True, dynamic=False)
    return _compiled


class CompiledStep:
    """The runner's compiled decoder stack: `hidden(ids, positions, attn)` -> hidden states [T, d_model]
    as the eager model returns them, or None when compilation is off."""

    def __init__(self, runner) -> None:
        self.runner = runner
        model, c = runner.model, runner.config
        self.layers = [layer.tensors(runner.linear) for layer in model.layers]
        self.embed = model.embed_tokens.weight
        self.heads, self.eps = (c.shape.n_heads, c.shape.n_kv_heads, c.shape.head_dim), model.layers[0].input_layernorm.eps
        self.rope_base = float(c.rope_base)
        self.disabled_reason: str | None = None
        self.steps = 0  # steps that ran compiled
        self.compiled_now = False  # whether the last step compiled (or recompiled) the graph it ran
        self.warm_up_s: float | None = None  # how long warm_up() took (None: not called)
        if any(w is None for w in self.layers):
            self.disabled_reason = "the model runs unfused"
        elif os.environ.get("ATEN_CPU_CAPABILITY"):
            # measured: with ATen held below the CPU's own ISA, inductor's kernels for this graph returned NaN
            self.disabled_reason = (f"ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']} is set: the compiled "
                                    "stack computed NaN under it, so the step stays eager")

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Compile now, on a one-token step into the scratch block (cached kernels load instead):
        -> seconds. A failure turns compilation off (`disabled_reason`)."""
        t0 = time.perf_counter()
        r = self.runner
        try:
            if self.enabled:
                dev = r.device
                slot = torch.tensor([r.num_blocks * r.block_size], device=dev)  # the scratch block's first slot
                attn = PagedAttention(r.k_cache, r.v_cache, slot, [(0, 1, 0, [r.num_blocks])])
                # two tensors, not one passed twice: the graph would be guarded on ids being positions
                ids, positions = (torch.zeros(1, dtype=torch.long, device=dev) for _ in range(2))
                self._forward(ids, positions, attn)
        except Exception as exc:  # noqa: BLE001 (any compiler failure): the runner steps eagerly
            self.disabled_reason = f"compiling failed: {exc!r}"[:500]
        self.warm_up_s = time.perf_counter() - t0
        return self.warm_up_s

    def hidden(self, ids: torch.Tensor, positions: torch.Tensor, attn) -> torch.Tensor | None:
        """Hidden states [T, d_model] of a step (ids, positions [T]) whose attention is `attn`; None
        when compilation is off (then the runner steps eagerly)."""
        if not self.enabled:
            return None
        graphs = _graphs_compiled()
        try:
            h = self._forward(ids, positions, attn)
        except Exception as exc:  # noqa: BLE001 (any compiler failure): eager from here on
            self.disabled_reason = f"compiled step failed: {exc!r}"[:500]
            return None
        self.steps += 1
        self.compiled_now = _graphs_compiled() != graphs
        return h

    def _forward(self, ids, positions, attn):
        for t in (ids, positions):
            torch._dynamo.decorators.mark_unbacked(t, 0)
        _STEP.attn = attn
        try:
            return _compiled_stack()(ids, positions, self.embed, self.layers, self.heads, self.eps, self.rope_base)
        finally:
            _STEP.attn = None
