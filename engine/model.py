"""The llama-family decoder (SmolLM2, Llama, Qwen2, Qwen3) in plain PyTorch.

The model computes over a flat batch of tokens [T] with their positions; attention itself is
delegated to an `attn` callable passed into `forward` (the kernels of engine/attention.py), so the
same weights run over a paged KV cache (the runner's step) or a plain contiguous sequence
(`causal_attention`, for `full_sequence_logits`). No state is kept between calls.
Parameter names follow Hugging Face's llama layout (minus the leading "model."), so safetensors
checkpoints load by name. `fuse()` (the runner calls it) then stacks each layer's q/k/v and gate/up
weights into one contiguous matrix each: one matmul instead of three (two). The named parameters
become row views into the stacked matrices, so memory is not doubled and in-place loads still reach
the fused weights.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import cpu_linear
from .attention import causal_attention
from .config import ModelConfig
from .cpu_linear import as_taken, linear, pack, panel

# attn(layer_idx, q [T, H, D], k [T, KV, D], v [T, KV, D]) -> [T, H, D]
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:  # one fused op, the same arithmetic as below
        return F.rms_norm(x, weight.shape, weight, eps)
    # normalise in fp32 whatever the activation dtype, round, then scale, as the reference implementation
    # does (the same arithmetic in 4 ops instead of 8: a decode step runs 61 of these)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype):
    """cos/sin [T, head_dim] for the half-split ("rotate_half") rotary layout."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype):
    """(cos, signed sin) [T, 1, D] for `apply_rope`: sin's first half negated, so that
    rotate_half(x) * sin == roll(x, D/2) * signed_sin exactly (a sign flip does not round)."""
    cos, sin = rope_cos_sin(positions, head_dim, base, dtype)
    half = head_dim // 2
    return cos[:, None, :], torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] with tables from rope_tables; rotates pairs (i, i + D/2). The halves swapped by
    a cat, not torch.roll: the same values, and a graph compiled for any token count can take it."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * signed_sin


def _fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One contiguous [sum(out), in] matrix (and bias) stacking the linears' weights; each linear's
    weight and bias become row views into it."""
    with torch.inference_mode(False), torch.no_grad():
        w = torch.cat([lin.weight for lin in linears]).contiguous()
        has_bias = linears[0].bias is not None
        bias = torch.cat([lin.bias for lin in linears]) if has_bias else None
        off = 0
        for lin in linears:
            n, grad = lin.out_features, lin.weight.requires_grad
            lin.weight = nn.Parameter(w[off:off + n], requires_grad=grad)
            if has_bias:
                lin.bias = nn.Parameter(bias[off:off + n], requires_grad=grad)
            off += n
    return w, bias


class _Fused:
    """The stacked weights of some linears, valid while those linears keep the parameters that
    were made views into them (a load with assign=True replaces them: then the model runs unfused)."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        self.linears = linears
        self.weight, self.bias = _fuse_linears(linears)
        self.params = [(lin.weight, lin.bias) for lin in linears]

    def valid(self) -> bool:
        # _parameters directly: nn.Module.__getattr__ made this check a visible share of a decode step
        return all(lin._parameters["weight"] is w and lin._parameters["bias"] is b
                   for lin, (w, b) in zip(self.linears, self.params))



class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.shape.n_heads, cfg.shape.n_kv_heads, cfg.shape.head_dim
        self.q_proj = nn.Linear(cfg.shape.d_model, cfg.shape.n_heads * cfg.shape.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.shape.d_model, cfg.shape.n_kv_heads * cfg.shape.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.shape.d_model, cfg.shape.n_kv_heads * cfg.shape.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.shape.n_heads * cfg.shape.head_dim, cfg.shape.d_model, bias=False)
        self.q_norm = RMSNorm(cfg.shape.head_dim, cfg.rms_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.shape.head_dim, cfg.rms_eps) if cfg.qk_norm else None
        self.qkv: _Fused | None = None  # after fuse()

    def fuse(self) -> None:
        if not self.fused:
            self.qkv = _Fused([self.q_proj, self.k_proj, self.v_proj])

    @property
    def fused(self) -> bool:
        return self.qkv is not None and self.qkv.valid()

    def forward(self, x, cos, sin, attn: AttentionFn):
        """The unfused projections (before fuse(), or after a load replaced the fused weights'
        parameters); cos, sin: tables from rope_tables."""
        T, H, KV, D = x.shape[0], self.n_heads, self.n_kv_heads, self.head_dim
        q, k = self.q_proj(x).view(T, H, D), self.k_proj(x).view(T, KV, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attn(self.layer_idx, q, k, self.v_proj(x).view(T, KV, D))
        return self.o_proj(out.reshape(T, H * D))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.shape.d_model, cfg.shape.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.shape.d_model, cfg.shape.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.shape.ffn, cfg.shape.d_model, bias=False)
        self.gate_up: _Fused | None = None  # after fuse()

    def fuse(self) -> None:
        if not self.fused:
            self.gate_up = _Fused([self.gate_proj, self.up_proj])

    @property
    def fused(self) -> bool:
        return self.gate_up is not None and self.gate_up.valid()

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.shape.d_model, cfg.rms_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.shape.d_model, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def tensors(self, linear: str = "torch") -> "LayerTensors | None":
        """The fused weights as `fused_layer` takes them, its linears run the `linear` way
        (engine/cpu_linear.py; bf16 "kernels" takes the matrices' panel copies); None while the layer
        runs unfused."""
        a, m = self.self_attn, self.mlp
        if not (a.fused and m.fused):
            return None
        kind, (qkv, o, gate_up, down) = as_taken(linear, a.qkv.weight, a.o_proj.weight, m.gate_up.weight, m.down_proj.weight)
        return LayerTensors(self.input_layernorm.weight, qkv, a.qkv.bias, o,
                            a.q_norm.weight if a.q_norm is not None else None,
                            a.k_norm.weight if a.k_norm is not None else None,
                            self.post_attention_layernorm.weight, gate_up, down, kind)

    def forward(self, h, cos, sin, attn: AttentionFn, linear: str = "torch"):
        w = self.tensors(linear)
        if w is not None:
            a, i = self.self_attn, self.self_attn.layer_idx
            return fused_layer(h, cos, sin, w, lambda q, k, v: attn(i, q, k, v), (a.n_heads, a.n_kv_heads, a.head_dim),
                               self.input_layernorm.eps)
        # .forward, not __call__: no hooks are used, and the call machinery cost ~3 % of a batch-1 step
        h = h + self.self_attn.forward(self.input_layernorm.forward(h), cos, sin, attn)
        return h + self.mlp.forward(self.post_attention_layernorm.forward(h))


