-- The residual of each step against its lower bound, grouped by the shape that could explain it, and
-- the trends that point to a source (docs/LEDGER.md "model_residuals", docs/MODEL.md "Residuals").
--
-- scope: rollup
-- reads: step_model, quantile_linear
-- creates: model_residuals, residual_sources

-- @table model_residuals: one row per group of steps with the same batch size, context bucket and mode
-- @column num_seqs: sequences in the batch
-- @column context_lo: the group's context per sequence (context_tokens / num_seqs) is at least this ...
-- @column context_hi: ... and below this (powers of two; 0 to 1 for no context)
-- @column mode: step mode (eager, padded, graph, graph_capture, compiled, compiling, simulated)
-- @column n_steps: steps in the group (with a bound)
-- @column median_measured_ms: median step time
-- @column median_bound_ms: median lower bound
-- @column median_residual_ms: median of measured_ms − bound_ms
-- @column median_residual_pct: median of residual_ms / bound_ms × 100
-- @column median_gap_after_ms: median host time to the next step's start
-- @column n_beats_bound: steps faster than their bound (step_model.beats_bound)
CREATE OR REPLACE TABLE model_residuals AS
WITH s AS (
  SELECT *, CASE WHEN context_tokens / num_seqs < 1 THEN 0
                 ELSE floor(log2(context_tokens / num_seqs)) END AS b
  FROM step_model WHERE bound_ms IS NOT NULL AND measured_ms IS NOT NULL
)
SELECT getvariable('run_id') AS run_id, num_seqs,
       CASE WHEN any_value(b) = 0 AND min(context_tokens) = 0 THEN 0 ELSE CAST(pow(2, any_value(b)) AS BIGINT) END AS context_lo,
       CAST(pow(2, any_value(b) + 1) AS BIGINT) AS context_hi, mode, count(*) AS n_steps,
       quantile_linear(measured_ms, 0.5) AS median_measured_ms, quantile_linear(bound_ms, 0.5) AS median_bound_ms,
       quantile_linear(residual_ms, 0.5) AS median_residual_ms, quantile_linear(residual_pct, 0.5) AS median_residual_pct,
       quantile_linear(gap_after_ms, 0.5) AS median_gap_after_ms, count(*) FILTER (WHERE beats_bound) AS n_beats_bound
FROM s GROUP BY num_seqs, b, mode
ORDER BY mode, num_seqs, context_lo;

-- @table residual_sources: one row per candidate source of the residual, with its size per step in ms
--   (docs/MODEL.md "Residuals"); the largest is marked dominant
-- @column source: fixed_overhead (the decode steps' residual at zero context), context_reads
--   (its growth with context: state reads the model misses), shape_jump (one group far above the rest
--   of its mode: kernel choice, padding, a graph fallback), inter_step_host (host time between steps)
-- @column ms_per_step: the source's size: the intercept; the slope × the median context; the jump
--   group's median residual − the median over all steps; the median gap after a step
-- @column detail: the figures behind it (slope, groups, counts)
-- @column dominant: the largest ms_per_step
CREATE OR REPLACE TABLE residual_sources AS
WITH s AS (SELECT * FROM step_model WHERE residual_ms IS NOT NULL AND prefill_tokens = 0),  -- decode steps
fit AS (  -- residual ≈ a + c · context: the intercept is a fixed cost, c a growth with context
  SELECT regr_intercept(residual_ms, context_tokens) AS a_ctx, regr_slope(residual_ms, context_tokens) AS c,
         regr_r2(residual_ms, context_tokens) AS r2, quantile_linear(context_tokens, 0.5) AS med_ctx,
         quantile_linear(residual_ms, 0.5) AS med_res, quantile_linear(gap_after_ms, 0.5) AS med_gap,
         count(*) AS n FROM s
), jump AS (
  SELECT r.mode, r.num_seqs, r.context_lo, r.context_hi, r.median_residual_ms, r.n_steps
  FROM model_residuals r WHERE r.n_steps >= 2
  ORDER BY r.median_residual_ms DESC LIMIT 1
), cand AS (
  SELECT 'fixed_overhead' AS source, greatest(a_ctx, 0) AS ms_per_step,
         format('intercept of residual_ms against context_tokens over {} steps: {} ms', n, round(a_ctx, 3)) AS detail
  FROM fit WHERE n >= 3
  UNION ALL
  SELECT 'context_reads', greatest(c * med_ctx, 0),
         format('{} ms per 1000 context tokens (r² {}), median context {}', round(c * 1000, 4), round(r2, 3), med_ctx)
  FROM fit WHERE n >= 3
  UNION ALL
  SELECT 'shape_jump', greatest(j.median_residual_ms - f.med_res, 0),
         format('{} steps of batch {} with {}–{} context per sequence ({}): median residual {} ms against {} ms over all',
                j.n_steps, j.num_seqs, j.context_lo, j.context_hi, j.mode, round(j.median_residual_ms, 3), round(f.med_res, 3))
  FROM jump j, fit f
  UNION ALL
  SELECT 'inter_step_host', med_gap, format('median host time between a step''s end and the next start over {} steps', n)
  FROM fit WHERE med_gap IS NOT NULL
)
SELECT getvariable('run_id') AS run_id, source, ms_per_step, detail,
       ms_per_step = max(ms_per_step) OVER () AND ms_per_step > 0 AS dominant
FROM cand ORDER BY ms_per_step DESC;
