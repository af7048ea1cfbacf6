-- Stage 8: reconciliation, step attribution, SLO-miss causes and the run's goodput (docs/LEDGER.md).

-- Ghost load: server work after the client stopped waiting (same clock or mapped, by the clock rule).
CREATE OR REPLACE TEMP TABLE ghost AS
WITH gave_up AS (
  SELECT a.attempt_id, a.server_end_ns, a.server_clock, m.client_end.ns + c.offset_ns AS gave_up_ns  -- in the server's clock
  FROM attempts a JOIN marks m USING (attempt_id)
  JOIN clock_conv c ON c.from_clock = m.client_end.clock AND c.to_clock = a.server_clock
  WHERE a.client_status IN ('timeout', 'cancelled', 'error') AND a.server_end_ns IS NOT NULL
)
SELECT g.attempt_id, g.gave_up_ns, (g.server_end_ns - g.gave_up_ns) / 1e6 AS ghost_ms,
       -- tokens after the give-up on the same clock (the engine saw the attempt: none is a known 0)
       (SELECT CASE WHEN count(*) = 0 THEN 0 ELSE sum(t.value) END FROM ev_tok t
        WHERE t.attempt_id = g.attempt_id AND t.clock = g.server_clock AND t.ts_ns > g.gave_up_ns) AS ghost_tokens
FROM gave_up g WHERE g.server_end_ns > g.gave_up_ns;

-- KV holding: ∫M(t)dt per attempt, each physical block counted once. An attempt holds a block from
-- the kv.alloc / kv.prefix_hit that names it to its next kv.release (or to the copy-on-write that
-- replaced it); while several attempts hold one block, its bytes are split equally among them
-- (policy 'equal_split'), so the attempts' integrals add up to the physical total.
CREATE OR REPLACE TEMP TABLE kv_holds AS
WITH acq AS (
  SELECT attempt_id, ts_ns, clock, seq, event_id,
         unnest(from_json(coalesce(json_extract(attrs, '$.blocks'), '[]'), '["BIGINT"]')) AS block
  FROM ev WHERE name IN ('kv.alloc', 'kv.prefix_hit') AND attempt_id IS NOT NULL
), rel AS (
  SELECT attempt_id, ts_ns, clock FROM ev WHERE name = 'kv.release' AND attempt_id IS NOT NULL
), cow AS (
  SELECT attempt_id, ts_ns, clock, TRY_CAST(json_extract_string(pair, '$[0]') AS BIGINT) AS block
  FROM (SELECT attempt_id, ts_ns, clock, unnest(from_json(json_extract(attrs, '$.copy_on_write'), '["JSON"]')) AS pair
        FROM ev WHERE name = 'kv.alloc' AND json_extract(attrs, '$.copy_on_write') IS NOT NULL)
)
SELECT a.attempt_id, a.block, a.clock, a.ts_ns AS start_ns,
       least((SELECT min(r.ts_ns) FROM rel r WHERE r.attempt_id = a.attempt_id AND r.clock = a.clock AND r.ts_ns >= a.ts_ns),
             (SELECT min(c.ts_ns) FROM cow c WHERE c.attempt_id = a.attempt_id AND c.clock = a.clock AND c.block = a.block
                                              AND c.ts_ns > a.ts_ns))
         AS end_ns
FROM acq a;

CREATE OR REPLACE TEMP TABLE kv_integral AS
WITH last_on_clock AS (SELECT clock, max(ts_ns) AS last_ns FROM events GROUP BY clock),
holds AS (  -- a hold never released ends when the run closed: the last event on the hold's own clock
  SELECT h.attempt_id, h.block, h.start_ns, coalesce(h.end_ns, l.last_ns) AS end_ns
  FROM kv_holds h JOIN last_on_clock l USING (clock)
), pts AS (
  SELECT block, start_ns AS t FROM holds UNION SELECT block, end_ns FROM holds
), segs AS (
  SELECT block, t AS t0, lead(t) OVER (PARTITION BY block ORDER BY t) AS t1 FROM pts
), covered AS (
  SELECT s.block, s.t0, s.t1, h.attempt_id, count(*) OVER (PARTITION BY s.block, s.t0) AS holders
  FROM segs s JOIN holds h ON h.block = s.block AND h.start_ns <= s.t0 AND h.end_ns >= s.t1
  WHERE s.t1 IS NOT NULL AND s.t1 > s.t0
)
SELECT attempt_id, sum((t1 - t0) / holders) / 1e9 * getvariable('kv_block_bytes') / 2^30 AS kv_gib_s,
       sum(t1 - t0) / 1e9 AS block_s_unshared
