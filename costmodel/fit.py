"""The step-time fit T = α + F / P_eff + Q / B_eff, and the host time between steps (docs/MODEL.md "Fit").

Least squares with non-negative coefficients (every subset of the terms is solved and the best
feasible one kept: three unknowns). It is trained on some step *shapes* and judged on others: a
step's shape is its batch size, its tokens and its context (each of the last two by powers of two);
the distinct shapes are sorted and every third one (the 2nd, 5th, ...) is held out, so held-out
steps are never neighbours of training steps of the same shape. The covered range is the training
steps' span of batch size, tokens and context; a step outside it is `extrapolated`.

The fitted rates are *effective* (source `fit`): what this engine reached on these shapes, never a
peak. The inter-step term is a second fit, gap = γ0 + γ1 · batch size, on the host time from one
step's end to the next one's start.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field

import numpy as np

from inferledger.probes.quantile import quantile

from .roofs import Roof, Roofs

HOLD_OUT_EVERY = 3  # every third distinct shape is held out


class FitError(ValueError):
    """Too few points to fit (the message says how many and of what)."""


@dataclass(frozen=True)
class FitPoint:
    flops: float
    bytes: float
    measured_ms: float
    num_seqs: int
    tokens: int
    context_tokens: int
    gap_ms: float | None = None  # host time from this step's end to the next step's start
    step_id: int | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.num_seqs, _bucket(self.tokens), _bucket(self.context_tokens))


def _bucket(n: int) -> int:
    return int(n).bit_length()  # 0 for 0, then 1, 2-3, 4-7, ...


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min |x c − y| with c >= 0, by solving each subset of columns and keeping the best feasible."""
    n = x.shape[1]
    best, best_err = np.zeros(n), float(np.sum(y ** 2))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            c, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.all(c >= 0):
                err = float(np.sum((x[:, cols] @ c - y) ** 2))
                if err < best_err:
                    best, best_err = np.zeros(n), err
                    best[list(cols)] = c
    return best


def split(points: list[FitPoint]) -> tuple[list[FitPoint], list[FitPoint]]:
    """(training, held-out) by shape: every third distinct shape, in sorted order, is held out."""
    shapes = sorted({p.shape for p in points})
    held = {s for i, s in enumerate(shapes) if i % HOLD_OUT_EVERY == 1}
    return [p for p in points if p.shape not in held], [p for p in points if p.shape in held]


def error_pct(predicted_ms: float, measured_ms: float) -> float | None:
    """(predicted − measured) / measured × 100 (None when nothing was measured)."""
    return (predicted_ms - measured_ms) / measured_ms * 100.0 if measured_ms else None


