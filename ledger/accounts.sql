-- The four accounts, one row per attempt: client status, server status, the task's outcome and the
-- resource account with its holding integral (docs/LEDGER.md "attempts and accounts").
--
-- reads: attempts, tasks, request_metrics, kv_integral
-- creates: accounts

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