FROM covered GROUP BY attempt_id;

CREATE OR REPLACE TEMP TABLE accounts_base AS SELECT * FROM accounts;
CREATE OR REPLACE TABLE accounts AS
SELECT a.*,
       -- KV events that show no block held (cancelled while queued: a release of none) are a known 0
       CASE WHEN k.kv_gib_s IS NOT NULL THEN k.kv_gib_s
            WHEN a.resource_status <> 'unknown' AND getvariable('kv_block_bytes') IS NOT NULL THEN 0.0 END AS kv_gib_s
FROM accounts_base a LEFT JOIN kv_integral k USING (attempt_id) ORDER BY a.attempt_id;

CREATE OR REPLACE TABLE reconciliation AS
WITH att AS (SELECT * FROM attempts a JOIN attempt_ids i USING (attempt_id)),
p AS (
  SELECT count(*) FILTER (WHERE client_status = 'completed') AS ok, count(*) FILTER (WHERE client_status IS NOT NULL) AS n
  FROM attempts
), per_request AS (
  SELECT request_id, count(*) AS n_attempts FROM attempts WHERE request_id IS NOT NULL GROUP BY request_id
), per_task AS (
  SELECT task_id, count(*) AS n_calls FROM attempts WHERE task_id IS NOT NULL GROUP BY task_id
), retries AS (
  SELECT max(max_attempts) - 1 AS r FROM contracts
)
SELECT getvariable('run_id') AS run_id,
  (SELECT count(*) FROM marks WHERE created IS NOT NULL) AS created,
  (SELECT count(*) FROM marks WHERE sent IS NOT NULL) AS sent,
  (SELECT count(*) FROM marks WHERE received IS NOT NULL OR enqueued IS NOT NULL) AS received,
  CASE WHEN p.n > 0 THEN (SELECT count(*) FROM attempts WHERE client_status = 'completed') END AS completed,
  CASE WHEN p.n > 0 THEN (SELECT count(*) FROM attempts WHERE client_status = 'cancelled') END AS cancelled,
  CASE WHEN p.n > 0 THEN (SELECT count(*) FROM attempts WHERE client_status = 'timeout') END AS timed_out,
  (SELECT count(*) FROM attempts WHERE server_status = 'rejected') AS rejected,
  CASE WHEN p.n > 0 THEN (SELECT count(*) FROM attempts WHERE client_status = 'error') END AS errored,
  (SELECT count(*) FROM attempts WHERE client_status = 'unterminated' OR server_status = 'unterminated') AS unterminated,
  (SELECT count(*) FROM attempts WHERE server_status = 'completed') AS server_completed,
  (SELECT count(*) FROM attempts WHERE server_status = 'cancelled') AS server_cancelled,
  -- ghost load needs the client's give-up time: unknown without client events, a known 0 without ghosts
  CASE WHEN p.n > 0 THEN (SELECT count(*) FROM ghost) END AS ghost_attempts,
  CASE WHEN p.n > 0 THEN (SELECT CASE WHEN count(*) = 0 THEN 0 ELSE sum(ghost_ms) END FROM ghost) END AS ghost_ms,
  CASE WHEN p.n > 0 THEN (SELECT CASE WHEN count(*) = 0 THEN 0 ELSE sum(ghost_tokens) END FROM ghost) END AS ghost_tokens,
  (SELECT sum(greatest(0, (least(h.end_ns, a.server_end_ns) - greatest(h.start_ns, g.gave_up_ns)))) / 1e9
          * getvariable('kv_block_bytes') / 2^30
   FROM kv_holds h JOIN ghost g USING (attempt_id) JOIN attempts a USING (attempt_id)) AS ghost_kv_gib_s,
  (SELECT avg(n_attempts) FROM per_request) AS attempts_per_request,
  (SELECT avg(n_calls) FROM per_task) AS calls_per_task,
  -- the measured probability that an attempt does not complete, and the retry formula's E[N]
  CASE WHEN p.n > 0 THEN 1 - p.ok / p.n END AS p_fail,
  (SELECT r FROM retries) AS max_retries,
  CASE WHEN p.n = 0 OR (SELECT r FROM retries) IS NULL THEN NULL
       WHEN p.ok = p.n THEN 1.0
       WHEN p.ok = 0 THEN (SELECT r FROM retries) + 1.0
       ELSE (1 - pow(1 - p.ok / p.n, (SELECT r FROM retries) + 1)) / (p.ok / p.n) END AS expected_attempts_per_request
