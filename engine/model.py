"""The llama-family decoder (SmolLM2, Llama, Qwen2, Qwen3) in plain PyTorch.

The model computes over a flat batch of tokens [T] with their positions; attention itself is
delegated to an `attn` callable passed into `forward`, so the same weights run over a paged KV cache
(engine/runner.py) or a plain contiguous sequence (`causal_attention`, used by tests). No state is
kept between calls.
Parameter names follow Hugging Face's llama layout (minus the leading "model."), so safetensors
checkpoints load by name.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig

# attn(layer_idx, q [T, H, D], k [T, KV, D], v [T, KV, D]) -> [T, H, D]
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32 whatever the activation dtype, as the reference implementation does
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype):
    """cos/sin [T, head_dim] for the half-split ("rotate_half") rotary layout."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; rotates pairs (i, i + D/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps) if cfg.qk_norm else None

    def forward(self, x, cos, sin, attn: AttentionFn):
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(T, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(T, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attn(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, cos, sin, attn: AttentionFn):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, attn)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        """input_ids, positions: [T] -> hidden states [T, d_model] before the final norm."""
        h = self.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_base, h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin, attn)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, d_model] -> fp32 logits [N, vocab]."""
        return self.lm_head(self.norm(hidden)).float()


def causal_attention(layer_idx: int, q, k, v):
    """Attention for one whole sequence held in q/k/v (no cache): the plain reference path."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return out.transpose(0, 1)


@torch.inference_mode()
def full_sequence_logits(model: LlamaModel, token_ids: list[int]) -> torch.Tensor:
    """Logits [len, vocab] of one sequence computed from scratch, without any KV cache."""
    device = model.embed_tokens.weight.device
    ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    hidden = model(ids, torch.arange(len(token_ids), device=device), causal_attention)
    return model.compute_logits(hidden)
