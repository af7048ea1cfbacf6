"""ModelConfig: the architecture fields of a llama-family decoder, from GGUF metadata or config.json."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")


@dataclass
class ModelConfig:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    max_position: int
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False       # Qwen2: bias on the q/k/v projections
    qk_norm: bool = False        # Qwen3: RMSNorm over each head of q and k before RoPE
    bos_id: int | None = None
    eos_ids: list[int] = field(default_factory=list)

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.float32) -> int:
        """Bytes of K and V one token occupies across all layers."""
        nbytes = torch.empty((), dtype=dtype).element_size()
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * nbytes

    @property
    def q_per_kv(self) -> int:
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict:
        return asdict(self)
