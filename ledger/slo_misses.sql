-- SLO misses: attempts of a task with a deadline that finished late or timed out, with the time each
-- cause took (ms) and the dominant one (docs/LEDGER.md "slo_misses"). For an attempt whose engine
-- figures an engine reported (a span, docs/LEDGER.md "Reported evidence"), the span sees no engine step:
-- interference and stalls are unknown, and the dominant cause is the largest of the phases the span
-- and the client measure.
--
-- scope: task
-- reads: attempts, request_metrics, contracts, intervals, step_attribution, ev_tok, quantile_linear
-- creates: slo_misses

-- @table slo_misses: one row per attempt of a task with a deadline that finished late or timed out,
--   with the time each cause took (disjoint stretches of its timeline) and the dominant one
--   (docs/LEDGER.md "slo_misses")
-- @column task_id: the attempt's task
-- @column client_status: as attempts.client_status (completed late, or timeout)
-- @column deadline_ms: the task's deadline
-- @column done_since_reference_ms: as request_metrics.done_since_reference_ms
-- @column client_queue_ms: the client's own queue (client_queue intervals); NULL without client events
-- @column server_queue_ms: request_metrics.queue_ms; NULL without engine events
-- @column prefill_interference_ms: this attempt's decode steps' time charged to other attempts' prefill
--   tokens; NULL without steps, or when a span reported the engine side
-- @column decode_stall_ms: engine gaps beyond twice the attempt's median gap, less what preemption and
--   interference explain (its most stalled choice's); NULL as prefill_interference_ms
-- @column preemption_ms: its preempted and recompute intervals; NULL without engine events
-- @column transfer_client_ms: client E2E − server E2E (≥ 0), for a response the client received whole
-- @column dominant_cause: the largest cause: server_queue, client_queue, prefill_interference,
--   decode_stall, preemption, transfer_client (prefill, decode where a span reported the engine side);
--   unknown when a cause that applies is unknown; NULL when every cause is measured and 0
-- @column prefill_ms: request_metrics.prefill_ms (NULL without server evidence)
-- @column decode_ms: request_metrics.decode_ms (NULL without server evidence)
-- @column cause_evidence: observed (our engine's probes), reported (a span) or simulated (a run on the
--   simulated clock): request_metrics.server_evidence; NULL without server evidence
CREATE OR REPLACE TABLE slo_misses AS
WITH missed AS (
  SELECT a.attempt_id, a.task_id, a.client_status, r.done_since_reference_ms, c.deadline_ms, r.queue_ms,
         r.prefill_ms, r.decode_ms, r.e2e_client_ms, r.e2e_server_ms, r.uplink_ms,
         r.server_evidence AS cause_evidence
  FROM attempts a JOIN request_metrics r USING (attempt_id) JOIN contracts c ON c.task_id = a.task_id
  WHERE c.deadline_ms IS NOT NULL AND (r.on_time = false OR a.client_status = 'timeout')
), client_queue AS (
  SELECT attempt_id, sum(dur_ms) AS ms FROM intervals WHERE stream = 'client' AND name = 'client_queue' GROUP BY 1
), preempt AS (
  SELECT attempt_id, sum(dur_ms) AS ms FROM intervals WHERE stream = 'engine' AND name IN ('preempted', 'recompute') GROUP BY 1
), interference AS (
  -- time this attempt's decode steps spent on other attempts' prefill tokens
  SELECT me.attempt_id, sum(o.share_ms) AS ms
  FROM step_attribution me JOIN step_attribution o ON o.step_id = me.step_id AND o.attempt_id <> me.attempt_id
  WHERE me.kind = 'decode' AND o.kind = 'prefill' GROUP BY 1
), tok_gaps AS (  -- engine gaps between consecutive tokens of one choice, with the step of the later token
  SELECT attempt_id, choice, clock, step_id, ts_ns, prev_ns, (ts_ns - prev_ns) / 1e6 AS gap_ms FROM (
    SELECT attempt_id, choice, clock, step_id, ts_ns,
           lag(ts_ns) OVER (PARTITION BY attempt_id, choice, clock ORDER BY ts_ns, seq) AS prev_ns
    FROM ev_tok WHERE attempt_id IN (SELECT attempt_id FROM missed))
  WHERE prev_ns IS NOT NULL
), explained AS (  -- the part of each gap another cause already holds: preemption and recompute time, and
                   -- the interference charged to the step that produced the later token
  SELECT g.attempt_id, g.choice, g.ts_ns,
         coalesce((SELECT sum(greatest(least(g.ts_ns, v.end_ns) - greatest(g.prev_ns, v.start_ns), 0)) / 1e6
                   FROM intervals v WHERE v.attempt_id = g.attempt_id AND v.stream = 'engine' AND v.clock = g.clock
                     AND v.name IN ('preempted', 'recompute')), 0)
         + coalesce((SELECT sum(o.share_ms) FROM step_attribution me JOIN step_attribution o
                       ON o.step_id = me.step_id AND o.attempt_id <> me.attempt_id AND o.kind = 'prefill'
                     WHERE me.attempt_id = g.attempt_id AND me.step_id = g.step_id AND me.kind = 'decode'), 0) AS ms
  FROM tok_gaps g
), stalls AS (
  -- engine gaps beyond twice the attempt's median gap, less what preemption and interference explain;
  -- choices decode in the same steps, so the attempt's stall is its most stalled choice's
  SELECT attempt_id, max(ms) AS ms FROM (
    SELECT g.attempt_id, g.choice, sum(greatest(g.gap_ms - x.ms - 2 * med.m, 0)) AS ms
    FROM tok_gaps g JOIN explained x USING (attempt_id, choice, ts_ns)
    JOIN (SELECT attempt_id, quantile_linear(gap_ms, 0.5) AS m FROM tok_gaps GROUP BY 1) med USING (attempt_id)
    GROUP BY g.attempt_id, g.choice)
  GROUP BY attempt_id
), layers AS (  -- which layers saw the attempt: a cause is 0 only where its layer could have seen it
  SELECT attempt_id, client_status IS NOT NULL AS has_client, server_status <> 'unknown' AS has_engine,
         attempt_id IN (SELECT attempt_id FROM step_attribution) AS has_steps
  FROM attempts
), causes AS (
  SELECT m.*,
         CASE WHEN l.has_client THEN coalesce(cq.ms, 0) END AS client_queue_ms,
         CASE WHEN l.has_engine THEN coalesce(m.queue_ms, 0) END AS server_queue_ms,
         CASE WHEN l.has_steps THEN coalesce(f.ms, 0) END AS prefill_interference_ms,
         CASE WHEN l.has_engine THEN coalesce(s.ms, 0) END AS decode_stall_ms,
         CASE WHEN l.has_engine THEN coalesce(p.ms, 0) END AS preemption_ms,
         -- transfer: only for a response the client received whole; NULL when the server's E2E is unknown
         CASE WHEN m.e2e_client_ms IS NOT NULL AND m.e2e_server_ms IS NOT NULL
              THEN greatest(m.e2e_client_ms - m.e2e_server_ms, 0) END AS transfer_client_ms
  FROM missed m JOIN layers l USING (attempt_id) LEFT JOIN client_queue cq USING (attempt_id)
  LEFT JOIN preempt p USING (attempt_id) LEFT JOIN interference f USING (attempt_id) LEFT JOIN stalls s USING (attempt_id)
)
SELECT getvariable('run_id') AS run_id, attempt_id, task_id, client_status, deadline_ms, done_since_reference_ms,
       client_queue_ms, server_queue_ms,
       CASE WHEN cause_evidence IS DISTINCT FROM 'reported' THEN prefill_interference_ms END AS prefill_interference_ms,
       CASE WHEN cause_evidence IS DISTINCT FROM 'reported' THEN decode_stall_ms END AS decode_stall_ms,
       preemption_ms, transfer_client_ms,
       CASE WHEN cause_evidence = 'reported' THEN
         CASE WHEN client_queue_ms IS NULL OR server_queue_ms IS NULL OR prefill_ms IS NULL
                   OR (transfer_client_ms IS NULL AND client_status = 'completed') THEN 'unknown'
              ELSE CASE greatest(client_queue_ms, server_queue_ms, prefill_ms, coalesce(decode_ms, 0), coalesce(transfer_client_ms, 0))
              WHEN 0 THEN NULL
              WHEN server_queue_ms THEN 'server_queue'
              WHEN client_queue_ms THEN 'client_queue'
              WHEN prefill_ms THEN 'prefill'
              WHEN decode_ms THEN 'decode'
              ELSE 'transfer_client' END END
       WHEN client_queue_ms IS NULL OR server_queue_ms IS NULL OR prefill_interference_ms IS NULL
                 OR decode_stall_ms IS NULL OR preemption_ms IS NULL
                 -- a response the client never received whole has no transfer: not applicable, not unknown
                 OR (transfer_client_ms IS NULL AND client_status = 'completed') THEN 'unknown'
            ELSE CASE greatest(client_queue_ms, server_queue_ms, prefill_interference_ms, decode_stall_ms, preemption_ms, transfer_client_ms)
            WHEN 0 THEN NULL
            WHEN server_queue_ms THEN 'server_queue'
            WHEN client_queue_ms THEN 'client_queue'
            WHEN prefill_interference_ms THEN 'prefill_interference'
            WHEN decode_stall_ms THEN 'decode_stall'
            WHEN preemption_ms THEN 'preemption'
            ELSE 'transfer_client' END END AS dominant_cause,
       CASE WHEN cause_evidence IS NOT NULL THEN prefill_ms END AS prefill_ms,
       CASE WHEN cause_evidence IS NOT NULL THEN decode_ms END AS decode_ms,
       cause_evidence
FROM causes ORDER BY attempt_id;
