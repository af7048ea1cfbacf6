"""The step-time fit, and the host time between steps (docs/MODEL.md "Fit").

The physics is held fixed where it is known: each step's FLOPs and bytes (costmodel/work.py: the
weights read once per step, the KV read and written, the activations) and the device's rates (the
run's microbenchmarks: the best of its matmul and memory-stream repeats, each raised to what a training
step demonstrably reached where a repeat was held back: `held_rates`, `rates`; a run with no rates
at all holds the highest rates its training steps reached). What is not known is fitted: a per-step
host overhead α, a per-sequence overhead, an efficiency factor on the compute roof for the linear layers
(e: the engine's linears against its best matmul) and one for attention's FLOPs (e_att: a prefill's
attention runs at about half the linears' rate on the CPUs measured, so one factor for both made the fit
of a mix of prompt lengths wrong on each: too slow for short prompts batched together, too fast for long
ones), k, the attention's KV traffic over its KV bytes (the engine reads a
sequence's KV through its block table at several times its bytes: a decode sequence's marginal cost is
its context at that rate, not the prefill's per-token rate) and κ, the on-CPU time a step loses per
ms it waited for a CPU (W, the step's measured wait: steps.contention_ms). The step is two serial
groups, the linear layers with the LM head and attention, each taking the longer of its compute and
its memory time:

    T = α + a_seq · num_seqs + max(e · F_lin / P, Q_lin / B) + max(e_att · F_att / P, k · Q_kv / B) + κ · min(W, T_0)

T_0 is the step's uncontended time (T without its last term): W counts up to it, since a thread is
preempted at most once per slice it runs and each preemption costs it at least a slice of wait, so
the preemptions, and what they cost on a CPU, grow with min(W, T_0) and not past it (the cap is found by refitting CAP_ROUNDS
times). κ is fitted only where the training steps waited for a CPU at least WAIT_EVIDENCE of their
time (a co-tenant was there to measure it), else held at 0; a step with no wait (StepWork, the
simulated clock) is predicted as it would have run uncontended.

The weights' memory rate carries no fitted factor: a step reads its weights once, so a fitted factor
on those bytes and α are the same column on decode-only steps (least squares keeps one and drops the
other); held at the measured rate the bytes term is always there, and α is what the step costs beyond
it. The KV bytes vary with the context, so their factor k is seen apart from α. e, e_att and k are
found by a search over log grids (e and e_att from 0.5 to 200, k from 1 to 64): (e, k) with e_att = e
first, coarse then refined around the best; then (e, e_att) around that e at its k; then all three
refined around the best. Where the
steps cannot tell values apart, a triple with e_att = e is kept if there is one (a decode's attention
FLOPs and KV bytes grow together, so on decodes e_att and k can trade places; a run without prefills
cannot see e_att: it stays e), then the one closest to (1, 1). α and a_seq are found by non-negative least squares on relative
error (the error is judged in percent, so a 200 ms prefill and a 17 ms decode weigh alike).

It is trained on some step *shapes* and judged on others: a step's shape is its batch size, its
tokens and its context (each of the last two by powers of two); the distinct shapes are sorted and
every third one (the 2nd, 5th, ...) is held out. The covered range is the training steps' span of
batch size, tokens and context; a step outside it is `extrapolated`. The inter-step term is a second
fit, gap = γ0 + γ1 · batch size, on the host time from one step's end to the next one's start.

A fit declared by an older run keeps its form: `combine = "sum"` (T = α + F / P_eff + Q / B_eff, the
free form once used without rates), the physics with k = 1 (`kv_factor` absent) or with e_att = e
(`attention_efficiency` absent).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from inferledger.probes.quantile import quantile

from .roofs import Roof, Roofs, fit_rates

HOLD_OUT_EVERY = 3  # every third distinct shape is held out
EFFICIENCY_GRID = np.geomspace(0.5, 200.0, 241)  # e searched here (1 % steps), refined around the best
KV_GRID = np.geomspace(1.0, 64.0, 43)  # k searched here (10 % steps), refined around the best
COARSE, REFINE = 4, 17  # (e, k) on every COARSE-th point of each grid, REFINE² around the best, then e_att, then REFINE_3³
REFINE_3 = 9            # points per parameter in the last, joint refinement
PAIRS_AT_ONCE = 64      # (e, e_att, k) triples solved together (a steps × triples array each)
FLAT = 1e-3  # a triple whose error is within 0.1 % of the best is as good: the one closest to (1, 1, e_att = e) is kept
KINDS = ("prefill", "decode", "mixed")
WAIT_EVIDENCE = 0.01  # κ is fitted where the training steps waited for a CPU >= 1 % of their time, else 0
CAP_ROUNDS = 4        # fits with κ: each step's wait capped at its uncontended time from the round before


class FitError(ValueError):
    """Too few points to fit (the message says how many and of what)."""


@dataclass(frozen=True)
class FitPoint:
    """One step as a fit sees it. measured_ms: the time the fit is trained on and judged against
    (steps.cpu_ms less blocked_ms: the step without its wait for a CPU and its sleep on a lock, ledger/step_fit.py
    POINTS_SQL); wall_ms: the step's wall time."""
    linear_flops: float
    attention_flops: float
    bytes: float
    kv_bytes: float  # KV read and written: the attention group's bytes
    measured_ms: float
    num_seqs: int
    tokens: int
    context_tokens: int
    gap_ms: float | None = None  # host time from this step's end to the next step's start
    step_id: int | None = None
    kind: str | None = None      # prefill, decode or mixed
    wall_ms: float | None = None
    wait_ms: float | None = None  # the step's measured wait for a CPU (steps.contention_ms); None: unmeasured

    @classmethod
    def of(cls, work, measured_ms: float, **kw) -> "FitPoint":
        """A point from a costmodel StepWork."""
        return cls(work.linear_flops, work.attention_flops, work.bytes, work.kv_read_bytes + work.kv_write_bytes,
                   measured_ms, work.num_seqs, work.tokens, work.context_tokens, **kw)

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.num_seqs, _bucket(self.tokens), _bucket(self.context_tokens))


