-- The attempts table: each attempt's place among its request's attempts and its client, server and
-- resource statuses (docs/LEDGER.md "attempts and accounts").
--
-- scope: task
-- reads: ev, marks, attempt_ids, clock_conv
-- creates: attempt_start, attempts, attempts_gaps

-- When each attempt started, for attempt_index: created, else sent, else its first event on the clock
-- of its first client event (else of its first server / engine event). Attempts of one request are
-- ordered on one clock, the one most of their starts use; a start no mapping brings to it is not
-- placed (attempt_index NULL, with a gap): timestamps of two clocks are never compared raw.
CREATE OR REPLACE TEMP TABLE attempt_start AS
WITH own AS (
  SELECT attempt_id, arg_min(clock, (source <> 'client', ts_ns, event_id)) AS clock FROM ev
  WHERE attempt_id IS NOT NULL AND source <> 'checker' GROUP BY attempt_id
), first_ev AS (
  SELECT e.attempt_id, arg_min(struct_pack(ns := e.ts_ns, clock := e.clock, eid := e.event_id), (e.ts_ns, e.event_id)) AS p
  FROM ev e JOIN own o ON o.attempt_id = e.attempt_id AND o.clock = e.clock GROUP BY e.attempt_id
), s AS (
  SELECT m.attempt_id, coalesce(i.request_id, m.attempt_id) AS grp, coalesce(m.created, m.sent, f.p) AS p
  FROM marks m JOIN attempt_ids i USING (attempt_id) LEFT JOIN first_ev f USING (attempt_id)
), ref AS (
  SELECT grp, arg_max(clock, (n, clock)) AS clock FROM (
    SELECT grp, p.clock AS clock, count(*) AS n FROM s WHERE p IS NOT NULL GROUP BY grp, p.clock
  ) GROUP BY grp
)
SELECT s.attempt_id, s.grp, s.p, r.clock AS ref_clock, s.p.ns + c.offset_ns AS start_ref_ns
FROM s LEFT JOIN ref r USING (grp) LEFT JOIN clock_conv c ON c.from_clock = s.p.clock AND c.to_clock = r.clock;

