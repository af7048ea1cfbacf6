-- Every difference of two events goes through one clock rule (docs/LEDGER.md "Clock rule").
-- `pairs` lists (figure, a, b) per subject; `figures` applies the rule once: same clock → measured,
-- a mapping either way → derived ± epsilon (`clock_conv`), otherwise NULL and a gap.
--
-- scope: task
-- reads: marks, attempt_ids, choice_marks, task_refs, clock_conv, point_of, events
-- creates: pairs, figures, figures_gaps

CREATE OR REPLACE TEMP TABLE pairs AS
WITH a AS (SELECT m.*, i.task_id FROM marks m JOIN attempt_ids i USING (attempt_id)),
p AS (
  SELECT attempt_id AS subject_id, 'ttft_client' AS figure, sent AS a, first_content AS b FROM a
  UNION ALL SELECT attempt_id, 'ttft_first_byte', sent, first_byte FROM a
  UNION ALL SELECT attempt_id, 'ttft_visible', sent, first_visible FROM a
  UNION ALL SELECT attempt_id, 'ttft_server', enqueued, first_token FROM a
  UNION ALL SELECT attempt_id, 'e2e_client', sent, done FROM a
  UNION ALL SELECT attempt_id, 'client_span', coalesce(created, sent),
                   point_of(client_end) FROM a
  UNION ALL SELECT attempt_id, 'e2e_server', enqueued, server_end FROM a
                   WHERE server_done IS NOT NULL OR finished IS NOT NULL
  UNION ALL SELECT attempt_id, 'queue', enqueued, scheduled FROM a
  UNION ALL SELECT attempt_id, 'prefill', scheduled, first_token FROM a
  UNION ALL SELECT attempt_id, 'decode', first_token,
                   point_of(finished) FROM a
  UNION ALL SELECT attempt_id, 'uplink', sent, coalesce(received, enqueued) FROM a
  UNION ALL SELECT attempt_id, 'downlink_first', coalesce(first_write, first_token), first_content FROM a
  UNION ALL SELECT attempt_id, 'release_after_cancel',
                   CASE WHEN client_cancel IS NOT NULL AND kv_free IS NOT NULL
                             AND EXISTS (SELECT 1 FROM clock_conv c WHERE c.from_clock = client_cancel.clock AND c.to_clock = kv_free.clock)
                        THEN client_cancel ELSE cancel_received END,
                   CASE WHEN client_cancel IS NOT NULL OR cancel_received IS NOT NULL THEN kv_free END FROM a
  UNION ALL SELECT a.attempt_id, 'since_reference',
                   struct_pack(ns := r.ref_ns, clock := r.ref_clock, eid := r.ref_eid), a.done
            FROM a JOIN task_refs r USING (task_id)
  -- per choice (subject "attempt#choice"): its TTFTs and the decode span its TPOT divides
  UNION ALL SELECT c.attempt_id || '#' || c.choice, 'choice_ttft_client', m.sent, c.first_content
            FROM choice_marks c JOIN marks m USING (attempt_id)
  UNION ALL SELECT c.attempt_id || '#' || c.choice, 'choice_ttft_server', m.enqueued, c.first_token
            FROM choice_marks c JOIN marks m USING (attempt_id)
  UNION ALL SELECT attempt_id || '#' || choice, 'choice_decode_client', first_content, client_end FROM choice_marks
  UNION ALL SELECT attempt_id || '#' || choice, 'choice_decode_server', first_token, server_end FROM choice_marks
  UNION ALL SELECT task_id, 'task_e2e', struct_pack(ns := ref_ns, clock := ref_clock, eid := ref_eid),
                   CASE WHEN end_ns IS NOT NULL THEN struct_pack(ns := end_ns, clock := end_clock, eid := end_eid) END
            FROM task_refs
)
SELECT subject_id, figure, a.ns AS a_ns, a.clock AS a_clock, a.eid AS a_eid,
       b.ns AS b_ns, b.clock AS b_clock, b.eid AS b_eid
FROM p WHERE a IS NOT NULL AND b IS NOT NULL AND a.ns IS NOT NULL AND b.ns IS NOT NULL;

-- A difference that comes out negative beyond the mapping's epsilon is an impossible order (a chunk
-- before its send, a token before its enqueue): NULL, and a gap row names both events. The release
-- after a cancel is signed on purpose (a block freed before the cancel arrived is a negative delay).
CREATE OR REPLACE TEMP TABLE figures AS
WITH f AS (
  SELECT p.*, c.label IS NULL AS refused, c.label, (p.b_ns - (p.a_ns + c.offset_ns)) / 1e6 AS raw_ms,
         c.eps_ns / 1e6 AS eps_ms,
         c.label IS NOT NULL AND p.figure <> 'release_after_cancel'
           AND p.b_ns - (p.a_ns + c.offset_ns) < -c.eps_ns AS impossible
  FROM pairs p LEFT JOIN clock_conv c ON c.from_clock = p.a_clock AND c.to_clock = p.b_clock
)
SELECT * EXCLUDE (label, raw_ms),
       CASE WHEN refused THEN 'unknown' WHEN impossible THEN 'impossible' ELSE label END AS label,
       CASE WHEN NOT impossible THEN raw_ms END AS ms, raw_ms
FROM f;

-- @gaps: a subtraction across clock domains with no mapping; an impossible order on one clock (or beyond
--   a mapping's epsilon): the figure is NULL, both events named.
CREATE OR REPLACE TEMP TABLE figures_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO figures_gaps
SELECT 'clock' AS scope, subject_id, figure AS affects,
       format('a clock.map between {} and {} (e.g. round trips to the server''s /clock)', a_clock, b_clock) AS needs,
       format('{} − {}: {} and {} cannot be compared', b_eid, a_eid, b_clock, a_clock) AS detail
FROM figures WHERE refused
UNION ALL
SELECT CASE WHEN f.figure = 'task_e2e' THEN 'task' ELSE 'attempt' END, split_part(f.subject_id, '#', 1),
       CASE WHEN f.figure LIKE 'choice\_%' ESCAPE '\'
            THEN format('choice_metrics {} (choice {})', f.figure, split_part(f.subject_id, '#', 2)) ELSE f.figure END,
       'events in a possible order (a clock that does not run backwards; ids not reused)',
       format('{} ({}) is {} ms before {} ({}){}: {} would be negative', f.b_eid, eb.name, round(-f.raw_ms, 3),
              f.a_eid, ea.name, CASE WHEN f.label = 'impossible' AND f.a_clock <> f.b_clock
                                      THEN format(' beyond the mapping''s ±{} ms', f.eps_ms) ELSE '' END, f.figure)
FROM figures f
LEFT JOIN (SELECT event_id, any_value(name) AS name FROM events
           WHERE event_id IN (SELECT a_eid FROM figures WHERE impossible UNION SELECT b_eid FROM figures WHERE impossible)
           GROUP BY event_id) ea ON ea.event_id = f.a_eid
LEFT JOIN (SELECT event_id, any_value(name) AS name FROM events
           WHERE event_id IN (SELECT a_eid FROM figures WHERE impossible UNION SELECT b_eid FROM figures WHERE impossible)
           GROUP BY event_id) eb ON eb.event_id = f.b_eid
WHERE f.impossible;
