"""ModelConfig: the engine's torch-side config of a llama-family decoder, from GGUF metadata or config.json.

It holds the model's shape (probes/model_shape.py `ModelShape`, at the dtype the model was loaded in:
the one type the manifest and the cost model use too) and adds only what the engine needs to run it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from inferledger.probes.model_shape import ModelShape

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")


@dataclass
class ModelConfig:
    arch: str
    shape: ModelShape
    max_position: int
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    qkv_bias: bool = False       # Qwen2: bias on the q/k/v projections
    qk_norm: bool = False        # Qwen3: RMSNorm over each head of q and k before RoPE
    bos_id: int | None = None
    eos_ids: list[int] = field(default_factory=list)

    @property
    def q_per_kv(self) -> int:
        return self.shape.n_heads // self.shape.n_kv_heads

    def to_dict(self) -> dict:
        """The fields under the engine's names (the manifest's model.architecture, with bos_id and eos_ids)."""
        return {"arch": self.arch, **self.shape.architecture(), "max_position": self.max_position,
                "rope_base": self.rope_base, "rms_eps": self.rms_eps, "qkv_bias": self.qkv_bias,
                "qk_norm": self.qk_norm, "bos_id": self.bos_id, "eos_ids": self.eos_ids}
