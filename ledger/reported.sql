-- What an engine reported about itself (attrs.evidence = 'reported'), kept apart from what our probes
-- observed (docs/LEDGER.md "Reported evidence"): vLLM's llm_request spans (mapped to events by
-- collectors.evidence.vllm_spans) beside its response metrics, llama.cpp's per-response timings (durations
-- the client received, placed inside the client's interval), and the /metrics counters (samples of
-- source 'vllm-metrics' or 'llamacpp-metrics') beside the sum of the spans or timings.
--
-- Its events are none of the per-output kinds: it reads them from `ev` (marks.sql), not the whole run.
--
-- scope: task
-- reads: ev, samples, figures, json_double, json_bigint
-- creates: reported_spans, reported_timings, reported_counters, reported_gaps

-- One row per reported llm_request span: vLLM's own figures beside ours, and the per-request
-- metrics vLLM put in its response (attempt.done attrs.server_metrics) checked against the span.
-- @table reported_spans: one row per llm_request span an engine reported: its own figures beside the
--   per-request metrics it put in its response (docs/LEDGER.md "Reported evidence")
-- @column event_id: the span's server.received event
-- @column reporter: the engine and version that reported it
-- @column joined_by: how the span was joined to the attempt (traceparent, gen_ai.request.id or both)
-- @column span_id: the span's id
-- @column trace_id: the span's trace id
-- @column engine_request_id: the engine's request id (gen_ai.request.id)
-- @column ttft_reported_ms: the engine's time to first token (arrival → first token)
-- @column queue_reported_ms: its time in queue
-- @column prefill_reported_ms: its time in model prefill
-- @column decode_reported_ms: its time in model decode (first token → last token)
-- @column inference_reported_ms: its time in model inference
-- @column e2e_reported_ms: its arrival → finish
-- @column prompt_tokens: its prompt tokens
-- @column completion_tokens: its completion tokens
-- @column client_usage_completion_tokens: the completion tokens of the usage the client received
-- @column response_queue_ms: the response's queue_time_ms (scheduled − queued)
-- @column response_prefill_ms: the response's time_to_first_token_ms (first token − scheduled: prefill only)
-- @column response_decode_ms: the response's generation_time_ms (last token − first token)
-- @column response_mean_itl_ms: the response's mean_itl_ms
-- @column queue_check_ms: response_queue_ms − queue_reported_ms
-- @column prefill_check_ms: response_prefill_ms − prefill_reported_ms
-- @column decode_check_ms: response_decode_ms − decode_reported_ms
-- @column completion_tokens_check: client_usage_completion_tokens − completion_tokens
-- @column evidence: always reported
CREATE OR REPLACE TABLE reported_spans AS
WITH rec AS (
  SELECT attempt_id, event_id, attrs, json_extract(attrs, '$.otel') AS o
  FROM ev
  WHERE name = 'server.received' AND json_extract_string(attrs, '$.evidence') = 'reported'
    AND json_extract_string(attrs, '$.otel_span') = 'llm_request'
), done AS (
  SELECT attempt_id, arg_max(json_extract(attrs, '$.server_metrics'), (ts_ns, seq)) AS pr,
         arg_max(json_bigint(attrs, '$.usage.completion_tokens'), (ts_ns, seq)) AS usage_completion
  FROM ev WHERE name = 'attempt.done' AND attempt_id IS NOT NULL GROUP BY attempt_id
), figs AS (
  SELECT r.attempt_id, r.event_id,
         json_extract_string(r.attrs, '$.reporter') AS reporter,
         json_extract_string(r.attrs, '$.joined_by') AS joined_by,
         json_extract_string(r.attrs, '$.span_id') AS span_id,
         json_extract_string(r.attrs, '$.trace_id') AS trace_id,
         json_extract_string(r.o, '$."gen_ai.request.id"') AS engine_request_id,
         json_double(r.o, '$."gen_ai.latency.time_to_first_token"') * 1000 AS ttft_reported_ms,
         json_double(r.o, '$."gen_ai.latency.time_in_queue"') * 1000 AS queue_reported_ms,
         json_double(r.o, '$."gen_ai.latency.time_in_model_prefill"') * 1000 AS prefill_reported_ms,
         json_double(r.o, '$."gen_ai.latency.time_in_model_decode"') * 1000 AS decode_reported_ms,
         json_double(r.o, '$."gen_ai.latency.time_in_model_inference"') * 1000 AS inference_reported_ms,
         json_double(r.o, '$."gen_ai.latency.e2e"') * 1000 AS e2e_reported_ms,
         json_bigint(r.o, '$."gen_ai.usage.prompt_tokens"') AS prompt_tokens,
         json_bigint(r.o, '$."gen_ai.usage.completion_tokens"') AS completion_tokens
  FROM rec r
)
SELECT getvariable('run_id') AS run_id, f.*,
       d.usage_completion AS client_usage_completion_tokens,
       -- vLLM's per-request response metrics: queue_time_ms = scheduled - queued, time_to_first_token_ms
       -- = first token - scheduled (prefill only), generation_time_ms = last token - first token
       json_double(d.pr, '$.queue_time_ms') AS response_queue_ms,
       json_double(d.pr, '$.time_to_first_token_ms') AS response_prefill_ms,
       json_double(d.pr, '$.generation_time_ms') AS response_decode_ms,
       json_double(d.pr, '$.mean_itl_ms') AS response_mean_itl_ms,
       json_double(d.pr, '$.queue_time_ms') - f.queue_reported_ms AS queue_check_ms,
       json_double(d.pr, '$.time_to_first_token_ms') - f.prefill_reported_ms AS prefill_check_ms,
       json_double(d.pr, '$.generation_time_ms') - f.decode_reported_ms AS decode_check_ms,
       d.usage_completion - f.completion_tokens AS completion_tokens_check,
       'reported' AS evidence
