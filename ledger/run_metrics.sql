-- The run's figures over its observation window: goodput beside completed throughput, token
-- throughput, Little's law, energy and its cost per good result (docs/LEDGER.md "run_metrics").
-- A run without client events has no client-side count: its client figures are NULL (one run gap in
-- the register), not 0. Every rate divides by t_obs_s through nullif: a zero-length window is unknown.
--
-- reads: window_bounds, request_metrics, attempts, marks, ev, steps, window_energy, power_check,
--        kv_integral, step_attribution
-- creates: run_metrics
CREATE OR REPLACE TABLE run_metrics AS
WITH win AS (SELECT *, nullif((t1 - t0) / 1e9, 0) AS t_div FROM window_bounds), counts AS (
  SELECT CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) FILTER (WHERE good) END AS n_good,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) FILTER (WHERE client_status = 'completed') END AS n_completed,
         count(*) FILTER (WHERE good IS NULL) AS n_unjudged
  FROM request_metrics JOIN attempts USING (attempt_id)
), little AS (
  SELECT CASE WHEN (SELECT has_client FROM window_bounds) THEN sum(client_span_ms) / 1e3 END AS busy_s,
         avg(client_span_ms) / 1e3 AS w_s,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) END AS n
  FROM request_metrics WHERE client_span_ms IS NOT NULL
), arrivals AS (
  SELECT count(DISTINCT task_id) AS n FROM ev WHERE name = 'arrival.planned'
), engine AS (
  SELECT sum(step_ms) / 1e3 AS busy_s FROM steps
), tok AS (
  -- token throughput over the attempts the client saw complete (the peers' denominator); a sum over
  -- attempts of which any count is unknown is unknown
  -- (no completed attempt is a known 0 only where the client was watched)
  SELECT CASE WHEN NOT (SELECT has_client FROM window_bounds) THEN NULL WHEN count(*) = 0 THEN 0
              WHEN count(*) = count(a.n_output_tokens) THEN sum(a.n_output_tokens) END AS output_tokens,
         -- prompt tokens: the engine's count, else the usage the client received (a black-box run)
         CASE WHEN NOT (SELECT has_client FROM window_bounds) THEN NULL WHEN count(*) = 0 THEN 0
              WHEN count(*) = count(coalesce(p.prompt, m.n_prompt_usage)) THEN sum(coalesce(p.prompt, m.n_prompt_usage)) END AS prompt_tokens,
         CASE WHEN NOT (SELECT has_client FROM window_bounds) THEN NULL WHEN count(*) = 0 THEN 0
              WHEN count(*) = count(p.prompt) THEN sum(coalesce(p.cached, 0)) END AS prompt_tokens_cached,
         CASE WHEN NOT (SELECT has_client FROM window_bounds) THEN NULL WHEN count(*) = 0 THEN 0
              WHEN count(*) = count(p.prompt) THEN sum(coalesce(p.computed, 0)) END AS prefill_tokens_computed,
         count(*) AS n
  FROM attempts a JOIN marks m USING (attempt_id) LEFT JOIN (
    SELECT attempt_id, max(value) FILTER (WHERE name = 'engine.enqueued') AS prompt,
           sum(TRY_CAST(json_extract_string(attrs, '$.cached_tokens') AS BIGINT)) FILTER (WHERE name = 'engine.prefill') AS cached,
           sum(value) FILTER (WHERE name = 'engine.prefill') AS computed
    FROM ev WHERE name IN ('engine.enqueued', 'engine.prefill') GROUP BY attempt_id) p USING (attempt_id)
  WHERE a.client_status = 'completed'
)
SELECT getvariable('run_id') AS run_id,
  (win.t1 - win.t0) / 1e9 AS t_obs_s, win.label AS window,
  counts.n_good, counts.n_completed, counts.n_unjudged,
  counts.n_good / win.t_div AS goodput_rps,
  -- the vLLM-bench variant: completed requests within TTFT / TPOT / E2E thresholds (TPOT 0 when n <= 1)
  CASE WHEN coalesce(getvariable('slo_ttft_ms'), getvariable('slo_tpot_ms'), getvariable('slo_e2e_ms')) IS NOT NULL THEN
    (SELECT count(*) FROM request_metrics r JOIN attempts a USING (attempt_id)
     WHERE a.client_status = 'completed'
       AND (getvariable('slo_ttft_ms') IS NULL OR r.ttft_client_ms <= getvariable('slo_ttft_ms'))
       AND (getvariable('slo_tpot_ms') IS NULL OR coalesce(r.tpot_ms, 0) <= getvariable('slo_tpot_ms'))
       AND (getvariable('slo_e2e_ms') IS NULL OR r.e2e_client_ms <= getvariable('slo_e2e_ms')))
    / win.t_div END AS vllm_goodput_rps,
  getvariable('slo_ttft_ms') AS slo_ttft_ms, getvariable('slo_tpot_ms') AS slo_tpot_ms,
  getvariable('slo_e2e_ms') AS slo_e2e_ms,
  counts.n_completed / win.t_div AS completed_rps,
  tok.output_tokens::BIGINT AS output_tokens, tok.output_tokens / win.t_div AS output_tok_s,
  tok.prompt_tokens::BIGINT AS prompt_tokens, tok.prompt_tokens_cached::BIGINT AS prompt_tokens_cached,
  tok.prefill_tokens_computed::BIGINT AS prefill_tokens_computed,
  -- the peers' "total token throughput" counts every prompt token, cached or not; computed_tok_s counts
  -- what the engine computed (prefill chunks, recomputation included, and output tokens)
  (tok.prompt_tokens + tok.output_tokens) / win.t_div AS total_tok_s,
  (tok.prefill_tokens_computed + tok.output_tokens) / win.t_div AS computed_tok_s,
  -- Little's law: mean number in system (time-averaged) against arrival rate × mean time in system
  little.busy_s / win.t_div AS mean_in_system,
  little.n / win.t_div AS arrival_rps,
  little.w_s AS mean_time_in_system_s,
  arrivals.n AS planned_arrivals,
  engine.busy_s AS engine_busy_s,
  CASE WHEN counts.n_good > 0 THEN engine.busy_s / counts.n_good END AS engine_s_per_good,
  gpu.energy_j AS energy_gpu_j, cpu.energy_j AS energy_cpu_j, dram.energy_j AS energy_dram_j,
  gpu.idle_w * gpu.covered_ns / 1e9 AS idle_gpu_j, cpu.idle_w * cpu.covered_ns / 1e9 AS idle_cpu_j,
  (SELECT gpu_power_integrated_j FROM power_check) AS gpu_power_integrated_j,
  gpu.covered_ns < 100e6 AS gpu_window_short,  -- shorter than the NVML counter's ~100 ms update period
  CASE WHEN gpu.energy_j IS NULL AND cpu.energy_j IS NULL THEN NULL
       WHEN gpu.energy_j IS NOT NULL AND cpu.energy_j IS NOT NULL THEN 'gpu+cpu_package'
       WHEN gpu.energy_j IS NOT NULL THEN 'gpu' ELSE 'cpu_package' END AS energy_scope,
  CASE WHEN counts.n_good > 0 AND coalesce(gpu.energy_j, cpu.energy_j) IS NOT NULL
       THEN (coalesce(gpu.energy_j, 0) + coalesce(cpu.energy_j, 0)) / counts.n_good END AS energy_per_good_j,
  CASE WHEN counts.n_good > 0 THEN gpu.energy_j / counts.n_good END AS energy_gpu_per_good_j,
  CASE WHEN counts.n_good > 0 THEN cpu.energy_j / counts.n_good END AS energy_cpu_per_good_j,
  CASE WHEN counts.n_good > 0 THEN (SELECT sum(value) / 1e3 FROM ev WHERE name = 'device.step') / counts.n_good
       END AS gpu_s_per_good,
  (SELECT sum(kv_gib_s) FROM kv_integral) AS kv_gib_s,
  (SELECT sum(share_ms) FROM step_attribution) AS attributed_step_ms,
  (SELECT sum(step_ms) FROM steps WHERE step_id IN (SELECT step_id FROM step_attribution)) AS attributed_steps_total_ms
FROM win, counts, little, arrivals, engine, tok
LEFT JOIN (SELECT * FROM window_energy WHERE metric = 'gpu_energy_mj' AND NOT invalid) gpu ON true
LEFT JOIN (SELECT * FROM window_energy WHERE metric = 'cpu_package_energy_uj' AND NOT invalid) cpu ON true
LEFT JOIN (SELECT * FROM window_energy WHERE metric = 'cpu_dram_energy_uj' AND NOT invalid) dram ON true;
