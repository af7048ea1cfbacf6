-- The gap register: what is missing, which figures it leaves NULL, what would close it (docs/LEDGER.md
-- "gaps"). Rows the ledger finds, numbered per subject; rows of reported evidence with ids of their
-- own; and the collectors' rows (gaps.parquet) as they were written.
--
-- reads: ev, events, samples, figures, marks, ms_raw, stream_clock, clock_conv, spans_raw, attempt_ids,
--        attempt_start, window_bounds, window_points, step_attribution, energy_shares, dag_problems,
--        window_energy, kv_holds, steps, attempts, choice_metrics, run_metrics, peer_views, peer_base,
--        attempt_evidence, reported_counters, collector_gaps, load_gaps, model_gaps,
--        fit_gaps, request_model_gaps, prediction_gaps
-- creates: client_reporter, gaps

CREATE OR REPLACE TEMP TABLE client_reporter AS  -- who reported the client events, when a load tool did
SELECT min(json_extract_string(attrs, '$.reporter')) AS reporter FROM ev
WHERE name = 'attempt.sent' AND json_extract_string(attrs, '$.evidence') = 'reported';

-- @table gaps: one row per gap: what is missing, which figures it leaves NULL, what would close it
--   (docs/LEDGER.md "gaps")
-- @column gap_id: deterministic: scope:subject:n for the ledger's rows, reported:... for reported
--   evidence, the collector's own id for its rows
-- @column scope: run, import, attempt, task, clock, energy, step, otlp (a reported span), event
-- @column subject_id: what the gap is about: an attempt, task, step or event id, a part file, a metric
--   (NULL for the run)
-- @column affects: the figures (columns, tables) it leaves NULL or changes
-- @column needs: what would close it
-- @column detail: what was found, naming events and files
-- @column origin: ledger (found by the rebuild) or collector (gaps.parquet, written at capture or import)
CREATE OR REPLACE TABLE gaps AS
WITH ledger_gaps AS (
  -- a subtraction across clock domains with no mapping
  SELECT 'clock' AS scope, subject_id, figure AS affects,
         format('a clock.map between {} and {} (e.g. round trips to the server''s /clock)', a_clock, b_clock) AS needs,
         format('{} − {}: {} and {} cannot be compared', b_eid, a_eid, b_clock, a_clock) AS detail
  FROM figures WHERE refused
  UNION ALL
  -- an impossible order on one clock (or beyond a mapping's epsilon): the figure is NULL, both events named
  SELECT CASE WHEN f.figure = 'task_e2e' THEN 'task' ELSE 'attempt' END, split_part(f.subject_id, '#', 1),
         CASE WHEN f.figure LIKE 'choice\_%' ESCAPE '\'
              THEN format('choice_metrics {} (choice {})', f.figure, split_part(f.subject_id, '#', 2)) ELSE f.figure END,
         'events in a possible order (a clock that does not run backwards; ids not reused)',
         format('{} ({}) is {} ms before {} ({}){}: {} would be negative', f.b_eid, eb.name, round(-f.raw_ms, 3),
                f.a_eid, ea.name, CASE WHEN f.label = 'impossible' AND f.a_clock <> f.b_clock
                                        THEN format(' beyond the mapping''s ±{} ms', f.eps_ms) ELSE '' END, f.figure)
  FROM figures f
  LEFT JOIN (SELECT event_id, any_value(name) AS name FROM events
             WHERE event_id IN (SELECT a_eid FROM figures WHERE impossible UNION SELECT b_eid FROM figures WHERE impossible)
             GROUP BY event_id) ea ON ea.event_id = f.a_eid
  LEFT JOIN (SELECT event_id, any_value(name) AS name FROM events
             WHERE event_id IN (SELECT a_eid FROM figures WHERE impossible UNION SELECT b_eid FROM figures WHERE impossible)
             GROUP BY event_id) eb ON eb.event_id = f.b_eid
  WHERE f.impossible
  UNION ALL
  -- conflicting client terminal events: the earliest decides every client figure
  SELECT 'attempt', attempt_id, 'client_status, e2e_client_ms, tpot_ms, on_time, good (the earliest terminal decides)',
         'one terminal event per attempt from the client',
         format('the client recorded {}; the earliest, {} ({}), decides', array_to_string(client_terminals, ' and '),
                client_end.name, client_end.eid)
  FROM marks WHERE len(client_terminals) > 1
  UNION ALL
  -- stream points in a clock the stream's clock cannot be compared with
  SELECT 'clock', r.attempt_id, format('{} stream intervals', r.stream),
         format('a clock.map between {} and {}', r.clock, sc.clock),
         format('{} left out of the {} stream', r.event_id, r.stream)
  FROM ms_raw r JOIN stream_clock sc USING (attempt_id, stream)
  LEFT JOIN clock_conv c ON c.from_clock = r.clock AND c.to_clock = sc.clock
  WHERE c.from_clock IS NULL
  UNION ALL
  SELECT 'attempt', attempt_id, format('span {} on stream {}', span, stream), 'its span.end event',
         format('span.start {} has no matching span.end', start_eid)
  FROM spans_raw WHERE end_ns IS NULL
  UNION ALL
  -- layer-wide absence: one run-scope row
  SELECT 'run', NULL, 'ttft_client_ms, e2e_client_ms, tpot_ms, client_status, good; run_metrics n_good, n_completed, '
                    || 'goodput_rps, completed_rps, output_tokens, output_tok_s, prompt_tokens, total_tok_s, '
                    || 'computed_tok_s, arrival_rps, mean_in_system; reconciliation completed, cancelled, timed_out, '
                    || 'errored, ghost_attempts, ghost_ms, ghost_tokens',
         'client events (capture with the inferledger client, or import the client''s trace)',
         'the run has no client events'
  WHERE NOT EXISTS (SELECT 1 FROM attempt_ids WHERE n_client_events > 0) AND EXISTS (SELECT 1 FROM attempt_ids)
  UNION ALL
  SELECT 'run', NULL, 'ttft_server_ms, e2e_server_ms, queue_ms, prefill_ms, decode_ms, server_status',
         'server or engine events (black-box target: the server exports none)',
         'the run has no server or engine events'
  WHERE NOT EXISTS (SELECT 1 FROM attempt_ids WHERE n_server_events > 0) AND EXISTS (SELECT 1 FROM attempt_ids)
  UNION ALL
  -- a single attempt missing a layer its peers have
  SELECT 'attempt', attempt_id, 'server_status and the server-side metrics',
         'the server''s events for this attempt (were its ids propagated?)', 'no server or engine event carries this attempt id'
  FROM attempt_ids WHERE n_server_events = 0 AND n_client_events > 0
    AND EXISTS (SELECT 1 FROM attempt_ids WHERE n_server_events > 0)
  UNION ALL
  SELECT 'attempt', attempt_id, 'client_status and the client-side metrics',
         'the client''s events for this attempt', 'no client event carries this attempt id'
  FROM attempt_ids WHERE n_client_events = 0 AND n_server_events > 0
    AND EXISTS (SELECT 1 FROM attempt_ids WHERE n_client_events > 0)
  UNION ALL
  SELECT 'clock', attempt_id, 'attempt_index (and max_attempts counting)',
         format('a clock.map between {} and {}', p.clock, ref_clock),
         format('{} (the attempt''s start) cannot be compared with the other attempts of its request, on {}', p.eid, ref_clock)
  FROM attempt_start WHERE p IS NOT NULL AND start_ref_ns IS NULL
  UNION ALL
  -- the observation window: one clock, a positive length
  SELECT 'run', NULL, 'goodput_rps, completed_rps, vllm_goodput_rps, output_tok_s, total_tok_s, computed_tok_s, '
                    || 'arrival_rps, mean_in_system',
         'a window of positive length (events spread over time)',
         'the observation window has zero length: every rate over it is unknown'
  FROM window_bounds WHERE t1 = t0
  UNION ALL
  SELECT 'run', NULL, 't_obs_s and every rate over the observation window',
         'a start (arrival.planned, attempt.created or attempt.sent; engine.enqueued without a client) and an end (a terminal event)',
         format('the observation window has no {} event', CASE WHEN t0 IS NULL THEN 'start' ELSE 'end' END)
  FROM window_bounds WHERE (t0 IS NULL OR t1 IS NULL) AND EXISTS (SELECT 1 FROM attempt_ids)
    AND NOT EXISTS (SELECT 1 FROM window_points WHERE dropped)
  UNION ALL
  SELECT 'clock', NULL, 't_obs_s and every rate over the observation window',
         format('a clock.map between {} and {}', clock, any_value(ref_clock)),
         format('{} window point(s) left out (first {}): {} cannot be compared with the window''s clock {}',
                count(*), min(event_id), clock, any_value(ref_clock))
  FROM window_points WHERE dropped GROUP BY clock
  UNION ALL
  SELECT 'step', step_id::VARCHAR, 'step_attribution share_ms, energy_shares',
         'the tokens each attempt processed in the step (step.start attrs.batch)',
         'the step''s batch lists 0 tokens in all: its time cannot be shared by tokens'
  FROM step_attribution GROUP BY step_id HAVING sum(tokens) = 0
  UNION ALL
  SELECT 'run', NULL, 'energy_shares fraction, gpu_j, cpu_j',
         'engine steps that take time (step.start before step.end)',
         'the attributed engine steps took 0 ms in all (or had no token shares): the window energy cannot be split by step time'
  WHERE EXISTS (SELECT 1 FROM energy_shares WHERE fraction IS NULL)
  UNION ALL
  SELECT scope, subject_id, 'critical_path', 'a dependency graph without cycles or negative durations', detail
  FROM dag_problems
  UNION ALL
  -- an event id found more than once in the run's parts (ledger/load.py keeps the first copy)
  SELECT scope, subject_id, affects, needs, detail FROM load_gaps
  UNION ALL
  -- the registered prediction: missing, changed after registration, or not of the prediction format
  SELECT 'run', 'prediction.json', affects, needs, detail FROM prediction_gaps
  UNION ALL
  -- the workload model: no shape, no roofs, batch rows without their context (ledger/step_model.py)
  SELECT scope, subject_id, affects, needs, detail FROM model_gaps
  UNION ALL
  SELECT scope, subject_id, affects, needs, detail FROM fit_gaps
  UNION ALL
  SELECT scope, subject_id, affects, needs, detail FROM request_model_gaps
  UNION ALL
  -- energy: no counter samples in the run (the ledger never reports 0 J for "not measured")
  SELECT 'energy', NULL, 'energy_gpu_j, energy_cpu_j, energy_per_good_j',
         'an energy source: NVML (GPU driver) or read access to RAPL powercap (see inferledger doctor)',
         'the run has no energy counter samples'
  WHERE NOT EXISTS (SELECT 1 FROM samples WHERE metric LIKE '%energy%') AND EXISTS (SELECT 1 FROM attempt_ids)
  UNION ALL
  SELECT 'clock', NULL, 'energy_gpu_j, energy_cpu_j, energy_dram_j, idle_gpu_j, idle_cpu_j, energy_per_good_j',
         format('a clock.map between {} and {}', sm.clock, wb.clock),
         format('{} energy samples on {} cannot be placed in the window''s clock {}', count(*), sm.clock, wb.clock)
  FROM samples sm, window_bounds wb
  WHERE sm.metric IN ('gpu_energy_mj', 'cpu_package_energy_uj', 'cpu_dram_energy_uj') AND wb.clock IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM clock_conv c WHERE c.from_clock = sm.clock AND c.to_clock = wb.clock)
  GROUP BY sm.clock, wb.clock
  UNION ALL
  SELECT 'energy', metric, CASE WHEN metric LIKE 'gpu%' THEN 'energy_gpu_j, energy_per_good_j' ELSE 'energy_cpu_j, energy_per_good_j' END,
         'a window without a counter reset (NVML restarts after a driver reload) and with RAPL wrap ranges',
         'the counter went down inside the observation window, or a RAPL wrap could not be unwrapped'
  FROM window_energy WHERE invalid
  UNION ALL
  SELECT 'run', NULL, 'kv_gib_s, ghost_kv_gib_s', 'the KV block size in bytes (manifest model.kv_bytes_per_token and engine_config.block_size)',
         'the run holds KV events but its manifest does not declare the bytes of a block'
  WHERE getvariable('kv_block_bytes') IS NULL AND EXISTS (SELECT 1 FROM kv_holds)
  UNION ALL
  SELECT 'run', NULL, 'gpu_s_per_good', 'device.step events on a CUDA clock (a GPU run)',
         'the run has no device time: engine_s_per_good counts engine step time instead'
  WHERE NOT EXISTS (SELECT 1 FROM ev WHERE name = 'device.step') AND EXISTS (SELECT 1 FROM steps)
  UNION ALL
  SELECT 'attempt', attempt_id, 'n_output_tokens, tpot_ms, tpot_server_ms',
         'engine.token events or usage in attempt.done (a chunk is not a token)',
         coalesce((SELECT format('usage.completion_tokens in attempt.done is {}, not a whole token count the ledger '
                                 'can read (0 to 2^53)', json_extract(e.attrs, '$.usage.completion_tokens'))
                   FROM ev e WHERE e.attempt_id = attempts.attempt_id AND e.name = 'attempt.done'
                     AND json_extract(e.attrs, '$.usage.completion_tokens') IS NOT NULL
                     AND json_type(e.attrs, '$.usage.completion_tokens') <> 'NULL' LIMIT 1),
                  'the server reported no token count')
  FROM attempts WHERE n_output_tokens IS NULL AND client_status = 'completed'
  UNION ALL
  SELECT 'attempt', attempt_id, 'choice_metrics n_output_tokens and tpot, tpot_ms, tpot_server_ms',
         'engine.token events with attrs.choice (usage counts all choices together; a chunk is not a token)',
         format('{} choices without a per-choice token count', count(*))
  FROM choice_metrics WHERE n_output_tokens IS NULL AND attempt_id IN (SELECT attempt_id FROM marks WHERE n_choices > 1)
  GROUP BY attempt_id
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
  SELECT 'run', NULL, format('peer_views ({} {})', metric, tool),
         CASE WHEN tool = 'MLPerf-style' THEN 'attempt.sent attrs.pacing_error_ms (the planned send; the inferledger client records it)'
              -- an imported load tool's records keep only what that tool measures (GuideLLM: first and last token)
              WHEN (SELECT reporter FROM client_reporter) IS NOT NULL
                THEN format('client chunk times that {}''s records do not keep (our own client records every chunk)',
                            (SELECT reporter FROM client_reporter))
              ELSE 'client chunks of completed attempts with enough output tokens' END,
         format('no completed attempt gives a sample for {} as {} defines it', metric, tool)
  FROM peer_views WHERE n = 0 AND EXISTS (SELECT 1 FROM peer_base)
), numbered AS (
  SELECT scope, subject_id, affects, needs, detail,
         format('{}:{}:{}', scope, coalesce(subject_id, '-'),
                row_number() OVER (PARTITION BY scope, subject_id ORDER BY affects, detail)) AS gap_id
  FROM ledger_gaps
)
SELECT getvariable('run_id') AS run_id, gap_id, scope, subject_id, affects, needs, detail, 'ledger' AS origin
FROM numbered
UNION ALL
-- reported evidence: engine-layer token gaps a span cannot give, and a counter that went down between
-- scrapes (the engine restarted: its run delta is unknown)
SELECT getvariable('run_id'), 'reported:itl', 'run', NULL, 'itl (engine layer), itl_engine_max_ms',
       'per-token engine events (a span reports the first and the last token only)',
       format('{} attempt(s) with tokens reported by {} as a span', count(*), string_agg(DISTINCT reporter, ', ')), 'ledger'
FROM attempt_evidence WHERE aggregate_tokens HAVING count(*) > 0
UNION ALL
SELECT getvariable('run_id'), format('reported:counter:{}', metric), 'run', metric, format('reported_counters.run_delta ({})', metric),
       'a scrape series in which the counter does not go down (no engine restart during the run)',
       format('{} went down between scrapes', metric), 'ledger'
FROM reported_counters WHERE went_down
UNION ALL
SELECT getvariable('run_id'), gap_id, scope, subject_id, affects, needs, detail, 'collector' FROM collector_gaps
ORDER BY origin, gap_id;