-- @table attempts: one row per attempt: its ids, its place among its request's attempts, and its
--   client, server and resource statuses (docs/LEDGER.md "attempts and accounts")
-- @column task_id: the attempt's task (first event that names one)
-- @column session_id: the attempt's session
-- @column request_id: the attempt's request
-- @column attempt_index: 1 for the first attempt of its request, by attempt.created (else sent, else its
--   first event), compared on one clock; a router's try (client_attempt false) numbered among the router's
--   tries of the request, apart from the client's attempts; NULL (with a clock gap) when no mapping places its start
-- @column client_status: completed, timeout, cancelled, error (the earliest client terminal event),
--   unterminated (client events, none terminal), in_flight (the same in a rebuild following a run still
--   recording, `reconstruct --follow` while the manifest's state is starting or running; not an end, with
--   a gap); NULL without client events
-- @column server_status: rejected, completed, cancelled, failed, unterminated (in_flight as the client's
--   in a --follow rebuild) from server and engine evidence only; unknown without any (docs/LEDGER.md "attempts and accounts")
-- @column server_last_state: for an unterminated server side, where it stopped: queued, running, preempted
-- @column resource_status: the highest level reached: returned, reallocatable, released, held;
--   unknown without kv.* events
-- @column finish_reason: engine.finished attrs.reason, else the client's attempt.done attrs.finish_reason
-- @column n_output_tokens: the server's count of output tokens, all choices together: engine.token
--   values, else the usage the client received; NULL without either (a chunk is not a token)
-- @column n_tokens_engine: the sum of the attempt's engine.token values (0 when the engine finished it
--   without a token); NULL without engine events
-- @column n_tokens_usage: usage.completion_tokens the client received in attempt.done; NULL without
-- @column n_chunks: the client's attempt.chunk events of any kind; NULL without client events
-- @column sent_ns: attempt.sent, ns on client_clock
-- @column client_clock: the clock of sent_ns and client_end_ns
-- @column client_end_ns: the earliest client terminal event, ns on client_clock
-- @column enqueued_ns: engine.enqueued, ns on server_clock
-- @column server_clock: the clock of enqueued_ns, server_end_ns and the kv times
-- @column server_end_ns: server.done, else server.rejected, else engine.finished, else
--   engine.cancel_effective, ns on server_clock
-- @column kv_release_ns: the last kv.release (the attempt holds no more references), ns on server_clock
-- @column kv_free_ns: the last kv.free (its blocks back in the free pool), ns on server_clock
-- @column replica_id: the replica that served it (its events' attrs.replica_id: a capture joining several
--   `serve --out` folders, or one beside replicas declared by URL; or the router's span of its try, the
--   router.try event, which names a replica declared by URL whatever its kind, two llama.cpp replicas too);
--   else, for an attempt answered with llama.cpp's timings, the deployment's one llama.cpp replica (the
--   manifest's deployment); NULL with one server, none, or a replica no evidence names (an attempt whose
--   router spans never came: a gap)
-- @column parent_attempt_id: for an upstream try the client never saw (a router's retry: attempt_id
--   `<client attempt>@<replica>#<n>`, client_status NULL), the client attempt it was a try of; else NULL
-- @column client_attempt: the client's attempt, the one definition every count of them reads: true for an
--   attempt the load client made (its own events record it: client_status not NULL); false for a router's
--   try the client never saw (parent_attempt_id set); NULL when no client event carries it and no router
--   made it (an engine-only run, or one the client's events miss: a layers gap names either)
CREATE OR REPLACE TABLE attempts AS
SELECT
  getvariable('run_id') AS run_id,
  i.task_id, i.session_id, i.request_id, m.attempt_id,
  CASE WHEN st.start_ref_ns IS NOT NULL THEN
    -- a router's tries never take a place among the client's attempts (its retry budget is the client's)
    row_number() OVER (PARTITION BY st.grp, st.start_ref_ns IS NULL, i.client_attempt IS FALSE
                       ORDER BY st.start_ref_ns, m.attempt_id) END::INTEGER
    AS attempt_index,
  CASE WHEN i.n_client_events = 0 THEN NULL
       WHEN m.client_end.name = 'attempt.done' THEN 'completed'
       WHEN m.client_end.name = 'attempt.timeout' THEN 'timeout'
       WHEN m.client_end.name = 'attempt.cancel' THEN 'cancelled'
       WHEN m.client_end.name = 'attempt.error' THEN 'error'
       WHEN getvariable('run_open') THEN 'in_flight'
       ELSE 'unterminated' END AS client_status,
  CASE WHEN i.n_server_events = 0 THEN 'unknown'
       WHEN m.rejected IS NOT NULL THEN 'rejected'
       WHEN m.finished.reason IN ('stop', 'length') THEN 'completed'
       WHEN m.finished.reason = 'cancelled' THEN 'cancelled'
       WHEN m.finished.reason = 'error' THEN 'failed'
       WHEN m.finished IS NOT NULL THEN 'completed'
       WHEN m.server_done IS NOT NULL THEN 'completed'
       WHEN m.cancel_effective IS NOT NULL OR m.disconnect IS NOT NULL THEN 'cancelled'
       WHEN getvariable('run_open') THEN 'in_flight'
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
  m.kv_release.ns AS kv_release_ns, m.kv_free.ns AS kv_free_ns,
  i.replica_id, i.parent_attempt_id, i.client_attempt
FROM marks m JOIN attempt_ids i USING (attempt_id) JOIN attempt_start st USING (attempt_id)
ORDER BY m.attempt_id;

-- @gaps: a start no mapping brings to its request's clock (attempt_index NULL); a completed attempt
--   without a token count; an attempt in flight in a run still recording (its end not yet on disk).
CREATE OR REPLACE TEMP TABLE attempts_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO attempts_gaps
SELECT 'clock', attempt_id, 'attempt_index (and max_attempts counting)',
       format('a clock.map between {} and {}', p.clock, ref_clock),
       format('{} (the attempt''s start) cannot be compared with the other attempts of its request, on {}', p.eid, ref_clock)
FROM attempt_start WHERE p IS NOT NULL AND start_ref_ns IS NULL
UNION ALL
SELECT 'attempt', attempt_id, 'n_output_tokens, tpot_ms, tpot_server_ms',
       'engine.token events or usage in attempt.done (a chunk is not a token)',
       coalesce((SELECT format('usage.completion_tokens in attempt.done is {}, not a whole token count the ledger '
                               'can read (0 to 2^53)', json_extract(e.attrs, '$.usage.completion_tokens'))
                 FROM ev e WHERE e.attempt_id = attempts.attempt_id AND e.name = 'attempt.done'
                   AND json_extract(e.attrs, '$.usage.completion_tokens') IS NOT NULL
                   AND json_type(e.attrs, '$.usage.completion_tokens') <> 'NULL' LIMIT 1),
                'the server reported no token count')
FROM attempts WHERE n_output_tokens IS NULL AND client_status = 'completed'
UNION ALL
SELECT 'attempt', attempt_id, 'client_status, server_status, e2e_client_ms, tpot_ms, good (and every figure over ended attempts)',
       'its end: the run is still recording (the manifest''s state), a rebuild after the run finishes reads it',
       format('in flight at the last flush: no {} terminal event yet',
              CASE WHEN client_status = 'in_flight' AND server_status = 'in_flight' THEN 'client or server'
                   WHEN client_status = 'in_flight' THEN 'client' ELSE 'server' END)
FROM attempts WHERE client_status = 'in_flight' OR server_status = 'in_flight';
