-- What an engine reported about itself (attrs.evidence = 'reported'), kept apart from what our probes
-- observed (docs/LEDGER.md "Reported evidence"): vLLM's llm_request spans (mapped to events by
-- collectors.evidence.vllm_spans) beside its response metrics, and its /metrics counters (samples of source
-- 'vllm-metrics') beside the sum of its spans.
--
-- scope: task
-- reads: events, samples, json_double, json_bigint
-- creates: reported_spans, reported_counters, reported_gaps

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
  FROM events
  WHERE name = 'server.received' AND json_extract_string(attrs, '$.evidence') = 'reported'
    AND json_extract_string(attrs, '$.otel_span') = 'llm_request'
), done AS (
  SELECT attempt_id, arg_max(json_extract(attrs, '$.server_metrics'), (ts_ns, seq)) AS pr,
         arg_max(json_bigint(attrs, '$.usage.completion_tokens'), (ts_ns, seq)) AS usage_completion
  FROM events WHERE name = 'attempt.done' AND attempt_id IS NOT NULL GROUP BY attempt_id
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

-- vLLM's /metrics counters over the run: last scrape - first scrape, set beside the sum of the
-- spans that the same engine reported (a difference says spans were lost or work ran outside the run).
-- @table reported_counters: one row per /metrics counter, histogram _sum or _count an engine exposed
--   (samples of source vllm-metrics), over the run (docs/LEDGER.md "Reported evidence")
-- @column metric: the counter's name
-- @column n_scrapes: the scrapes that read it
-- @column first_value: its first reading
-- @column last_value: its last reading
-- @column went_down: it went down between two scrapes (an engine restart)
-- @column run_delta: last_value − first_value; NULL with fewer than two scrapes or when it went down
-- @column span_sum: the same quantity summed over reported_spans (tokens, requests, seconds)
-- @column delta_minus_spans: run_delta − span_sum (not 0: spans lost, or work outside the run)
-- @column evidence: always reported
CREATE OR REPLACE TABLE reported_counters AS
WITH s AS (
  SELECT metric, ts_ns, value, lag(value) OVER (PARTITION BY metric ORDER BY ts_ns) AS prev
  FROM samples
  WHERE source = 'vllm-metrics' AND (suffix(metric, '_total') OR suffix(metric, '_count') OR suffix(metric, '_sum'))
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
         END AS span_sum
  FROM agg a, spans sp
)
SELECT getvariable('run_id') AS run_id, metric, n_scrapes, first_value, last_value, went_down, run_delta,
       CASE WHEN (SELECT n FROM spans) > 0 THEN span_sum END AS span_sum,
       CASE WHEN (SELECT n FROM spans) > 0 THEN run_delta - span_sum END AS delta_minus_spans,
       'reported' AS evidence
FROM joined ORDER BY metric;

-- @gaps: a counter that went down between scrapes (the engine restarted: its run delta is unknown); the
--   register keeps its id `reported:counter:<metric>` (docs/LEDGER.md "Reported evidence").
CREATE OR REPLACE TEMP TABLE reported_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO reported_gaps
SELECT 'run', metric, format('reported_counters.run_delta ({})', metric),
       'a scrape series in which the counter does not go down (no engine restart during the run)',
       format('{} went down between scrapes', metric)
FROM reported_counters WHERE went_down;