FROM p;

-- Step attribution: each engine step's time is charged to the attempts in its batch in proportion to
-- the tokens each processed in that step (policy 'by_tokens'); shares add up to the step's time.
CREATE OR REPLACE TEMP TABLE steps AS
SELECT s.step_id, s.ts_ns AS start_ns, e.ts_ns AS end_ns, (e.ts_ns - s.ts_ns) / 1e6 AS step_ms, s.attrs AS start_attrs
FROM ev s JOIN ev e ON e.step_id = s.step_id AND e.name = 'step.end' AND e.clock = s.clock
WHERE s.name = 'step.start';

CREATE OR REPLACE TABLE step_attribution AS
WITH items AS (
  SELECT st.step_id, st.step_ms, unnest(from_json(json_extract(st.start_attrs, '$.batch'), '[["JSON"]]')) AS item
  FROM steps st WHERE json_extract(st.start_attrs, '$.batch') IS NOT NULL
), parsed AS (
  SELECT step_id, step_ms, json_extract_string(item[1], '$') AS attempt_id, json_extract_string(item[2], '$') AS kind,
         TRY_CAST(json_extract_string(item[3], '$') AS DOUBLE) AS tokens
  FROM items
)
SELECT getvariable('run_id') AS run_id, step_id, attempt_id, kind, tokens, step_ms,
       step_ms * tokens / nullif(sum(tokens) OVER (PARTITION BY step_id), 0) AS share_ms, 'by_tokens' AS policy
FROM parsed
ORDER BY step_id, attempt_id;

