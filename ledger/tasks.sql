-- Task outcomes from each task's contract and the checker's verdicts (docs/LEDGER.md "tasks").
--
-- scope: task
-- reads: attempts, request_metrics, contracts, task_refs, figures
-- creates: request_state, tasks

CREATE OR REPLACE TEMP TABLE request_state AS
WITH task_requests AS (
  SELECT DISTINCT task_id, request_id FROM attempts WHERE task_id IS NOT NULL AND request_id IS NOT NULL
  UNION SELECT task_id, unnest(required) FROM contracts WHERE required IS NOT NULL
), att AS (
  SELECT a.task_id, a.request_id, r.good, r.correct, r.on_time, true AS attempted
  FROM attempts a JOIN request_metrics r USING (attempt_id) JOIN contracts c ON c.task_id = a.task_id
  -- the contract counts the client's attempts: a router's try is none (attempts.client_attempt false)
  WHERE a.client_attempt IS NOT FALSE AND (c.max_attempts IS NULL OR a.attempt_index <= c.max_attempts)
)
-- one rule with request_metrics.good: a request succeeded when one of its counted attempts is good;
-- it is undetermined when none is good and one is unknown (no verdict, still open, no client events)
SELECT tr.task_id, tr.request_id,
  CASE WHEN bool_or(att.good) THEN 'succeeded'
       WHEN bool_or(att.on_time = false AND att.correct IS DISTINCT FROM false) THEN 'late'
       WHEN bool_or(att.attempted AND att.good IS NULL) THEN 'undetermined'
       -- a required request never attempted (a later turn after a failed one) is simply failed, once
       -- the run has finished: while it records, the turn may yet be sent
       WHEN getvariable('run_open') AND NOT coalesce(bool_or(att.attempted), false) THEN 'undetermined'
       ELSE 'failed' END AS state
FROM task_requests tr LEFT JOIN att USING (task_id, request_id)
GROUP BY tr.task_id, tr.request_id;

-- @table tasks: one row per task: its outcome judged by its contract (docs/LEDGER.md "tasks")
-- @column task_id: the task
-- @column outcome: success (every required request succeeded), unknown (one undetermined: in flight,
--   no verdict, or not yet sent while the run records; or no required request), partial_success
--   (on_missing = partial_success and one succeeded), failure
-- @column deadline_ms: the contract's deadline, from the reference (NULL: none)
-- @column e2e_ms: (task.end, else the task's last client terminal) − the reference
-- @column deadline_reference: the event the deadline counts from: arrival.planned, task.start,
--   attempt.created or attempt.sent
-- @column n_requests: the task's requests (attempted, or required by its contract)
-- @column n_attempts: the task's attempts
-- @column n_required: its required requests (default: all of them)
-- @column n_required_succeeded: the required ones that succeeded (one of their first max_attempts
--   attempts good)
-- @column on_missing: what a missing required request makes the task: failure (default) or partial_success
-- @column max_attempts: the attempts counted per request (NULL: unlimited)
-- @column task_class: the workload class the load client dealt it (task.start attrs.task_class, e.g. chat or
--   long_context); NULL for a task that did not come from a workload class (an imported or black-box run)
CREATE OR REPLACE TABLE tasks AS
WITH req AS (
  SELECT s.task_id, s.request_id, s.state,
         c.required IS NULL OR list_contains(c.required, s.request_id) AS is_required
  FROM request_state s JOIN contracts c USING (task_id)
), agg AS (
  SELECT task_id,
         count(*) AS n_requests,
         count(*) FILTER (WHERE is_required) AS n_required,
         count(*) FILTER (WHERE is_required AND state = 'succeeded') AS n_required_succeeded,
         count(*) FILTER (WHERE is_required AND state = 'undetermined') AS n_required_undetermined
  FROM req GROUP BY task_id
), att AS (
  SELECT task_id, count(*) AS n_attempts FROM attempts WHERE task_id IS NOT NULL GROUP BY task_id
)
SELECT getvariable('run_id') AS run_id, c.task_id,
  CASE WHEN coalesce(g.n_required, 0) = 0 THEN 'unknown'
       WHEN g.n_required_succeeded = g.n_required THEN 'success'
       WHEN g.n_required_undetermined > 0 THEN 'unknown'
       WHEN c.on_missing = 'partial_success' AND g.n_required_succeeded > 0 THEN 'partial_success'
       ELSE 'failure' END AS outcome,
  c.deadline_ms, f.ms AS e2e_ms, r.ref_name AS deadline_reference,
  coalesce(g.n_requests, 0) AS n_requests, coalesce(att.n_attempts, 0) AS n_attempts,
  coalesce(g.n_required, 0) AS n_required, coalesce(g.n_required_succeeded, 0) AS n_required_succeeded,
  c.on_missing, c.max_attempts, c.task_class
FROM contracts c
LEFT JOIN agg g USING (task_id)
LEFT JOIN att USING (task_id)
LEFT JOIN task_refs r USING (task_id)
LEFT JOIN figures f ON f.subject_id = c.task_id AND f.figure = 'task_e2e'
ORDER BY c.task_id;