def _bucket(n: int) -> int:
    return int(n).bit_length()  # 0 for 0, then 1, 2-3, 4-7, ...


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min |x c − y| with c >= 0, by solving each subset of columns and keeping the best feasible."""
    return _nnls_many(x, y[:, None])[0][:, 0]


def _nnls_many(x: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_nnls` for each column of ys at once: (the coefficients, one column per column of ys; the squared
    errors). Each subset of x's columns is solved once (its pseudo-inverse) for every column of ys."""
    n = x.shape[1]
    best, best_err = np.zeros((n, ys.shape[1])), np.sum(ys ** 2, axis=0)
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sub = x[:, cols]
            c = np.linalg.pinv(sub) @ ys
            err = np.sum((sub @ c - ys) ** 2, axis=0)
            better = np.all(c >= 0, axis=0) & (err < best_err)
            best[:, better] = 0.0
            best[np.ix_(cols, better)] = c[:, better]
            best_err = np.where(better, err, best_err)
    return best, best_err


def split(points: list[FitPoint]) -> tuple[list[FitPoint], list[FitPoint]]:
    """(training, held-out) by shape: every third distinct shape, in sorted order, is held out."""
    shapes = sorted({p.shape for p in points})
    held = {s for i, s in enumerate(shapes) if i % HOLD_OUT_EVERY == 1}
    return [p for p in points if p.shape not in held], [p for p in points if p.shape in held]


def error_pct(predicted_ms: float, measured_ms: float) -> float | None:
    """(predicted − measured) / measured × 100 (None when nothing was measured)."""
    return (predicted_ms - measured_ms) / measured_ms * 100.0 if measured_ms else None


def _groups(work) -> tuple[float, float, float, float]:
    """(linear FLOPs, linear bytes, attention FLOPs, KV bytes) of a FitPoint or a StepWork."""
    kv = work.kv_bytes if isinstance(work, FitPoint) else work.kv_read_bytes + work.kv_write_bytes
    return work.linear_flops, work.bytes - kv, work.attention_flops, kv