-- SLO misses: attempts of a task with a deadline that finished late or timed out, with the time each
-- cause took (ms) and the dominant one.
CREATE OR REPLACE TABLE slo_misses AS
WITH missed AS (
  SELECT a.attempt_id, a.task_id, a.client_status, r.done_since_reference_ms, c.deadline_ms, r.queue_ms,
         r.prefill_ms, r.e2e_client_ms, r.e2e_server_ms, r.uplink_ms
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
    JOIN (SELECT attempt_id, median(gap_ms) AS m FROM tok_gaps GROUP BY 1) med USING (attempt_id)
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
       client_queue_ms, server_queue_ms, prefill_interference_ms, decode_stall_ms, preemption_ms, transfer_client_ms,
       CASE WHEN client_queue_ms IS NULL OR server_queue_ms IS NULL OR prefill_interference_ms IS NULL
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
            ELSE 'transfer_client' END END AS dominant_cause
FROM causes ORDER BY attempt_id;

-- The run's observation window, on ONE clock: from the first planned arrival or client event to the
-- last client terminal event (else the last server end); an engine-only run uses the first
-- engine.enqueued instead. The window's clock is the one most of its start events use; every other
-- point is converted by the clock rule, or left out with a gap (never compared across clocks raw).
CREATE OR REPLACE TEMP TABLE window_points AS
WITH client AS (  -- with client events the window opens at a client start, or is unknown
  SELECT EXISTS (SELECT 1 FROM attempt_ids WHERE n_client_events > 0)
         OR EXISTS (SELECT 1 FROM ev WHERE name IN ('arrival.planned', 'attempt.created', 'attempt.sent')) AS yes,
         EXISTS (SELECT 1 FROM marks WHERE client_end IS NOT NULL) AS ended
), pts AS (
  SELECT 'start' AS side, ts_ns, clock, event_id FROM ev
  WHERE name IN ('arrival.planned', 'attempt.created', 'attempt.sent')
  UNION ALL SELECT 'start', enqueued.ns, enqueued.clock, enqueued.eid FROM marks
  WHERE enqueued IS NOT NULL AND NOT (SELECT yes FROM client)
  UNION ALL SELECT 'end', client_end.ns, client_end.clock, client_end.eid FROM marks WHERE client_end IS NOT NULL
  UNION ALL SELECT 'end', server_end.ns, server_end.clock, server_end.eid FROM marks
  WHERE server_end IS NOT NULL AND NOT (SELECT ended FROM client)
), ref AS (
  SELECT clock FROM pts WHERE side = 'start' GROUP BY clock ORDER BY count(*) DESC, clock LIMIT 1
)
SELECT p.side, p.ts_ns, p.clock, p.event_id, ref.clock AS ref_clock, p.ts_ns + c.offset_ns AS t,
       c.from_clock IS NULL AS dropped
FROM pts p CROSS JOIN ref LEFT JOIN clock_conv c ON c.from_clock = p.clock AND c.to_clock = ref.clock;

CREATE OR REPLACE TEMP TABLE window_bounds AS
-- a point left out could be the first start or the last end: the window is then unknown, not shorter
SELECT (SELECT CASE WHEN bool_or(dropped) THEN NULL ELSE min(t) END FROM window_points WHERE side = 'start') AS t0,
       (SELECT CASE WHEN bool_or(dropped) THEN NULL ELSE max(t) END FROM window_points WHERE side = 'end') AS t1,
       (SELECT any_value(ref_clock) FROM window_points) AS clock,
       CASE WHEN NOT EXISTS (SELECT 1 FROM ev WHERE name IN ('arrival.planned', 'attempt.created', 'attempt.sent'))
                 AND NOT EXISTS (SELECT 1 FROM attempt_ids WHERE n_client_events > 0)
            THEN 'first engine.enqueued → last server end (no client events)'
            WHEN NOT EXISTS (SELECT 1 FROM marks WHERE client_end IS NOT NULL)
            THEN 'first arrival or client event → last server end (no client terminal event)'
            ELSE 'first arrival or client event → last client terminal' END AS label,
       EXISTS (SELECT 1 FROM attempt_ids WHERE n_client_events > 0) AS has_client;

-- Energy over the observation window, from raw counters (docs/ENERGY.md). Each counter sample is
-- placed in the window's clock by the clock rule; RAPL deltas unwrap at max_energy_range_uj; an NVML
-- counter that goes down (driver reload) invalidates its device's window.
CREATE OR REPLACE TEMP TABLE counter_deltas AS
WITH s AS (
  SELECT sm.metric, sm.device, sm.ts_ns + c.offset_ns AS t, sm.value,
         lag(sm.value) OVER w AS prev, lag(sm.ts_ns + c.offset_ns) OVER w AS prev_t
  FROM samples sm JOIN window_bounds wb ON true
  JOIN clock_conv c ON c.from_clock = sm.clock AND c.to_clock = wb.clock
  WHERE sm.metric IN ('gpu_energy_mj', 'cpu_package_energy_uj', 'cpu_dram_energy_uj')
  WINDOW w AS (PARTITION BY sm.metric, sm.device ORDER BY sm.ts_ns)
), ranges AS (
  SELECT device, max(value) AS max_range FROM samples WHERE metric = 'rapl_max_energy_range_uj' GROUP BY device
)
SELECT s.metric, s.device, s.prev_t, s.t,
       CASE WHEN s.value >= s.prev THEN s.value - s.prev
            WHEN s.metric LIKE 'cpu_%' AND r.max_range IS NOT NULL THEN r.max_range - s.prev + s.value END AS delta,
       s.value < s.prev AS went_down
FROM s LEFT JOIN ranges r USING (device)
WHERE s.prev IS NOT NULL;

-- Window energy (J) per metric. A counter only says what was spent between two samples, so a delta
-- is spread evenly over its interval: the part of it inside the window counts (a delta straddling an
-- edge is apportioned by the time it overlaps, i.e. the counter is interpolated at the edge), the
-- part before the window feeds the idle power. The idle term is that power times the time the window
-- energy covers, so both terms stand on the same time base.
CREATE OR REPLACE TEMP TABLE window_energy AS
WITH d AS (
  SELECT d.*, d.t - d.prev_t AS dur,
         greatest(least(d.t, wb.t1) - greatest(d.prev_t, wb.t0), 0) AS inside_ns,
         greatest(least(d.t, wb.t0) - d.prev_t, 0) AS before_ns,
         wb.t0, wb.t1, CASE WHEN d.metric = 'gpu_energy_mj' THEN 1e3 ELSE 1e6 END AS per_j
  FROM counter_deltas d, window_bounds wb
)
SELECT metric,
       count(DISTINCT device) AS devices,
       sum(delta * inside_ns / nullif(dur, 0)) FILTER (WHERE inside_ns > 0) / any_value(per_j) AS energy_j,
       bool_or(went_down AND metric = 'gpu_energy_mj' AND t >= t0 AND prev_t <= t1)
         OR bool_or(delta IS NULL AND t >= t0 AND prev_t <= t1) AS invalid,
       -- per device the covered time is the same; the window's is that of one device
       sum(inside_ns) / nullif(count(DISTINCT device), 0) AS covered_ns,
       sum(delta * before_ns / nullif(dur, 0)) FILTER (WHERE before_ns > 0)
         / nullif(sum(before_ns) FILTER (WHERE before_ns > 0), 0) * count(DISTINCT device)
         * 1e9 / any_value(per_j) AS idle_w
FROM d
GROUP BY metric;

CREATE OR REPLACE TEMP TABLE power_check AS
WITH p AS (
  SELECT sm.ts_ns + c.offset_ns AS t, sm.value, sm.device,
         lag(sm.ts_ns + c.offset_ns) OVER (PARTITION BY sm.device ORDER BY sm.ts_ns) AS prev_t,
         lag(sm.value) OVER (PARTITION BY sm.device ORDER BY sm.ts_ns) AS prev
  FROM samples sm JOIN window_bounds wb ON true JOIN clock_conv c ON c.from_clock = sm.clock AND c.to_clock = wb.clock
  WHERE sm.metric = 'gpu_power_instant_mw'
), clipped AS (  -- each segment cut to the window, the power interpolated linearly at a cut
  SELECT greatest(p.prev_t, wb.t0) AS a, least(p.t, wb.t1) AS b, p.prev, p.value, p.prev_t, p.t
  FROM p, window_bounds wb WHERE p.prev_t IS NOT NULL AND p.t > p.prev_t AND p.t > wb.t0 AND p.prev_t < wb.t1
)
SELECT sum(((prev + (value - prev) * (a - prev_t) / (t - prev_t)) + (prev + (value - prev) * (b - prev_t) / (t - prev_t)))
           / 2 * (b - a)) / 1e12 AS gpu_power_integrated_j  -- mW x ns -> J
FROM clipped;

-- A run without client events has no client-side count: its client figures are NULL (one run gap in
-- 90_gaps.sql), not 0. Every rate divides by t_obs_s through nullif: a zero-length window is unknown.
CREATE OR REPLACE TABLE run_metrics AS
WITH win AS (SELECT *, nullif((t1 - t0) / 1e9, 0) AS t_div FROM window_bounds), counts AS (
  SELECT CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) FILTER (WHERE good) END AS n_good,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) FILTER (WHERE client_status = 'completed') END AS n_completed,
         count(*) FILTER (WHERE good IS NULL) AS n_unjudged
  FROM request_metrics JOIN attempts USING (attempt_id)
), little AS (
  SELECT CASE WHEN (SELECT has_client FROM window_bounds) THEN sum(client_span_ms) / 1e3 END AS busy_s,
         avg(client_span_ms) / 1e3 AS w_s,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) END AS n
  FROM request_metrics WHERE client_span_ms IS NOT NULL
), arrivals AS (
  SELECT count(DISTINCT task_id) AS n FROM ev WHERE name = 'arrival.planned'
), engine AS (
  SELECT sum(step_ms) / 1e3 AS busy_s FROM steps
), tok AS (
  -- token throughput over the attempts the client saw complete (the peers' denominator); a sum over
  -- attempts of which any count is unknown is unknown
  -- (no completed attempt is a known 0 only where the client was watched)
  SELECT CASE WHEN NOT (SELECT has_client FROM window_bounds) THEN NULL WHEN count(*) = 0 THEN 0
              WHEN count(*) = count(a.n_output_tokens) THEN sum(a.n_output_tokens) END AS output_tokens,
         -- prompt tokens: the engine's count, else the usage the client received (a black-box run)
         CASE WHEN NOT (SELECT has_client FROM window_bounds) THEN NULL WHEN count(*) = 0 THEN 0
              WHEN count(*) = count(coalesce(p.prompt, m.n_prompt_usage)) THEN sum(coalesce(p.prompt, m.n_prompt_usage)) END AS prompt_tokens,
         CASE WHEN NOT (SELECT has_client FROM window_bounds) THEN NULL WHEN count(*) = 0 THEN 0
              WHEN count(*) = count(p.prompt) THEN sum(coalesce(p.cached, 0)) END AS prompt_tokens_cached,
         CASE WHEN NOT (SELECT has_client FROM window_bounds) THEN NULL WHEN count(*) = 0 THEN 0
              WHEN count(*) = count(p.prompt) THEN sum(coalesce(p.computed, 0)) END AS prefill_tokens_computed,
         count(*) AS n
  FROM attempts a JOIN marks m USING (attempt_id) LEFT JOIN (
    SELECT attempt_id, max(value) FILTER (WHERE name = 'engine.enqueued') AS prompt,
           sum(TRY_CAST(json_extract_string(attrs, '$.cached_tokens') AS BIGINT)) FILTER (WHERE name = 'engine.prefill') AS cached,
           sum(value) FILTER (WHERE name = 'engine.prefill') AS computed
    FROM ev WHERE name IN ('engine.enqueued', 'engine.prefill') GROUP BY attempt_id) p USING (attempt_id)
  WHERE a.client_status = 'completed'
)
SELECT getvariable('run_id') AS run_id,
  (win.t1 - win.t0) / 1e9 AS t_obs_s, win.label AS window,
  counts.n_good, counts.n_completed, counts.n_unjudged,
  counts.n_good / win.t_div AS goodput_rps,
  -- the vLLM-bench variant: completed requests within TTFT / TPOT / E2E thresholds (TPOT 0 when n <= 1)
  CASE WHEN coalesce(getvariable('slo_ttft_ms'), getvariable('slo_tpot_ms'), getvariable('slo_e2e_ms')) IS NOT NULL THEN
    (SELECT count(*) FROM request_metrics r JOIN attempts a USING (attempt_id)
     WHERE a.client_status = 'completed'
       AND (getvariable('slo_ttft_ms') IS NULL OR r.ttft_client_ms <= getvariable('slo_ttft_ms'))
       AND (getvariable('slo_tpot_ms') IS NULL OR coalesce(r.tpot_ms, 0) <= getvariable('slo_tpot_ms'))
       AND (getvariable('slo_e2e_ms') IS NULL OR r.e2e_client_ms <= getvariable('slo_e2e_ms')))
    / win.t_div END AS vllm_goodput_rps,
  getvariable('slo_ttft_ms') AS slo_ttft_ms, getvariable('slo_tpot_ms') AS slo_tpot_ms,
  getvariable('slo_e2e_ms') AS slo_e2e_ms,
  counts.n_completed / win.t_div AS completed_rps,
  tok.output_tokens::BIGINT AS output_tokens, tok.output_tokens / win.t_div AS output_tok_s,
  tok.prompt_tokens::BIGINT AS prompt_tokens, tok.prompt_tokens_cached::BIGINT AS prompt_tokens_cached,
  tok.prefill_tokens_computed::BIGINT AS prefill_tokens_computed,
  -- the peers' "total token throughput" counts every prompt token, cached or not; computed_tok_s counts
  -- what the engine computed (prefill chunks, recomputation included, and output tokens)
  (tok.prompt_tokens + tok.output_tokens) / win.t_div AS total_tok_s,
  (tok.prefill_tokens_computed + tok.output_tokens) / win.t_div AS computed_tok_s,
  -- Little's law: mean number in system (time-averaged) against arrival rate × mean time in system
  little.busy_s / win.t_div AS mean_in_system,
  little.n / win.t_div AS arrival_rps,
  little.w_s AS mean_time_in_system_s,
  arrivals.n AS planned_arrivals,
  engine.busy_s AS engine_busy_s,
  CASE WHEN counts.n_good > 0 THEN engine.busy_s / counts.n_good END AS engine_s_per_good,
  gpu.energy_j AS energy_gpu_j, cpu.energy_j AS energy_cpu_j, dram.energy_j AS energy_dram_j,
  gpu.idle_w * gpu.covered_ns / 1e9 AS idle_gpu_j, cpu.idle_w * cpu.covered_ns / 1e9 AS idle_cpu_j,
  (SELECT gpu_power_integrated_j FROM power_check) AS gpu_power_integrated_j,
  gpu.covered_ns < 100e6 AS gpu_window_short,  -- shorter than the NVML counter's ~100 ms update period
  CASE WHEN gpu.energy_j IS NULL AND cpu.energy_j IS NULL THEN NULL
       WHEN gpu.energy_j IS NOT NULL AND cpu.energy_j IS NOT NULL THEN 'gpu+cpu_package'
       WHEN gpu.energy_j IS NOT NULL THEN 'gpu' ELSE 'cpu_package' END AS energy_scope,
  CASE WHEN counts.n_good > 0 AND coalesce(gpu.energy_j, cpu.energy_j) IS NOT NULL
       THEN (coalesce(gpu.energy_j, 0) + coalesce(cpu.energy_j, 0)) / counts.n_good END AS energy_per_good_j,
  CASE WHEN counts.n_good > 0 THEN gpu.energy_j / counts.n_good END AS energy_gpu_per_good_j,
  CASE WHEN counts.n_good > 0 THEN cpu.energy_j / counts.n_good END AS energy_cpu_per_good_j,
  CASE WHEN counts.n_good > 0 THEN (SELECT sum(value) / 1e3 FROM ev WHERE name = 'device.step') / counts.n_good
       END AS gpu_s_per_good,
  (SELECT sum(kv_gib_s) FROM kv_integral) AS kv_gib_s,
  (SELECT sum(share_ms) FROM step_attribution) AS attributed_step_ms,
  (SELECT sum(step_ms) FROM steps WHERE step_id IN (SELECT step_id FROM step_attribution)) AS attributed_steps_total_ms
FROM win, counts, little, arrivals, engine, tok
LEFT JOIN (SELECT * FROM window_energy WHERE metric = 'gpu_energy_mj' AND NOT invalid) gpu ON true
LEFT JOIN (SELECT * FROM window_energy WHERE metric = 'cpu_package_energy_uj' AND NOT invalid) cpu ON true
LEFT JOIN (SELECT * FROM window_energy WHERE metric = 'cpu_dram_energy_uj' AND NOT invalid) dram ON true;

-- Each attempt's share of the window's energy: the window total split by its share of engine step time
-- (itself split by tokens processed per step), so the shares add up to the total.
CREATE OR REPLACE TABLE energy_shares AS
WITH busy AS (SELECT attempt_id, sum(share_ms) AS ms FROM step_attribution GROUP BY attempt_id),
tot AS (SELECT sum(ms) AS ms FROM busy)
SELECT getvariable('run_id') AS run_id, b.attempt_id, b.ms / nullif(tot.ms, 0) AS fraction,
       r.energy_gpu_j * b.ms / nullif(tot.ms, 0) AS gpu_j, r.energy_cpu_j * b.ms / nullif(tot.ms, 0) AS cpu_j
FROM busy b, tot, run_metrics r
WHERE r.energy_gpu_j IS NOT NULL OR r.energy_cpu_j IS NOT NULL
ORDER BY b.attempt_id;

-- Ghost joules: the window energy charged (by step-time shares) to ghost attempts in steps that
-- started after their client gave up. NULL when the window's energy is unknown.
CREATE OR REPLACE TEMP TABLE reconciliation_base AS SELECT * FROM reconciliation;
CREATE OR REPLACE TABLE reconciliation AS
WITH ghost_ms AS (
  SELECT sum(sa.share_ms) AS ms FROM step_attribution sa JOIN ghost g USING (attempt_id)
  JOIN steps st USING (step_id) WHERE st.start_ns >= g.gave_up_ns
), all_ms AS (SELECT sum(share_ms) AS ms FROM step_attribution)
SELECT r.*,
       (coalesce(m.energy_gpu_j, 0) + coalesce(m.energy_cpu_j, 0)) * coalesce(gm.ms, 0) / nullif(am.ms, 0)
         * CASE WHEN coalesce(m.energy_gpu_j, m.energy_cpu_j) IS NULL THEN NULL ELSE 1 END AS ghost_energy_j
FROM reconciliation_base r, run_metrics m, ghost_ms gm, all_ms am;