FROM figs f LEFT JOIN done d USING (attempt_id)
ORDER BY f.attempt_id;

-- llama.cpp's per-response `timings` (attempt.done attrs.server_timings, as the client received them on
-- the final chunk): durations without a time of day. They are placed only as durations inside the
-- client's own interval: prefill before the first content chunk reached the client (prefill ≤ ttft_client),
-- prefill + decode inside sent → done (≤ e2e_client), each beyond ε refused (NULL in request_metrics, a gap).
-- @table reported_timings: one row per attempt whose response carried an engine's per-response timings
--   (llama.cpp's `timings` object), checked against the client's interval (docs/LEDGER.md "Reported evidence")
-- @column reporter: llamacpp-<build>, the build the response named (system_fingerprint; unknown without one)
-- @column cached_tokens: timings.cache_n: prompt tokens the engine reused from its cache
-- @column prompt_tokens: timings.prompt_n: prompt tokens it processed (the cached ones not included)
-- @column prefill_reported_ms: timings.prompt_ms: its time processing those prompt tokens
-- @column completion_tokens: timings.predicted_n: tokens it generated
-- @column decode_reported_ms: timings.predicted_ms: its time generating them
-- @column engine_ms: prefill_reported_ms + decode_reported_ms
-- @column ttft_client_ms: request_metrics.ttft_client_ms (sent → first content chunk)
-- @column e2e_client_ms: request_metrics.e2e_client_ms (sent → done)
-- @column eps_ms: the bound of the comparison: the client figure's own ± ms, 0.001 ms (the engine's µs
--   timer) and 100 ppm of e2e_client_ms (the two clocks' rates)
-- @column prefill_slack_ms: ttft_client_ms − prefill_reported_ms (≥ −eps_ms: the prompt was processed
--   before its first token reached the client)
-- @column e2e_slack_ms: e2e_client_ms − engine_ms (≥ −eps_ms: the engine's work lies inside sent → done)
-- @column inside_client: both slacks ≥ −eps_ms; NULL when a figure is unknown
-- @column client_usage_completion_tokens: the completion tokens of the usage the client received
-- @column completion_tokens_check: client_usage_completion_tokens − completion_tokens
-- @column evidence: always reported
CREATE OR REPLACE TABLE reported_timings AS
WITH t AS (
  SELECT attempt_id, arg_max(json_extract(attrs, '$.server_timings'), (ts_ns, seq)) AS tm,
         arg_max(json_extract_string(attrs, '$.server_fingerprint'), (ts_ns, seq)) AS fingerprint,
         arg_max(json_bigint(attrs, '$.usage.completion_tokens'), (ts_ns, seq)) AS usage_completion
  FROM ev
  WHERE name = 'attempt.done' AND attempt_id IS NOT NULL
    AND json_extract_string(attrs, '$.server_timings_evidence') = 'reported'
  GROUP BY attempt_id
), fig AS (
  SELECT subject_id AS attempt_id,
         max(ms) FILTER (WHERE figure = 'ttft_client') AS ttft_client_ms,
         max(eps_ms) FILTER (WHERE figure = 'ttft_client') AS ttft_eps_ms,
         max(ms) FILTER (WHERE figure = 'e2e_client') AS e2e_client_ms,
         max(eps_ms) FILTER (WHERE figure = 'e2e_client') AS e2e_eps_ms
  FROM figures WHERE figure IN ('ttft_client', 'e2e_client') GROUP BY subject_id
), v AS (
  SELECT t.attempt_id, 'llamacpp-' || coalesce(t.fingerprint, 'unknown') AS reporter,
         json_bigint(t.tm, '$.cache_n') AS cached_tokens, json_bigint(t.tm, '$.prompt_n') AS prompt_tokens,
         json_double(t.tm, '$.prompt_ms') AS prefill_reported_ms,
         json_bigint(t.tm, '$.predicted_n') AS completion_tokens,
         json_double(t.tm, '$.predicted_ms') AS decode_reported_ms,
         f.ttft_client_ms, f.e2e_client_ms,
         coalesce(f.e2e_eps_ms, 0) + 0.001 + 1e-4 * f.e2e_client_ms AS eps_ms,
         coalesce(f.ttft_eps_ms, 0) + 0.001 + 1e-4 * f.ttft_client_ms AS ttft_bound_ms,
         t.usage_completion
  FROM t LEFT JOIN fig f USING (attempt_id)
)
SELECT getvariable('run_id') AS run_id, attempt_id, reporter, cached_tokens, prompt_tokens, prefill_reported_ms,
       completion_tokens, decode_reported_ms, prefill_reported_ms + decode_reported_ms AS engine_ms,
       ttft_client_ms, e2e_client_ms, eps_ms,
       ttft_client_ms - prefill_reported_ms AS prefill_slack_ms,
       e2e_client_ms - (prefill_reported_ms + decode_reported_ms) AS e2e_slack_ms,
       (ttft_client_ms - prefill_reported_ms >= -ttft_bound_ms)
         AND (e2e_client_ms - (prefill_reported_ms + decode_reported_ms) >= -eps_ms) AS inside_client,
       usage_completion AS client_usage_completion_tokens,
       usage_completion - completion_tokens AS completion_tokens_check,
       'reported' AS evidence
FROM v ORDER BY attempt_id;

-- An engine's /metrics counters over the run: last scrape - first scrape, set beside the sum of the
-- spans (vLLM) or per-response timings (llama.cpp) that the same engine reported (a difference says
-- reports were lost or work ran outside the run).
-- @table reported_counters: one row per /metrics counter, histogram _sum or _count an engine exposed
--   (samples of source vllm-metrics or llamacpp-metrics of the target itself: a deployment's replicas' own,
--   device = the replica, are in `replicas`), over the run (docs/LEDGER.md "Reported evidence")
-- @column metric: the counter's name
-- @column n_scrapes: the scrapes that read it
-- @column first_value: its first reading
-- @column last_value: its last reading
-- @column went_down: it went down between two scrapes (an engine restart)
-- @column run_delta: last_value − first_value; NULL with fewer than two scrapes or when it went down
-- @column span_sum: the same quantity summed over reported_spans (tokens, requests, seconds), or over
--   reported_timings for llamacpp:* (prompt, cached and predicted tokens, prompt and predicted seconds)
-- @column delta_minus_spans: run_delta − span_sum (not 0: reports lost, or work outside the run)
-- @column evidence: always reported
CREATE OR REPLACE TABLE reported_counters AS
WITH s AS (
  SELECT metric, ts_ns, value, lag(value) OVER (PARTITION BY metric ORDER BY ts_ns) AS prev
  FROM samples
  WHERE source IN ('vllm-metrics', 'llamacpp-metrics') AND device IS NULL  -- a deployment's replicas: `replicas`
    AND (suffix(metric, '_total') OR suffix(metric, '_count') OR suffix(metric, '_sum'))
), agg AS (
  SELECT metric, count(*) AS n_scrapes, arg_min(value, ts_ns) AS first_value, arg_max(value, ts_ns) AS last_value,
         coalesce(bool_or(value < prev), false) AS went_down
  FROM s GROUP BY metric
), spans AS (
  SELECT count(*) AS n, sum(prompt_tokens) AS prompt, sum(completion_tokens) AS completion,
         sum(e2e_reported_ms) / 1000 AS e2e_s, sum(queue_reported_ms) / 1000 AS queue_s,
         sum(prefill_reported_ms) / 1000 AS prefill_s, sum(decode_reported_ms) / 1000 AS decode_s,
         sum(inference_reported_ms) / 1000 AS inference_s
  FROM reported_spans
), timings AS (
  SELECT count(*) AS n, sum(prompt_tokens) AS prompt, sum(cached_tokens) AS cached, sum(completion_tokens) AS completion,
         sum(prefill_reported_ms) / 1000 AS prefill_s, sum(decode_reported_ms) / 1000 AS decode_s
  FROM reported_timings
), joined AS (
  SELECT a.*,
         CASE WHEN a.n_scrapes >= 2 AND NOT a.went_down THEN a.last_value - a.first_value END AS run_delta,
         CASE a.metric
           WHEN 'vllm:prompt_tokens_total' THEN sp.prompt
           WHEN 'vllm:generation_tokens_total' THEN sp.completion
           WHEN 'vllm:request_success_total' THEN sp.n
           WHEN 'vllm:e2e_request_latency_seconds_count' THEN sp.n
           WHEN 'vllm:e2e_request_latency_seconds_sum' THEN sp.e2e_s
           WHEN 'vllm:request_queue_time_seconds_sum' THEN sp.queue_s
           WHEN 'vllm:request_prefill_time_seconds_sum' THEN sp.prefill_s
           WHEN 'vllm:request_decode_time_seconds_sum' THEN sp.decode_s
           WHEN 'vllm:request_inference_time_seconds_sum' THEN sp.inference_s
           WHEN 'llamacpp:prompt_tokens_total' THEN tm.prompt
           WHEN 'llamacpp:prompt_tokens_cached_total' THEN tm.cached
           WHEN 'llamacpp:prompt_seconds_total' THEN tm.prefill_s
           WHEN 'llamacpp:tokens_predicted_total' THEN tm.completion
           WHEN 'llamacpp:tokens_predicted_seconds_total' THEN tm.decode_s
         END AS span_sum,
         CASE WHEN starts_with(a.metric, 'llamacpp:') THEN tm.n ELSE sp.n END AS n_reports
  FROM agg a, spans sp, timings tm
)
SELECT getvariable('run_id') AS run_id, metric, n_scrapes, first_value, last_value, went_down, run_delta,
       CASE WHEN n_reports > 0 THEN span_sum END AS span_sum,
       CASE WHEN n_reports > 0 THEN run_delta - span_sum END AS delta_minus_spans,
       'reported' AS evidence
FROM joined ORDER BY metric;

-- @gaps: a counter that went down between scrapes (the engine restarted: its run delta is unknown); the
--   register keeps its id `reported:counter:<metric>`; per-response timings outside the client's interval
--   beyond ε or incomplete (the attempt's reported prefill and decode are NULL), id
--   `reported:timings:<attempt>` (docs/LEDGER.md "Reported evidence").
CREATE OR REPLACE TEMP TABLE reported_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO reported_gaps
SELECT 'run', metric, format('reported_counters.run_delta ({})', metric),
       'a scrape series in which the counter does not go down (no engine restart during the run)',
       format('{} went down between scrapes', metric)
FROM reported_counters WHERE went_down;
INSERT INTO reported_gaps
SELECT 'attempt', attempt_id, 'request_metrics.prefill_ms, decode_ms (reported timings)',
       'per-response timings with prompt_ms and predicted_ms that fit inside the client''s sent → done',
       CASE WHEN inside_client IS NULL
            THEN 'timings without prompt_ms or predicted_ms, or no client TTFT / E2E to place them in'
            ELSE format('prefill {} ms + decode {} ms against the client''s TTFT {} ms and E2E {} ms (ε {} ms)',
                        round(prefill_reported_ms, 3), round(decode_reported_ms, 3), round(ttft_client_ms, 3),
                        round(e2e_client_ms, 3), round(eps_ms, 3)) END
FROM reported_timings WHERE inside_client IS NOT true;