@dataclass
class StepFit:
    alpha_ms: float
    ms_per_gflop: float     # e / P (stage_max) or 1 / P_eff (sum), ms per GFLOP
    ms_per_mb: float        # 1 / B: held at the measured rate (stage_max), or fitted (sum), ms per MB
    gap_alpha_ms: float | None = None
    gap_ms_per_seq: float | None = None
    covered: dict = field(default_factory=dict)  # {"num_seqs": [lo, hi], "tokens": [...], "context_tokens": [...]}
    n_train: int = 0
    n_held_out: int = 0
    held_out_median_abs_pct: float | None = None
    held_out_p90_abs_pct: float | None = None
    train_median_abs_pct: float | None = None
    trained_on: str = ""  # the run (or data) it was trained on
    ms_per_seq: float = 0.0
    compute_efficiency: float | None = None  # e: the step's FLOPs ran e times slower than the best matmul
    rates: dict | None = None  # {"compute_tflops", "memory_gbps", "source", "label"}: the physics held fixed
    combine: str = "sum"       # "stage_max" (the physics fit) or "sum" (the free form of older fits)
    ms_per_wait_ms: float = 0.0  # κ: on-CPU ms a step loses per ms it waited for a CPU (0: not fitted)
    kv_factor: float = 1.0  # k: the attention's KV traffic over its KV bytes (1: the bytes once; older fits)
    attention_efficiency: float | None = None  # e_att: attention's FLOPs ran e_att times slower than the best
    # matmul (None: a fit recorded before it was fitted apart, attention at e)
    gap_covered_num_seqs: list | None = None  # [lo, hi] batch sizes of the steps the gap term was trained on
    # the engine its run ran (ledger/fit_read.py engine_of: the model's shape, the device, the engine's threads):
    # what it may be applied to; None for a fit made elsewhere or recorded before
    engine: dict | None = None

    @classmethod
    def fit(cls, points: list[FitPoint], roofs: Roofs | None, trained_on: str = "",
            kv_factor: float | None = None) -> "StepFit":
        """Train on the training shapes of `points` with the rates of `roofs` held fixed (raised to what a
        training step reached; without roofs, what the steps reached), report errors on the held-out shapes.
        `kv_factor`: k held at this value (`held_kv_factor`: where the attention reads the KV in place), else
        fitted."""
        train, held = split(points)
        if len(train) < 3:
            raise FitError(f"step fit: {len(train)} training steps (of {len(points)}); at least 3 are needed")
        out = cls._physics(train, roofs, trained_on, kv_factor)
        out.n_held_out = len(held)
        out.train_median_abs_pct = out.median_abs_pct(train)
        out.held_out_median_abs_pct = out.median_abs_pct(held)
        out.held_out_p90_abs_pct = out.abs_pct_quantile(held, 0.9)
        return out

    @classmethod
    def _physics(cls, train: list[FitPoint], roofs: Roofs | None, trained_on: str,
                 kv_factor: float | None = None) -> "StepFit":
        rates = held_rates(train, roofs)
        ms_per_gflop, ms_per_mb = 1 / rates["compute_tflops"], 1 / rates["memory_gbps"]
        g = np.array([_groups(p) for p in train]) * [ms_per_gflop / 1e9, ms_per_mb / 1e6, ms_per_gflop / 1e9,
                                                     ms_per_mb / 1e6]
        y = np.array([p.measured_ms for p in train])
        wait = np.array([p.wait_ms or 0.0 for p in train])
        seqs = np.array([p.num_seqs for p in train], dtype=float)
        # one batch size among the training steps: a sequence's cost cannot be told from the step's (the two
        # columns are one), so it is held at 0 and reported unknown (ms_per_seq_known), never as a fitted 0
        cols = [np.ones(len(train)), seqs if len(set(seqs)) > 1 else np.zeros(len(train))]
        seen = wait.sum() >= WAIT_EVIDENCE * y.sum()  # a co-tenant was there: κ is seen, else held at 0
        uncontended = None  # each step's predicted time without its wait: the cap on the wait that costs
        for _ in range(CAP_ROUNDS if seen else 1):
            x = np.column_stack(cols + ([wait if uncontended is None else np.minimum(wait, uncontended)]
                                        if seen else [])) / y[:, None]  # relative error: rows divided by y
            e, a, k, c = _search(g, y, x, KV_GRID if kv_factor is None else np.array([float(kv_factor)]))
            uncontended = c[0] + c[1] * cols[1] + _stages(g, e, k, a)
        alpha, per_seq, *kappa = (float(v) for v in c)
        gap_alpha, gap_per_seq, gap_seqs = _gap_fit(train)
        return cls(alpha, e * ms_per_gflop, ms_per_mb, gap_alpha, gap_per_seq, _covered(train), len(train),
                   trained_on=trained_on, ms_per_seq=per_seq, compute_efficiency=float(e), rates=rates,
                   combine="stage_max", ms_per_wait_ms=kappa[0] if kappa else 0.0, kv_factor=k,
                   attention_efficiency=a, gap_covered_num_seqs=gap_seqs)

    def on_host(self, memory_scale: float, compute_scale: float) -> "StepFit":
        """This fit with its memory term × memory_scale and its compute terms × compute_scale: a fit trained
        where the host gave B and P, applied where it gave B / memory_scale and P / compute_scale (the
        efficiencies, α and the per-sequence cost as fitted)."""
        return replace(self, ms_per_mb=self.ms_per_mb * memory_scale, ms_per_gflop=self.ms_per_gflop * compute_scale)

    def predict_ms(self, work) -> float:
        """The step's on-CPU time for a FitPoint or a StepWork: κ times the step's measured wait, counted up
        to the step's own uncontended time, is added where it carries one (a FitPoint's wait_ms); a
        StepWork is the step as it would run uncontended."""
        fl, bl, fa, bkv = _groups(work)
        c_lin, m_lin = fl / 1e9 * self.ms_per_gflop, bl / 1e6 * self.ms_per_mb
        c_att, m_att = fa / 1e9 * self.attention_ms_per_gflop, self.kv_factor * bkv / 1e6 * self.ms_per_mb
        body = (max(c_lin, m_lin) + max(c_att, m_att) if self.combine == "stage_max"
                else c_lin + m_lin + c_att + m_att)
        uncontended = self.alpha_ms + self.ms_per_seq * work.num_seqs + body
        return uncontended + self.ms_per_wait_ms * min(getattr(work, "wait_ms", None) or 0.0, uncontended)

    @property
    def formula(self) -> str:
        """How predict_ms turns a step's work into milliseconds, in words."""
        if self.combine == "stage_max":
            return ("alpha_ms + ms_per_seq × sequences + max(ms_per_gflop × linear GFLOP, ms_per_mb × linear MB) "
                    "+ max(attention_ms_per_gflop × attention GFLOP, kv_factor × ms_per_mb × KV MB) of the step's work "
                    "(costmodel.work) + ms_per_wait_ms × the step's measured wait for a CPU (none: uncontended); "
                    "ms_per_gflop = compute_efficiency / the measured matmul rate, attention_ms_per_gflop = "
                    "attention_efficiency / that rate, ms_per_mb = 1 / the measured memory rate")
        return "alpha_ms + ms_per_gflop × GFLOP + ms_per_mb × MB of the step's work (costmodel.work)"

    @property
    def attention_ms_per_gflop(self) -> float:
        """ms per GFLOP of attention: e_att / P (ms_per_gflop where e_att was not fitted apart: older fits,
        the free form)."""
        if self.attention_efficiency is None or not self.compute_efficiency:
            return self.ms_per_gflop
        return self.ms_per_gflop * self.attention_efficiency / self.compute_efficiency

    @property
    def ms_per_seq_known(self) -> bool:
        """Whether ms_per_seq was fitted: the training steps had more than one batch size (else it is held at 0
        and α carries the sequences' cost at the one batch size they had)."""
        lo, hi = self.covered.get("num_seqs", (None, None))
        return lo is not None and lo < hi

    @property
    def ms_per_seq_reported(self) -> float | None:
        """ms_per_seq where it was fitted, else None (unknown)."""
        return self.ms_per_seq if self.ms_per_seq_known else None

    @property
    def gap_ms_per_seq_known(self) -> bool:
        """Whether gap_ms_per_seq was fitted: the steps the gap term was trained on had more than one batch size
        (else it is held at 0 and gap_alpha_ms is the host time at the one batch size they had). A fit
        recorded without that range is judged by the training steps' batch sizes."""
        lo, hi = self.gap_covered_num_seqs or self.covered.get("num_seqs", (None, None))
        return self.gap_alpha_ms is not None and lo is not None and lo < hi

    @property
    def gap_ms_per_seq_reported(self) -> float | None:
        """gap_ms_per_seq where it was fitted, else None (unknown)."""
        return self.gap_ms_per_seq if self.gap_ms_per_seq_known else None

    def predict_gap_ms(self, num_seqs: int) -> float | None:
        """The host time after a step of num_seqs sequences (gap_ms_per_seq held at 0 where it is unknown, as
        ms_per_seq is in predict_ms); None without a gap term."""
        if self.gap_alpha_ms is None:
            return None
        return self.gap_alpha_ms + self.gap_ms_per_seq * num_seqs

    def held_beyond(self, num_seqs: int) -> list[str]:
        """The per-sequence terms this fit could not see (its steps had one batch size) that a step of
        `num_seqs` sequences outside that batch size needs: predict_ms and predict_gap_ms leave them out there
        (held at 0), so a prediction at num_seqs is short by their unknown cost. Each as "term (trained at
        batch size B)"; empty where none is missing."""
        out = []
        lo, hi = self.covered.get("num_seqs", (None, None))
        if not self.ms_per_seq_known and lo is not None and not lo <= num_seqs <= hi:
            out.append(f"ms_per_seq (trained at batch size {lo})")
        glo, ghi = self.gap_covered_num_seqs or (lo, hi)
        if self.gap_alpha_ms is not None and not self.gap_ms_per_seq_known and glo is not None \
                and not glo <= num_seqs <= ghi:
            out.append(f"gap_ms_per_seq (trained at batch size {glo})")
        return out

    def blind_spot_note(self, num_seqs: int) -> str | None:
        """In words, what a prediction at `num_seqs` sequences leaves out (`held_beyond`), None where nothing."""
        held = self.held_beyond(num_seqs)
        return (f"a step of {num_seqs} sequences needs {' and '.join(held)}, unknown and held at 0: the prediction "
                f"there leaves the cost per sequence out") if held else None

    def extrapolated(self, num_seqs: int, tokens: int, context_tokens: int) -> bool:
        """Outside the training steps' range of batch size, tokens or context."""
        vals = {"num_seqs": num_seqs, "tokens": tokens, "context_tokens": context_tokens}
        return any(not lo <= vals[k] <= hi for k, (lo, hi) in self.covered.items())

    def n_extrapolated(self, points: list[FitPoint]) -> int:
        """How many of `points` lie outside the training steps' range (`extrapolated`)."""
        return sum(self.extrapolated(p.num_seqs, p.tokens, p.context_tokens) for p in points)

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


