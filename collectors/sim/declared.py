"""Declared model shapes for simulated runs: the architecture a simulation stands for, without weights.

A simulated run computes nothing, but its KV pool, its context limit and the figures derived from
its shape (KV bytes per token, the block's bytes in the resource account) come from a declared
config, recorded in the run's manifest with evidence `declared`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inferledger.engine.config import ModelConfig
from inferledger.probes.model_shape import ModelShape

# Qwen3-8B, the model of the book's chapter 8 (36 layers, 8 KV heads of 128: 144 KiB of bf16 KV a token);
# the other fields as its published config.json gives them
QWEN3_8B = ModelConfig(arch="qwen3", shape=ModelShape(layers=36, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128,
                                                      ffn=12288, vocab=151936, tied_embeddings=False,
                                                      weight_bytes_per_param=2, act_bytes=2, kv_bytes=2,
                                                      source="Qwen3-8B config.json, bf16"),
                       max_position=40960, rope_base=1_000_000.0, rms_eps=1e-6, qk_norm=True, bos_id=None,
                       eos_ids=[151645])
DECLARED = {"Qwen3-8B": QWEN3_8B}


@dataclass(frozen=True)
class DeclaredModel:
    """The model a simulated run stands for: its name, its declared shape and its KV cache's dtype."""
    name: str
    config: ModelConfig
    kv_dtype: torch.dtype

    def identity(self) -> dict:
        """The manifest's `model` entry of a simulated run: the declared shape, no file and no weights."""
        kv = str(self.kv_dtype).removeprefix("torch.")
        return {"name": self.name, "path": None, "sha256": None, "format": "declared shape (no weights)",
                "quantization": None,
                "architecture": {k: v for k, v in self.config.to_dict().items() if k not in ("bos_id", "eos_ids")},
                "dtype": {"weights": None, "activations": None, "kv": kv, "resolved_by": "declared"},
                "kv_bytes_per_token": self.config.shape.at(self.kv_dtype).kv_bytes_per_token}


QWEN3_8B_BF16 = DeclaredModel("Qwen3-8B", QWEN3_8B, torch.bfloat16)  # what a simulation stands for unless told
