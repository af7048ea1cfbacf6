-- The roofline of the run: each step's arithmetic intensity against the FLOP rate it achieved, the
-- roofs it is held against (peak, sustained, effective, each with its source), and the one-line
-- verdict the summary prints (docs/LEDGER.md "roofline_points, roofline_roofs and model_summary").
--
-- scope: rollup
-- reads: step_model, step_fit, residual_sources, prediction_registration, quantile_linear
-- creates: roofline_points, roofline_roofs, model_summary

-- @table roofline_points: one row per engine step with work and a measured time
-- @column step_id: the engine step
-- @column kind: prefill (the step computes prefill tokens only), decode (none), mixed (both)
-- @column num_seqs: sequences in the batch
-- @column context_tokens: the rows' context before the step, summed
-- @column intensity: step_model.intensity (FLOP per byte)
-- @column achieved_tflops: step_model.flops / measured_ms: the FLOP rate the step reached, TFLOP/s
-- @column bound_share_pct: bound_ms / measured_ms × 100: how close the step came to its lower bound
-- @column binding_roof: step_model.binding_roof (compute or memory)
-- @column mode: step mode (eager, padded, graph, graph_capture, compiled, compiling, simulated)
CREATE OR REPLACE TABLE roofline_points AS
SELECT getvariable('run_id') AS run_id, step_id,
       CASE WHEN prefill_tokens = tokens THEN 'prefill' WHEN prefill_tokens = 0 THEN 'decode' ELSE 'mixed' END AS kind,
       num_seqs, context_tokens, intensity, flops / (measured_ms * 1e9) AS achieved_tflops,
       bound_ms / measured_ms * 100 AS bound_share_pct, binding_roof, mode
FROM step_model WHERE flops IS NOT NULL AND measured_ms > 0
ORDER BY step_id;

-- @table roofline_roofs: one row per roof the run's steps can be held against
-- @column roof: compute or memory
-- @column statistic: peak (the bounds' roofs), sustained (the capture-start microbenchmarks' medians, as the
--   registered prediction holds them) or effective (the run's step fit)
-- @column value: TFLOP/s for compute, GB/s for memory
-- @column unit: TFLOP/s or GB/s
-- @column source: spec, microbenchmark, fit or assumption
-- @column label: what the number is, with where it came from
CREATE OR REPLACE TABLE roofline_roofs AS
WITH peak AS (
  SELECT any_value(roof_source) AS source, any_value(roof_compute_tflops) AS tflops,
         any_value(roof_memory_gbps) AS gbps FROM step_model WHERE roof_source IS NOT NULL
), pred AS (SELECT roofs::JSON AS j FROM prediction_registration WHERE valid)
SELECT getvariable('run_id') AS run_id, * FROM (
  SELECT 'compute' AS roof, 'peak' AS statistic, tflops AS value, 'TFLOP/s' AS unit, source,
         format('{} peak compute (the bounds'' roof)', source) AS label FROM peak WHERE tflops IS NOT NULL
  UNION ALL
  SELECT 'memory', 'peak', gbps, 'GB/s', source, format('{} peak memory bandwidth (the bounds'' roof)', source)
  FROM peak WHERE gbps IS NOT NULL
  UNION ALL
  SELECT r.roof, 'sustained', json_extract(j, format('$.sustained.{}.value', r.roof))::DOUBLE,
         json_extract_string(j, format('$.sustained.{}.unit', r.roof)),
         json_extract_string(j, format('$.sustained.{}.source', r.roof)),
         json_extract_string(j, format('$.sustained.{}.label', r.roof))
  FROM pred, (VALUES ('compute'), ('memory')) r(roof)
  WHERE json_extract(j, format('$.sustained.{}.value', r.roof)) IS NOT NULL
  UNION ALL
  SELECT CASE name WHEN 'p_eff_tflops' THEN 'compute' ELSE 'memory' END, 'effective', value, unit, source,
         format('effective rate of this run''s step fit ({})', name)
  FROM step_fit WHERE name IN ('p_eff_tflops', 'b_eff_gbps') AND value IS NOT NULL
) ORDER BY roof, statistic;

-- @table model_summary: one row: the terminal summary's verdict on the steps against the workload model
-- @column n_steps: steps with a bound and a measured time
-- @column median_bound_share_pct: the median step's bound_ms / measured_ms × 100 (roofline_points)
-- @column n_beats_bound: steps faster than their bound (step_model.beats_bound)
-- @column dominant_source: the largest candidate source of the residual (residual_sources.dominant)
-- @column dominant_ms_per_step: its size per step
CREATE OR REPLACE TABLE model_summary AS
SELECT getvariable('run_id') AS run_id, (SELECT count(*) FROM roofline_points WHERE bound_share_pct IS NOT NULL) AS n_steps,
       (SELECT quantile_linear(bound_share_pct, 0.5) FROM roofline_points) AS median_bound_share_pct,
       (SELECT count(*) FILTER (WHERE beats_bound) FROM step_model) AS n_beats_bound,
       (SELECT any_value(source) FROM residual_sources WHERE dominant) AS dominant_source,
       (SELECT any_value(ms_per_step) FROM residual_sources WHERE dominant) AS dominant_ms_per_step;