def _stages(g: np.ndarray, e: float, k: float = 1.0, a: float | None = None) -> np.ndarray:
    """Each step's two serial groups at efficiencies e (linears) and a (attention; e where None) and KV factor k
    (g: linear compute, linear memory, attention compute, KV memory, in ms at the held rates), each the longer
    of its compute and its memory time."""
    return np.maximum(e * g[:, 0], g[:, 1]) + np.maximum((e if a is None else a) * g[:, 2], k * g[:, 3])


def _search(g: np.ndarray, y: np.ndarray, x: np.ndarray,
            kv_grid: np.ndarray = KV_GRID) -> tuple[float, float, float, np.ndarray]:
    """(e, e_att, k, the coefficients of x's columns): (e, k) over a coarse log grid with e_att = e, refined
    around the best, then (e, e_att) around that e at its k, then the three refined around the best; of the flattest stretch the
    triple with e_att = e if there is one, then the one closest to (1, 1); for each triple the columns by non-negative least squares on
    relative error."""
    def errors(triples: list[tuple[float, float, float]]) -> dict:
        out = {}
        for i in range(0, len(triples), PAIRS_AT_ONCE):
            chunk = np.array(triples[i:i + PAIRS_AT_ONCE])
            e, a, k = chunk[:, 0], chunk[:, 1], chunk[:, 2]
            stages = np.maximum(np.outer(g[:, 0], e), g[:, [1]]) + np.maximum(np.outer(g[:, 2], a), np.outer(g[:, 3], k))
            _, err = _nnls_many(x, (y[:, None] - stages) / y[:, None])
            out.update(zip(map(tuple, chunk.tolist()), err.tolist()))
        return out

    def around(grid: np.ndarray, v: float, n: int = REFINE) -> np.ndarray:
        i = int(np.searchsorted(grid, v))
        return np.geomspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], n)

    coarse_e, coarse_k = EFFICIENCY_GRID[::COARSE], kv_grid[::COARSE]
    tried = errors([(float(e), float(e), float(k)) for e in coarse_e for k in coarse_k])
    e0, _, k0 = min(tried, key=tried.get)
    tried |= errors([(float(e), float(e), float(k)) for e in around(coarse_e, e0) for k in around(coarse_k, k0)])
    e0, _, k0 = min(tried, key=tried.get)  # the best with attention at the linears' efficiency
    tried |= errors([(float(e), float(a), k0) for e in around(coarse_e, e0) for a in coarse_e])
    e1, a1, k1 = min(tried, key=tried.get)
    tried |= errors([(float(e), float(a), float(k)) for e in around(EFFICIENCY_GRID, e1, REFINE_3)
                     for a in around(EFFICIENCY_GRID, a1, REFINE_3) for k in around(kv_grid, k1, REFINE_3)])
    best = min(tried.values())
    flat = (t for t, err in tried.items() if err <= best * (1 + FLAT) + 1e-15)
    # attention at the linears' efficiency where the steps allow it (a decode's attention FLOPs and KV bytes grow
    # together, so e_att and k can trade places on decodes: e_att is fitted apart only where it is seen)
    e, a, k = min(flat, key=lambda t: (t[1] != t[0], abs(math.log(t[0])) + abs(math.log(t[2])) + abs(math.log(t[1] / t[0]))))
    return e, a, k, _nnls(x, (y - _stages(g, e, k, a)) / y)


