-- The run's figures over its observation window: goodput beside completed throughput, token
-- throughput, Little's law, energy and its cost per good result (docs/LEDGER.md "run_metrics").
-- A run without client events has no client-side count: its client figures are NULL (one run gap in
-- the register), not 0. Every rate divides by t_obs_s through nullif: a zero-length window is unknown.
--
-- scope: rollup
-- reads: window_bounds, window_starts, device_steps, request_metrics, attempts, marks, steps, window_energy, power_check,
--        kv_integral, step_attribution, sum_if_known, clock_conv, samples, declared_replicas
-- creates: run_metrics, run_metrics_gaps
-- @table run_metrics: one row per run: its figures over the observation window (docs/LEDGER.md
--   "run_metrics")
-- @column t_obs_s: the observation window's length, s, on one clock (NULL when a point cannot be placed)
-- @column window: which events bound the window (client terminals, else server ends; engine-only runs)
-- @column n_good: attempts whose good is true; NULL without client events
-- @column n_completed: attempts the client saw complete; NULL without client events
-- @column n_client_attempts: the client's attempts (attempts.client_attempt); NULL without client events
-- @column n_unjudged: the client's attempts whose good is unknown; NULL without client events
-- @column goodput_rps: n_good / t_obs_s
-- @column vllm_goodput_rps: completed requests within slo_ttft_ms / slo_tpot_ms / slo_e2e_ms (TPOT 0
--   with ≤ 1 token) per second of the window; NULL without thresholds
-- @column slo_ttft_ms: the TTFT threshold declared in the manifest's slo (or the workload's [slo])
-- @column slo_tpot_ms: the TPOT threshold declared likewise
-- @column slo_e2e_ms: the E2E threshold declared likewise
-- @column completed_rps: n_completed / t_obs_s
-- @column output_tokens: Σ n_output_tokens over the attempts the client saw complete; NULL when one is unknown
-- @column output_tok_s: output_tokens / t_obs_s
-- @column prompt_tokens: Σ prompt tokens over those attempts (engine.enqueued values, else the usage
--   the client received)
-- @column prompt_tokens_cached: Σ engine.prefill attrs.cached_tokens over those attempts
-- @column prefill_tokens_computed: Σ engine.prefill values (recomputation after preemption included)
-- @column total_tok_s: (prompt + output tokens) / t_obs_s: the peers' total token throughput (cached
--   prompt tokens counted as if computed)
-- @column computed_tok_s: (prefill tokens computed + output tokens) / t_obs_s: the work the engine did
-- @column mean_in_system: the attempts in the client's system (created, else sent → the client's
--   terminal, else the window's end) integrated over the window / t_obs_s: Little's L, measured
-- @column offered_rps: the workload's planned arrival rate, req/s (manifest workload: Poisson or gamma
--   arrivals, after calibration); NULL for a closed loop or a replay, with a gap
-- @column attempted_rps: attempts sent (attempt.sent) per second of the window: Little's λ
-- @column arrival_rps: attempted_rps, under its former name
-- @column mean_time_in_system_s: mean client_span_ms over the attempts with a client terminal, s: Little's W
-- @column little_rel_err: |mean_in_system − attempted_rps × mean_time_in_system_s| / mean_in_system: L from
--   the in-flight attempts' time, λ from the sends, W from the spans that ended. On a window that holds every
--   attempt whole they are one sum (Little's law is then an identity), so this is a bookkeeping check: it
--   is non-zero for attempts clipped at the window's edges, sent but never ended, or counted in one and not
--   the other
-- @column server_in_system: the server's own in-system gauge, time-weighted over the window: Little's L at the
--   server, measured apart from any span. Our engine: num_running + num_waiting of each step.start, held from
--   that step's start to the next's, but 0 from the end of a step that held every sequence of the engine (none
--   waiting, every running one in its batch) of which none goes on in the next step (the engine idle, empty)
--   and 0 before its first step; a vLLM run: the scraped vllm:num_requests_running + vllm:num_requests_waiting
--   (llama.cpp: llamacpp:requests_processing + llamacpp:requests_deferred), each scrape held until the next,
--   known where the scrapes reach back to the window's start. A deployment adds its replicas' gauges (unknown
--   where a declared replica has none). Sequences, as the gauges count them (an n > 1 request counts n)
-- @column server_in_system_source: which gauges: engine_steps (step.start num_running, num_waiting),
--   vllm_metrics, llamacpp_metrics (scraped /metrics), joined by + where a deployment has several; NULL where
--   the run has none
-- @column server_attempted_rps: attempts the server admitted (engine.enqueued) in the window / t_obs_s: the
--   server's λ
-- @column mean_time_in_server_s: mean engine.enqueued → engine.finished over those attempts that finished, s:
--   the server's W
-- @column server_little_rel_err: |server_in_system − server_attempted_rps × mean_time_in_server_s| /
--   server_in_system: two independent measurements (the gauge against the admissions and spans), so non-zero
--   where the engine's gauge misses requests (or counts ones it does not hold), beside the gauge's sampling at
--   step starts (an arrival counts from the next step's start, a departure until it)
-- @column client_transport_in_system: mean_in_system − server_in_system: the mean number of attempts in the
--   client and the transport (sent, not yet in the engine, or answered and not yet received), not in the engine
-- @column planned_arrivals: tasks with an arrival.planned event
-- @column engine_busy_s: Σ engine step time (step.start → step.end), s
-- @column engine_s_per_good: engine_busy_s / n_good
-- @column energy_gpu_j: GPU energy in the window from the NVML counters, J (docs/ENERGY.md); NULL
--   without them
-- @column energy_cpu_j: CPU package energy in the window from the RAPL counters (psys never added), J
-- @column energy_dram_j: DRAM energy in the window from the RAPL counters, J
-- @column idle_gpu_j: the GPU's idle term: mean power before the window × the time the window energy
--   covers, J (a term of its own, not subtracted)
-- @column idle_cpu_j: the CPU package's idle term, likewise
-- @column gpu_power_integrated_j: the instant GPU power integrated over the window (trapezoid), J: a
--   cross-check of energy_gpu_j
-- @column gpu_window_short: the GPU window is shorter than the NVML counter's ~100 ms update period
-- @column energy_scope: which energies energy_per_good_j adds: gpu+cpu_package, gpu or cpu_package
-- @column energy_per_good_j: (GPU + CPU package energy, whichever are known) / n_good, J
-- @column energy_gpu_per_good_j: energy_gpu_j / n_good
-- @column energy_cpu_per_good_j: energy_cpu_j / n_good
-- @column gpu_s_per_good: Σ device.step time / n_good, s (NULL without a device clock)
-- @column kv_gib_s: Σ accounts.kv_gib_s, the physical KV holding of the run, GiB·s
-- @column attributed_step_ms: Σ step_attribution.share_ms (equals attributed_steps_total_ms: the
--   conservation check)
-- @column attributed_steps_total_ms: Σ step_ms of the steps step_attribution shares
-- @column window_clock: the clock the window lives on: the one most of its start events use
-- @column window_start_ns: the window's start (the first planned arrival or client event; the first
--   engine.enqueued of an engine-only run), ns on window_clock, every point converted by the clock rule
-- @column window_end_ns: the window's end (the last client terminal, else the last server end), ns on
--   window_clock; t_obs_s = (window_end_ns − window_start_ns) / 1e9
CREATE OR REPLACE TABLE run_metrics AS
WITH win AS (SELECT *, nullif((t1 - t0) / 1e9, 0) AS t_div FROM window_bounds), counts AS (
  SELECT CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) FILTER (WHERE good) END AS n_good,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) FILTER (WHERE client_status = 'completed') END AS n_completed,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) FILTER (WHERE client_attempt) END
           AS n_client_attempts,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) FILTER (WHERE client_attempt AND good IS NULL) END
           AS n_unjudged
  FROM request_metrics JOIN attempts USING (attempt_id)
), spans AS (  -- each attempt in the client's system, on the window's clock (NULL where no mapping reaches it)
  SELECT m.attempt_id, m.sent IS NOT NULL AS sent, coalesce(m.created, m.sent).ns + cs.offset_ns AS s,
         CASE WHEN m.client_end IS NULL THEN (SELECT t1 FROM window_bounds) ELSE m.client_end.ns + ce.offset_ns END AS e
  FROM marks m
  LEFT JOIN clock_conv cs ON cs.from_clock = coalesce(m.created, m.sent).clock AND cs.to_clock = (SELECT clock FROM window_bounds)
  LEFT JOIN clock_conv ce ON ce.from_clock = m.client_end.clock AND ce.to_clock = (SELECT clock FROM window_bounds)
  WHERE coalesce(m.created, m.sent) IS NOT NULL
), little AS (
  -- L: the attempts in flight integrated over the window (each span clipped to it); λ: attempts sent;
  -- W: the mean client span of the attempts that ended. Three separate measurements.
  SELECT CASE WHEN (SELECT has_client FROM window_bounds) AND count(*) = count(s) AND count(*) = count(e)
              THEN coalesce(sum(greatest(least(e, w.t1) - greatest(s, w.t0), 0)), 0) / 1e9 END AS in_system_s,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) FILTER (WHERE sent) END AS n_sent,
         (SELECT avg(client_span_ms) / 1e3 FROM request_metrics WHERE client_span_ms IS NOT NULL) AS w_s
  FROM spans, window_bounds w
), gauge_steps AS (
  -- the server's own in-system gauge, our engine: step.start attrs num_running + num_waiting (the sequences
  -- its scheduler holds once the step is scheduled), on the window's clock
  SELECT st.clock, st.replica_id, st.start_ns + cv.offset_ns AS s_ns, st.end_ns + cv.offset_ns AS e_ns,
         TRY_CAST(json_extract(st.start_attrs, '$.num_running') AS BIGINT) AS n_run,
         TRY_CAST(json_extract(st.start_attrs, '$.num_waiting') AS BIGINT) AS n_wait,
         coalesce(json_extract_string(st.start_attrs, '$.batch[*][0]'), []) AS ids
  FROM steps st
  LEFT JOIN clock_conv cv ON cv.from_clock = st.clock AND cv.to_clock = (SELECT clock FROM window_bounds)
), gauge_segments AS (
  -- each step at its gauge; from its end to the next step's start the same value (the gauge holds), except
  -- after a step that held every sequence of the engine (none waiting, every running one in its batch) of
  -- which none goes on in the next step: the engine is empty, the idle time until the next step counts 0.
  -- After the engine's last step, to the window's end, likewise; before its first step it held nothing
  SELECT s_ns AS s, e_ns AS e, n_run + n_wait AS level FROM gauge_steps
  UNION ALL
  SELECT e_ns, coalesce(next_s, (SELECT t1 FROM window_bounds)),
         CASE WHEN n_wait = 0 AND n_run = len(ids) AND (next_ids IS NULL OR NOT list_has_any(ids, next_ids)) THEN 0
              ELSE n_run + n_wait END
  FROM (SELECT *, lead(s_ns) OVER w AS next_s, lead(ids) OVER w AS next_ids
        FROM gauge_steps WINDOW w AS (PARTITION BY clock, replica_id ORDER BY s_ns))
), engine_gauge AS (
  SELECT count(*) AS n, count(*) FILTER (WHERE level IS NULL OR s IS NULL OR e IS NULL) AS n_unknown,
         sum(level * greatest(least(e, w.t1) - greatest(s, w.t0), 0)) / 1e9 AS in_server_s
  FROM gauge_segments, window_bounds w
), scrapes AS (
  -- an engine's own gauges scraped from its /metrics (summed over label sets), each scrape held until the
  -- replica's next: vLLM's running + waiting, llama.cpp's processing + deferred
  SELECT sm.source, sm.device, sm.ts_ns + cv.offset_ns AS t,
         sum(sm.value) FILTER (WHERE sm.metric IN ('vllm:num_requests_running', 'llamacpp:requests_processing'))
           + sum(sm.value) FILTER (WHERE sm.metric IN ('vllm:num_requests_waiting', 'llamacpp:requests_deferred')) AS level
  FROM samples sm
  LEFT JOIN clock_conv cv ON cv.from_clock = sm.clock AND cv.to_clock = (SELECT clock FROM window_bounds)
  WHERE (sm.source = 'vllm-metrics' AND sm.metric IN ('vllm:num_requests_running', 'vllm:num_requests_waiting'))
     OR (sm.source = 'llamacpp-metrics' AND sm.metric IN ('llamacpp:requests_processing', 'llamacpp:requests_deferred'))
  GROUP BY sm.source, sm.device, sm.ts_ns, sm.clock, cv.offset_ns
), scraped_gauge AS (
  -- known where every replica's scrapes reach back to the window's start (the capture scrapes once before the load)
  SELECT count(*) AS n, string_agg(DISTINCT replace(source, '-', '_'), '+' ORDER BY replace(source, '-', '_')) AS sources,
         count(*) FILTER (WHERE level IS NULL OR t IS NULL OR first_t > w.t0) AS n_unknown,
         sum(level * greatest(least(coalesce(next_t, w.t1), w.t1) - greatest(t, w.t0), 0)) / 1e9 AS in_server_s
  FROM (SELECT *, lead(t) OVER (PARTITION BY source, device ORDER BY t) AS next_t,
               min(t) OVER (PARTITION BY source, device) AS first_t FROM scrapes), window_bounds w
), gauged_replicas AS (  -- the replicas a gauge covers: a deployment's replica without one leaves the sum unknown
  SELECT DISTINCT replica_id FROM steps WHERE replica_id IS NOT NULL
  UNION SELECT DISTINCT device FROM scrapes WHERE device IS NOT NULL
), server_gauge AS (
  -- the engine's steps and the scraped gauges each cover their own servers (our replicas are scraped under
  -- a source of their own, not counted twice)
  SELECT nullif(concat_ws('+', CASE WHEN g.n > 0 THEN 'engine_steps' END, v.sources), '') AS source,
         CASE WHEN (g.n > 0 OR v.n > 0) AND (g.n = 0 OR g.n_unknown = 0) AND (v.n = 0 OR v.n_unknown = 0)
                   AND NOT EXISTS (SELECT 1 FROM declared_replicas() d
                                   WHERE d.replica_id NOT IN (SELECT replica_id FROM gauged_replicas))
              THEN coalesce(CASE WHEN g.n > 0 THEN g.in_server_s END, 0) + coalesce(CASE WHEN v.n > 0 THEN v.in_server_s END, 0)
              END AS in_server_s
  FROM engine_gauge g, scraped_gauge v
), server_little AS (
  -- λ and W at the server: the attempts it admitted (engine.enqueued) in the window, their enqueue → engine.finished
  SELECT count(*) AS n_enqueued, count(a) FILTER (WHERE a BETWEEN w.t0 AND w.t1) AS n_admitted,
         count(*) FILTER (WHERE a IS NULL) AS n_unplaced,
         avg(f - a) FILTER (WHERE a BETWEEN w.t0 AND w.t1) / 1e9 AS w_s
  FROM (SELECT m.enqueued.ns + ca.offset_ns AS a, m.finished.ns + cf.offset_ns AS f
        FROM marks m
        LEFT JOIN clock_conv ca ON ca.from_clock = m.enqueued.clock AND ca.to_clock = (SELECT clock FROM window_bounds)
        LEFT JOIN clock_conv cf ON cf.from_clock = m.finished.clock AND cf.to_clock = (SELECT clock FROM window_bounds)
        WHERE m.enqueued IS NOT NULL), window_bounds w
), arrivals AS (
  SELECT count(DISTINCT task_id) AS n FROM window_starts WHERE name = 'arrival.planned'
), engine AS (
  SELECT sum(step_ms) / 1e3 AS busy_s FROM steps
), tok AS (
  -- token throughput over the attempts the client saw complete (the peers' denominator); a sum over
  -- attempts of which any count is unknown is unknown
  -- (no completed attempt is a known 0 only where the client was watched)
  SELECT CASE WHEN (SELECT has_client FROM window_bounds) THEN sum_if_known(a.n_output_tokens, a.n_output_tokens)
              END AS output_tokens,
         -- prompt tokens: the engine's count, else the usage the client received (a black-box run)
         CASE WHEN (SELECT has_client FROM window_bounds)
              THEN sum_if_known(m.n_prompt_tokens, m.n_prompt_tokens) END AS prompt_tokens,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN sum_if_known(m.n_prompt_engine, coalesce(m.n_prompt_cached, 0))
              END AS prompt_tokens_cached,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN sum_if_known(m.n_prompt_engine, coalesce(m.n_prefill_computed, 0))
              END AS prefill_tokens_computed,
         count(*) AS n
  FROM attempts a JOIN marks m USING (attempt_id)
  WHERE a.client_status = 'completed'
)
SELECT getvariable('run_id') AS run_id,
  (win.t1 - win.t0) / 1e9 AS t_obs_s, win.label AS window,
  counts.n_good, counts.n_completed, counts.n_client_attempts, counts.n_unjudged,
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
  -- Little's law: mean number in system (time-averaged) against attempted rate × mean time in system
  little.in_system_s / win.t_div AS mean_in_system,
  getvariable('offered_rps') AS offered_rps,
  little.n_sent / win.t_div AS attempted_rps,
  little.n_sent / win.t_div AS arrival_rps,
  little.w_s AS mean_time_in_system_s,
  abs(little.in_system_s / win.t_div - little.n_sent / win.t_div * little.w_s) / nullif(little.in_system_s / win.t_div, 0)
    AS little_rel_err,
  -- Little's law at the server, from two independent measurements: the server's own in-system gauge over
  -- time against the attempts it admitted per second × their mean time in it
  server_gauge.in_server_s / win.t_div AS server_in_system, server_gauge.source AS server_in_system_source,
  CASE WHEN server_little.n_enqueued > 0 AND server_little.n_unplaced = 0 THEN server_little.n_admitted / win.t_div
       END AS server_attempted_rps,
  CASE WHEN server_little.n_unplaced = 0 THEN server_little.w_s END AS mean_time_in_server_s,
  CASE WHEN server_little.n_unplaced = 0 THEN
    abs(server_gauge.in_server_s / win.t_div - server_little.n_admitted / win.t_div * server_little.w_s)
      / nullif(server_gauge.in_server_s / win.t_div, 0) END AS server_little_rel_err,
  (little.in_system_s - server_gauge.in_server_s) / win.t_div AS client_transport_in_system,
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
  CASE WHEN counts.n_good > 0 THEN (SELECT sum(device_ms) / 1e3 FROM device_steps) / counts.n_good
       END AS gpu_s_per_good,
  (SELECT sum(kv_gib_s) FROM kv_integral) AS kv_gib_s,
  (SELECT sum(share_ms) FROM step_attribution) AS attributed_step_ms,
  (SELECT sum(step_ms) FROM steps WHERE step_id IN (SELECT step_id FROM step_attribution)) AS attributed_steps_total_ms,
  win.clock AS window_clock, win.t0 AS window_start_ns, win.t1 AS window_end_ns
FROM win, counts, little, server_gauge, server_little, arrivals, engine, tok
LEFT JOIN (SELECT * FROM window_energy WHERE metric = 'gpu_energy_mj' AND NOT invalid) gpu ON true
LEFT JOIN (SELECT * FROM window_energy WHERE metric = 'cpu_package_energy_uj' AND NOT invalid) cpu ON true
LEFT JOIN (SELECT * FROM window_energy WHERE metric = 'cpu_dram_energy_uj' AND NOT invalid) dram ON true;

-- @gaps: no planned arrival rate (a closed loop, a replay, or a manifest that does not say); no device time; a completed attempt without a token count or without its engine prompt counts
--   (the run's sums are unknown); no server in-system gauge (neither engine steps with num_running / num_waiting
--   nor scraped engine gauges reaching back to the window's start, or a declared replica without one); no server
--   admission and departure events.
CREATE OR REPLACE TEMP TABLE run_metrics_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO run_metrics_gaps
SELECT 'run', NULL, 'offered_rps, run_diagnosis point rows',
       'an open-loop workload with a planned rate (manifest workload.arrivals poisson or gamma, [arrivals] rate_rps)',
       'the run has no planned arrival rate (a closed loop offers what it completes): offered_rps is unknown'
WHERE getvariable('offered_rps') IS NULL AND EXISTS (SELECT 1 FROM window_bounds WHERE t0 IS NOT NULL)
UNION ALL
SELECT 'run', NULL, 'gpu_s_per_good', 'device.step events on a CUDA clock (a GPU run)',
       'the run has no device time: engine_s_per_good counts engine step time instead'
WHERE NOT EXISTS (SELECT 1 FROM device_steps) AND EXISTS (SELECT 1 FROM steps)
UNION ALL
SELECT 'run', NULL, 'output_tokens, output_tok_s, total_tok_s, computed_tok_s',
       'a token count for every completed attempt (engine.token events or usage in attempt.done)',
       'a completed attempt has no token count (its own gap row names it), so the run''s sum is unknown'
FROM run_metrics WHERE output_tokens IS NULL AND n_completed > 0
UNION ALL
SELECT 'run', NULL,
       CASE WHEN prompt_tokens IS NULL THEN 'prompt_tokens, prompt_tokens_cached, prefill_tokens_computed, total_tok_s, computed_tok_s'
            ELSE 'prompt_tokens_cached, prefill_tokens_computed, computed_tok_s' END,
       'engine.enqueued and engine.prefill events (the embedded engine, inferledger serve --out, or an engine trace)',
       CASE WHEN prompt_tokens IS NULL
            THEN 'a completed attempt has no engine.enqueued event and no usage.prompt_tokens: its prompt length and prefill work are unknown'
            ELSE 'a completed attempt has no engine.enqueued event: its prompt length comes from usage, its cached and computed prefill tokens are unknown' END
FROM run_metrics WHERE prefill_tokens_computed IS NULL AND n_completed > 0
UNION ALL
SELECT 'run', NULL, 'server_in_system, server_little_rel_err, client_transport_in_system',
       CASE WHEN server_in_system_source IS NULL
            THEN 'the server''s in-system gauge: our engine''s step events (step.start num_running, num_waiting) or '
                 || 'an engine''s scraped gauges (capture --scrape-metrics: vllm:num_requests_running and _waiting; '
                 || 'llamacpp:requests_processing and _deferred)'
            ELSE 'num_running and num_waiting on every step.start, both gauges in every scrape with the first '
                 || 'before the window''s start, every point on a clock the window''s clock maps, a gauge for every '
                 || 'replica of the deployment' END,
       CASE WHEN server_in_system_source IS NULL
            THEN 'the run has neither engine steps nor scraped engine gauges: the number of requests in the server is unknown'
            ELSE 'a step.start without num_running / num_waiting (an older run or another writer), a scrape without '
                 || 'one of its two gauges, a replica first scraped after the window''s start, a point no clock mapping '
                 || 'places, or a declared replica with neither steps nor scrapes: the server''s gauge over the window '
                 || 'is unknown' END
FROM run_metrics WHERE server_in_system IS NULL AND t_obs_s > 0
UNION ALL
SELECT 'run', NULL, 'server_attempted_rps, mean_time_in_server_s, server_little_rel_err',
       'each attempt''s admission and departure at the server (engine.enqueued, engine.finished: our engine, or '
       || 'vLLM''s spans) on a clock the window''s clock maps',
       'no attempt the server admitted in the window has its engine.enqueued and engine.finished placed on the '
       || 'window''s clock: the time in the server (W) is unknown'
FROM run_metrics WHERE mean_time_in_server_s IS NULL AND t_obs_s > 0 AND EXISTS (SELECT 1 FROM marks);
