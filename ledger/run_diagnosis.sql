-- The run's diagnosis, defined once: the late attempts' cause times (slo_misses' per-attempt
-- definition, attempt_causes) added up per cause, each cause's share of their delay time, the first
-- cause and its evidence, for the run and for its load point (docs/LEDGER.md "run_diagnosis").
--
-- scope: rollup
-- reads: attempt_causes, attempts, replicas
-- creates: run_diagnosis, run_diagnosis_gaps

-- @table run_diagnosis: one row for the run (scope run) and one for its load point (scope point, an
--   open-loop run with a planned arrival rate): where the diagnosed attempts' delay went, per cause
--   (docs/LEDGER.md "run_diagnosis")
-- @column scope: run, or point (the run's load point: a load study runs each offered rate as a run)
-- @column point: the point's offered rate, req/s (run_metrics.offered_rps); NULL on the run row
-- @column diagnosed: late (the attempts that missed a deadline or a declared SLO threshold), or all
--   (none was late: every attempt); of the client's attempts (attempts.client_attempt), a router's tries
--   being part of the client attempt each was made for
-- @column n_attempts: the attempts diagnosed
-- @column n_late: the run's late attempts (slo_misses rows)
-- @column delay_ms: Σ over the diagnosed attempts of every cause whose time is known, ms (their own
--   prefill and decode work is where their time went, not a cause)
-- @column server_queue_share: Σ server_queue_ms / delay_ms; NULL when one diagnosed attempt's is unknown
-- @column client_queue_share: likewise for client_queue_ms
-- @column prefill_interference_share: likewise for prefill_interference_ms
-- @column preemption_share: likewise for preemption_ms
-- @column decode_stall_share: likewise for decode_stall_ms
-- @column host_contention_share: likewise for host_contention_ms
-- @column transport_share: likewise for transport_ms (not applicable to an attempt the client did not
--   see complete)
-- @column client_share: likewise for client_ms (not applicable likewise)
-- @column spec_rejected_share: likewise for spec_rejected_ms
-- @column first_cause: the cause with the largest share (ties in the order above); 'unknown' when one of
--   the engine's causes (server_queue, prefill_interference, preemption, decode_stall) is unknown (a black
--   box; an engine's own spans, which see no step), or when a diagnosed attempt's dominant_cause is (its
--   client queue, transport or rejected drafts unknown): any of them could be the largest; NULL when the
--   known causes add up to 0. host_contention and client rank where measured (the gap register names them)
-- @column first_cause_share: its share (NULL when first_cause is unknown)
-- @column evidence: one sentence: the first cause's time against the delay, over which attempts, and
--   the causes left unknown; in a deployment, the replica named (replica_id) and why
-- @column replica_id: in a deployment of two replicas or more, the replica that served at least 3/4 of the late
--   attempts when every late attempt's replica is known and at least 2 were late (one slow or one hot replica
--   explains them); NULL otherwise (docs/LEDGER.md "run_diagnosis")
-- @column replica_balance: the deployment's balance figure, the busiest replica's busy time over the replicas'
--   mean (max replicas.balance); NULL for one server or when a replica's busy time is unknown
-- @column replica_balance_evidence: what replica_balance's busy times are (replicas.balance_evidence): observed (our
--   engines' steps), reported (engines' own reports) or observed and reported; NULL with replica_balance
CREATE OR REPLACE TABLE run_diagnosis AS
WITH ac AS (  -- the client's attempts (or every attempt of a run without a client): a router's try is part of the
  -- client attempt it was made for, whose delay already holds its time (attempts.client_attempt false)
  SELECT c.* FROM attempt_causes c JOIN attempts a USING (attempt_id) WHERE a.client_attempt IS NOT FALSE
), d AS (
  SELECT *, NOT EXISTS (SELECT 1 FROM ac WHERE late) AS none_late FROM ac
), diag AS (SELECT * FROM d WHERE late OR none_late
), causes(cause, ord) AS (VALUES ('server_queue', 1), ('client_queue', 2), ('prefill_interference', 3),
                                 ('preemption', 4), ('decode_stall', 5), ('host_contention', 6), ('transport', 7),
                                 ('client', 8), ('spec_rejected', 9)
), long AS (
  SELECT c.cause, c.ord,
         CASE c.cause WHEN 'server_queue' THEN server_queue_ms WHEN 'client_queue' THEN client_queue_ms
              WHEN 'prefill_interference' THEN prefill_interference_ms WHEN 'preemption' THEN preemption_ms
              WHEN 'decode_stall' THEN decode_stall_ms WHEN 'host_contention' THEN host_contention_ms
              -- transport and the client's delay do not apply to a response the client never received whole
              WHEN 'transport' THEN CASE WHEN client_status IS DISTINCT FROM 'completed' THEN coalesce(transport_ms, 0)
                                         ELSE transport_ms END
              WHEN 'client' THEN CASE WHEN client_status IS DISTINCT FROM 'completed' THEN coalesce(client_ms, 0)
                                      ELSE client_ms END
              ELSE spec_rejected_ms END AS ms
  FROM diag, causes c
), totals AS (
  SELECT cause, ord, CASE WHEN count(ms) = count(*) THEN coalesce(sum(ms), 0) END AS ms FROM long GROUP BY cause, ord
), run AS (
  SELECT (SELECT count(*) FROM diag) AS n_attempts, (SELECT count(*) FROM d WHERE late) AS n_late,
         coalesce((SELECT bool_or(none_late) FROM d), true) AS none_late,  -- no attempt: none was late
         sum(ms) AS delay_ms,
         arg_max(cause, (ms, -ord)) FILTER (WHERE ms > 0) AS largest_known,
         max(ms) FILTER (WHERE ms > 0) AS first_ms,
         -- the engine's side unknown (a black box; an engine's own spans see no step): any of its causes
         -- could be the largest, so none is named first
         bool_or(ms IS NULL AND cause IN ('server_queue', 'prefill_interference', 'preemption', 'decode_stall'))
           AS engine_unknown,
         -- a diagnosed attempt whose own largest cause is unknown (slo_misses' rule: its client queue, its
         -- transport or its rejected drafts unknown too): that cause could be the run's largest as well
         (SELECT bool_or(dominant_cause = 'unknown') FROM diag) AS attempt_unknown,
         string_agg(cause, ', ' ORDER BY ord) FILTER (WHERE ms IS NULL) AS unknown,
         map(list(cause ORDER BY ord), list(ms ORDER BY ord)) AS by_cause
  FROM totals
), late_by AS (  -- the late attempts per replica that served them
  SELECT a.replica_id, count(*) AS n FROM d JOIN attempts a USING (attempt_id) WHERE d.late GROUP BY a.replica_id
), rep AS (
  SELECT arg_max(replica_id, n) FILTER (WHERE replica_id IS NOT NULL) AS top,
         max(n) FILTER (WHERE replica_id IS NOT NULL) AS top_late, sum(n) AS n_late,
         count(*) FILTER (WHERE replica_id IS NULL) AS unplaced
  FROM late_by
), named AS (
  SELECT CASE WHEN (SELECT count(*) FROM replicas) >= 2 AND rep.unplaced = 0 AND rep.n_late >= 2
                   AND 4 * rep.top_late >= 3 * rep.n_late THEN rep.top END AS replica_id,
         rep.top_late, rep.n_late,
         (SELECT count(*) FROM d JOIN attempts a USING (attempt_id) WHERE a.replica_id = rep.top) AS top_attempts,
         (SELECT count(*) FROM d) AS all_attempts,
         (SELECT balance FROM replicas WHERE replica_id = rep.top) AS top_balance,
         (SELECT max(balance) FROM replicas) AS replica_balance,
         (SELECT any_value(balance_evidence) FROM replicas) AS replica_balance_evidence
  FROM rep
), scopes(scope, point) AS (
  SELECT 'run', NULL::DOUBLE UNION ALL SELECT 'point', getvariable('offered_rps') WHERE getvariable('offered_rps') IS NOT NULL
)
SELECT getvariable('run_id') AS run_id, s.scope, s.point,
       CASE WHEN r.none_late THEN 'all' ELSE 'late' END AS diagnosed, r.n_attempts, r.n_late, r.delay_ms,
       r.by_cause['server_queue'] / nullif(r.delay_ms, 0) AS server_queue_share,
       r.by_cause['client_queue'] / nullif(r.delay_ms, 0) AS client_queue_share,
       r.by_cause['prefill_interference'] / nullif(r.delay_ms, 0) AS prefill_interference_share,
       r.by_cause['preemption'] / nullif(r.delay_ms, 0) AS preemption_share,
       r.by_cause['decode_stall'] / nullif(r.delay_ms, 0) AS decode_stall_share,
       r.by_cause['host_contention'] / nullif(r.delay_ms, 0) AS host_contention_share,
       r.by_cause['transport'] / nullif(r.delay_ms, 0) AS transport_share,
       r.by_cause['client'] / nullif(r.delay_ms, 0) AS client_share,
       r.by_cause['spec_rejected'] / nullif(r.delay_ms, 0) AS spec_rejected_share,
       CASE WHEN r.engine_unknown OR r.attempt_unknown THEN 'unknown' ELSE r.largest_known END AS first_cause,
       CASE WHEN NOT (r.engine_unknown OR r.attempt_unknown) THEN r.first_ms / nullif(r.delay_ms, 0) END
         AS first_cause_share,
       CASE WHEN r.n_attempts = 0 THEN 'no attempt to diagnose'
            ELSE concat(CASE WHEN (r.engine_unknown OR r.attempt_unknown) AND r.largest_known IS NOT NULL
                             THEN printf('%s, so none is named first; the largest known, %s: %.1f ms of the '
                                         '%.1f ms known', r.why_unknown, r.largest_known, r.first_ms, r.delay_ms)
                             WHEN r.engine_unknown OR r.attempt_unknown THEN r.why_unknown || ', so none is named first'
                             WHEN r.largest_known IS NULL THEN 'no measured delay'
                             ELSE printf('%s: %.1f ms of the %.1f ms of delay (%.0f %%)', r.largest_known, r.first_ms,
                                         r.delay_ms, 100 * r.first_ms / r.delay_ms) END,
                        printf(' over %d %sattempt%s', r.n_attempts, CASE WHEN r.none_late THEN '' ELSE 'late ' END,
                               CASE WHEN r.n_attempts = 1 THEN '' ELSE 's' END),
                        CASE WHEN r.none_late THEN ' (none was late)' ELSE '' END,
                        CASE WHEN r.unknown IS NOT NULL THEN '; unknown: ' || r.unknown ELSE '' END,
                        CASE WHEN nm.replica_id IS NOT NULL
                             THEN printf('; replica %s served %d of the %d late attempts (%d of the %d attempts)%s',
                                         nm.replica_id, nm.top_late, nm.n_late, nm.top_attempts, nm.all_attempts,
                                         CASE WHEN nm.top_balance IS NOT NULL
                                              THEN printf('; its busy time %.1f× the mean', nm.top_balance)
                                              ELSE '' END)
                             ELSE '' END) END AS evidence,
       nm.replica_id, nm.replica_balance, nm.replica_balance_evidence