def held_rates(points: list[FitPoint], roofs: Roofs | None) -> dict:
    """The rates a physics fit holds fixed: the roofs', each raised to the rate a step demonstrably reached
    where that is higher (a step that read Q bytes in T ms of cpu_ms had at least Q / T of memory, and
    F / T of compute; a roof below that was measured while its thread was held back, and holding the
    fit at it puts steps below their own bytes term); without roofs (no microbenchmarks, spec entry or
    declared roofs) the rates the steps reached. {"compute_tflops", "memory_gbps", "source", "label"}."""
    if roofs is None:
        out = {"compute_tflops": 0.0, "memory_gbps": 0.0, "source": "steps",
               "label": "no measured, spec or declared rates: the highest rates the training steps reached"}
    else:
        out = {"compute_tflops": roofs.compute.value, "memory_gbps": roofs.memory.value,
               "source": roofs.memory.source, "label": roofs.memory.label}
    for key, work, scale, unit in (("memory_gbps", "bytes", 1e6, "GB/s"), ("compute_tflops", "flops", 1e9, "TFLOP/s")):
        p = max(points, key=lambda q: getattr(q, work) / q.measured_ms)
        reached = getattr(p, work) / p.measured_ms / scale  # GB/s or TFLOP/s: bytes / ms / 1e6, FLOP / ms / 1e9
        if reached > out[key]:
            if roofs is not None:
                out["source"] = "steps"
                out["label"] += (f"; {key.split('_')[0]} raised from {out[key]:.4g} to {reached:.4g} {unit}, what "
                                 f"step {p.step_id} reached on a CPU (the roof is below it: measured while held back)")
            out[key] = reached
    return out


