-- Stage 2: the attempts table and the client / server / resource accounts (docs/LEDGER.md).

CREATE OR REPLACE TEMP TABLE attempt_first_event AS
SELECT attempt_id, min(ts_ns) AS first_ns FROM ev WHERE attempt_id IS NOT NULL GROUP BY attempt_id;

CREATE OR REPLACE TABLE attempts AS
SELECT
  getvariable('run_id') AS run_id,
  i.task_id, i.session_id, i.request_id, m.attempt_id,
  row_number() OVER (PARTITION BY coalesce(i.request_id, m.attempt_id)
                     ORDER BY coalesce(m.created.ns, m.sent.ns, fe.first_ns), m.attempt_id)::INTEGER AS attempt_index,
  CASE WHEN i.n_client_events = 0 THEN NULL
       WHEN m.client_end.name = 'attempt.done' THEN 'completed'
       WHEN m.client_end.name = 'attempt.timeout' THEN 'timeout'
       WHEN m.client_end.name = 'attempt.cancel' THEN 'cancelled'
       WHEN m.client_end.name = 'attempt.error' THEN 'error'
       ELSE 'unterminated' END AS client_status,
  CASE WHEN i.n_server_events = 0 THEN 'unknown'
       WHEN m.rejected IS NOT NULL THEN 'rejected'
       WHEN m.finished.reason IN ('stop', 'length') THEN 'completed'
       WHEN m.finished.reason = 'cancelled' THEN 'cancelled'
       WHEN m.finished.reason = 'error' THEN 'failed'
       WHEN m.finished IS NOT NULL THEN 'completed'
       WHEN m.server_done IS NOT NULL THEN 'completed'
       WHEN m.cancel_effective IS NOT NULL OR m.disconnect IS NOT NULL THEN 'cancelled'
       ELSE 'unterminated' END AS server_status,
  CASE WHEN i.n_server_events = 0 OR m.finished IS NOT NULL OR m.server_done IS NOT NULL
            OR m.rejected IS NOT NULL OR m.cancel_effective IS NOT NULL OR m.disconnect IS NOT NULL THEN NULL
       WHEN m.scheduled IS NULL THEN 'queued'
       WHEN m.last_preempted IS NOT NULL AND (m.last_preempted.ns, 1) > (m.last_scheduled.ns, 0) THEN 'preempted'
       ELSE 'running' END AS server_last_state,
  CASE WHEN i.n_kv_events = 0 AND m.mem_returned IS NULL THEN 'unknown'
       WHEN m.mem_returned IS NOT NULL THEN 'returned'
       WHEN m.kv_free IS NOT NULL THEN 'reallocatable'
       WHEN m.kv_release IS NOT NULL THEN 'released'
       ELSE 'held' END AS resource_status,
  coalesce(m.finished.reason, m.client_finish_reason) AS finish_reason,
  m.n_output_tokens::BIGINT AS n_output_tokens,
  m.n_tokens_engine::BIGINT AS n_tokens_engine,
  m.n_tokens_usage::BIGINT AS n_tokens_usage,
  CASE WHEN i.n_client_events > 0 THEN m.n_chunks END::BIGINT AS n_chunks,
  m.sent.ns AS sent_ns, m.sent.clock AS client_clock,
  m.client_end.ns AS client_end_ns,
  m.enqueued.ns AS enqueued_ns, m.enqueued.clock AS server_clock,
  m.server_end.ns AS server_end_ns,
  m.kv_release.ns AS kv_release_ns, m.kv_free.ns AS kv_free_ns
FROM marks m JOIN attempt_ids i USING (attempt_id) JOIN attempt_first_event fe USING (attempt_id)
ORDER BY m.attempt_id;
