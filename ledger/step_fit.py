"""The step-time fit of this run (costmodel/fit.py): the step's FLOPs and bytes at the run's measured
rates, with α, a per-sequence overhead and a compute efficiency fitted on the steps' cpu_ms; trained on
some step shapes and reported on the held-out ones, with the inter-step host time as its own term.

The steps a fit sees are selected here, from step_model (`fit_points`): the cost model is handed
the rows, for this run's fit and, through ledger/fit_read.py, for a fit read from or applied to another
run's built ledger.
"""
from __future__ import annotations

import pyarrow as pa

from inferledger.costmodel.fit import FitError, FitPoint, StepFit, error_pct, run_step_fit, split
from inferledger.ledger.tables import StageTable, gap_table

READS = ("step_model",)
CREATES = ("step_fit", "step_fit_points", "step_fit_gaps")
SCOPE = "rollup"  # over the run's steps and attempts together (docs/SCALE.md)
PUBLIC = ("step_fit", "step_fit_points")

STEP_FIT = StageTable("step_fit", (("name", pa.string()), ("value", pa.float64()), ("unit", pa.string()),
                              ("source", pa.string()), ("trained_on", pa.string())))
STEP_FIT_POINTS = StageTable("step_fit_points", (("step_id", pa.int64()), ("split", pa.string()),
                                            ("measured_ms", pa.float64()), ("predicted_ms", pa.float64()),
                                            ("error_pct", pa.float64()), ("extrapolated", pa.bool_())),
                        order="step_id")
# @gaps: too few engine steps of known shape to fit; no measured rates to hold the fit's physics at (held at
#   the rates its own steps reached); training steps of one batch size (ms_per_seq unknown, held at 0); steps
#   with host time after them of one batch size (gap_ms_per_seq unknown, held at 0)
GAPS = gap_table("step_fit")

# The steps a fit sees: a measured time and a shape, and not simulated ones, nor steps whose time holds
# one-off build work (`compiling`: the step compiled its graph; `graph_capture`: it captured a CUDA
# graph). A step with no mode (an older run) counts. The fit's time is the step's cpu_ms less its blocked_ms
# (without its wait for a CPU and its sleep on a lock: the time its own work took; cpu_ms where blocked_ms is
# unknown: a step with intra-op workers), its wall time where the capture could not measure the wait (cpu_ms
# NULL: an older run, a kernel that hides schedstat); the wait itself (contention_ms) rides along for the fit's
# κ term.
POINTS_SQL = """
SELECT flops_linear, flops_attention, bytes, bytes_kv_read + bytes_kv_write,
       coalesce(cpu_ms - coalesce(blocked_ms, 0), measured_ms), num_seqs,
       tokens, context_tokens,
       gap_after_ms, step_id,
       CASE WHEN prefill_tokens = 0 THEN 'decode' WHEN prefill_tokens = tokens THEN 'prefill' ELSE 'mixed' END,
       measured_ms, contention_ms
FROM step_model
WHERE flops IS NOT NULL AND coalesce(cpu_ms - coalesce(blocked_ms, 0), measured_ms) > 0 AND coalesce(mode, '') NOT IN ('simulated', 'compiling', 'graph_capture')
ORDER BY step_id
"""


def fit_points(con) -> list[FitPoint]:
    """The steps of a ledger's step_model a fit sees, as the cost model's FitPoints."""
    return [FitPoint(*r) for r in con.execute(POINTS_SQL).fetchall()]


