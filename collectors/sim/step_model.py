"""Step-time models: how long one engine step lasts, from what the step computes.

A model sees each scheduled chunk of the step as a `StepRow`: how many positions of the sequence were
already in the KV cache (h) and how many tokens the chunk computes (c; a decode computes 1). Any object
with `name`, `step_ns(rows)` and `describe()` (its formula and every parameter with its unit and
source, recorded in the run's manifest) is a step model; `BookStepModel` is the one of the book's
§8.2.2: a fixed time per step, plus a time per new token, plus a time per causal query–key pair.
A chunk of c tokens after h filled positions has c·h + c(c+1)/2 causal pairs (each new token
attends to every position before it and to itself), so a decode at position h has h + 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from inferledger.costmodel.work import causal_pairs  # the one definition (docs/MODEL.md)


@dataclass(frozen=True)
class StepRow:
    context_tokens: int  # h: positions of the sequence already in the KV cache before this chunk
    new_tokens: int      # c: tokens the chunk computes this step


class StepModel(Protocol):
    name: str

    def step_ns(self, rows: Sequence[StepRow]) -> int: ...

    def describe(self) -> dict: ...


@dataclass(frozen=True)
class BookStepModel:
    """T(step) = fixed + per_token × Σc + per_pair × Σ pairs (the book's fit on its own GPU)."""
    fixed_ms: float = 26.22
    per_token_us: float = 30.4
    per_pair_ns: float = 3.0
    source: str = "the book's §8.2.2 fit to batch-1 measurements of experiment 8-1 (Qwen3-8B, RTX PRO 6000)"
    name: str = "book"

    def step_ns(self, rows: Sequence[StepRow]) -> int:
        tokens = sum(r.new_tokens for r in rows)
        pairs = sum(causal_pairs(r.new_tokens, r.context_tokens) for r in rows)
        return round(self.fixed_ms * 1e6 + self.per_token_us * 1e3 * tokens + self.per_pair_ns * pairs)

    def describe(self) -> dict:
        return {"name": self.name,
                "formula": "fixed_ms + per_token_us × Σ new tokens + per_pair_ns × Σ (c·h + c(c+1)/2) over the "
                           "step's chunks (c new tokens after h filled positions)",
                "parameters": {"fixed_ms": {"value": self.fixed_ms, "unit": "ms", "source": self.source},
                               "per_token_us": {"value": self.per_token_us, "unit": "µs", "source": self.source},
                               "per_pair_ns": {"value": self.per_pair_ns, "unit": "ns", "source": self.source}}}
