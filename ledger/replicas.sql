-- Per-replica accounts of a deployment capture (several `serve --out` folders behind a router):
-- attempts, the router's own count of what it sent each worker, busy time, queue, prefix-cache hits
-- (docs/LEDGER.md "replicas").
--
-- scope: rollup
-- reads: attempts, request_metrics, step_attribution, kv_holds, samples, quantile_linear
-- creates: replicas, replicas_gaps

-- @table replicas: one row per replica of a deployment capture (attempts.replica_id, or a worker the
--   router's counters name); empty for a run of one server (docs/LEDGER.md "replicas")
-- @column replica_id: the replica (its `serve --out` folder's server id), or a router worker's URL when no
--   joined folder is that worker
-- @column attempts: its rows in attempts: the client attempts it answered and the upstream tries it got
--   that the client never saw; NULL for a worker no joined folder is
-- @column client_attempts: of those, the attempts the client sent (parent_attempt_id NULL)
-- @column unseen_tries: of those, the router's tries the client never saw (parent_attempt_id set)
-- @column server_completed: of those, server_status completed
-- @column router_sent: the router's vllm_router_processed_requests_total for this worker, its last scrape
--   minus its first (a labelled counter is exported from its first increment: absent in a first scrape
--   that answered, it was 0); NULL without two router scrapes (capture --router-metrics)
-- @column router_agrees: attempts = router_sent; NULL when either is unknown
-- @column busy_ms: Σ step_ms of its engine's steps in the run (those copied from its folder: the window of
--   this run's attempts there)
-- @column balance: busy_ms over the mean busy_ms of the replicas (1 for an even spread; the busiest
--   replica's is the run's imbalance)
-- @column queue_p50_ms: the median queue_ms (engine.enqueued → first scheduled) of its attempts
-- @column queue_p99_ms: the 99th percentile of the same
-- @column prefix_hit_blocks: KV blocks its attempts took from its prefix cache (kv_holds how prefix_hit)
-- @column prefix_hit_attempts: its attempts that took at least one cached block
-- @column kv_blocks_used_max: the most KV blocks its engine held at once, from its engine's samples in the
--   run (kv_blocks_used, device = the replica); NULL without them
CREATE OR REPLACE TABLE replicas AS
WITH served AS (
  SELECT replica_id, count(*) AS attempts, count(*) FILTER (WHERE parent_attempt_id IS NULL) AS client_attempts,
         count(*) FILTER (WHERE parent_attempt_id IS NOT NULL) AS unseen_tries,
         count(*) FILTER (WHERE server_status = 'completed') AS server_completed
  FROM attempts WHERE replica_id IS NOT NULL GROUP BY replica_id
), router AS (  -- the router's two scrapes (before and after the load): the counter's difference per worker
  SELECT min(ts_ns) AS first_ns, max(ts_ns) AS last_ns FROM samples WHERE source = 'vllm-router'
), processed AS (
  SELECT s.device AS replica_id,
         max(s.value) FILTER (WHERE s.ts_ns = r.last_ns) - coalesce(max(s.value) FILTER (WHERE s.ts_ns = r.first_ns), 0)
           AS router_sent
  FROM samples s, router r
  WHERE s.source = 'vllm-router' AND s.metric = 'vllm_router_processed_requests_total' AND s.device IS NOT NULL
    AND r.first_ns < r.last_ns
  GROUP BY s.device
), busy AS (
  SELECT replica_id, sum(step_ms) AS busy_ms FROM (
    SELECT DISTINCT replica_id, step_id, step_ms FROM step_attribution WHERE replica_id IS NOT NULL
  ) GROUP BY replica_id
), queue AS (
  SELECT replica_id, quantile_linear(queue_ms, 0.5) AS queue_p50_ms, quantile_linear(queue_ms, 0.99) AS queue_p99_ms
  FROM request_metrics WHERE replica_id IS NOT NULL GROUP BY replica_id
), hits AS (
  SELECT a.replica_id, count(*) AS prefix_hit_blocks, count(DISTINCT h.attempt_id) AS prefix_hit_attempts
  FROM kv_holds h JOIN attempts a USING (attempt_id) WHERE h.how = 'prefix_hit' AND a.replica_id IS NOT NULL
  GROUP BY a.replica_id
), kv AS (
  SELECT device AS replica_id, max(value) AS kv_blocks_used_max FROM samples
  WHERE source = 'engine' AND metric = 'kv_blocks_used' AND device IS NOT NULL GROUP BY device
), ids AS (
  SELECT replica_id FROM served UNION SELECT replica_id FROM processed UNION SELECT replica_id FROM busy
)
SELECT getvariable('run_id') AS run_id, ids.replica_id,
  s.attempts, s.client_attempts, s.unseen_tries, s.server_completed,
  p.router_sent::BIGINT AS router_sent, s.attempts = p.router_sent AS router_agrees,
  coalesce(b.busy_ms, CASE WHEN s.attempts IS NOT NULL THEN 0 END) AS busy_ms,
  coalesce(b.busy_ms, CASE WHEN s.attempts IS NOT NULL THEN 0 END)
    / nullif(avg(coalesce(b.busy_ms, CASE WHEN s.attempts IS NOT NULL THEN 0 END)) OVER (), 0) AS balance,
  q.queue_p50_ms, q.queue_p99_ms,
  CASE WHEN s.attempts IS NOT NULL THEN coalesce(h.prefix_hit_blocks, 0) END AS prefix_hit_blocks,
  CASE WHEN s.attempts IS NOT NULL THEN coalesce(h.prefix_hit_attempts, 0) END AS prefix_hit_attempts,
  kv.kv_blocks_used_max::BIGINT AS kv_blocks_used_max
FROM ids LEFT JOIN served s USING (replica_id) LEFT JOIN processed p USING (replica_id)
LEFT JOIN busy b USING (replica_id) LEFT JOIN queue q USING (replica_id) LEFT JOIN hits h USING (replica_id)
LEFT JOIN kv USING (replica_id)
ORDER BY ids.replica_id;

-- @gaps: a worker the router counted that no joined folder is (its attempts unknown); a replica the
--   router's counters do not name while router samples exist (router_sent unknown).
CREATE OR REPLACE TEMP TABLE replicas_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO replicas_gaps
SELECT 'run', replica_id, 'replicas attempts, busy_ms, queue, prefix hits of this worker',
       'the worker''s `serve --out` folder given to the capture as --server (its own host and port in its manifest)',
       format('the router sent {} request(s) to {}, but no joined --server folder is that worker', router_sent, replica_id)
FROM replicas WHERE attempts IS NULL
UNION ALL
SELECT 'run', replica_id, 'replicas router_sent, router_agrees',
       'vllm_router_processed_requests_total{worker} for this replica in two router scrapes',
       format('replica {} served {} attempt(s) but the router''s scrapes name no worker that is it', replica_id, attempts)
FROM replicas WHERE router_sent IS NULL AND attempts IS NOT NULL
  AND (SELECT count(DISTINCT ts_ns) FROM samples WHERE source = 'vllm-router') >= 2;
