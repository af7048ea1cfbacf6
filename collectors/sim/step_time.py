"""Step-time models: how long one engine step lasts, from what the step computes.

A model sees each scheduled chunk of the step as a `SimStepRow`: how many positions of the sequence were
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
class SimStepRow:
    context_tokens: int  # h: positions of the sequence already in the KV cache before this chunk
    new_tokens: int      # c: tokens the chunk computes this step


class StepModel(Protocol):
    name: str

    def step_ns(self, rows: Sequence[SimStepRow]) -> int: ...

    def describe(self) -> dict: ...


@dataclass(frozen=True)
class BookStepModel:
    """T(step) = fixed + per_token × Σc + per_pair × Σ pairs (the book's fit on its own GPU)."""
    fixed_ms: float = 26.22
    per_token_us: float = 30.4
    per_pair_ns: float = 3.0
    source: str = "the book's §8.2.2 fit to batch-1 measurements of experiment 8-1 (Qwen3-8B, RTX PRO 6000)"
    name: str = "book"

    def step_ns(self, rows: Sequence[SimStepRow]) -> int:
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


@dataclass(frozen=True)
class FittedStepModel:
    """T(step) = a step fit's prediction over the step's work, plus its host time between steps.

    The work (FLOPs and bytes of every serial stage) comes from costmodel.work for the declared model
    shape; the fit (costmodel.fit.StepFit: the work at a real run's measured rates, with α, a
    per-sequence overhead, a compute efficiency and a KV factor fitted on its steps; docs/MODEL.md "Fit") turns it into milliseconds, and its inter-step term (γ0 + γ1 · batch size, the host time from
    one step's end to the next one's start on that run) is added, so consecutive simulated steps are as
    far apart as real ones. A chunk of one token is counted as a decode, anything longer as a prefill
    (both give the LM head one row)."""
    fit: object   # costmodel.fit.StepFit
    shape: object  # probes.model_shape.ModelShape
    name: str = "fit"

    def work_ms(self, rows: Sequence[SimStepRow]) -> float:
        """The fit's prediction for the step's work alone (uncontended: the fit learns cpu_ms)."""
        from inferledger.costmodel.work import StepRow, step_work

        work = step_work(self.shape, [StepRow("decode" if r.new_tokens == 1 else "prefill", r.new_tokens,
                                              r.context_tokens) for r in rows])
        return self.fit.predict_ms(work)

    def gap_ms(self, rows: Sequence[SimStepRow]) -> float:
        """The fit's host time between steps after this one."""
        return self.fit.predict_gap_ms(len(rows)) or 0.0

    def step_ms(self, rows: Sequence[SimStepRow]) -> float:
        return self.work_ms(rows) + self.gap_ms(rows)

    def step_ns(self, rows: Sequence[SimStepRow]) -> int:
        return round(self.step_ms(rows) * 1e6)

    def describe(self) -> dict:
        f, source = self.fit, f"step fit on {self.fit.trained_on or 'a real run'}"
        return {"name": self.name,
                "formula": f.formula + ", + gap_alpha_ms + gap_ms_per_seq × the step's sequences (host time "
                           "between steps)",
                "parameters": {"alpha_ms": {"value": f.alpha_ms, "unit": "ms", "source": source},
                               "ms_per_gflop": {"value": f.ms_per_gflop, "unit": "ms/GFLOP", "source": source},
                               "ms_per_mb": {"value": f.ms_per_mb, "unit": "ms/MB", "source": source},
                               "ms_per_seq": {"value": f.ms_per_seq_reported, "unit": "ms",
                                              "source": source if f.ms_per_seq_known else
                                              "unknown: one batch size in training; held at 0"},
                               "kv_factor": {"value": f.kv_factor, "unit": "×", "source": source},
                               "attention_ms_per_gflop": {"value": f.attention_ms_per_gflop, "unit": "ms/GFLOP",
                                                          "source": source},
                               "gap_alpha_ms": {"value": f.gap_alpha_ms, "unit": "ms", "source": source},
                               "gap_ms_per_seq": {"value": f.gap_ms_per_seq_reported, "unit": "ms",
                                                  "source": source if f.gap_ms_per_seq_known
                                                  or f.gap_alpha_ms is None else
                                                  "unknown: one batch size in training; held at 0"}},
                "fit": f.to_dict(), "shape": self.shape.to_dict()}
