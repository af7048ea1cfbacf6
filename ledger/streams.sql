-- Each attempt rebuilt per stream, intervals labelled, double counting detected (docs/LEDGER.md
-- "intervals and stream_checks").
--
-- scope: task
-- reads: marks, ev, ev_tok, clock_conv, figures, point_of, attempt_ids
-- creates: ms_raw, spans_raw, stream_clock, stream_points, span_iv, cuts, ms_state, stream_segs, state_iv,
--          span_off, intervals, stream_checks, streams_gaps

-- Milestones and the state each one starts (NULL state = the stream's end).
CREATE OR REPLACE TEMP TABLE ms_raw AS
WITH m AS (SELECT * FROM marks),
engine_seq AS (
  -- engine milestones: every scheduled, the first token after each (re)schedule, every preemption, every enqueue
  SELECT attempt_id, name, ts_ns, clock, event_id, seq,
         last_value(CASE WHEN name IN ('engine.scheduled', 'engine.token', 'engine.preempted') THEN name END IGNORE NULLS)
             OVER (PARTITION BY attempt_id ORDER BY ts_ns, seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_name,
         count(*) FILTER (WHERE name = 'engine.preempted')
             OVER (PARTITION BY attempt_id ORDER BY ts_ns, seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS preempted_before
  FROM (SELECT attempt_id, name, ts_ns, clock, event_id, seq FROM ev
        WHERE name IN ('engine.enqueued', 'engine.scheduled', 'engine.preempted',
                       'engine.cancel_received', 'engine.cancel_effective', 'engine.finished')
        UNION ALL SELECT attempt_id, 'engine.token', ts_ns, clock, event_id, seq FROM ev_tok)
  WHERE attempt_id IS NOT NULL
), engine_ms AS (
  SELECT attempt_id, 'engine' AS stream, ts_ns, clock, event_id,
         -- a preempted attempt put back in the waiting queue is still preempted: its wait to be admitted
         -- again is the preemption's, not a queue (the queue is the wait before its first admission)
         CASE name WHEN 'engine.enqueued' THEN CASE WHEN preempted_before > 0 THEN 'preempted' ELSE 'queue' END
                   WHEN 'engine.scheduled' THEN CASE WHEN preempted_before > 0 THEN 'recompute' ELSE 'prefill' END
                   WHEN 'engine.token' THEN 'decode'
                   WHEN 'engine.preempted' THEN 'preempted'
                   WHEN 'engine.cancel_received' THEN 'cancelling'
                   WHEN 'engine.cancel_effective' THEN 'releasing' END AS state,
         CASE name WHEN 'engine.enqueued' THEN 1 WHEN 'engine.scheduled' THEN 2 WHEN 'engine.token' THEN 3
                   WHEN 'engine.preempted' THEN 4 WHEN 'engine.cancel_received' THEN 5
                   WHEN 'engine.cancel_effective' THEN 6 ELSE 7 END AS prio
  FROM engine_seq
  WHERE name <> 'engine.token' OR prev_name IS DISTINCT FROM 'engine.token'
), fixed AS (
  SELECT attempt_id, stream, p.ns AS ts_ns, p.clock, p.eid AS event_id, state, prio FROM (
    SELECT attempt_id, 'client' AS stream, created AS p, 'client_queue' AS state, 1 AS prio FROM m
    UNION ALL SELECT attempt_id, 'client', sent, 'await_first_byte', 2 FROM m
    UNION ALL SELECT attempt_id, 'client', first_byte, 'await_first_content', 3 FROM m
    UNION ALL SELECT attempt_id, 'client', first_content, 'await_first_visible', 4 FROM m
    UNION ALL SELECT attempt_id, 'client', first_visible, 'stream', 5 FROM m
    UNION ALL SELECT attempt_id, 'client', point_of(client_end), NULL, 6 FROM m
    UNION ALL SELECT attempt_id, 'server', received, 'front_end', 1 FROM m
    UNION ALL SELECT attempt_id, 'server', enqueued, 'queue', 2 FROM m
    UNION ALL SELECT attempt_id, 'server', scheduled, 'prefill', 3 FROM m
    UNION ALL SELECT attempt_id, 'server', prefill_end, 'sample', 4 FROM m
    UNION ALL SELECT attempt_id, 'server', first_token, 'await_first_write', 5 FROM m
    UNION ALL SELECT attempt_id, 'server', first_write, 'stream', 6 FROM m
    UNION ALL SELECT attempt_id, 'server', point_of(finished), 'finalize', 7 FROM m
    UNION ALL SELECT attempt_id, 'server', server_end, NULL, 8 FROM m
  ) WHERE p.ns IS NOT NULL
)
SELECT * FROM fixed
UNION ALL SELECT * FROM engine_ms;

-- Explicit spans, paired in order per attempt, stream and span name.
CREATE OR REPLACE TEMP TABLE spans_raw AS
WITH s AS (
  SELECT attempt_id, span_stream AS stream, span_name AS span, name, ts_ns, clock, event_id, seq,
         row_number() OVER (PARTITION BY attempt_id, span_stream, span_name, name ORDER BY ts_ns, seq) AS k
  FROM ev WHERE name IN ('span.start', 'span.end') AND attempt_id IS NOT NULL
)
SELECT st.attempt_id, st.stream, st.span, st.k,
       st.ts_ns AS start_ns, st.clock AS start_clock, st.event_id AS start_eid, st.seq AS start_seq,
       en.ts_ns AS end_ns, en.clock AS end_clock, en.event_id AS end_eid
FROM s st LEFT JOIN s en
  ON en.name = 'span.end' AND en.attempt_id = st.attempt_id AND en.stream = st.stream
 AND en.span = st.span AND en.k = st.k
WHERE st.name = 'span.start';

-- Each stream keeps the clock of its first-listed milestone (else of its first span); other points
-- are converted by the clock rule or dropped (and registered as a gap in stage 7).
CREATE OR REPLACE TEMP TABLE stream_clock AS
SELECT attempt_id, stream, arg_min(clock, (pri, ts_ns, clock)) AS clock FROM (
  SELECT attempt_id, stream, clock, prio AS pri, ts_ns FROM ms_raw
  UNION ALL SELECT attempt_id, stream, start_clock, 100, start_ns FROM spans_raw
) GROUP BY attempt_id, stream;

CREATE OR REPLACE TEMP TABLE stream_points AS
SELECT r.attempt_id, r.stream, r.ts_ns + c.offset_ns AS t, r.event_id, r.state, r.prio, c.eps_ns, sc.clock,
       r.clock <> sc.clock AS conv
FROM ms_raw r JOIN stream_clock sc USING (attempt_id, stream)
JOIN clock_conv c ON c.from_clock = r.clock AND c.to_clock = sc.clock;

CREATE OR REPLACE TEMP TABLE span_iv AS
SELECT r.attempt_id, r.stream, r.span, r.k, r.start_eid, r.end_eid, r.start_seq, sc.clock,
       r.start_ns + c1.offset_ns AS t0, r.end_ns + c2.offset_ns AS t1, c1.eps_ns + c2.eps_ns AS eps_ns,
       (r.start_clock <> sc.clock OR r.end_clock <> sc.clock) AS conv
FROM spans_raw r JOIN stream_clock sc USING (attempt_id, stream)
JOIN clock_conv c1 ON c1.from_clock = r.start_clock AND c1.to_clock = sc.clock
JOIN clock_conv c2 ON c2.from_clock = r.end_clock AND c2.to_clock = sc.clock
WHERE r.end_ns IS NOT NULL;

-- Cut points: milestones and span boundaries; the event named at a point prefers a milestone.
CREATE OR REPLACE TEMP TABLE cuts AS
SELECT attempt_id, stream, t, arg_max(event_id, (pri, event_id)) AS event_id, max(eps_ns) AS eps_ns, bool_or(conv) AS conv FROM (
  SELECT attempt_id, stream, t, event_id, prio + 10 AS pri, eps_ns, conv FROM stream_points
  UNION ALL SELECT attempt_id, stream, t0, start_eid, 1, eps_ns, conv FROM span_iv
  UNION ALL SELECT attempt_id, stream, t1, end_eid, 0, eps_ns, conv FROM span_iv
) GROUP BY attempt_id, stream, t;

CREATE OR REPLACE TEMP TABLE ms_state AS
SELECT attempt_id, stream, t, arg_max(state, (prio, state)) AS state FROM stream_points GROUP BY attempt_id, stream, t;

CREATE OR REPLACE TEMP TABLE stream_segs AS
WITH c AS (  -- each cut, with the state of the milestone at it where there is one (a NULL state is one too)
  SELECT c.*, CASE WHEN st.t IS NOT NULL THEN {'state': st.state} END AS at_state
  FROM cuts c LEFT JOIN ms_state st USING (attempt_id, stream, t)
), s AS (
  -- a segment runs from each cut to the next, in the state of the last milestone at or before its start
  -- (every milestone is a cut: a running last value, not a join per segment)
  SELECT attempt_id, stream, t AS t0, event_id AS start_eid, eps_ns AS eps0, conv AS conv0,
         lead(t) OVER w AS t1, lead(event_id) OVER w AS end_eid, lead(eps_ns) OVER w AS eps1, lead(conv) OVER w AS conv1,
         (last_value(at_state IGNORE NULLS) OVER (PARTITION BY attempt_id, stream ORDER BY t
                                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)).state AS state
  FROM c WINDOW w AS (PARTITION BY attempt_id, stream ORDER BY t)
), cov AS (
  SELECT s.attempt_id, s.stream, s.t0, count(span_iv.span) AS n_cover
  FROM s LEFT JOIN span_iv ON span_iv.attempt_id = s.attempt_id AND span_iv.stream = s.stream AND span_iv.t0 <= s.t0 AND span_iv.t1 >= s.t1
  WHERE s.t1 IS NOT NULL GROUP BY ALL
)
SELECT s.* EXCLUDE (state), cov.n_cover > 0 AS covered, s.state
FROM s JOIN cov USING (attempt_id, stream, t0)
WHERE s.t1 IS NOT NULL;

-- Consecutive uncovered segments of one state become one interval.
CREATE OR REPLACE TEMP TABLE state_iv AS
WITH f AS (
  SELECT *, CASE WHEN covered OR lag(covered) OVER w OR state IS DISTINCT FROM lag(state) OVER w
                 OR lag(t1) OVER w IS NULL THEN 1 ELSE 0 END AS brk
  FROM stream_segs WINDOW w AS (PARTITION BY attempt_id, stream ORDER BY t0)
), g AS (
  SELECT *, sum(brk) OVER (PARTITION BY attempt_id, stream ORDER BY t0) AS island FROM f WHERE NOT covered
)
SELECT attempt_id, stream, coalesce(state, 'unattributed') AS name, state IS NULL AS unattributed,
       min(t0) AS t0, max(t1) AS t1, arg_min(start_eid, t0) AS start_eid, arg_max(end_eid, t1) AS end_eid,
       arg_min(eps0, t0) + arg_max(eps1, t1) AS eps_ns, arg_min(conv0, t0) OR arg_max(conv1, t1) AS conv
FROM g GROUP BY attempt_id, stream, island, state;

-- Overlapping spans: the contained one (or the later-starting one) leaves the path.
CREATE OR REPLACE TEMP TABLE span_off AS
SELECT b.attempt_id, b.stream, b.start_eid, string_agg(a.span, ', ' ORDER BY a.t0, a.span, a.start_eid) AS overlaps_with
FROM span_iv a JOIN span_iv b ON a.attempt_id = b.attempt_id AND a.stream = b.stream AND a.start_eid <> b.start_eid
 AND a.t0 < b.t1 AND b.t0 < a.t1
 AND ((a.t0 <= b.t0 AND b.t1 <= a.t1 AND NOT (b.t0 <= a.t0 AND a.t1 <= b.t1))   -- b strictly inside a
      OR (a.t0 = b.t0 AND a.t1 = b.t1 AND a.start_seq < b.start_seq)          -- registered twice
      OR (NOT (a.t0 <= b.t0 AND b.t1 <= a.t1) AND NOT (b.t0 <= a.t0 AND a.t1 <= b.t1) AND a.t0 < b.t0))
GROUP BY ALL;

-- @table intervals: one row per interval of an attempt's stream: explicit spans, the states between
--   milestones, unattributed time and the link figures (docs/LEDGER.md "intervals and stream_checks")
-- @column stream: client, server, engine, link, or a stream an explicit span names
-- @column name: the span's name, the state's (queue, prefill, decode, await_first_byte, ...),
--   unattributed, or the link figure (uplink, downlink_first)
-- @column kind: span, state, unattributed or link
-- @column start_event: the event id where it starts
-- @column end_event: the event id where it ends
-- @column clock: the stream's clock (the clock of its first-listed milestone)
-- @column start_ns: start, ns on clock (NULL for an unknown link)
-- @column end_ns: end, ns on clock
-- @column dur_ms: end_ns − start_ns
-- @column eps_ms: its ± ms (the mappings' epsilons of converted points)
-- @column label: measured (one clock), derived (a point converted by a mapping), simulated (on a sim:
--   clock: a simulated run's), unknown (a link across clocks no mapping joins)
-- @column on_path: registered on the stream's path: false for unattributed time, an unknown link, and a
--   span contained in another, or the later-starting of two that overlap
-- @column overlaps_with: the spans an off-path span overlaps
-- @column replica_id: as attempts.replica_id: the replica that served its attempt (NULL with one server)
CREATE OR REPLACE TABLE intervals AS
WITH iv_rows AS (
  SELECT s.attempt_id, s.stream, s.span AS name, 'span' AS kind, s.start_eid AS start_event, s.end_eid AS end_event,
         s.clock, s.t0 AS start_ns, s.t1 AS end_ns, s.eps_ns, s.conv, o.start_eid IS NULL AS on_path, o.overlaps_with
  FROM span_iv s LEFT JOIN span_off o USING (attempt_id, stream, start_eid)
  UNION ALL
  SELECT v.attempt_id, v.stream, v.name, CASE WHEN v.unattributed THEN 'unattributed' ELSE 'state' END,
         v.start_eid, v.end_eid, sc.clock, v.t0, v.t1, v.eps_ns, v.conv, NOT v.unattributed, NULL
  FROM state_iv v JOIN stream_clock sc USING (attempt_id, stream)
  UNION ALL
  SELECT subject_id, 'link', figure, 'link', a_eid, b_eid, b_clock,
         CASE WHEN ms IS NOT NULL THEN b_ns - round(ms * 1e6)::BIGINT END,
         CASE WHEN ms IS NOT NULL THEN b_ns END, CASE WHEN ms IS NULL THEN NULL ELSE round(eps_ms * 1e6)::BIGINT END,
         label = 'derived', ms IS NOT NULL, NULL
  FROM figures WHERE figure IN ('uplink', 'downlink_first')
)
SELECT getvariable('run_id') AS run_id, attempt_id, stream, name, kind, start_event, end_event, clock,
       start_ns, end_ns, (end_ns - start_ns) / 1e6 AS dur_ms, eps_ns / 1e6 AS eps_ms,
       CASE WHEN kind = 'link' AND end_ns IS NULL THEN 'unknown'
            WHEN conv THEN 'derived' WHEN clock LIKE 'sim:%' THEN 'simulated' ELSE 'measured' END AS label,
       on_path, overlaps_with, i.replica_id
FROM iv_rows LEFT JOIN attempt_ids i USING (attempt_id)
ORDER BY attempt_id, stream, start_ns NULLS LAST, name, start_event;

-- @table stream_checks: one row per attempt × stream: the path sum against the stream's span
-- @column stream: as intervals.stream
-- @column span_ms: the stream's end − start (its earliest to latest point)
-- @column path_sum_ms: Σ registered intervals (spans and states)
-- @column residual_ms: span_ms − path_sum_ms
-- @column unattributed_ms: Σ unattributed intervals
-- @column status: double_counted (registered intervals overlap), unattributed (residual > 0), else ok
CREATE OR REPLACE TABLE stream_checks AS
WITH b AS (
  SELECT attempt_id, stream, min(t) AS t_start, max(t) AS t_end FROM cuts GROUP BY attempt_id, stream
), s AS (
  SELECT attempt_id, stream,
         sum(end_ns - start_ns) FILTER (WHERE kind IN ('span', 'state')) AS registered_ns,
         coalesce(sum(end_ns - start_ns) FILTER (WHERE kind = 'unattributed'), 0) AS unattributed_ns,
         count(*) FILTER (WHERE kind = 'span' AND NOT on_path) AS n_overlapping
  FROM intervals WHERE kind <> 'link' GROUP BY attempt_id, stream
)
SELECT getvariable('run_id') AS run_id, b.attempt_id, b.stream,
       (b.t_end - b.t_start) / 1e6 AS span_ms,
       coalesce(s.registered_ns, 0) / 1e6 AS path_sum_ms,
       (b.t_end - b.t_start - coalesce(s.registered_ns, 0)) / 1e6 AS residual_ms,
       s.unattributed_ns / 1e6 AS unattributed_ms,
       CASE WHEN s.n_overlapping > 0 THEN 'double_counted'
            WHEN b.t_end - b.t_start - coalesce(s.registered_ns, 0) > 0 THEN 'unattributed'
            ELSE 'ok' END AS status
FROM b LEFT JOIN s USING (attempt_id, stream)
ORDER BY b.attempt_id, b.stream;

-- @gaps: stream points in a clock the stream's clock cannot be compared with; a span.start without its end.
CREATE OR REPLACE TEMP TABLE streams_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO streams_gaps
SELECT 'clock', r.attempt_id, format('{} stream intervals', r.stream),
       format('a clock.map between {} and {}', r.clock, sc.clock),
       format('{} left out of the {} stream', r.event_id, r.stream)
FROM ms_raw r JOIN stream_clock sc USING (attempt_id, stream)
LEFT JOIN clock_conv c ON c.from_clock = r.clock AND c.to_clock = sc.clock
WHERE c.from_clock IS NULL
UNION ALL
SELECT 'attempt', attempt_id, format('span {} on stream {}', span, stream), 'its span.end event',
       format('span.start {} has no matching span.end', start_eid)
FROM spans_raw WHERE end_ns IS NULL;
