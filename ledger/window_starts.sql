-- The events that can open the observation window and count the planned arrivals: every
-- arrival.planned, attempt.created and attempt.sent, one row each (task scope, so a shard keeps the
-- rows of its own events); ledger/window.sql and ledger/run_metrics.sql read them and no event
-- (docs/SCALE.md).
--
-- scope: task
-- reads: ev
-- creates: window_starts
CREATE OR REPLACE TEMP TABLE window_starts AS
SELECT event_id, name, task_id, ts_ns, clock FROM ev
WHERE name IN ('arrival.planned', 'attempt.created', 'attempt.sent');
