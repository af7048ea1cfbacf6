-- The peers' definitions of TTFT / ITL / TPOT / E2E, computed from this run's client events
-- (docs/LEDGER.md "peer_views"): our own client's, or a load tool's own records imported with
-- `inferledger import --from`. Same attempts for every row: those the client saw complete. The peers'
-- names collide (AIPerf's "ITL" is vLLM's TPOT; GuideLLM's TPOT includes the TTFT), so every row names
-- its tool, its formula, its weighting and its percentile rule.
--
-- Its inputs are one row per attempt (ledger/peer_base.sql, task scope: which chunks an imported tool
-- kept, its token count, the chunk times each tool reads, the attempt's gap samples as lists): this
-- rollup reads no event.
--
-- scope: rollup
-- reads: peer_base, peer_reporters
-- creates: peer_views, peer_views_gaps, peer_pool, peer_pool_all, peer_pool_content, peer_pool_choices,
--   peer_pool_content_all, peer_pool_choices_all

-- The two pooled-gap rows (millions of samples in a big run: an exact quantile holds every sample of its
-- set in memory, which DuckDB cannot spill) are unnested from peer_base's lists where they are read, never
-- copied into a table of their own, and computed one set at a time: each statement below holds one
-- pooled set's samples (8 bytes a gap), so the memory limit must hold the largest set, not their sum.
-- Row 4 is the output-bearing chunks' gaps, row 5 vLLM bench's gaps between chunks with choices; the
-- _all tables the same with the refused attempts' gaps in, only where an attempt is refused.
-- A NULL sample (a chunk time a tool did not keep) is no sample; itl's gaps, which content_gaps_ms lists, have none.
CREATE OR REPLACE TEMP MACRO peer_pool(k, gap_lists) AS TABLE
SELECT k AS k, count(v) FILTER (WHERE NOT refused) AS n, avg(v) FILTER (WHERE NOT refused) AS mean_ms,
       quantile_cont(v, [0.5, 0.9, 0.99]) FILTER (WHERE NOT refused) AS q, count(v) FILTER (WHERE refused) AS n_refused
FROM (SELECT refused, unnest(gap_lists) AS v FROM peer_base) WHERE v IS NOT NULL;
CREATE OR REPLACE TEMP MACRO peer_pool_all(k, gap_lists) AS TABLE
SELECT k AS k, avg(v) AS mean_ms, quantile_cont(v, [0.5, 0.9, 0.99]) AS q
FROM (SELECT unnest(gap_lists) AS v FROM peer_base)
WHERE v IS NOT NULL AND EXISTS (SELECT 1 FROM peer_base WHERE refused AND len(gap_lists) > 0) HAVING count(*) > 0;
CREATE OR REPLACE TEMP TABLE peer_pool_content AS FROM peer_pool(4, content_gaps_ms);
CREATE OR REPLACE TEMP TABLE peer_pool_choices AS FROM peer_pool(5, choice_gaps_ms);
CREATE OR REPLACE TEMP TABLE peer_pool_content_all AS FROM peer_pool_all(4, content_gaps_ms);
CREATE OR REPLACE TEMP TABLE peer_pool_choices_all AS FROM peer_pool_all(5, choice_gaps_ms);

-- The samples of each per-request row: (row number, value in ms, weight).
-- @table peer_views: one row per metric × tool: the run read through each tool's definition of TTFT,
--   ITL, TPOT and E2E, over the attempts the client saw complete (docs/LEDGER.md "peer_views")
-- @column metric: TTFT, ITL, TPOT or E2E
-- @column tool: inferledger (ours), vLLM bench, AIPerf, GuideLLM, MLPerf-style
-- @column definition: the tool's formula, in words
-- @column weighting: request, gap, token or token (tokens − 1): what one sample is
-- @column percentiles: linear (interpolation between ranks) or cumulative weight (GuideLLM's rule)
-- @column n: the samples (0 when the events cannot feed the row: its figures are then NULL, with a gap)
-- @column mean_ms: the mean (weighted by the row's weighting)
-- @column p50_ms: the 50th percentile by the row's rule
-- @column p90_ms: the 90th percentile by the row's rule
-- @column p99_ms: the 99th percentile by the row's rule
-- @column ledger_column: the ledger column the row equals, for our own rows
-- @column n_refused: samples left out because their attempt has a client figure request_metrics refuses
--   as an impossible order (a chunk or done before the send, a done before the first content)
-- @column mean_incl_refused_ms: the mean with those samples in, as a tool that keeps them counts (NULL
--   when none was left out)
-- @column p50_incl_refused_ms: the p50 with them, by the row's rule
-- @column p90_incl_refused_ms: the p90 with them
-- @column p99_incl_refused_ms: the p99 with them
CREATE OR REPLACE TABLE peer_views AS
WITH per_request(k, v, w, refused) AS (
  SELECT 1, (first_content_ns - sent_ns) / 1e6, 1, refused FROM peer_base WHERE first_content_ns IS NOT NULL
  UNION ALL
  SELECT 2, (first_choices_ns - sent_ns) / 1e6, 1, refused FROM peer_base WHERE first_choices_ns IS NOT NULL
  UNION ALL
  SELECT 3, (first_content_ns - sent_ns) / 1e6 + pacing_error_ms, 1, refused FROM peer_base
  WHERE first_content_ns IS NOT NULL AND pacing_error_ms IS NOT NULL
  UNION ALL
  SELECT 11, (first_content_ns - sent_ns) / 1e6, 1, refused FROM peer_base WHERE first_content_ns IS NOT NULL
  UNION ALL
  SELECT 12, (first_content_ns - sent_ns) / 1e6, 1, refused FROM peer_base WHERE first_content_ns IS NOT NULL
  UNION ALL
  SELECT 6, (last_content_ns - first_content_ns) / 1e6 / (n_tool - 1), 1, refused FROM peer_base WHERE n_tool > 1
  UNION ALL
  SELECT 7, (last_content_ns - first_content_ns) / 1e6 / (n_tool - 1), n_tool - 1, refused FROM peer_base WHERE n_tool > 1
  UNION ALL
  SELECT 8, (done_ns - first_content_ns) / 1e6 / (n - 1), 1, refused FROM peer_base WHERE n > 1
  UNION ALL
  SELECT 9, (last_choices_ns - first_choices_ns) / 1e6 / (n_tool - 1), 1, refused FROM peer_base WHERE n_tool > 1
  UNION ALL
  SELECT 10, (last_content_ns - sent_ns) / 1e6 / n_tool, n_tool, refused FROM peer_base WHERE n_tool > 0
  UNION ALL
  SELECT 13, (done_ns - sent_ns) / 1e6, 1, refused FROM peer_base
  UNION ALL
  SELECT 14, (last_choices_ns - sent_ns) / 1e6, 1, refused FROM peer_base WHERE last_choices_ns IS NOT NULL
  UNION ALL
  SELECT 15, (last_content_ns - sent_ns) / 1e6, 1, refused FROM peer_base WHERE last_content_ns IS NOT NULL
  UNION ALL
  SELECT 16, (done_ns - sent_ns) / 1e6, 1, refused FROM peer_base
), plain AS (  -- linear interpolation between ranks (numpy's default, DuckDB's quantile_cont); refused left out
  SELECT k, count(v) FILTER (WHERE NOT refused) AS n, avg(v) FILTER (WHERE NOT refused) AS mean_ms,
         quantile_cont(v, [0.5, 0.9, 0.99]) FILTER (WHERE NOT refused) AS q, count(v) FILTER (WHERE refused) AS n_refused
  FROM per_request WHERE v IS NOT NULL AND k NOT IN (7, 10, 12, 16) GROUP BY k
  UNION ALL
  SELECT * FROM peer_pool_content UNION ALL SELECT * FROM peer_pool_choices
), plain_all AS (  -- the same rows with the refused samples in, as a tool that keeps them counts: only
                   -- where a row has any (the pooled gaps of a big run are not read twice for nothing; whether
                   -- any is refused is asked of the attempts' rows, not of their millions of gaps)
  SELECT k, avg(v) AS mean_ms, quantile_cont(v, [0.5, 0.9, 0.99]) AS q
  FROM per_request WHERE v IS NOT NULL AND k NOT IN (7, 10, 12, 16)
    AND k IN (SELECT k FROM per_request WHERE refused AND v IS NOT NULL) GROUP BY k
  UNION ALL
  SELECT * FROM peer_pool_content_all UNION ALL SELECT * FROM peer_pool_choices_all
), guidellm AS (  -- GuideLLM's rows without the refused samples, and with them where a row has any
  SELECT k, v, w, false AS with_refused FROM per_request
  WHERE v IS NOT NULL AND k IN (7, 10, 12, 16) AND NOT refused
  UNION ALL
  SELECT k, v, w, true FROM per_request
  WHERE v IS NOT NULL AND k IN (SELECT k FROM per_request WHERE refused AND v IS NOT NULL AND k IN (7, 10, 12, 16))
), cum AS (
  SELECT k, with_refused, v, w,
         sum(w) OVER (PARTITION BY k, with_refused ORDER BY v ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cw,
         sum(w) OVER (PARTITION BY k, with_refused) AS tw
  FROM guidellm
), weighted_both AS (  -- GuideLLM's rule: the smallest value whose cumulative weight reaches q of the total
  SELECT k, with_refused, count(*) AS n, sum(v * w) / nullif(sum(w), 0) AS mean_ms,
         [min(v) FILTER (WHERE cw >= 0.5 * tw), min(v) FILTER (WHERE cw >= 0.9 * tw),
          min(v) FILTER (WHERE cw >= 0.99 * tw)] AS q
  FROM cum GROUP BY k, with_refused
), refused_n AS (
  SELECT k, count(*) AS n_refused FROM per_request WHERE refused AND v IS NOT NULL GROUP BY k
), weighted AS (  -- a row whose every sample is refused keeps its count of them
  SELECT k, coalesce(w.n, 0), w.mean_ms, w.q, coalesce(r.n_refused, 0)
  FROM (SELECT * FROM weighted_both WHERE NOT with_refused) w FULL JOIN refused_n r USING (k)
  WHERE k IN (7, 10, 12, 16)
), stats AS (
  SELECT * FROM plain UNION ALL SELECT * FROM weighted
), stats_all AS (
  SELECT * FROM plain_all UNION ALL SELECT k, mean_ms, q FROM weighted_both WHERE with_refused
), defs(k, ord, metric, tool, definition, weighting, percentiles, ledger_column) AS (VALUES
  (1, 1, 'TTFT', 'inferledger', 'sent → first chunk with content, reasoning or a tool call', 'request', 'linear', 'request_metrics.ttft_client_ms'),
  (2, 2, 'TTFT', 'vLLM bench', 'sent → first chunk with choices (the role chunk counts)', 'request', 'linear', NULL),
  (11, 3, 'TTFT', 'AIPerf', 'request start → first non-empty content response', 'request', 'linear', NULL),
  (12, 4, 'TTFT', 'GuideLLM', 'request start → first token iteration', 'request', 'cumulative weight', NULL),
  (3, 5, 'TTFT', 'MLPerf-style', 'planned send → first content chunk (includes the client''s issue delay)', 'request', 'linear', NULL),
  (4, 6, 'ITL', 'inferledger', 'gap between consecutive output-bearing chunks, pooled', 'gap', 'linear', 'itl.gap_ms (client)'),
  (5, 7, 'ITL', 'vLLM bench', 'gap between consecutive chunks with choices, pooled (a chunk is not a token)', 'gap', 'linear', NULL),
  (6, 8, 'ITL', 'AIPerf', '(last content − first content) / (tokens − 1) per request', 'request', 'linear', NULL),
  (7, 9, 'ITL', 'GuideLLM', '(last content − first content) / (tokens − 1) per request', 'token (tokens − 1)', 'cumulative weight', NULL),
  (8, 10, 'TPOT', 'inferledger', '(done − first content) / (tokens − 1) per request', 'request', 'linear', 'request_metrics.tpot_ms'),
  (9, 11, 'TPOT', 'vLLM bench', '(last chunk with choices − first chunk with choices) / (tokens − 1) per request', 'request', 'linear', NULL),
  (10, 12, 'TPOT', 'GuideLLM', '(last content − sent) / tokens per request: includes the TTFT', 'token', 'cumulative weight', NULL),
  (13, 13, 'E2E', 'inferledger', 'sent → done (the stream''s end)', 'request', 'linear', 'request_metrics.e2e_client_ms'),
  (14, 14, 'E2E', 'vLLM bench', 'sent → last chunk with choices (the usage chunk does not count)', 'request', 'linear', NULL),
  (15, 15, 'E2E', 'AIPerf', 'request start → last content response', 'request', 'linear', NULL),
  (16, 16, 'E2E', 'GuideLLM', 'request start → request end', 'request', 'cumulative weight', NULL)
)
SELECT getvariable('run_id') AS run_id, d.metric, d.tool, d.definition, d.weighting, d.percentiles,
       coalesce(s.n, 0)::BIGINT AS n, s.mean_ms, s.q[1] AS p50_ms, s.q[2] AS p90_ms, s.q[3] AS p99_ms,
       d.ledger_column, coalesce(s.n_refused, 0)::BIGINT AS n_refused,
       CASE WHEN s.n_refused > 0 THEN sa.mean_ms END AS mean_incl_refused_ms,
       CASE WHEN s.n_refused > 0 THEN sa.q[1] END AS p50_incl_refused_ms,
       CASE WHEN s.n_refused > 0 THEN sa.q[2] END AS p90_incl_refused_ms,
       CASE WHEN s.n_refused > 0 THEN sa.q[3] END AS p99_incl_refused_ms
FROM defs d LEFT JOIN stats s USING (k) LEFT JOIN stats_all sa USING (k)
ORDER BY d.ord;

-- @gaps: a view no completed attempt gives a sample for (an imported load tool's records keep only
--   what that tool measures; GuideLLM: the first and the last token).
CREATE OR REPLACE TEMP TABLE peer_views_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO peer_views_gaps
WITH client AS (  -- who reported the client events, when a load tool did
  SELECT min(reporter) AS reporter FROM peer_reporters WHERE evidence = 'reported')
SELECT 'run', NULL, format('peer_views ({} {})', metric, tool),
       CASE WHEN tool = 'MLPerf-style' THEN 'attempt.sent attrs.pacing_error_ms (the planned send; the inferledger client records it)'
            WHEN client.reporter IS NOT NULL
              THEN format('client chunk times that {}''s records do not keep (our own client records every chunk)',
                          client.reporter)
            ELSE 'client chunks of completed attempts with enough output tokens' END,
       format('no completed attempt gives a sample for {} as {} defines it', metric, tool)
FROM peer_views, client WHERE n = 0 AND EXISTS (SELECT 1 FROM peer_base);
