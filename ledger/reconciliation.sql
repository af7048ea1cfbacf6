-- Reconciliation, one row per run: what was created, sent, received, completed, cancelled, timed out,
-- rejected, errored, unterminated; ghost load; attempts per request against the retry formula
-- (docs/LEDGER.md "reconciliation").
--
-- scope: rollup
-- reads: attempts, marks, contracts, ghost, kv_holds, run_metrics, step_attribution, steps, replicas, samples
-- creates: reconciliation

-- @table reconciliation: one row per run: the attempts counted at each layer, ghost load and the retry
--   check (docs/LEDGER.md "reconciliation")
-- @column created: attempts with an attempt.created event
-- @column sent: attempts with an attempt.sent event
-- @column received: attempts the server saw (server.received or engine.enqueued)
-- @column completed: client_status completed (NULL without client events, as the next four)
-- @column cancelled: client_status cancelled
-- @column timed_out: client_status timeout
-- @column rejected: server_status rejected
-- @column errored: client_status error
-- @column unterminated: attempts unterminated at the client or the server
-- @column in_flight: attempts in flight at the client or the server in a run still recording (neither
--   unterminated nor counted in p_fail: their end is not yet on disk)
-- @column server_completed: server_status completed
-- @column server_cancelled: server_status cancelled
-- @column ghost_attempts: attempts whose client timed out, cancelled or failed while the server went on, and
--   a router's tries it gave up on (router.try with an error) while the replica went on
-- @column ghost_ms: Σ (server end − the client's terminal event, or the router's end of the try), by the clock rule
-- @column ghost_tokens: engine tokens committed after the client (or the router) gave up
-- @column ghost_kv_gib_s: the KV GiB·s those attempts held after the give-up (NULL without the block size)
-- @column attempts_per_request: mean attempts per request; NULL in a deployment where the router sent a replica
--   tries the run does not hold (replicas.router_agrees false: the gap names the replica)
-- @column calls_per_task: mean attempts (model calls) per task
-- @column p_fail: the measured probability that an attempt does not complete at the client, over the
--   attempts that ended (or ended unterminated); an attempt in flight is not counted
-- @column max_retries: the contracts' largest max_attempts − 1 (NULL when no contract limits it)
-- @column expected_attempts_per_request: the retry formula (1 − p^(r+1)) / (1 − p) with p = p_fail,
--   r = max_retries
-- @column ghost_energy_j: the window energy charged to ghost attempts by their step-time shares in steps
--   that started after the give-up; NULL when the window's energy is unknown
-- @column unseen_tries: upstream tries the client never saw (a router's retries: attempts rows with
--   parent_attempt_id); NULL without server events (a black-box run cannot see them), and where the router sent
--   a replica tries the run does not hold (replicas.router_agrees false)
-- @column router_tries: the upstream tries the router sent over the load, Σ replicas.router_sent (its retries
--   included; over `sent`, the router's retry amplification); NULL without two router scrapes or when a
--   replica's count is unknown
-- @column router_retries: the router's own count of its retries over the load (vllm_router_retries_total, last
--   scrape − first, summed over routes; 0 when it never appeared); NULL without two router scrapes
-- @column retry_amplification: the router's upstream tries per client attempt, router_tries / sent (1.0 when it
--   retried nothing); NULL without router_tries or without a sent attempt
CREATE OR REPLACE TABLE reconciliation AS
WITH p AS (  -- the client's attempts (attempts.client_attempt): unknown (NULL) without any, a count otherwise
  SELECT count(*) FILTER (WHERE client_status = 'completed') AS ok, count(*) FILTER (WHERE client_attempt) AS n,
         count(*) FILTER (WHERE client_attempt AND client_status <> 'in_flight') AS n_ended,
         count(*) FILTER (WHERE client_status = 'cancelled') AS n_cancelled,
         count(*) FILTER (WHERE client_status = 'timeout') AS n_timed_out,
         count(*) FILTER (WHERE client_status = 'error') AS n_errored
  FROM attempts
), per_request AS (
  SELECT request_id, count(*) AS n_attempts FROM attempts WHERE request_id IS NOT NULL GROUP BY request_id
), per_task AS (
  SELECT task_id, count(*) AS n_calls FROM attempts WHERE task_id IS NOT NULL GROUP BY task_id
), retries AS (
  SELECT max(max_attempts) - 1 AS r FROM contracts
), ghost_steps AS (  -- step time charged to ghost attempts in steps that started after their client gave up
  SELECT sum(sa.share_ms) AS ms FROM step_attribution sa JOIN ghost g USING (attempt_id)
  JOIN steps st USING (step_id) WHERE st.start_ns >= g.gave_up_ns
), all_steps AS (SELECT sum(share_ms) AS ms FROM step_attribution
), router AS (  -- the router's two scrapes, and whether the run holds every try it counted per replica
  SELECT min(ts_ns) AS first_ns, max(ts_ns) AS last_ns,
         coalesce((SELECT bool_and(router_agrees) FROM replicas WHERE router_agrees IS NOT NULL), true) AS whole
  FROM samples WHERE source = 'vllm-router'
), router_retries AS (
  SELECT CASE WHEN r.first_ns < r.last_ns THEN
           coalesce((SELECT sum(CASE WHEN s.ts_ns = r.last_ns THEN s.value ELSE -s.value END) FROM samples s
                     WHERE s.source = 'vllm-router' AND s.metric LIKE 'vllm\_router\_retries\_total%' ESCAPE '\'
                       AND s.ts_ns IN (r.first_ns, r.last_ns)), 0) END AS n
  FROM router r)
