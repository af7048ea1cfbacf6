-- The four accounts, one row per attempt: client status, server status, the task's outcome and the
-- resource account with its holding integral (docs/LEDGER.md "attempts and accounts").
--
-- scope: rollup
-- reads: attempts, tasks, request_metrics, kv_integral
-- creates: accounts

-- @table accounts: one row per attempt: the four accounts side by side, linked by ids
--   (docs/LEDGER.md "attempts and accounts")
-- @column task_id: the attempt's task
-- @column request_id: the attempt's request
-- @column attempt_index: as attempts.attempt_index
-- @column client_status: as attempts.client_status (the client's account)
-- @column server_status: as attempts.server_status (the server's account; a client timeout is not one)
-- @column task_outcome: the outcome of the attempt's task, tasks.outcome (the task's account)
-- @column resource_status: as attempts.resource_status (the resource account)
-- @column kv_release_ns: as attempts.kv_release_ns
-- @column kv_free_ns: as attempts.kv_free_ns
-- @column release_after_cancel_ms: as request_metrics.release_after_cancel_ms
-- @column kv_gib_s: ∫M(t)dt of the attempt's KV blocks, GiB·s, shared blocks split equally among their
--   holders (policy equal_split); 0 when its kv.* events show no block held; NULL without kv.* events
--   or without the block size (docs/LEDGER.md "The resource account")
CREATE OR REPLACE TABLE accounts AS
SELECT a.run_id, a.attempt_id, a.task_id, a.request_id, a.attempt_index,
       a.client_status, a.server_status, t.outcome AS task_outcome, a.resource_status,
       a.kv_release_ns, a.kv_free_ns, r.release_after_cancel_ms,
       -- KV events that show no block held (cancelled while queued: a release of none) are a known 0
       CASE WHEN k.kv_gib_s IS NOT NULL THEN k.kv_gib_s
            WHEN a.resource_status <> 'unknown' AND getvariable('kv_block_bytes') IS NOT NULL THEN 0.0 END AS kv_gib_s
FROM attempts a LEFT JOIN tasks t USING (task_id) JOIN request_metrics r USING (attempt_id)
LEFT JOIN kv_integral k USING (attempt_id)
ORDER BY a.attempt_id;
