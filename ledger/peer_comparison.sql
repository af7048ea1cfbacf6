-- Each peer tool's reading beside ours on the same attempts, and the engine's own account where the
-- run has server evidence (docs/LEDGER.md "peer_comparison").
--
-- scope: rollup
-- reads: peer_views, peer_base, peer_reporters, request_metrics, quantiles_linear
-- creates: peer_comparison

-- One row per (metric, tool): the tool's reading beside ours on the same attempts (our client's
-- definition on the same events, and the engine's own account where the run has server evidence),
-- and why they differ (docs/LEDGER.md "peer_comparison" gives each formula). `imported` marks the
-- rows of the tool whose own records this run was imported from (attrs.reporter of its events).
-- @table peer_comparison: one row per metric × tool other than ours: the tool's reading beside ours on
--   the same attempts, and why they differ (docs/LEDGER.md "peer_comparison")
-- @column metric: TTFT, ITL, TPOT or E2E
-- @column tool: the tool of the row
-- @column imported: the run's client events are this tool's own records (imported with import --from)
-- @column reporter: the importing tool and version (attrs.reporter), where one did
-- @column tool_n: the tool row's samples (peer_views.n)
-- @column tool_mean_ms: its mean
-- @column tool_p50_ms: its p50
-- @column tool_p99_ms: its p99
-- @column ours_n: our row's samples for the metric, from the same client events
-- @column ours_mean_ms: our mean
-- @column ours_p50_ms: our p50
-- @column ours_p99_ms: our p99
-- @column diff_mean_ms: tool_mean_ms − ours_mean_ms
-- @column server_column: the engine-side column set beside them
-- @column server_n: its samples over the same attempts (NULL where the run has no server evidence)
-- @column server_mean_ms: its mean
-- @column server_p50_ms: its p50 (linear)
-- @column server_p99_ms: its p99 (linear)
-- @column tool_n_refused: the tool row's samples left out as impossible orders (peer_views.n_refused)
-- @column tool_mean_incl_refused_ms: its mean with them in, as a tool that keeps them counts
-- @column tool_p50_incl_refused_ms: its p50 with them
-- @column tool_p99_incl_refused_ms: its p99 with them
-- @column reason: why the two readings differ: what always holds of the two definitions, what this run's
--   chunks show (the role chunk's lead), and the samples left out
CREATE OR REPLACE TABLE peer_comparison AS
WITH reporters AS (
  SELECT reporter, count(*) AS n FROM peer_reporters WHERE source = 'client' AND reporter IS NOT NULL GROUP BY 1
), tool_names(prefix, tool) AS (VALUES ('aiperf-', 'AIPerf'), ('vllm-bench-', 'vLLM bench'), ('guidellm-', 'GuideLLM')
), imported AS (
  SELECT t.tool, r.reporter FROM reporters r JOIN tool_names t ON starts_with(r.reporter, t.prefix)
  QUALIFY row_number() OVER (ORDER BY r.n DESC, r.reporter) = 1
), server_side AS (  -- the engine's account of the same attempts (NULL n = 0 where the run has none)
  SELECT 'TTFT' AS metric, 'request_metrics.ttft_server_ms' AS col, count(ttft_server_ms) AS n, avg(ttft_server_ms) AS mean_ms,
         quantiles_linear(ttft_server_ms, [0.5, 0.99]) AS q
  FROM request_metrics SEMI JOIN peer_base USING (attempt_id)
  UNION ALL
  SELECT 'TPOT', 'request_metrics.tpot_server_ms', count(tpot_server_ms), avg(tpot_server_ms), quantiles_linear(tpot_server_ms, [0.5, 0.99])
  FROM request_metrics SEMI JOIN peer_base USING (attempt_id)
  UNION ALL
  SELECT 'E2E', 'request_metrics.e2e_server_ms', count(e2e_server_ms), avg(e2e_server_ms), quantiles_linear(e2e_server_ms, [0.5, 0.99])
  FROM request_metrics SEMI JOIN peer_base USING (attempt_id)
  UNION ALL
  SELECT 'ITL', 'itl.gap_ms (server)', count(gap_ms), avg(gap_ms), quantiles_linear(gap_ms, [0.5, 0.99])
  FROM (SELECT unnest(server_gaps_ms) AS gap_ms FROM peer_base)
), facts AS (  -- what this run's chunks show, for the reasons that depend on it
  SELECT count(*) AS n, avg(first_content_ns - first_choices_ns) / 1e6 AS role_lead_ms,
         avg(last_choices_ns - last_content_ns) / 1e6 AS finish_lag_ms
  FROM peer_base WHERE NOT refused AND first_choices_ns IS NOT NULL AND first_content_ns IS NOT NULL
)
SELECT getvariable('run_id') AS run_id, p.metric, p.tool, (p.tool = i.tool) IS TRUE AS imported, i.reporter,
       p.n AS tool_n, p.mean_ms AS tool_mean_ms, p.p50_ms AS tool_p50_ms, p.p99_ms AS tool_p99_ms,
       o.n AS ours_n, o.mean_ms AS ours_mean_ms, o.p50_ms AS ours_p50_ms, o.p99_ms AS ours_p99_ms,
       p.mean_ms - o.mean_ms AS diff_mean_ms,
       s.col AS server_column, nullif(s.n, 0) AS server_n, s.mean_ms AS server_mean_ms,
       s.q[1] AS server_p50_ms, s.q[2] AS server_p99_ms,
       p.n_refused AS tool_n_refused, p.mean_incl_refused_ms AS tool_mean_incl_refused_ms,
       p.p50_incl_refused_ms AS tool_p50_incl_refused_ms, p.p99_incl_refused_ms AS tool_p99_incl_refused_ms,
       -- each clause states what always holds of the two definitions, or what this run's events show
       CASE WHEN o.n = 0 AND p.n > 0 THEN 'ours is unknown: the tool kept too few chunks for it; ' ELSE '' END
       || CASE WHEN p.n_refused > 0
               THEN format('{} sample(s) left out, on both sides: their attempts have a client figure the ledger '
                           'refuses as an impossible order; a tool that keeps them gives mean {} ms, p50 {} ms, '
                           'p99 {} ms; ', p.n_refused, round(p.mean_incl_refused_ms, 1),
                           round(p.p50_incl_refused_ms, 1), round(p.p99_incl_refused_ms, 1)) ELSE '' END
       || CASE p.metric || ' ' || p.tool
            WHEN 'TTFT vLLM bench' THEN 'stops at the first chunk with choices (for chat the role chunk), not at the '
                 || 'first content' || CASE WHEN f.role_lead_ms IS NOT NULL
                      THEN format(': on this run that chunk came {} ms before the first content on average '
                                  '({} attempts)', round(f.role_lead_ms, 1), f.n) ELSE '' END
            WHEN 'TTFT AIPerf' THEN 'the same span (request start → first non-empty content)'
                 || CASE WHEN i.tool = 'AIPerf' THEN '; AIPerf times it on its perf counter from a wall-clock start'
                         ELSE '' END
            WHEN 'TTFT GuideLLM' THEN 'the same span; percentiles are the smallest value whose share reaches p '
                 || '(no interpolation)'
            WHEN 'TTFT MLPerf-style' THEN 'counts from the planned send: adds the client''s own issue delay'
            WHEN 'ITL vLLM bench' THEN 'pools the gaps of every chunk with choices: role → first content and last '
                 || 'content → finish are samples too, and a chunk of several tokens is one gap'
                 || CASE WHEN f.role_lead_ms IS NOT NULL
                      THEN format('; on this run those two gaps average {} ms and {} ms', round(f.role_lead_ms, 1),
                                  round(f.finish_lag_ms, 1)) ELSE '' END
            WHEN 'ITL AIPerf' THEN 'one value per request, (last − first content) / (tokens − 1) with '
                 || CASE WHEN i.tool = 'AIPerf' THEN 'AIPerf''s re-tokenised count' ELSE 'the server''s count' END
                 || '; we pool every content gap'
            WHEN 'ITL GuideLLM' THEN 'one value per request as AIPerf''s, weighted by tokens − 1, cumulative-weight '
                 || 'percentiles'
            WHEN 'TPOT vLLM bench' THEN 'from the first chunk with choices (the role chunk) to the last (the finish '
                 || 'chunk), over tokens − 1'
                 || CASE WHEN i.tool = 'vLLM bench' THEN '; on its own records ours ends where vLLM bench stopped '
                         || 'recording' ELSE '' END
            WHEN 'TPOT GuideLLM' THEN '(last content − request start) / tokens: includes the TTFT, token-weighted'
            WHEN 'E2E vLLM bench' THEN 'ends at the last chunk with choices (the finish chunk), before the usage '
                 || 'chunk and [DONE]'
                 || CASE WHEN i.tool = 'vLLM bench' THEN '; it records no later time, so on its records ours ends '
                         || 'there too' ELSE '' END
            WHEN 'E2E AIPerf' THEN 'ends at the last content response, before the finish and usage chunks and [DONE]'
            WHEN 'E2E GuideLLM' THEN 'the same span (request start → request end); cumulative-weight percentiles'
          END AS reason
FROM peer_views p JOIN peer_views o ON o.metric = p.metric AND o.tool = 'inferledger'
LEFT JOIN imported i ON true
LEFT JOIN server_side s ON s.metric = p.metric
CROSS JOIN facts f
WHERE p.tool <> 'inferledger'
ORDER BY p.metric = 'E2E', p.metric = 'TPOT', p.metric = 'ITL', p.metric, p.tool;
