-- The run's observation window, on ONE clock: from the first planned arrival or client event to the
-- last client terminal event (else the last server end); an engine-only run uses the first
-- engine.enqueued instead. The window's clock is the one most of its start events use; every other
-- point is converted by the clock rule, or left out with a gap (never compared across clocks raw).
--
-- scope: rollup
-- reads: attempt_ids, window_starts, marks, clock_conv
-- creates: window_points, window_bounds, window_gaps
CREATE OR REPLACE TEMP TABLE window_points AS
WITH client AS (  -- with client events the window opens at a client start, or is unknown
  SELECT EXISTS (SELECT 1 FROM attempt_ids WHERE client_attempt)
         OR EXISTS (SELECT 1 FROM window_starts) AS yes,
         EXISTS (SELECT 1 FROM marks WHERE client_end IS NOT NULL) AS ended
), pts AS (
  SELECT 'start' AS side, ts_ns, clock, event_id FROM window_starts
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
       CASE WHEN NOT EXISTS (SELECT 1 FROM window_starts)
                 AND NOT EXISTS (SELECT 1 FROM attempt_ids WHERE client_attempt)
            THEN 'first engine.enqueued → last server end (no client events)'
            WHEN NOT EXISTS (SELECT 1 FROM marks WHERE client_end IS NOT NULL)
            THEN 'first arrival or client event → last server end (no client terminal event)'
            ELSE 'first arrival or client event → last client terminal' END AS label,
       EXISTS (SELECT 1 FROM attempt_ids WHERE client_attempt) AS has_client;

-- @gaps: a window of zero length, without a start or an end, or with points no mapping brings to its clock.
CREATE OR REPLACE TEMP TABLE window_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO window_gaps
SELECT 'run', NULL, 'goodput_rps, completed_rps, vllm_goodput_rps, output_tok_s, total_tok_s, computed_tok_s, '
                  || 'attempted_rps, arrival_rps, mean_in_system, little_rel_err, server_in_system, server_attempted_rps, '
                  || 'server_little_rel_err, client_transport_in_system',
       'a window of positive length (events spread over time)',
       'the observation window has zero length: every rate over it is unknown'
FROM window_bounds WHERE t1 = t0
UNION ALL
SELECT 'run', NULL, 't_obs_s and every rate over the observation window',
       'a start (arrival.planned, attempt.created or attempt.sent; engine.enqueued without a client) and an end (a terminal event)',
       format('the observation window has no {} event', CASE WHEN t0 IS NULL THEN 'start' ELSE 'end' END)
FROM window_bounds WHERE (t0 IS NULL OR t1 IS NULL) AND EXISTS (SELECT 1 FROM attempt_ids)
  AND NOT EXISTS (SELECT 1 FROM window_points WHERE dropped)
UNION ALL
SELECT 'clock', NULL, 't_obs_s and every rate over the observation window',
       format('a clock.map between {} and {}', clock, any_value(ref_clock)),
       format('{} window point(s) left out (first {}): {} cannot be compared with the window''s clock {}',
              count(*), min(event_id), clock, any_value(ref_clock))
FROM window_points WHERE dropped GROUP BY clock;