FROM (SELECT *, CASE WHEN engine_unknown THEN 'an engine cause is unknown'
                     ELSE 'a diagnosed attempt''s own cause is unknown (its client queue, transport or rejected drafts)'
                     END AS why_unknown FROM run) r, scopes s, named nm
ORDER BY s.scope DESC;

-- @gaps: a cause whose time is unknown for a diagnosed attempt (its share is NULL).
CREATE OR REPLACE TEMP TABLE run_diagnosis_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO run_diagnosis_gaps
SELECT 'run', NULL, t.cause || '_share',
       CASE t.cause WHEN 'host_contention' THEN 'steps.contention_ms for the steps holding the diagnosed attempts'
            WHEN 'client' THEN 'a trace of every wake of the client''s event loop (samples client_loop_lag_ms)'
            WHEN 'client_queue' THEN 'client events'
            ELSE 'engine events (the embedded engine, inferledger serve --out, or an engine trace)' END,
       'a diagnosed attempt''s ' || t.cause || ' time is unknown: the share is NULL and the other shares are of the known causes'
FROM (SELECT unnest(['server_queue', 'client_queue', 'prefill_interference', 'preemption', 'decode_stall',
                     'host_contention', 'transport', 'client', 'spec_rejected']) AS cause,
             unnest([server_queue_share, client_queue_share, prefill_interference_share, preemption_share,
                     decode_stall_share, host_contention_share, transport_share, client_share,
                     spec_rejected_share]) AS share, delay_ms
      FROM run_diagnosis WHERE scope = 'run' AND n_attempts > 0) t
WHERE t.share IS NULL AND t.delay_ms > 0;