SELECT getvariable('run_id') AS run_id,
  (SELECT count(*) FROM marks WHERE created IS NOT NULL) AS created,
  (SELECT count(*) FROM marks WHERE sent IS NOT NULL) AS sent,
  (SELECT count(*) FROM marks WHERE received IS NOT NULL OR enqueued IS NOT NULL) AS received,
  CASE WHEN p.n > 0 THEN p.ok END AS completed,
  CASE WHEN p.n > 0 THEN p.n_cancelled END AS cancelled,
  CASE WHEN p.n > 0 THEN p.n_timed_out END AS timed_out,
  (SELECT count(*) FROM attempts WHERE server_status = 'rejected') AS rejected,
  CASE WHEN p.n > 0 THEN p.n_errored END AS errored,
  (SELECT count(*) FROM attempts WHERE client_status = 'unterminated' OR server_status = 'unterminated') AS unterminated,
  (SELECT count(*) FROM attempts WHERE client_status = 'in_flight' OR server_status = 'in_flight') AS in_flight,
  (SELECT count(*) FROM attempts WHERE server_status = 'completed') AS server_completed,
  (SELECT count(*) FROM attempts WHERE server_status = 'cancelled') AS server_cancelled,
  -- ghost load needs the client's give-up time: unknown without client events, a known 0 without ghosts
  CASE WHEN p.n > 0 THEN (SELECT count(*) FROM ghost) END AS ghost_attempts,
  CASE WHEN p.n > 0 THEN (SELECT CASE WHEN count(*) = 0 THEN 0 ELSE sum(ghost_ms) END FROM ghost) END AS ghost_ms,
  CASE WHEN p.n > 0 THEN (SELECT CASE WHEN count(*) = 0 THEN 0 ELSE sum(ghost_tokens) END FROM ghost) END AS ghost_tokens,
  (SELECT sum(greatest(0, (least(h.end_ns, a.server_end_ns) - greatest(h.start_ns, g.gave_up_ns)))) / 1e9
          * getvariable('kv_block_bytes') / 2^30
   FROM kv_holds h JOIN ghost g USING (attempt_id) JOIN attempts a USING (attempt_id)) AS ghost_kv_gib_s,
  CASE WHEN rt.whole THEN (SELECT avg(n_attempts) FROM per_request) END AS attempts_per_request,
  (SELECT avg(n_calls) FROM per_task) AS calls_per_task,
  -- the measured probability that an attempt does not complete, and the retry formula's E[N]
  CASE WHEN p.n_ended > 0 THEN 1 - p.ok / p.n_ended END AS p_fail,
  (SELECT r FROM retries) AS max_retries,
  CASE WHEN p.n_ended = 0 OR (SELECT r FROM retries) IS NULL THEN NULL
       WHEN p.ok = p.n_ended THEN 1.0
       WHEN p.ok = 0 THEN (SELECT r FROM retries) + 1.0
       ELSE (1 - pow(1 - p.ok / p.n_ended, (SELECT r FROM retries) + 1)) / (p.ok / p.n_ended) END AS expected_attempts_per_request,
  -- ghost joules: the window energy charged to ghost attempts by their step-time shares after the
  -- give-up; NULL when the window's energy is unknown
  (coalesce(m.energy_gpu_j, 0) + coalesce(m.energy_cpu_j, 0)) * coalesce(gs.ms, 0) / nullif(al.ms, 0)
    * CASE WHEN coalesce(m.energy_gpu_j, m.energy_cpu_j) IS NULL THEN NULL ELSE 1 END AS ghost_energy_j,
  CASE WHEN (SELECT count(*) FROM marks WHERE received IS NOT NULL OR enqueued IS NOT NULL) > 0 AND rt.whole
       THEN (SELECT count(*) FROM attempts WHERE parent_attempt_id IS NOT NULL) END AS unseen_tries,
  (SELECT CASE WHEN count(*) > 0 AND count(router_sent) = count(*) THEN sum(router_sent) END FROM replicas
   WHERE router_sent IS NOT NULL OR attempts IS NOT NULL)::BIGINT AS router_tries,
  rr.n::BIGINT AS router_retries,
  (SELECT CASE WHEN count(*) > 0 AND count(router_sent) = count(*) THEN sum(router_sent) END FROM replicas
   WHERE router_sent IS NOT NULL OR attempts IS NOT NULL)
    / nullif((SELECT count(*) FROM marks WHERE sent IS NOT NULL), 0) AS retry_amplification
FROM p, run_metrics m, ghost_steps gs, all_steps al, router rt, router_retries rr;
