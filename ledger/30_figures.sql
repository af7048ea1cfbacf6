-- Stage 3: every difference of two events goes through one clock rule (docs/LEDGER.md).
-- `pairs` lists (figure, a, b) per subject; `figures` applies the rule once: same clock → measured,
-- a mapping either way → derived ± epsilon (`clock_conv`, 10_marks.sql), otherwise NULL and a gap.

-- Task contracts: tasks.parquet first, else the contract carried by task.start.
CREATE OR REPLACE TEMP TABLE contracts AS
WITH from_events AS (
  SELECT task_id,
         TRY_CAST(json_extract_string(attrs, '$.deadline_ms') AS DOUBLE) AS deadline_ms,
         json_extract(attrs, '$.required')::VARCHAR AS required,
         json_extract_string(attrs, '$.on_missing') AS on_missing,
         TRY_CAST(json_extract_string(attrs, '$.max_attempts') AS BIGINT) AS max_attempts
  FROM ev WHERE name = 'task.start' AND task_id IS NOT NULL
  QUALIFY row_number() OVER (PARTITION BY task_id ORDER BY ts_ns, seq, event_id) = 1
), from_file AS (
  SELECT task_id, deadline_ms, required, on_missing, max_attempts FROM task_contracts
  QUALIFY row_number() OVER (PARTITION BY task_id ORDER BY contract, deadline_ms, required) = 1
), all_tasks AS (
  SELECT DISTINCT task_id FROM ev WHERE task_id IS NOT NULL
  UNION SELECT task_id FROM task_contracts
)
SELECT t.task_id,
       coalesce(ff.deadline_ms, fe.deadline_ms) AS deadline_ms,
       CASE WHEN coalesce(ff.required, fe.required) IS NULL THEN NULL
            ELSE from_json(coalesce(ff.required, fe.required), '["VARCHAR"]') END AS required,
       coalesce(ff.on_missing, fe.on_missing, 'failure') AS on_missing,
       coalesce(ff.max_attempts, fe.max_attempts) AS max_attempts
FROM all_tasks t LEFT JOIN from_file ff USING (task_id) LEFT JOIN from_events fe USING (task_id);

-- The reference a task's deadline counts from: arrival.planned, else task.start, else its first attempt.
CREATE OR REPLACE TEMP TABLE task_refs AS
WITH cand AS (
  SELECT task_id, 1 AS pri, ts_ns, clock, event_id, name FROM ev WHERE name = 'arrival.planned' AND task_id IS NOT NULL
  UNION ALL SELECT task_id, 2, ts_ns, clock, event_id, name FROM ev WHERE name = 'task.start' AND task_id IS NOT NULL
  UNION ALL SELECT task_id, 3, ts_ns, clock, event_id, name FROM ev
            WHERE name IN ('attempt.created', 'attempt.sent') AND task_id IS NOT NULL
), ends AS (
  SELECT task_id, 1 AS pri, ts_ns, clock, event_id FROM ev WHERE name = 'task.end' AND task_id IS NOT NULL
  UNION ALL SELECT a.task_id, 2, m.client_end.ns, m.client_end.clock, m.client_end.eid
            FROM marks m JOIN attempt_ids a USING (attempt_id) WHERE a.task_id IS NOT NULL AND m.client_end IS NOT NULL
)
SELECT r.task_id, r.ts_ns AS ref_ns, r.clock AS ref_clock, r.event_id AS ref_eid, r.name AS ref_name,
       e.ts_ns AS end_ns, e.clock AS end_clock, e.event_id AS end_eid
FROM (SELECT * FROM cand QUALIFY row_number() OVER (PARTITION BY task_id ORDER BY pri, ts_ns, event_id) = 1) r
LEFT JOIN (SELECT * FROM ends QUALIFY row_number() OVER (PARTITION BY task_id ORDER BY pri, ts_ns DESC, event_id) = 1) e
USING (task_id);

CREATE OR REPLACE TEMP TABLE pairs AS
WITH a AS (SELECT m.*, i.task_id FROM marks m JOIN attempt_ids i USING (attempt_id)),
p AS (
  SELECT attempt_id AS subject_id, 'ttft_client' AS figure, sent AS a, first_content AS b FROM a
  UNION ALL SELECT attempt_id, 'ttft_first_byte', sent, first_byte FROM a
  UNION ALL SELECT attempt_id, 'ttft_visible', sent, first_visible FROM a
  UNION ALL SELECT attempt_id, 'ttft_server', enqueued, first_token FROM a
  UNION ALL SELECT attempt_id, 'e2e_client', sent, done FROM a
  UNION ALL SELECT attempt_id, 'client_span', coalesce(created, sent),
                   struct_pack(ns := client_end.ns, clock := client_end.clock, eid := client_end.eid) FROM a
  UNION ALL SELECT attempt_id, 'e2e_server', enqueued, server_end FROM a
                   WHERE server_done IS NOT NULL OR finished IS NOT NULL
  UNION ALL SELECT attempt_id, 'queue', enqueued, scheduled FROM a
  UNION ALL SELECT attempt_id, 'prefill', scheduled, first_token FROM a
  UNION ALL SELECT attempt_id, 'decode', first_token,
                   CASE WHEN finished IS NOT NULL THEN struct_pack(ns := finished.ns, clock := finished.clock, eid := finished.eid) END FROM a
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