@dataclass
class StepFit:
    alpha_ms: float
    ms_per_gflop: float
    ms_per_mb: float
    gap_alpha_ms: float | None = None
    gap_ms_per_seq: float | None = None
    covered: dict = field(default_factory=dict)  # {"num_seqs": [lo, hi], "tokens": [...], "context_tokens": [...]}
    n_train: int = 0
    n_held_out: int = 0
    held_out_median_abs_pct: float | None = None
    held_out_p90_abs_pct: float | None = None
    train_median_abs_pct: float | None = None
    trained_on: str = ""  # the run (or data) it was trained on

    @classmethod
    def fit(cls, points: list[FitPoint], trained_on: str = "") -> "StepFit":
        """Train on the training shapes of `points`, report errors on the held-out shapes."""
        train, held = split(points)
        if len(train) < 3:
            raise FitError(f"step fit: {len(train)} training steps (of {len(points)}); at least 3 are needed")
        x = np.array([[1.0, p.flops / 1e9, p.bytes / 1e6] for p in train])
        alpha, per_gflop, per_mb = (float(v) for v in _nnls(x, np.array([p.measured_ms for p in train])))
        gaps = [p for p in train if p.gap_ms is not None]
        g0 = g1 = None
        if len(gaps) >= 2:
            g0, g1 = (float(v) for v in _nnls(np.array([[1.0, p.num_seqs] for p in gaps]), np.array([p.gap_ms for p in gaps])))
        covered = {k: [min(getattr(p, k) for p in train), max(getattr(p, k) for p in train)]
                   for k in ("num_seqs", "tokens", "context_tokens")}
        out = cls(alpha, per_gflop, per_mb, g0, g1, covered, len(train), len(held), trained_on=trained_on)
        out.train_median_abs_pct = out.median_abs_pct(train)
        out.held_out_median_abs_pct = out.median_abs_pct(held)
        out.held_out_p90_abs_pct = out.abs_pct_quantile(held, 0.9)
        return out

    def predict_ms(self, work) -> float:
        """The step time for a StepWork (or anything with `flops` and `bytes`)."""
        return self.alpha_ms + work.flops / 1e9 * self.ms_per_gflop + work.bytes / 1e6 * self.ms_per_mb

    def predict_gap_ms(self, num_seqs: int) -> float | None:
        if self.gap_alpha_ms is None:
            return None
        return self.gap_alpha_ms + self.gap_ms_per_seq * num_seqs

    def extrapolated(self, num_seqs: int, tokens: int, context_tokens: int) -> bool:
        """Outside the training steps' range of batch size, tokens or context."""
        vals = {"num_seqs": num_seqs, "tokens": tokens, "context_tokens": context_tokens}
        return any(not lo <= vals[k] <= hi for k, (lo, hi) in self.covered.items())

    def abs_errors_pct(self, points: list[FitPoint]) -> list[float]:
        out = (error_pct(self.predict_ms(p), p.measured_ms) for p in points)
        return [abs(e) for e in out if e is not None]

    def median_abs_pct(self, points: list[FitPoint]) -> float | None:
        return quantile(self.abs_errors_pct(points), 0.5)

    def abs_pct_quantile(self, points: list[FitPoint], q: float) -> float | None:
        return quantile(self.abs_errors_pct(points), q)

    @property
    def p_eff_tflops(self) -> float | None:
        """Effective compute rate (None: the fit found no FLOP term)."""
        return 1.0 / self.ms_per_gflop if self.ms_per_gflop > 0 else None

    @property
    def b_eff_gbps(self) -> float | None:
        """Effective memory rate (None: the fit found no byte term)."""
        return 1.0 / self.ms_per_mb if self.ms_per_mb > 0 else None

    def roofs(self) -> Roofs | None:
        """The effective rates as roofs labelled `fit` (None when a term is absent)."""
        if self.p_eff_tflops is None or self.b_eff_gbps is None:
            return None
        label = f"step fit on {self.trained_on or 'the training shapes'}"
        return Roofs(Roof("compute", self.p_eff_tflops, "TFLOP/s", "fit", "effective", label),
                     Roof("memory", self.b_eff_gbps, "GB/s", "fit", "effective", label))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StepFit":
        return cls(**d)


def apply(fit: StepFit, points: list[FitPoint]) -> dict:
    """A fit (from any run) held against another run's steps (the ledger selects them:
    `inferledger.ledger.step_fit.ledger_fit_points`): per-step predictions and the error summary."""
    steps = [{"step_id": p.step_id, "measured_ms": p.measured_ms, "predicted_ms": fit.predict_ms(p),
              "error_pct": error_pct(fit.predict_ms(p), p.measured_ms),
              "extrapolated": fit.extrapolated(p.num_seqs, p.tokens, p.context_tokens)} for p in points]
    inside = [p for p in points if not fit.extrapolated(p.num_seqs, p.tokens, p.context_tokens)]
    return {"steps": steps, "n": len(points), "n_inside": len(inside),
            "median_abs_pct": fit.median_abs_pct(points), "p90_abs_pct": fit.abs_pct_quantile(points, 0.9),
            "inside_median_abs_pct": fit.median_abs_pct(inside)}
