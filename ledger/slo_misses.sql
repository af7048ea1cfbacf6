-- The causes of delay, per attempt, defined once: every attempt's cause times (ms, disjoint stretches of
-- its timeline) in attempt_causes, which run_diagnosis aggregates; slo_misses keeps its
-- late attempts (a missed deadline, a client timeout, or a declared SLO threshold exceeded) with the
-- dominant cause (docs/LEDGER.md "slo_misses"). For an attempt whose engine figures an engine reported
-- (a span, docs/LEDGER.md "Reported evidence"), the span sees no engine step: interference, stalls and
-- contention are unknown, and the dominant cause is the largest of the phases the span and the client
-- measure.
--
-- scope: task
-- reads: attempts, request_metrics, contracts, intervals, step_attribution, steps, ev_tok, marks, samples,
--        quantile_linear, clock_conv
-- creates: attempt_causes, slo_misses, slo_misses_gaps

-- @table attempt_causes: one row per attempt: the time each cause of delay took (disjoint stretches of
--   its timeline, ms), the one definition slo_misses and run_diagnosis read (docs/LEDGER.md "slo_misses");
--   for an attempt the client let go of (timeout, cancel, error), only while the client held it
-- @column task_id: the attempt's task
-- @column client_status: as attempts.client_status
-- @column late: it missed its task's deadline (late or timed out) or exceeded a declared SLO threshold
-- @column missed: what it missed, comma-separated: deadline, timeout, slo_ttft, slo_tpot, slo_e2e ('' when none)
-- @column deadline_ms: the task's deadline (NULL without one)
-- @column done_since_reference_ms: as request_metrics.done_since_reference_ms
-- @column client_queue_ms: the client's own queue (client_queue intervals: created -> sent) less the lag
--   of its event loop in that time (a send the busy loop put off is client_ms); NULL without client events
-- @column server_queue_ms: the time the server held it before its engine first admitted it: its front end
--   (server.received → engine.enqueued, on one clock: HTTP, tokenization, the hand-off; an engine's own span's
--   arrival → queued) and request_metrics.queue_ms (the engine's queue), each cut where the client let go;
--   NULL without engine events
-- @column prefill_interference_ms: the on-CPU time of the steps holding this attempt (its prefill and
--   decode steps; not those recomputing it after a preemption) charged to other attempts' prefill tokens (their token shares of steps.cpu_ms
--   less the step's blocked_ms, where known; of the wall step where cpu_ms is unknown); NULL without steps, or when a span reported the engine side
-- @column preemption_ms: its preempted and recompute intervals (each engine.preempted → its next token: the
--   wait to be admitted again and the recompute, whose steps count for no other cause); NULL without
--   engine events
-- @column decode_stall_ms: engine gaps beyond twice the attempt's median gap, less what preemption,
--   interference and contention explain (its most stalled choice's); NULL as prefill_interference_ms
-- @column host_contention_ms: Σ over the steps holding it (not those recomputing it: preemption_ms holds
--   them) of the step's steps.contention_ms (time the step waited for a CPU: every attempt in the step
--   waited all of it); NULL when one step's contention is unknown
-- @column transport_ms: ttft_client_ms − ttft_server_ms, at most what client_ms leaves of the client's
--   time outside the server's span (e2e_client_ms − e2e_server_ms), less the front end (both server figures
--   start at the engine's queue; the front end is server_queue_ms's), beyond the clock mappings' epsilon
--   (≥ 0); NULL without both TTFTs and both E2Es
-- @column client_ms: the client's own event-loop lag (samples client_loop_lag_ms, every wake traced) while
--   the attempt waited to be sent (at most its client_queue interval) and while it held the attempt (at most
--   the client's time outside the server's span, e2e_client_ms − e2e_server_ms: a late read of the first
--   chunk or of the last); NULL when unknown
-- @column spec_rejected_ms: its decode steps' on-CPU time (share_ms × (cpu_ms − blocked_ms) / step_ms; wall where cpu_ms
--   is unknown) × rejected drafted tokens / (drafted tokens + rounds);
--   0 without speculative rounds
-- @column dominant_cause: its largest cause: server_queue, client_queue, prefill_interference,
--   preemption, decode_stall, host_contention, transport, client, spec_rejected (prefill, decode where a
--   span reported the engine side); unknown when a queue, interference, stall, preemption or transport
--   cause that applies is unknown; NULL when every cause is measured and 0
-- @column prefill_ms: request_metrics.prefill_ms (NULL without server evidence)
-- @column decode_ms: request_metrics.decode_ms (NULL without server evidence)
-- @column prefill_work_ms: its own prefill work: prefill_ms less the CPU wait and the interference of the
--   steps that prefilled its prompt and less a preemption before its first token (≥ 0; a wait that is
--   unknown stays in it); prefill_ms where a span reported the engine side; NULL where prefill_ms is (no first token)
-- @column decode_work_ms: its own decode work: decode_ms less the causes inside it (the rest of its
--   interference and CPU wait, preemption after its first token, stalls, rejected drafts; ≥ 0); decode_ms where a span reported
--   the engine side
-- @column blocked_ms: of its time in steps, how long their step thread slept on a lock: Σ over the steps holding
--   it (as host_contention_ms) of steps.blocked_ms, every attempt in the step slept all of it (in a Python
--   server the interpreter lock, held by its front end or a full collection: docs/MODEL.md "Contention").
--   Not a cause: it lies inside its prefill and decode work and its stalls, and is shown beside them; NULL
--   when one step's is unknown (intra-op workers), or as host_contention_ms
-- @column cause_evidence: observed (our engine's probes), reported (a span) or simulated (a run on the
--   simulated clock): request_metrics.server_evidence; NULL without server evidence
CREATE OR REPLACE TABLE attempt_causes AS
WITH gone AS (
  -- an attempt the client let go of (timed out, cancelled, errored) delays it no longer: the moment, on the
  -- engine's clock (mapped, its epsilon given to the engine), after which the engine's work on it is no cause
  -- of the client's delay and no work of its own (an abandoned stream the engine went on with, a cancel it
  -- learned of later)
  SELECT m.attempt_id, m.enqueued.clock AS clock, m.client_end.ns + c.offset_ns + c.eps_ns AS ns
  FROM marks m JOIN attempts a USING (attempt_id)
  JOIN clock_conv c ON c.from_clock = m.client_end.clock AND c.to_clock = m.enqueued.clock
  WHERE a.client_status IN ('timeout', 'cancelled', 'error') AND m.client_end IS NOT NULL AND m.enqueued IS NOT NULL
), front AS (  -- the server's front end: its receipt to the engine's queue (HTTP, tokenization, the hand-off), one clock
  SELECT m.attempt_id, greatest(m.enqueued.ns - m.received.ns, 0) / 1e6 AS ms,
         CASE WHEN g.attempt_id IS NOT NULL THEN greatest(least(m.enqueued.ns, g.ns) - m.received.ns, 0) / 1e6 END
           AS held_ms
  FROM marks m LEFT JOIN gone g USING (attempt_id)
  WHERE m.received IS NOT NULL AND m.enqueued IS NOT NULL AND m.received.clock = m.enqueued.clock
), held_work AS (  -- its queue, prefill and decode stretches as far as the client held it (gone: clipped there)
  SELECT m.attempt_id, g.ns AS gone_ns,
         greatest(least(m.scheduled.ns, g.ns) - m.enqueued.ns, 0) / 1e6 AS queue_ms,
         greatest(least(coalesce(t.first_ns, g.ns), g.ns) - m.scheduled.ns, 0) / 1e6 AS prefill_ms,
         CASE WHEN t.first_ns IS NOT NULL
              THEN greatest(least(coalesce(m.finished.ns, g.ns), g.ns) - t.first_ns, 0) / 1e6 ELSE 0 END AS decode_ms
  FROM marks m JOIN gone g USING (attempt_id)
  LEFT JOIN (SELECT attempt_id, clock, min(ts_ns) AS first_ns FROM ev_tok GROUP BY 1, 2) t
    ON t.attempt_id = m.attempt_id AND t.clock = g.clock
  WHERE m.scheduled.clock = g.clock
), base AS (
  SELECT a.attempt_id, a.task_id, a.client_status, r.done_since_reference_ms, c.deadline_ms,
         -- the engine's stretches while the client held the attempt (its own, whole, where it saw it complete),
         -- by one rule whoever timed them: our probes, or an engine's own span mapped to its events
         CASE WHEN hw.attempt_id IS NOT NULL AND r.queue_ms IS NOT NULL THEN least(r.queue_ms, hw.queue_ms)
              ELSE r.queue_ms END AS queue_ms,
         coalesce(fe.held_ms, fe.ms) AS front_end_ms, coalesce(fe.ms, 0) AS front_end_whole_ms,
         CASE WHEN hw.attempt_id IS NOT NULL AND r.prefill_ms IS NOT NULL
              THEN least(r.prefill_ms, hw.prefill_ms) ELSE r.prefill_ms END AS prefill_ms,
         CASE WHEN hw.attempt_id IS NOT NULL AND r.decode_ms IS NOT NULL
              THEN least(r.decode_ms, hw.decode_ms) ELSE r.decode_ms END AS decode_ms,
         r.ttft_client_ms, r.ttft_server_ms, r.e2e_client_ms, r.e2e_server_ms, r.uplink_eps_ms, r.downlink_first_eps_ms,
         r.spec_rounds, r.spec_drafted_tokens, r.spec_accepted_tokens, r.server_evidence AS cause_evidence,
         concat_ws(',',
           CASE WHEN c.deadline_ms IS NOT NULL AND r.on_time = false THEN 'deadline' END,
           CASE WHEN c.deadline_ms IS NOT NULL AND a.client_status = 'timeout' THEN 'timeout' END,
           CASE WHEN r.ttft_client_ms > getvariable('slo_ttft_ms') THEN 'slo_ttft' END,
           CASE WHEN r.tpot_ms > getvariable('slo_tpot_ms') THEN 'slo_tpot' END,
           CASE WHEN r.e2e_client_ms > getvariable('slo_e2e_ms') THEN 'slo_e2e' END) AS missed
  FROM attempts a JOIN request_metrics r USING (attempt_id) LEFT JOIN contracts c ON c.task_id = a.task_id
  LEFT JOIN held_work hw USING (attempt_id) LEFT JOIN front fe USING (attempt_id)
), client_queue AS (
  SELECT attempt_id, sum(dur_ms) AS ms FROM intervals WHERE stream = 'client' AND name = 'client_queue' GROUP BY 1
), preempt AS (  -- its preempted and recompute intervals, and the part of them before its first token (in prefill_ms)
  SELECT p.attempt_id, sum(p.ms) AS ms,
         coalesce(sum(p.ms) FILTER (WHERE d.first_ns IS NULL OR p.start_ns < d.first_ns), 0) AS before_first_ms
  FROM (SELECT v.attempt_id, v.start_ns,  -- as far as the client held it
               CASE WHEN g.ns IS NULL THEN v.dur_ms ELSE greatest(least(v.end_ns, g.ns) - v.start_ns, 0) / 1e6 END AS ms
        FROM intervals v LEFT JOIN gone g ON g.attempt_id = v.attempt_id AND g.clock = v.clock
        WHERE v.stream = 'engine' AND v.name IN ('preempted', 'recompute')) p
  LEFT JOIN (SELECT attempt_id, min(start_ns) AS first_ns FROM intervals WHERE stream = 'engine' AND name = 'decode'
             GROUP BY 1) d USING (attempt_id)
  GROUP BY 1
), mine AS (
  -- the steps holding the attempt whose time its step causes may take: all but those that recomputed it
  -- (its prefill steps once it was first preempted, inside its recompute interval): the preemption holds
  -- those whole, their CPU wait and other attempts' share of them included
  -- held: the part of the step the client held the attempt through (1 but for the step it let go of it in)
  SELECT sa.*, CASE WHEN g.ns IS NULL OR sa.end_ns <= g.ns OR sa.end_ns <= sa.start_ns THEN 1.0
                    ELSE (g.ns - sa.start_ns) / (sa.end_ns - sa.start_ns) END AS held
  FROM step_attribution sa
  LEFT JOIN (SELECT attempt_id, clock, min(start_ns) AS t FROM intervals
             WHERE stream = 'engine' AND name = 'preempted' GROUP BY 1, 2) p
    ON p.attempt_id = sa.attempt_id AND p.clock = sa.clock
  LEFT JOIN gone g ON g.attempt_id = sa.attempt_id AND g.clock = sa.clock
  WHERE NOT (sa.kind = 'prefill' AND p.t IS NOT NULL AND sa.start_ns >= p.t)
    AND NOT coalesce(sa.start_ns >= g.ns, false)  -- begun after the client let go of it: no delay of its
), step_cpu AS (  -- the fraction of each step the CPU worked on it: cpu_ms less the step thread's sleep on a lock
                  -- (blocked_ms, where known), over step_ms; 1 where unknown: wall
  SELECT step_id, contention_ms, blocked_ms,
         coalesce((cpu_ms - coalesce(blocked_ms, 0)) / nullif(step_ms, 0), 1.0) AS cpu_frac FROM steps
), others_prefill AS (
  -- per step holding the attempt (its decode steps, and its own prefill step when other prompts were
  -- prefilled beside it): the step's on-CPU time spent on other attempts' prefill tokens (their token
  -- shares of cpu_ms; of the wall step where cpu_ms is unknown). The CPU wait is not theirs: it is
  -- host_contention, whole
  SELECT me.attempt_id, me.step_id, sum(o.share_ms * sc.cpu_frac) * any_value(me.held) AS ms
  FROM mine me JOIN step_attribution o ON o.step_id = me.step_id AND o.attempt_id <> me.attempt_id
  JOIN step_cpu sc ON sc.step_id = me.step_id
  WHERE o.kind = 'prefill' GROUP BY 1, 2
), interference AS (
  SELECT attempt_id, sum(ms) AS ms FROM others_prefill GROUP BY 1
), held AS (  -- the CPU wait of each step holding the attempt: the whole wait (every attempt in the step
              -- waited it out), not a token share
  SELECT sa.attempt_id, sa.step_id, sc.contention_ms * sa.held AS ms, sc.blocked_ms * sa.held AS blocked_ms
  FROM mine sa JOIN step_cpu sc USING (step_id)
), contention AS (  -- unknown (NULL) as soon as one of its steps' contention is unknown; the steps' sleep on a lock too
  SELECT attempt_id, CASE WHEN count(*) = count(ms) THEN sum(ms) END AS ms,
         CASE WHEN count(*) = count(blocked_ms) THEN sum(blocked_ms) END AS blocked_ms FROM held GROUP BY 1
), in_prefill AS (  -- the CPU wait and the interference of the steps that prefilled the attempt's prompt
  SELECT sa.attempt_id, sum(coalesce(sc.contention_ms * sa.held, 0) + coalesce(op.ms, 0)) AS ms
  FROM mine sa JOIN step_cpu sc USING (step_id)
  LEFT JOIN others_prefill op ON op.attempt_id = sa.attempt_id AND op.step_id = sa.step_id
  WHERE sa.kind = 'prefill' GROUP BY 1
), tok_gaps AS (  -- engine gaps between consecutive tokens of one choice, with the step of the later token
  SELECT t.attempt_id, t.choice, t.clock, t.step_id, t.ts_ns, t.prev_ns, (t.ts_ns - t.prev_ns) / 1e6 AS gap_ms FROM (
    SELECT attempt_id, choice, clock, step_id, ts_ns,
           lag(ts_ns) OVER (PARTITION BY attempt_id, choice, clock ORDER BY ts_ns, seq) AS prev_ns
    FROM ev_tok WHERE attempt_id IS NOT NULL) t
  LEFT JOIN gone g ON g.attempt_id = t.attempt_id AND g.clock = t.clock
  WHERE t.prev_ns IS NOT NULL AND NOT coalesce(t.ts_ns > g.ns, false)  -- ended after the client let go: none of its
), explained AS (  -- the part of each gap another cause already holds: preemption and recompute time, and
                   -- the interference and CPU wait charged to the step that produced the later token
  SELECT g.attempt_id, g.choice, g.ts_ns,
         coalesce((SELECT sum(greatest(least(g.ts_ns, v.end_ns) - greatest(g.prev_ns, v.start_ns), 0)) / 1e6
                   FROM intervals v WHERE v.attempt_id = g.attempt_id AND v.stream = 'engine' AND v.clock = g.clock
                     AND v.name IN ('preempted', 'recompute')), 0)
         + coalesce((SELECT sum(op.ms) FROM others_prefill op
                     WHERE op.attempt_id = g.attempt_id AND op.step_id = g.step_id), 0)
         + coalesce((SELECT sum(h.ms) FROM held h WHERE h.attempt_id = g.attempt_id AND h.step_id = g.step_id), 0) AS ms
  FROM tok_gaps g
), stalls AS (
  -- engine gaps beyond twice the attempt's median gap, less what preemption, interference and contention
  -- explain; choices decode in the same steps, so the attempt's stall is its most stalled choice's
  SELECT attempt_id, max(ms) AS ms FROM (
    SELECT g.attempt_id, g.choice, sum(greatest(g.gap_ms - x.ms - 2 * med.m, 0)) AS ms
    FROM tok_gaps g JOIN explained x USING (attempt_id, choice, ts_ns)
    JOIN (SELECT attempt_id, quantile_linear(gap_ms, 0.5) AS m FROM tok_gaps GROUP BY 1) med USING (attempt_id)
    GROUP BY g.attempt_id, g.choice)
  GROUP BY attempt_id
), lag_trace AS (  -- the client's event-loop lag, every wake traced (a subsampled trace is no measure)
  SELECT ts_ns, clock, value FROM samples WHERE metric = 'client_loop_lag_ms' AND getvariable('client_lag_every') = 1
), lag_windows AS (  -- the attempt's two stretches on the client: waiting to be sent, and held to its end
  SELECT attempt_id, 'send' AS stretch, sent.clock AS clock, created.ns AS lo, sent.ns AS hi FROM marks
  WHERE sent IS NOT NULL AND created IS NOT NULL AND created.clock = sent.clock
  UNION ALL
  SELECT attempt_id, 'held', sent.clock, sent.ns, client_end.ns FROM marks WHERE sent IS NOT NULL AND client_end IS NOT NULL
), window_lag AS (  -- the client loop's lag in each: a sample stamped at the late wake covers the value
                    -- before it, counted where it overlaps the window
  SELECT w.attempt_id, w.stretch,
         coalesce(sum(greatest(least(l.ts_ns, w.hi) - greatest(l.ts_ns - l.value * 1e6, w.lo), 0)) / 1e6, 0) AS ms
  FROM lag_windows w LEFT JOIN lag_trace l ON l.clock = w.clock AND l.ts_ns > w.lo AND l.ts_ns - l.value * 1e6 < w.hi
  WHERE EXISTS (SELECT 1 FROM lag_trace)
  GROUP BY 1, 2
), client_lag AS (SELECT attempt_id, ms FROM window_lag WHERE stretch = 'held'
), send_lag AS (SELECT attempt_id, ms FROM window_lag WHERE stretch = 'send'
), layers AS (  -- which layers saw the attempt: a cause is 0 only where its layer could have seen it
  SELECT attempt_id, client_attempt IS TRUE AS has_client, server_status <> 'unknown' AS has_engine,
         attempt_id IN (SELECT attempt_id FROM step_attribution) AS has_steps
  FROM attempts
), causes AS (
  SELECT b.*, b.missed <> '' AS late,
         -- the client's own queue less what its loop's lag explains of it (a send the busy loop put off
         -- is the client's overhead, not a queue)
         CASE WHEN l.has_client THEN coalesce(cq.ms, 0) - least(coalesce(sl.ms, 0), coalesce(cq.ms, 0)) END
           AS client_queue_ms,
         CASE WHEN l.has_client AND sl.ms IS NOT NULL THEN least(sl.ms, coalesce(cq.ms, 0)) END AS send_lag_ms,
         -- the server held it before its engine's first admission: its front end, then the engine's queue
         CASE WHEN l.has_engine THEN coalesce(b.queue_ms, 0) + coalesce(b.front_end_ms, 0) END AS server_queue_ms,
         CASE WHEN l.has_steps AND b.cause_evidence IS DISTINCT FROM 'reported' THEN coalesce(f.ms, 0) END
           AS prefill_interference_ms,
         CASE WHEN l.has_engine AND b.cause_evidence IS DISTINCT FROM 'reported' THEN coalesce(s.ms, 0) END
           AS decode_stall_ms,
         CASE WHEN l.has_engine THEN coalesce(p.ms, 0) END AS preemption_ms,
         -- contention lives in the steps: without them it is unknown, never 0
         CASE WHEN l.has_steps AND b.cause_evidence IS DISTINCT FROM 'reported'
              THEN CASE WHEN h.attempt_id IS NULL THEN 0.0 ELSE h.ms END END AS host_contention_ms,
         CASE WHEN l.has_steps AND b.cause_evidence IS DISTINCT FROM 'reported'
              THEN CASE WHEN h.attempt_id IS NULL THEN 0.0 ELSE h.blocked_ms END END AS blocked_ms,
         -- the client's time outside the server's span (client E2E − server E2E: before the server's
         -- first event and after its last write); the client's own lag takes what it can of it, and the
         -- link the client / server TTFT difference (a first chunk the server held back is not the
         -- link's) of the rest, beyond the clock mappings' epsilon
         -- (least and greatest skip a NULL in DuckDB: every unknown is spelled out)
         CASE WHEN b.e2e_client_ms IS NOT NULL AND b.e2e_server_ms IS NOT NULL
              THEN greatest(b.e2e_client_ms - b.e2e_server_ms - b.front_end_whole_ms, 0) END AS outside_ms,
         CASE WHEN b.ttft_client_ms IS NOT NULL AND b.ttft_server_ms IS NOT NULL AND b.e2e_client_ms IS NOT NULL
                   AND b.e2e_server_ms IS NOT NULL
              -- both server figures start at the engine's queue: the front end before it is the server's
              THEN least(b.ttft_client_ms - b.ttft_server_ms, b.e2e_client_ms - b.e2e_server_ms)
                   - b.front_end_whole_ms END AS link_ms,
         coalesce(b.uplink_eps_ms, 0) + coalesce(b.downlink_first_eps_ms, 0) AS link_eps_ms,
         cl.ms AS lag_ms, coalesce(ip.ms, 0) AS in_prefill_ms, coalesce(p.before_first_ms, 0) AS preempted_in_prefill_ms,
         CASE WHEN b.spec_rounds = 0 THEN 0.0 WHEN b.spec_rounds > 0 THEN
           -- the share of its decode step time spent verifying drafted tokens that were rejected: each
           -- round verifies its drafted tokens and one more
           -- (on-CPU time: the step's CPU wait is host_contention's)
           (SELECT sum(sa.share_ms * sa.held * sc.cpu_frac) FROM mine sa JOIN step_cpu sc USING (step_id)
            WHERE sa.attempt_id = b.attempt_id AND sa.kind = 'decode')
           * (b.spec_drafted_tokens - b.spec_accepted_tokens) / nullif(b.spec_drafted_tokens + b.spec_rounds, 0) END
           AS spec_rejected_ms
  FROM base b JOIN layers l USING (attempt_id) LEFT JOIN client_queue cq USING (attempt_id)
  LEFT JOIN preempt p USING (attempt_id) LEFT JOIN interference f USING (attempt_id) LEFT JOIN stalls s USING (attempt_id)
  LEFT JOIN contention h USING (attempt_id) LEFT JOIN client_lag cl USING (attempt_id)
  LEFT JOIN in_prefill ip USING (attempt_id) LEFT JOIN send_lag sl USING (attempt_id)
), linked AS (
  SELECT *, CASE WHEN client_late_ms IS NOT NULL THEN client_late_ms + coalesce(send_lag_ms, 0) END AS client_ms,
         CASE WHEN link_ms IS NOT NULL AND lag_ms IS NOT NULL
                 THEN greatest(least(link_ms, outside_ms - client_late_ms) - link_eps_ms, 0)
                 WHEN link_ms IS NOT NULL THEN greatest(link_ms - link_eps_ms, 0) END AS transport_ms
  FROM (SELECT *, CASE WHEN outside_ms IS NOT NULL AND lag_ms IS NOT NULL THEN least(lag_ms, outside_ms) END
                    AS client_late_ms  -- its lag read a chunk late
        FROM causes)
)
SELECT getvariable('run_id') AS run_id, attempt_id, task_id, client_status, late, missed, deadline_ms,
       done_since_reference_ms, client_queue_ms, server_queue_ms, prefill_interference_ms, preemption_ms, decode_stall_ms,
       host_contention_ms, transport_ms, client_ms, spec_rejected_ms,
       CASE WHEN cause_evidence = 'reported' THEN
         CASE WHEN client_queue_ms IS NULL OR server_queue_ms IS NULL OR prefill_ms IS NULL
                   OR (transport_ms IS NULL AND client_status = 'completed') THEN 'unknown'
              ELSE CASE greatest(client_queue_ms, server_queue_ms, prefill_ms, coalesce(decode_ms, 0),
                                 coalesce(transport_ms, 0), coalesce(client_ms, 0))
              WHEN 0 THEN NULL
              WHEN server_queue_ms THEN 'server_queue'
              WHEN client_queue_ms THEN 'client_queue'
              WHEN prefill_ms THEN 'prefill'
              WHEN decode_ms THEN 'decode'
              WHEN transport_ms THEN 'transport'
              ELSE 'client' END END
       WHEN client_queue_ms IS NULL OR server_queue_ms IS NULL OR prefill_interference_ms IS NULL
                 OR decode_stall_ms IS NULL OR preemption_ms IS NULL OR (spec_rejected_ms IS NULL AND spec_rounds > 0)
                 -- a response without a first token at both layers has no transport: not applicable, not unknown
                 OR (transport_ms IS NULL AND client_status = 'completed') THEN 'unknown'
            -- host_contention and client rank where measured; unknown, they are named by the gap register
            ELSE CASE greatest(client_queue_ms, server_queue_ms, prefill_interference_ms, decode_stall_ms, preemption_ms,
                               coalesce(host_contention_ms, 0), coalesce(transport_ms, 0), coalesce(client_ms, 0),
                               coalesce(spec_rejected_ms, 0))
            WHEN 0 THEN NULL
            WHEN server_queue_ms THEN 'server_queue'
            WHEN client_queue_ms THEN 'client_queue'
            WHEN prefill_interference_ms THEN 'prefill_interference'
            WHEN preemption_ms THEN 'preemption'
            WHEN decode_stall_ms THEN 'decode_stall'
            WHEN host_contention_ms THEN 'host_contention'
            WHEN transport_ms THEN 'transport'
            WHEN client_ms THEN 'client'
            ELSE 'spec_rejected' END END AS dominant_cause,
       CASE WHEN cause_evidence IS NOT NULL THEN prefill_ms END AS prefill_ms,
       CASE WHEN cause_evidence IS NOT NULL THEN decode_ms END AS decode_ms,
       -- its own work: each phase less the causes that lie inside it (a reported span has none measured)
       CASE WHEN cause_evidence = 'reported' THEN prefill_ms
            -- (greatest() skips a NULL: an unknown phase stays unknown, never 0)
            WHEN cause_evidence IS NOT NULL AND prefill_ms IS NOT NULL
            THEN greatest(prefill_ms - in_prefill_ms - preempted_in_prefill_ms, 0) END
              AS prefill_work_ms,
       CASE WHEN cause_evidence = 'reported' THEN decode_ms
            WHEN cause_evidence IS NOT NULL AND decode_ms IS NOT NULL THEN greatest(decode_ms - (coalesce(prefill_interference_ms, 0)
                   + coalesce(host_contention_ms, 0) - in_prefill_ms) - (coalesce(preemption_ms, 0) - preempted_in_prefill_ms)
                   - coalesce(decode_stall_ms, 0) - coalesce(spec_rejected_ms, 0), 0) END AS decode_work_ms,
       blocked_ms, cause_evidence
FROM linked ORDER BY attempt_id;

-- @table slo_misses: one row per late attempt (attempt_causes.late): a task deadline missed or timed
--   out, or a declared SLO threshold exceeded, with the time each cause took and the dominant one
--   (docs/LEDGER.md "slo_misses")
-- @column task_id: the attempt's task
-- @column client_status: as attempts.client_status (completed late, or timeout)
-- @column missed: as attempt_causes.missed
-- @column deadline_ms: the task's deadline (NULL when only an SLO threshold was missed)
-- @column done_since_reference_ms: as request_metrics.done_since_reference_ms
-- @column client_queue_ms: as attempt_causes.client_queue_ms
-- @column server_queue_ms: as attempt_causes.server_queue_ms
-- @column prefill_interference_ms: as attempt_causes.prefill_interference_ms
-- @column preemption_ms: as attempt_causes.preemption_ms
-- @column decode_stall_ms: as attempt_causes.decode_stall_ms
-- @column host_contention_ms: as attempt_causes.host_contention_ms
-- @column transport_ms: as attempt_causes.transport_ms
-- @column client_ms: as attempt_causes.client_ms
-- @column spec_rejected_ms: as attempt_causes.spec_rejected_ms
-- @column dominant_cause: as attempt_causes.dominant_cause
-- @column prefill_ms: as attempt_causes.prefill_ms
-- @column decode_ms: as attempt_causes.decode_ms
-- @column cause_evidence: as attempt_causes.cause_evidence
CREATE OR REPLACE TABLE slo_misses AS
SELECT getvariable('run_id') AS run_id, attempt_id, task_id, client_status, missed, deadline_ms,
       done_since_reference_ms, client_queue_ms, server_queue_ms, prefill_interference_ms, preemption_ms,
       decode_stall_ms, host_contention_ms, transport_ms, client_ms, spec_rejected_ms, dominant_cause,
       prefill_ms, decode_ms, cause_evidence
FROM attempt_causes WHERE late ORDER BY attempt_id;

-- @gaps: an attempt whose host contention is unknown (no steps, or a step holding it without contention_ms) or whose
--   client delay is unknown (no full trace of the client's event-loop lag).
CREATE OR REPLACE TEMP TABLE slo_misses_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO slo_misses_gaps
SELECT 'attempt', attempt_id, 'host_contention_ms',
       'step events with steps.contention_ms for every step holding the attempt (the engine thread''s run-queue wait)',
       'no step holding this attempt says how long it waited for a CPU: its host contention is unknown'
FROM attempt_causes WHERE late AND host_contention_ms IS NULL AND server_queue_ms IS NOT NULL
UNION ALL
SELECT 'attempt', attempt_id, 'client_ms, transport_ms',
       'a trace of every wake of the client''s event loop (samples client_loop_lag_ms, manifest client.loop_lag_trace_every = 1)',
       'the client''s own delay is unknown, so the client / server TTFT difference is all counted as transport'
FROM attempt_causes WHERE late AND client_ms IS NULL AND transport_ms IS NOT NULL;