def _gap_fit(train: list[FitPoint]) -> tuple[float | None, float | None, list | None]:
    """(γ0, γ1, [lo, hi] batch sizes of the steps it was trained on) of gap = γ0 + γ1 · batch. Steps of one
    batch size cannot tell γ0 from γ1 · batch (the columns are one): γ1 is held at 0 there
    (StepFit.gap_ms_per_seq_known), never split between the two."""
    gaps = [p for p in train if p.gap_ms is not None]
    if len(gaps) < 2:
        return None, None, None
    seqs = [p.num_seqs for p in gaps]
    several = len(set(seqs)) > 1
    g0, g1 = _nnls(np.array([[1.0, n if several else 0.0] for n in seqs]), np.array([p.gap_ms for p in gaps]))
    return float(g0), float(g1), [min(seqs), max(seqs)]


def _covered(train: list[FitPoint]) -> dict:
    return {k: [min(getattr(p, k) for p in train), max(getattr(p, k) for p in train)]
            for k in ("num_seqs", "tokens", "context_tokens")}


def time_ratio(fit: StepFit, points: list[FitPoint], ms: str = "measured_ms") -> float | None:
    """Σ measured / Σ predicted over the points with a measured time: above 1 the steps took longer than the
    fit predicts (the host ran slower than on the fit's run, or the fit is low), below 1 shorter. Signed where
    the |error| quantiles are not: a simulated clock sums step times, so this is what a fit carries into a
    simulated TPOT or E2E. None without a point (or a prediction of 0)."""
    return _ratio([(getattr(p, ms), fit.predict_ms(p)) for p in points if getattr(p, ms) is not None])


