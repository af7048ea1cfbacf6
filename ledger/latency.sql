-- The latency-percentile table: each figure's distribution per observation layer, over the run's
-- attempts (ITL: over its gaps), by the ledger's one quantile rule (docs/LEDGER.md "Quantiles"). The
-- terminal summary and the report show these rows; each names the column it summarises.
--
-- scope: rollup
-- reads: request_metrics, itl, quantiles_linear, attempt_evidence
-- creates: latency_percentiles, latency_gaps, latency_pool, latency_pool_client, latency_pool_server,
--   latency_pool_engine

-- @table latency_percentiles: one row per figure × observation layer: n, mean and percentiles of one
--   ledger column (docs/LEDGER.md "latency_percentiles")
-- @column position: the row's place in the table (TTFT, TPOT, E2E, queue, ITL, max ITL)
-- @column metric: TTFT, TPOT, E2E, queue, ITL or max ITL
-- @column layer: client, server or engine: where the figure is observed
-- @column label: the layer as the summary names it, e.g. client (first content), engine (per output event)
-- @column source_column: the column summarised: request_metrics.<column>, or itl.gap_ms of one layer
-- @column sample: attempt (one value per attempt that has it) or gap (every gap of the layer)
-- @column n: the values (0 when none: the figures are then NULL)
-- @column mean_ms: their mean
-- @column p50_ms: the 50th percentile, linear interpolation between closest ranks
-- @column p90_ms: the 90th percentile, likewise
-- @column p95_ms: the 95th percentile, likewise
-- @column p99_ms: the 99th percentile, likewise
-- @column max_ms: the largest value
-- The pooled gaps of each layer (millions of samples in a big run: an exact quantile holds every sample of
-- its set in memory, which DuckDB cannot spill), one layer a statement, so the memory limit must hold the
-- largest layer's gaps (8 bytes a gap), not the three at once.
CREATE OR REPLACE TEMP MACRO latency_pool(l) AS TABLE
SELECT l AS layer, count(gap_ms) AS n, avg(gap_ms) AS mean_ms, quantiles_linear(gap_ms, [0.5, 0.9, 0.95, 0.99]) AS q,
       max(gap_ms) AS max_ms
FROM itl WHERE layer = l HAVING count(*) > 0;
CREATE OR REPLACE TEMP TABLE latency_pool_client AS FROM latency_pool('client');
CREATE OR REPLACE TEMP TABLE latency_pool_server AS FROM latency_pool('server');
CREATE OR REPLACE TEMP TABLE latency_pool_engine AS FROM latency_pool('engine');

CREATE OR REPLACE TABLE latency_percentiles AS
WITH defs(position, metric, layer, label, col) AS (VALUES
  (1, 'TTFT', 'client', 'client (first content)', 'ttft_client_ms'),
  (2, 'TTFT', 'client', 'client (first answer)', 'ttft_visible_ms'),
  (3, 'TTFT', 'client', 'client (first byte)', 'ttft_first_byte_ms'),
  (4, 'TTFT', 'engine', 'engine', 'ttft_server_ms'),
  (5, 'TPOT', 'client', 'client', 'tpot_ms'),
  (6, 'TPOT', 'server', 'server', 'tpot_server_ms'),
  (7, 'E2E', 'client', 'client', 'e2e_client_ms'),
  (8, 'E2E', 'server', 'server', 'e2e_server_ms'),
  (9, 'queue', 'engine', 'engine', 'queue_ms'),
  (10, 'ITL', 'client', 'client (per output event)', NULL),
  (11, 'ITL', 'server', 'server (per output event)', NULL),
  (12, 'ITL', 'engine', 'engine (per output event)', NULL),
  (13, 'max ITL', 'client', 'client (per attempt)', 'itl_client_max_ms'),
  (14, 'max ITL', 'server', 'server (per attempt)', 'itl_server_max_ms'),
  (15, 'max ITL', 'engine', 'engine (per attempt)', 'itl_engine_max_ms')
), per_attempt AS (
  UNPIVOT (SELECT ttft_client_ms, ttft_visible_ms, ttft_first_byte_ms, ttft_server_ms, tpot_ms, tpot_server_ms,
                  e2e_client_ms, e2e_server_ms, queue_ms, itl_client_max_ms, itl_server_max_ms, itl_engine_max_ms
           FROM request_metrics)
  ON COLUMNS(*) INTO NAME col VALUE v
), stats AS (
  SELECT col, NULL AS layer, count(v) AS n, avg(v) AS mean_ms, quantiles_linear(v, [0.5, 0.9, 0.95, 0.99]) AS q,
         max(v) AS max_ms
  FROM per_attempt GROUP BY col
  UNION ALL
  SELECT NULL, layer, n, mean_ms, q, max_ms FROM latency_pool_client
  UNION ALL SELECT NULL, layer, n, mean_ms, q, max_ms FROM latency_pool_server
  UNION ALL SELECT NULL, layer, n, mean_ms, q, max_ms FROM latency_pool_engine
)
SELECT getvariable('run_id') AS run_id, d.position, d.metric, d.layer, d.label,
       CASE WHEN d.col IS NULL THEN format('itl.gap_ms ({})', d.layer) ELSE 'request_metrics.' || d.col END AS source_column,
       CASE WHEN d.col IS NULL THEN 'gap' ELSE 'attempt' END AS sample,
       coalesce(s.n, 0)::BIGINT AS n, s.mean_ms, s.q[1] AS p50_ms, s.q[2] AS p90_ms, s.q[3] AS p95_ms,
       s.q[4] AS p99_ms, s.max_ms
FROM defs d
LEFT JOIN stats s ON (d.col IS NOT NULL AND s.col = d.col) OR (d.col IS NULL AND s.col IS NULL AND s.layer = d.layer)
ORDER BY d.position;

-- @gaps: engine-layer token gaps a reported span cannot give (it reports the first and the last token
--   only), counted over the run; the register keeps its id `reported:itl` (docs/LEDGER.md "Reported evidence").
CREATE OR REPLACE TEMP TABLE latency_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO latency_gaps
SELECT 'run', NULL, 'itl (engine layer), itl_engine_max_ms',
       'per-token engine events (a span reports the first and the last token only)',
       format('{} attempt(s) with tokens reported by {} as a span', count(*), string_agg(DISTINCT reporter, ', ' ORDER BY reporter))
FROM attempt_evidence WHERE aggregate_tokens HAVING count(*) > 0;
