"""The step-time fit of this run (costmodel/fit.py): T = α + F / P_eff + Q / B_eff, trained on some step
shapes and reported on the held-out ones, with the inter-step host time as its own term.
"""
from __future__ import annotations

import pyarrow as pa

from inferledger.costmodel.fit import POINT_COLUMNS, POINT_FILTER, FitError, FitPoint, StepFit, error_pct, split

READS = ("step_model",)
CREATES = ("step_fit", "step_fit_points", "fit_gaps")
SCOPE = "rollup"  # over the run's steps and attempts together (docs/SCALE.md)
PUBLIC = ("step_fit", "step_fit_points")


# @table step_fit: one row per parameter or figure of the run's step-time fit (docs/LEDGER.md "step_fit",
#   docs/MODEL.md "Fit"); empty when the run has too few steps with a shape
# @column name: alpha_ms, p_eff_tflops, b_eff_gbps, gap_alpha_ms, gap_ms_per_seq; n_train, n_held_out;
#   train_median_abs_pct, held_out_median_abs_pct, held_out_p90_abs_pct; covered_num_seqs_lo / _hi,
#   covered_tokens_lo / _hi, covered_context_tokens_lo / _hi
# @column value: the figure (NULL: the fit found no such term, or no held-out step)
# @column unit: ms, TFLOP/s, GB/s, steps, %, sequences, tokens
# @column source: fit (every parameter here is effective, never a peak)
# @column trained_on: the run the fit was trained on (another run's name when manifest step_fit declared
#   one: then n_train and the held-out figures are that run's, applied_median_abs_pct and
#   applied_p90_abs_pct this run's)
#
# @table step_fit_points: one row per step the fit saw
# @column step_id: the engine step
# @column split: train or held_out (by shape: batch size, tokens and context by powers of two), or
#   applied (a declared fit from another run: every step is outside its training)
# @column measured_ms: step_model.measured_ms
# @column predicted_ms: the fit's α + F / P_eff + Q / B_eff
# @column error_pct: (predicted − measured) / measured × 100
# @column extrapolated: the step lies outside the training steps' range of batch size, tokens or context
def build(con, run) -> None:
    points = [FitPoint(*r) for r in con.execute(f"SELECT {POINT_COLUMNS} FROM step_model WHERE {POINT_FILTER} ORDER BY step_id").fetchall()]
    con.execute("CREATE OR REPLACE TEMP TABLE fit_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, "
                "needs VARCHAR, detail VARCHAR)")
    params, rows = [], []
    declared = run.manifest.step_fit
    fit = None
    if isinstance(declared, dict):  # a fit from another run, applied here: every step is held out
        fit = StepFit.from_dict(declared)
    else:
        try:
            fit = StepFit.fit(points, trained_on=run.run_dir.name)
        except FitError as exc:
            if points:
                con.execute("INSERT INTO fit_gaps VALUES ('run', NULL, 'step_fit, step_fit_points', "
                            "'more engine steps of known shape', ?)", [str(exc)])
    if fit is not None:
        params = [("alpha_ms", fit.alpha_ms, "ms"), ("p_eff_tflops", fit.p_eff_tflops, "TFLOP/s"),
                  ("b_eff_gbps", fit.b_eff_gbps, "GB/s"), ("gap_alpha_ms", fit.gap_alpha_ms, "ms"),
                  ("gap_ms_per_seq", fit.gap_ms_per_seq, "ms"), ("n_train", fit.n_train, "steps"),
                  ("n_held_out", fit.n_held_out, "steps"), ("train_median_abs_pct", fit.train_median_abs_pct, "%"),
                  ("held_out_median_abs_pct", fit.held_out_median_abs_pct, "%"),
                  ("held_out_p90_abs_pct", fit.held_out_p90_abs_pct, "%")]
        units = {"num_seqs": "sequences", "tokens": "tokens", "context_tokens": "tokens"}
        for k, (lo, hi) in fit.covered.items():
            params += [(f"covered_{k}_lo", lo, units[k]), (f"covered_{k}_hi", hi, units[k])]
        if isinstance(declared, dict):
            params += [("applied_median_abs_pct", fit.median_abs_pct(points), "%"),
                       ("applied_p90_abs_pct", fit.abs_pct_quantile(points, 0.9), "%")]
        train_ids = set() if isinstance(declared, dict) else {p.step_id for p in split(points)[0]}
        for p in points:
            pred = fit.predict_ms(p)
            label = "applied" if isinstance(declared, dict) else "train" if p.step_id in train_ids else "held_out"
            rows.append((p.step_id, label, p.measured_ms, pred,
                         error_pct(pred, p.measured_ms), fit.extrapolated(p.num_seqs, p.tokens, p.context_tokens)))
    cols = list(zip(*params)) if params else [[], [], []]
    con.register("_fit", pa.table({"name": pa.array(cols[0], pa.string()),
                                   "value": pa.array([None if v is None else float(v) for v in cols[1]], pa.float64()),
                                   "unit": pa.array(cols[2], pa.string())}))
    con.execute("CREATE OR REPLACE TABLE step_fit AS SELECT getvariable('run_id') AS run_id, name, value, unit, "
                "'fit' AS source, ? AS trained_on FROM _fit", [fit.trained_on if fit is not None else None])
    con.unregister("_fit")
    cols = list(zip(*rows)) if rows else [[]] * 6
    types = (pa.int64(), pa.string(), pa.float64(), pa.float64(), pa.float64(), pa.bool_())
    names = ("step_id", "split", "measured_ms", "predicted_ms", "error_pct", "extrapolated")
    con.register("_pts", pa.table({n: pa.array(list(c), t) for n, c, t in zip(names, cols, types)}))
    con.execute("CREATE OR REPLACE TABLE step_fit_points AS SELECT getvariable('run_id') AS run_id, * FROM _pts "
                "ORDER BY step_id")
    con.unregister("_pts")