def held_kv_factor(engine_config: dict) -> float | None:
    """k a fit holds rather than fits, from a run's manifest `engine_config`: 1 where the engine's attention ran
    the paged kernel (`resolved.attention.kernel` "paged": each decode reads its K and V in place, once), None
    (fitted) elsewhere (the gather path copies a decode's KV before reading it; a server whose attention this
    run does not know). Fitted where the KV is read once, k took up a host that slowed over a closed loop's
    run, whose contexts grow as it goes (docs/MODEL.md "Fit")."""
    resolved = engine_config.get("resolved") if isinstance(engine_config, dict) else None
    attention = resolved.get("attention") if isinstance(resolved, dict) else None
    return 1.0 if isinstance(attention, dict) and attention.get("kernel") == "paged" else None


def run_step_fit(points: list[FitPoint], manifest, trained_on: str) -> tuple[StepFit, Roofs | None, str]:
    """The step fit of a run's steps at the rates its manifest gives (`roofs.fit_rates`: its microbenchmarks
    first), k held where its attention read the KV in place (`held_kv_factor`), tagged with the engine it ran
    (what the fit may be applied to): the one rule the ledger's step_fit and `inferledger fit` train by.
    -> (the fit, the roofs it holds (None: the rates its steps reached), why those). FitError when it cannot fit."""
    roofs, why = fit_rates(manifest)
    fit = StepFit.fit(points, roofs, trained_on=trained_on, kv_factor=held_kv_factor(manifest.block("engine_config")))
    fit.engine = manifest.engine
    return fit, roofs, why


def _ratio(pairs: list[tuple[float, float]]) -> float | None:
    """time_ratio of (measured, predicted) pairs."""
    predicted = sum(q for _, q in pairs)
    return sum(m for m, _ in pairs) / predicted if pairs and predicted > 0 else None


