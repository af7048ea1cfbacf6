"""One step's work: FLOPs and bytes per serial stage (docs/MODEL.md "Counting").

A step runs its batch's tokens through every layer, then the LM head on the rows that give logits.
The serial stages, in order: `embed` (the gather), and per layer `qkv` (input norm + the fused q/k/v
GEMM), `attention` (QK^T and PV over each row's causal context, KV written and read), `o_proj`,
`gate_up` (post-attention norm + the fused gate/up GEMM), `down`; then `lm_head` (final norm + the
vocabulary GEMM). Each layer stage carries the sum over layers (the layers are identical, so the
sum of per-layer bounds is the bound of the summed work).

Counted: GEMMs (a multiply-add is 2 FLOP), attention score and value products over the causal
context (no padding, no masked-out pairs), weight bytes once per step, input and output activations
of each GEMM, the KV read for the context before the step and the KV written for its tokens.
Not counted: FLOPs of norms, rotary embedding, softmax, the SiLU product, residual adds, sampling.
"""
from __future__ import annotations

from dataclasses import dataclass

from inferledger.probes.model_shape import ModelShape

KINDS = ("prefill", "decode", "verify")


@dataclass(frozen=True)
class StepRow:
    """One sequence's part of a step: its kind, tokens computed and tokens already in KV before them.
    logit_rows: rows the LM head runs for (None: 1 for prefill and decode, every token for verify)."""
    kind: str
    tokens: int
    context_before: int
    logit_rows: int | None = None

    @property
    def logits(self) -> int:
        if self.logit_rows is not None:
            return self.logit_rows
        return self.tokens if self.kind == "verify" else (1 if self.tokens > 0 else 0)


@dataclass(frozen=True)
class StageWork:
    name: str
    flops: float
    weight_bytes: float = 0.0
    kv_read_bytes: float = 0.0
    kv_write_bytes: float = 0.0
    act_bytes: float = 0.0
    attention: bool = False  # its FLOPs are attention's, not a linear layer's

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.act_bytes

    @property
    def intensity(self) -> float | None:
        """FLOP per byte (None without bytes)."""
        return self.flops / self.bytes if self.bytes else None


def gemm_work(name: str, m: int, k: int, n: int, weight_bytes: int, act_bytes: int, *, extra_weight: float = 0.0,
              repeat: int = 1) -> StageWork:
    """[m, k] × [k, n]: 2mkn FLOP; the weight read once, the input read and the output written once."""
    return StageWork(name, repeat * 2.0 * m * k * n, repeat * (k * n * weight_bytes + extra_weight),
                     act_bytes=repeat * (m * k + m * n) * act_bytes)


@dataclass(frozen=True)
class StepWork:
    stages: tuple[StageWork, ...]
    tokens: int
    num_seqs: int
    context_tokens: int     # sum of the rows' context before the step
    kv_bytes_per_token: int

    def _sum(self, field: str, attention: bool | None = None) -> float:
        return sum(getattr(s, field) for s in self.stages if attention is None or s.attention == attention)

    @property
    def flops(self) -> float:
        return self._sum("flops")

    @property
    def linear_flops(self) -> float:
        return self._sum("flops", attention=False)

    @property
    def attention_flops(self) -> float:
        return self._sum("flops", attention=True)

    @property
    def bytes(self) -> float:
        return self._sum("bytes")

    @property
    def weight_bytes(self) -> float:
        return self._sum("weight_bytes")

    @property
    def kv_read_bytes(self) -> float:
        return self._sum("kv_read_bytes")

    @property
    def kv_write_bytes(self) -> float:
        return self._sum("kv_write_bytes")

    @property
    def act_bytes(self) -> float:
        return self._sum("act_bytes")

    @property
    def intensity(self) -> float | None:
        return self.flops / self.bytes if self.bytes else None


def causal_pairs(tokens: int, context_before: int) -> int:
    """(query, key) pairs a chunk attends to: token j of the chunk sees context_before + j + 1 keys."""
    return tokens * context_before + tokens * (tokens + 1) // 2


def step_work(shape: ModelShape, rows: list[StepRow]) -> StepWork:
    """The work of one step whose batch is `rows` (docs/MODEL.md)."""
    for r in rows:
        if r.kind not in KINDS or r.tokens < 0 or r.context_before < 0:
            raise ValueError(f"step row {r}: kind must be one of {', '.join(KINDS)}, tokens and context >= 0")
    s, L = shape, shape.layers
    t = sum(r.tokens for r in rows)
    ctx = sum(r.context_before for r in rows)
    logits = sum(r.logits for r in rows)
    wb, ab, d = s.weight_bytes_per_param, s.act_bytes, s.d_model
    norm = d * wb  # an RMSNorm's weight, read with the GEMM it feeds
    kv_tok = s.kv_bytes_per_layer_token
    pairs = sum(causal_pairs(r.tokens, r.context_before) for r in rows)
    attention = StageWork("attention", L * 4.0 * s.q_dim * pairs, kv_read_bytes=L * ctx * kv_tok,
                          kv_write_bytes=L * t * kv_tok, act_bytes=L * 2.0 * t * s.q_dim * ab, attention=True)
    stages = (
        StageWork("embed", 0.0, t * d * wb, act_bytes=t * d * ab),
        gemm_work("qkv", t, d, s.q_dim + 2 * s.kv_dim, wb, ab, extra_weight=norm, repeat=L),
        attention,
        gemm_work("o_proj", t, s.q_dim, d, wb, ab, repeat=L),
        gemm_work("gate_up", t, d, 2 * s.ffn, wb, ab, extra_weight=norm, repeat=L),
        gemm_work("down", t, s.ffn, d, wb, ab, repeat=L),
        gemm_work("lm_head", logits, d, s.vocab, wb, ab, extra_weight=norm) if logits else StageWork("lm_head", 0.0),
    )
    return StepWork(stages, t, len(rows), ctx, s.kv_bytes_per_token)
