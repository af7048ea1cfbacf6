-- Stage 8b: the peers' definitions of TTFT / ITL / TPOT, computed from this run's own client events
-- (docs/LEDGER.md "peer_views"). Same attempts for every row: those the client saw complete. The
-- peers' names collide (AIPerf's "ITL" is vLLM's TPOT; GuideLLM's TPOT includes the TTFT), so every
-- row names its tool, its formula and its weighting.

CREATE OR REPLACE TEMP TABLE peer_base AS
WITH c AS (
  SELECT attempt_id,
         min(ts_ns) FILTER (WHERE choices_bearing) AS first_choices_ns,
         min(ts_ns) FILTER (WHERE output_bearing) AS first_content_ns,
         max(ts_ns) FILTER (WHERE output_bearing) AS last_content_ns
  FROM ev_out WHERE name = 'attempt.chunk' GROUP BY attempt_id
), sent AS (
  SELECT attempt_id, TRY_CAST(json_extract_string(attrs, '$.pacing_error_ms') AS DOUBLE) AS pacing_error_ms
  FROM ev WHERE name = 'attempt.sent'
  QUALIFY row_number() OVER (PARTITION BY attempt_id ORDER BY ts_ns, seq, event_id) = 1
)
SELECT a.attempt_id, a.sent_ns, a.client_end_ns AS done_ns, a.n_output_tokens AS n,
       c.first_choices_ns, c.first_content_ns, c.last_content_ns, s.pacing_error_ms
FROM attempts a JOIN c USING (attempt_id) LEFT JOIN sent s USING (attempt_id)
WHERE a.client_status = 'completed' AND a.sent_ns IS NOT NULL;

-- The samples of each row: (row number, value in ms, weight); weight 1 unless the tool weights by
-- output tokens. The two pooled-gap rows (millions of samples in a big run) are aggregated where
-- they are read, never copied into a table of their own.
CREATE OR REPLACE TABLE peer_views AS
WITH per_request(k, v, w) AS (
  SELECT 1, (first_content_ns - sent_ns) / 1e6, 1 FROM peer_base WHERE first_content_ns IS NOT NULL
  UNION ALL
  SELECT 2, (first_choices_ns - sent_ns) / 1e6, 1 FROM peer_base WHERE first_choices_ns IS NOT NULL
  UNION ALL
  SELECT 3, (first_content_ns - sent_ns) / 1e6 + pacing_error_ms, 1 FROM peer_base
  WHERE first_content_ns IS NOT NULL AND pacing_error_ms IS NOT NULL
  UNION ALL
  SELECT 6, (last_content_ns - first_content_ns) / 1e6 / (n - 1), 1 FROM peer_base WHERE n > 1
  UNION ALL
  SELECT 7, (last_content_ns - first_content_ns) / 1e6 / (n - 1), n FROM peer_base WHERE n > 1
  UNION ALL
  SELECT 8, (done_ns - first_content_ns) / 1e6 / (n - 1), 1 FROM peer_base WHERE n > 1
  UNION ALL
  SELECT 9, (done_ns - first_choices_ns) / 1e6 / (n - 1), 1 FROM peer_base WHERE n > 1 AND first_choices_ns IS NOT NULL
  UNION ALL
  SELECT 10, (last_content_ns - sent_ns) / 1e6 / n, n FROM peer_base WHERE n > 0
), vllm_chunks AS (
  SELECT list(ts_ns ORDER BY ts_ns, seq) AS ts
  FROM ev_out o SEMI JOIN peer_base b USING (attempt_id)
  WHERE o.name = 'attempt.chunk' AND o.choices_bearing GROUP BY attempt_id
), vllm_gaps AS (
  SELECT unnest(list_transform(range(1, len(ts)), lambda i: (ts[i + 1] - ts[i]) / 1e6)) AS v FROM vllm_chunks
), plain AS (
  SELECT k, count(v) AS n, avg(v) AS mean_ms, quantile_cont(v, [0.5, 0.9, 0.99]) AS q
  FROM per_request WHERE v IS NOT NULL AND k NOT IN (7, 10) GROUP BY k
  UNION ALL
  SELECT 4, count(gap_ms), avg(gap_ms), quantile_cont(gap_ms, [0.5, 0.9, 0.99])
  FROM itl i SEMI JOIN peer_base b USING (attempt_id) WHERE i.layer = 'client' AND i.gap_ms IS NOT NULL
  UNION ALL
  SELECT 5, count(v), avg(v), quantile_cont(v, [0.5, 0.9, 0.99]) FROM vllm_gaps WHERE v IS NOT NULL
), cum AS (
  SELECT k, v, w,
         sum(w) OVER (PARTITION BY k ORDER BY v ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cw,
         sum(w) OVER (PARTITION BY k) AS tw
  FROM per_request WHERE v IS NOT NULL AND k IN (7, 10)  -- the token-weighted rows
), weighted AS (  -- the smallest value whose cumulative weight reaches q of the total
  SELECT k, count(*) AS n, sum(v * w) / sum(w) AS mean_ms,
         [min(v) FILTER (WHERE cw >= 0.5 * tw), min(v) FILTER (WHERE cw >= 0.9 * tw),
          min(v) FILTER (WHERE cw >= 0.99 * tw)] AS q
  FROM cum GROUP BY k
), stats AS (
  SELECT * FROM plain UNION ALL SELECT * FROM weighted
), defs(k, metric, tool, definition, weighting, ledger_column) AS (VALUES
  (1, 'TTFT', 'inferledger', 'sent → first chunk with content, reasoning or a tool call', 'request', 'request_metrics.ttft_client_ms'),
  (2, 'TTFT', 'vLLM bench', 'sent → first chunk with choices (the role chunk counts)', 'request', NULL),
  (3, 'TTFT', 'MLPerf-style', 'planned send → first content chunk (includes the client''s issue delay)', 'request', NULL),
  (4, 'ITL', 'inferledger', 'gap between consecutive output-bearing chunks, pooled', 'gap', 'itl.gap_ms (client)'),
  (5, 'ITL', 'vLLM bench', 'gap between consecutive chunks with choices, pooled (a chunk is not a token)', 'gap', NULL),
  (6, 'ITL', 'AIPerf', '(last content − first content) / (tokens − 1) per request', 'request', NULL),
  (7, 'ITL', 'GuideLLM', '(last content − first content) / (tokens − 1) per request', 'token', NULL),
  (8, 'TPOT', 'inferledger', '(done − first content) / (tokens − 1) per request', 'request', 'request_metrics.tpot_ms'),
  (9, 'TPOT', 'vLLM bench', '(done − first chunk with choices) / (tokens − 1) per request', 'request', NULL),
  (10, 'TPOT', 'GuideLLM', '(last content − sent) / tokens per request: includes the TTFT', 'token', NULL)
)
SELECT getvariable('run_id') AS run_id, d.metric, d.tool, d.definition, d.weighting,
       coalesce(s.n, 0)::BIGINT AS n, s.mean_ms, s.q[1] AS p50_ms, s.q[2] AS p90_ms, s.q[3] AS p99_ms,
       d.ledger_column
FROM defs d LEFT JOIN stats s USING (k)
ORDER BY d.k;