class LayerTensors(NamedTuple):
    """One decoder layer's fused weights: what `fused_layer` computes with (as tensors, so a compiled
    `fused_layer` serves every layer)."""
    in_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    linear: str  # how the linears run: "torch", "onednn" (oneDNN-reordered copies) or "kernels" (engine/cpu_linear.py)


def fused_layer(h, cos, sin, w: LayerTensors, attn, heads: tuple[int, int, int], eps: float) -> torch.Tensor:
    """One decoder layer over stacked q/k/v and gate/up weights; attn(q [T, H, D], k, v [T, KV, D])
    -> [T, H, D]. The eager step and the compiled step (engine/compiled_step.py) both run this."""
    (H, KV, D), T = heads, h.shape[0]
    qkv = linear(rms_norm(h, w.in_norm, eps), w.qkv, w.qkv_bias, w.linear)
    if w.q_norm is None:  # RoPE over the q and k heads at once
        qk = apply_rope(qkv[:, :(H + KV) * D].view(T, H + KV, D), cos, sin)
        q, k = qk[:, :H], qk[:, H:]
    else:
        q = apply_rope(rms_norm(qkv[:, :H * D].view(T, H, D), w.q_norm, eps), cos, sin)
        k = apply_rope(rms_norm(qkv[:, H * D:(H + KV) * D].view(T, KV, D), w.k_norm, eps), cos, sin)
    out = attn(q, k, qkv[:, (H + KV) * D:].view(T, KV, D))
    h = h + linear(out.reshape(T, H * D), w.o, None, w.linear)
    gate, up = linear(rms_norm(h, w.post_norm, eps), w.gate_up, None, w.linear).chunk(2, dim=-1)
    return h + linear(F.silu(gate, inplace=True).mul_(up), w.down, None, w.linear)  # in place: no [T, ffn] temporaries


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.shape.vocab, cfg.shape.d_model)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.shape.layers))
        self.norm = RMSNorm(cfg.shape.d_model, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.shape.d_model, cfg.shape.vocab, bias=False)
        if cfg.shape.tied_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def fuse(self, linear: str = "onednn") -> "LlamaModel":
        """Stack each layer's q/k/v and gate/up weights for the fast path and prepare every matrix for
        the `linear` kind (engine/cpu_linear.py): "onednn" keeps a oneDNN-reordered copy where bf16 is
        native, bf16 "kernels" a panel copy; other kinds use the matrices as they are (idempotent)."""
        mats = [self.lm_head.weight]
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
            if (w := layer.tensors()) is not None:
                mats += [w.qkv, w.o, w.gate_up, w.down]
        if linear == "onednn" or (linear == "kernels" and self.lm_head.weight.dtype == torch.bfloat16):
            for m in mats:
                (pack if linear == "onednn" else panel)(m)
        return self

    def prepared(self, linear: str) -> bool:
        """Whether every fused matrix is ready for the `linear` kind (for "onednn": has its reordered
        copy; for bf16 "kernels": its panel copy)."""
        return all((w := layer.tensors(linear)) is not None and w.linear == linear for layer in self.layers)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn,
                linear: str = "torch") -> torch.Tensor:
        """input_ids, positions: [T] -> hidden states [T, d_model] before the final norm; the fused
        layers' linears run the `linear` way (engine/cpu_linear.py)."""
        h = self.embed_tokens(input_ids)
        cos, sin = rope_tables(positions, self.config.shape.head_dim, self.config.rope_base, h.dtype)
        for layer in self.layers:
            h = layer.forward(h, cos, sin, attn, linear)
        return h

    def compute_logits(self, hidden: torch.Tensor, linear: str = "torch") -> torch.Tensor:
        """hidden [N, d_model] -> fp32 logits [N, vocab], lm_head run the `linear` way."""
        kind, (w,) = as_taken(linear, self.lm_head.weight)
        return cpu_linear.linear(self.norm(hidden), w, None, kind).float()


@torch.inference_mode()
def full_sequence_logits(model: LlamaModel, token_ids: list[int], linear: str = "torch") -> torch.Tensor:
    """Logits [len, vocab] of one sequence computed from scratch, without any KV cache; the fused
    layers' linears run the `linear` way (engine/cpu_linear.py)."""
    device = model.embed_tokens.weight.device
    ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    hidden = model(ids, torch.arange(len(token_ids), device=device), causal_attention, linear)
    return model.compute_logits(hidden, linear)
