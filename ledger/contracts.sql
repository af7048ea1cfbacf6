-- Each task's contract and the reference its deadline counts from (docs/LEDGER.md "tasks").
--
-- scope: task
-- reads: ev, task_contracts, marks, attempt_ids
-- creates: contracts, task_refs

-- Task contracts: tasks.parquet first, else the contract carried by task.start.
CREATE OR REPLACE TEMP TABLE contracts AS
WITH from_events AS (
  SELECT task_id,
         TRY_CAST(json_extract_string(attrs, '$.deadline_ms') AS DOUBLE) AS deadline_ms,
         json_extract(attrs, '$.required')::VARCHAR AS required,
         json_extract_string(attrs, '$.on_missing') AS on_missing,
         TRY_CAST(json_extract_string(attrs, '$.max_attempts') AS BIGINT) AS max_attempts,
         json_extract_string(attrs, '$.task_class') AS task_class
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
       coalesce(ff.max_attempts, fe.max_attempts) AS max_attempts, fe.task_class
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