# @table step_fit: one row per parameter or figure of the run's step-time fit (docs/LEDGER.md "step_fit",
#   docs/MODEL.md "Fit"); empty when the run has too few steps with a shape
# @column name: alpha_ms, ms_per_seq, compute_efficiency (e: the best matmul's rate over the linears'),
#   attention_efficiency (e_att: the best matmul's rate over attention's FLOPs),
#   p_eff_tflops (the best matmul's rate / e), b_eff_gbps (the memory rate held fixed: the run's measured rate, or what a step reached where
#   that is higher, or without a measured rate the highest a step reached), kv_factor (k: the attention's KV traffic over its
#   KV bytes; held at 1 where the run's attention read the KV in place, the paged kernel), ms_per_wait_ms (κ: on-CPU
#   ms a step loses per ms it waited for a CPU; 0 where the training steps hardly waited), gap_alpha_ms,
#   gap_ms_per_seq (NULL, with a gap, where the steps with host time after them had one batch size); n_train,
#   n_held_out; train_median_abs_pct, held_out_median_abs_pct, held_out_p90_abs_pct; covered_num_seqs_lo / _hi,
#   covered_tokens_lo / _hi, covered_context_tokens_lo / _hi; gap_covered_num_seqs_lo / _hi (the batch sizes the
#   gap term was trained on)
# @column value: the figure (NULL: the fit found no such term, or no held-out step)
# @column unit: ms, ×, TFLOP/s, GB/s, ms/ms, steps, %, sequences, tokens
# @column source: fit (every parameter here is effective, never a peak; b_eff_gbps is the run's measured
#   memory rate the fit holds fixed)
# @column trained_on: the run the fit was trained on (another run's name when manifest step_fit declared
#   one: then n_train and the held-out figures are that run's, applied_median_abs_pct and
#   applied_p90_abs_pct this run's)
#
# @table step_fit_points: one row per step the fit saw
# @column step_id: the engine step
# @column split: train or held_out (by shape: batch size, tokens and context by powers of two), or
#   applied (a declared fit from another run: every step is outside its training)
# @column measured_ms: step_model.cpu_ms − blocked_ms (the step without its wait for a CPU and its sleep on a lock;
#   cpu_ms where blocked_ms is unknown, its wall time measured_ms where the capture could not measure the wait),
#   what the fit is judged against
# @column predicted_ms: the fit's α + a_seq · num_seqs + max(e · F_lin / P, Q_lin / B) + max(e · F_att / P, k · Q_kv / B)
#   + κ · min(the step's contention_ms, its time without this term)
# @column error_pct: (predicted − measured) / measured × 100
# @column extrapolated: the step lies outside the training steps' range of batch size, tokens or context
def build(con, run) -> None:
    points = fit_points(con)
    params, rows, gaps = [], [], []
    declared = run.manifest.step_fit
    fit = None
    if isinstance(declared, dict):  # a fit from another run, applied here: every step is held out
        fit = StepFit.from_dict(declared)
    else:
        try:
            fit, roofs, why = run_step_fit(points, run.manifest, run.run_dir.name)
        except FitError as exc:
            if points:
                gaps.append(("run", None, "step_fit, step_fit_points", "more engine steps of known shape", str(exc)))
        else:
            if roofs is None:
                gaps.append(("run", None, "step_fit (its physics: held at the rates its own steps reached)",
                             "the capture's microbenchmarks (manifest device_params), a spec entry or declared_roofs",
                             f"no measured rates to hold the step's work at ({why}): the fit holds the highest "
                             "rates a training step reached, a lower bound of the device's"))
    if fit is not None:
        if not fit.ms_per_seq_known:
            n = fit.covered.get("num_seqs", [None])[0]
            gaps.append(("run", None, "step_fit ms_per_seq", "training steps of more than one batch size",
                         f"every training step had {n} sequence(s): the cost of one more sequence cannot be told "
                         "from the step's own (alpha_ms carries it at that batch size); held at 0 in predictions"))
        if fit.gap_alpha_ms is not None and not fit.gap_ms_per_seq_known:
            n = (fit.gap_covered_num_seqs or fit.covered.get("num_seqs", [None]))[0]
            gaps.append(("run", None, "step_fit gap_ms_per_seq",
                         "training steps of more than one batch size with host time after them",
                         f"every training step with host time after it had {n} sequence(s): the host time of one "
                         "more sequence cannot be told from the gap's own (gap_alpha_ms carries it at that batch "
                         "size); held at 0 in predictions"))
        params = [("alpha_ms", fit.alpha_ms, "ms"), ("ms_per_seq", fit.ms_per_seq_reported, "ms"),
                  ("compute_efficiency", fit.compute_efficiency, "×"),
                  ("attention_efficiency", fit.attention_efficiency, "×"), ("p_eff_tflops", fit.p_eff_tflops, "TFLOP/s"),
                  ("b_eff_gbps", fit.b_eff_gbps, "GB/s"), ("kv_factor", fit.kv_factor, "×"),
                  ("ms_per_wait_ms", fit.ms_per_wait_ms, "ms/ms"),
                  ("gap_alpha_ms", fit.gap_alpha_ms, "ms"),
                  ("gap_ms_per_seq", fit.gap_ms_per_seq_reported, "ms"), ("n_train", fit.n_train, "steps"),
                  ("n_held_out", fit.n_held_out, "steps"), ("train_median_abs_pct", fit.train_median_abs_pct, "%"),
                  ("held_out_median_abs_pct", fit.held_out_median_abs_pct, "%"),
                  ("held_out_p90_abs_pct", fit.held_out_p90_abs_pct, "%")]
        units = {"num_seqs": "sequences", "tokens": "tokens", "context_tokens": "tokens"}
        for k, (lo, hi) in fit.covered.items():
            params += [(f"covered_{k}_lo", lo, units[k]), (f"covered_{k}_hi", hi, units[k])]
        if fit.gap_covered_num_seqs is not None:
            lo, hi = fit.gap_covered_num_seqs
            params += [("gap_covered_num_seqs_lo", lo, "sequences"), ("gap_covered_num_seqs_hi", hi, "sequences")]
        if isinstance(declared, dict):
            params += [("applied_median_abs_pct", fit.median_abs_pct(points), "%"),
                       ("applied_p90_abs_pct", fit.abs_pct_quantile(points, 0.9), "%")]
        train_ids = set() if isinstance(declared, dict) else {p.step_id for p in split(points)[0]}
        for p in points:
            pred = fit.predict_ms(p)
            label = "applied" if isinstance(declared, dict) else "train" if p.step_id in train_ids else "held_out"
            rows.append((p.step_id, label, p.measured_ms, pred,
                         error_pct(pred, p.measured_ms), fit.extrapolated(p.num_seqs, p.tokens, p.context_tokens)))
    STEP_FIT.store(con, [(name, None if v is None else float(v), unit, "fit", fit.trained_on)
                         for name, v, unit in params])
    STEP_FIT_POINTS.store(con, rows)
    GAPS.store(con, gaps)