def held_out_summary(fit: StepFit, points: list[FitPoint]) -> dict:
    """|error| in percent of `fit` on every point against its measured_ms (the step's own work, "against":
    "work": cpu_ms less blocked_ms, ledger/step_fit.py POINTS_SQL) and its wall_ms ("wall"), all points and by
    kind, and the signed `time_ratio` of each: the figures of `inferledger fit TRAIN --test TEST`. Each point is
    predicted once."""
    predicted = [fit.predict_ms(p) for p in points]

    def block(ms: str) -> dict:
        rows = [(p.kind, getattr(p, ms), q) for p, q in zip(points, predicted) if getattr(p, ms) is not None]

        def errs(rs):
            out = (error_pct(q, m) for _, m, q in rs)
            return [abs(float(e)) for e in out if e is not None]
        every = errs(rows)
        by_kind = {}
        for k in KINDS:
            kind = [r for r in rows if r[0] == k]
            ek = errs(kind)
            by_kind[k] = {"n_steps": len(ek), "median_abs_error_pct": quantile(ek, 0.5),
                          "p90_abs_error_pct": quantile(ek, 0.9), "time_ratio": _ratio([(m, q) for _, m, q in kind])}
        return {"held_out_median_abs_error_pct": quantile(every, 0.5),
                "held_out_p90_abs_error_pct": quantile(every, 0.9), "by_kind": by_kind, "n_steps": len(every),
                "time_ratio": _ratio([(m, q) for _, m, q in rows])}
    out = {**block("measured_ms"), "against": "work"}
    out["wall"] = {**block("wall_ms"), "against": "wall"}
    return out


DRIFT_WINDOW_MS = 1000.0  # of the engine's step time: about a second of a busy run
DRIFT_MIN_STEPS = 5  # decode-only steps a window needs for its ratio


def decode_ratio_by_window(fit: StepFit, points: list[FitPoint], window_ms: float = DRIFT_WINDOW_MS,
                           min_steps: int = DRIFT_MIN_STEPS) -> dict:
    """How a run's own decode-only steps moved against `fit` while it ran: the steps, in step order, cut into
    windows of `window_ms` of step time (their wall times summed; the idle time between steps left out), each
    window's Σ measured / Σ predicted over its decode-only steps (a window with fewer than `min_steps` of them
    left out), and the 10th and 90th percentile of those ratios over the windows: {"p10", "p90", "n_windows"},
    the percentiles None below 3 windows. One fit prices every window alike, so their spread is the run's own:
    a shared host's speed moving under it (seen as steps of one shape taking longer in one second than in the
    next, with no wait for a CPU), which no fit trained on another run can follow."""
    windows: list[list[tuple[float, float]]] = [[]]
    elapsed = 0.0
    for p in sorted(points, key=lambda p: (p.step_id is None, p.step_id)):
        if elapsed >= window_ms:
            windows.append([])
            elapsed = 0.0
        elapsed += p.wall_ms if p.wall_ms is not None else p.measured_ms
        if p.kind == "decode":
            windows[-1].append((p.measured_ms, fit.predict_ms(p)))
    ratios = [r for w in windows if len(w) >= min_steps and (r := _ratio(w)) is not None]
    if len(ratios) < 3:
        return {"p10": None, "p90": None, "n_windows": len(ratios)}
    return {"p10": quantile(ratios, 0.1), "p90": quantile(ratios, 0.9), "n_windows": len(ratios)}


def apply(fit: StepFit, points: list[FitPoint]) -> dict:
    """A fit (from any run) held against another run's steps (the ledger selects them:
    `inferledger.ledger.fit_read.ledger_fit_points`): per-step predictions and the error summary."""
    steps = [{"step_id": p.step_id, "measured_ms": p.measured_ms, "predicted_ms": fit.predict_ms(p),
              "error_pct": error_pct(fit.predict_ms(p), p.measured_ms),
              "extrapolated": fit.extrapolated(p.num_seqs, p.tokens, p.context_tokens)} for p in points]
    inside = [p for p in points if not fit.extrapolated(p.num_seqs, p.tokens, p.context_tokens)]
    return {"steps": steps, "n": len(points), "n_inside": len(inside),
            "median_abs_pct": fit.median_abs_pct(points), "p90_abs_pct": fit.abs_pct_quantile(points, 0.9),
            "inside_median_abs_pct": fit.median_abs_pct(inside)}
