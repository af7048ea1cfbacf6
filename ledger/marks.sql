-- Per-attempt milestones (docs/LEDGER.md "Attempt milestones"): the narrow working sets of events and
-- each attempt's first / last events of every kind, each kept as a point (ns, clock, event id).
--
-- scope: task
-- reads: events, first_point, last_point, point_of, json_bigint, declared_replicas
-- creates: ev, ev_out, ev_tok, choice_outs, attempt_ids, marks, choice_marks, marks_gaps

-- Three narrow working sets instead of one wide copy: the per-output rows (client chunks, server
-- writes, engine tokens) are most of a run and need only a few columns.
CREATE OR REPLACE TEMP TABLE ev AS
SELECT event_id, seq, source, name, ts_ns, clock, task_id, session_id, request_id, attempt_id, step_id, value, attrs,
       CASE WHEN name = 'engine.finished' THEN json_extract_string(attrs, '$.reason')
            WHEN name = 'attempt.done' THEN json_extract_string(attrs, '$.finish_reason') END AS reason,
       CASE WHEN name = 'attempt.done'
            THEN json_bigint(attrs, '$.usage.completion_tokens') END AS usage_completion,
       CASE WHEN name = 'attempt.done'
            THEN json_bigint(attrs, '$.usage.prompt_tokens') END AS usage_prompt,
       CASE WHEN name = 'verdict' THEN TRY_CAST(json_extract_string(attrs, '$.correct') AS BOOLEAN) END AS verdict_correct,
       CASE WHEN name IN ('span.start', 'span.end') THEN json_extract_string(attrs, '$.span') END AS span_name,
       CASE WHEN name IN ('span.start', 'span.end')
            THEN coalesce(json_extract_string(attrs, '$.stream'), source) END AS span_stream
FROM events
WHERE name NOT IN ('attempt.chunk', 'server.write', 'engine.token');

-- Output-bearing: a client chunk or server write that carries content, reasoning or a tool call.
-- A chunk or write without a `kinds` attribute counts as content.
CREATE OR REPLACE TEMP TABLE ev_out AS
WITH distinct_attrs AS (  -- a run has few distinct chunk attrs: parse each once
  SELECT DISTINCT coalesce(attrs, '{}') AS attrs FROM events WHERE name IN ('attempt.chunk', 'server.write')
), parsed AS (
  SELECT attrs, CASE WHEN json_extract(attrs, '$.kinds') IS NOT NULL
                     THEN from_json(json_extract(attrs, '$.kinds'), '["VARCHAR"]') END AS kinds,
         TRY_CAST(json_extract_string(attrs, '$.choice') AS INTEGER) AS choice
  FROM distinct_attrs
), flags AS MATERIALIZED (  -- evaluated once per distinct attrs, not once per chunk after the join
  SELECT attrs, choice, (kinds IS NULL OR list_has_any(kinds, ['content', 'reasoning', 'tool_call'])) AS output_bearing,
                (kinds IS NULL OR list_contains(kinds, 'content')) AS answer_bearing,
                -- a chunk with choices (vLLM bench's TTFT / ITL unit): any but a usage-only one
                (kinds IS NULL OR NOT list_contains(kinds, 'usage') OR len(kinds) > 1) AS choices_bearing,
                kinds IS NOT NULL AND list_contains(kinds, 'finish') AS finish_bearing
  FROM parsed
)
SELECT e.attempt_id, e.name, e.ts_ns, e.seq, e.clock, e.event_id, e.value, f.output_bearing, f.answer_bearing,
       f.choices_bearing, f.finish_bearing, coalesce(f.choice, 0) AS choice
FROM events e JOIN flags f ON coalesce(e.attrs, '{}') = f.attrs
WHERE e.name IN ('attempt.chunk', 'server.write');

-- Engine tokens with their choice (attrs.choice; absent = choice 0, the only one of an n = 1 request).
CREATE OR REPLACE TEMP TABLE ev_tok AS
WITH distinct_attrs AS (
  SELECT DISTINCT coalesce(attrs, '{}') AS attrs FROM events WHERE name = 'engine.token'
), parsed AS MATERIALIZED (
  SELECT attrs, coalesce(TRY_CAST(json_extract_string(attrs, '$.choice') AS INTEGER), 0) AS choice FROM distinct_attrs
)
SELECT e.attempt_id, e.ts_ns, e.seq, e.clock, e.event_id, e.value, p.choice, e.step_id
FROM events e JOIN parsed p ON coalesce(e.attrs, '{}') = p.attrs WHERE e.name = 'engine.token';

-- Each choice's first chunks and writes of every kind, and its counts: the one pass over the client's and
-- server's output rows that attempt_ids, marks and choice_marks read. A point keeps its seq (`sq`) so that an
-- attempt's first over its choices is its first event, ties broken as first_point breaks them.
CREATE OR REPLACE TEMP TABLE choice_outs AS
SELECT attempt_id, choice,
       arg_min(struct_pack(ns := ts_ns, clock := clock, eid := event_id, sq := seq), (ts_ns, seq, event_id))
         FILTER (WHERE name = 'attempt.chunk') AS first_chunk,
       arg_min(struct_pack(ns := ts_ns, clock := clock, eid := event_id, sq := seq), (ts_ns, seq, event_id))
         FILTER (WHERE name = 'attempt.chunk' AND output_bearing) AS first_content,
       arg_min(struct_pack(ns := ts_ns, clock := clock, eid := event_id, sq := seq), (ts_ns, seq, event_id))
         FILTER (WHERE name = 'attempt.chunk' AND answer_bearing) AS first_visible,
       arg_min(struct_pack(ns := ts_ns, clock := clock, eid := event_id, sq := seq), (ts_ns, seq, event_id))
         FILTER (WHERE name = 'server.write' AND output_bearing) AS first_write,
       first_point(ts_ns, clock, event_id, seq, name = 'attempt.chunk' AND finish_bearing) AS finish_chunk,
       first_point(ts_ns, clock, event_id, seq, name = 'server.write' AND finish_bearing) AS finish_write,
       count(*) FILTER (WHERE name = 'attempt.chunk') AS n_chunks,
       count(*) FILTER (WHERE name = 'server.write') AS n_writes,
       bool_or(output_bearing) AS has_output
FROM ev_out WHERE attempt_id IS NOT NULL GROUP BY attempt_id, choice;

CREATE OR REPLACE TEMP TABLE attempt_ids AS
WITH per_output AS (
  SELECT attempt_id, sum(n_chunks)::BIGINT AS n_client, sum(n_writes)::BIGINT AS n_server FROM choice_outs GROUP BY attempt_id
  UNION ALL
  SELECT attempt_id, 0, count(*) FROM ev_tok WHERE attempt_id IS NOT NULL GROUP BY attempt_id
), control AS (
  SELECT attempt_id,
         arg_min(task_id, (ts_ns, event_id)) FILTER (WHERE task_id IS NOT NULL) AS task_id,
         arg_min(session_id, (ts_ns, event_id)) FILTER (WHERE session_id IS NOT NULL) AS session_id,
         arg_min(request_id, (ts_ns, event_id)) FILTER (WHERE request_id IS NOT NULL) AS request_id,
         count(*) FILTER (WHERE source = 'client' AND name <> 'verdict') AS n_client,
         count(*) FILTER (WHERE name LIKE 'server.%' OR name LIKE 'engine.%') AS n_server,
         count(*) FILTER (WHERE name LIKE 'kv.%') AS n_kv_events,
         -- the replica that served it and, for a router's try the client never saw, the client attempt
         -- (attrs of the events a capture copied from several `serve --out` folders; docs/EVENTS.md)
         arg_min(json_extract_string(attrs, '$.replica_id'), (ts_ns, event_id))
           FILTER (WHERE attrs LIKE '%"replica_id"%') AS replica_id,
         arg_min(json_extract_string(attrs, '$.parent_attempt_id'), (ts_ns, event_id))
           FILTER (WHERE attrs LIKE '%"parent_attempt_id"%') AS parent_attempt_id,
         -- the replica the router's span of its try names (router.try; docs/EVENTS.md)
         arg_min(json_extract_string(attrs, '$.replica_id'), (ts_ns, event_id))
           FILTER (WHERE name = 'router.try') AS router_replica_id,
         -- answered with llama.cpp's own per-response timings (the client keeps them on attempt.done)
         bool_or(name = 'attempt.done' AND source = 'client' AND attrs LIKE '%"server_timings"%') AS llamacpp_answered
  FROM ev WHERE attempt_id IS NOT NULL GROUP BY attempt_id
), outputs AS (
  SELECT attempt_id, sum(n_client) AS n_client, sum(n_server) AS n_server FROM per_output GROUP BY attempt_id
)
SELECT coalesce(c.attempt_id, o.attempt_id) AS attempt_id, c.task_id, c.session_id, c.request_id,
       coalesce(c.n_client, 0) + coalesce(o.n_client, 0) AS n_client_events,
       coalesce(c.n_server, 0) + coalesce(o.n_server, 0) AS n_server_events,
       coalesce(c.n_kv_events, 0) AS n_kv_events,
       -- no served folder holds it and llama.cpp's timings answered it: the deployment's one llama.cpp replica
       coalesce(c.replica_id, CASE WHEN c.llamacpp_answered THEN (
         SELECT any_value(replica_id) FROM declared_replicas() WHERE kind = 'llamacpp' HAVING count(*) = 1) END)
         AS replica_id,
       c.parent_attempt_id, c.router_replica_id,
       -- the client's attempt: one the load client made (its own events record it); a router's try never
       -- is; neither known without a client event (docs/LEDGER.md "attempts and accounts")
       CASE WHEN c.parent_attempt_id IS NOT NULL THEN false
            WHEN coalesce(c.n_client, 0) + coalesce(o.n_client, 0) > 0 THEN true END AS client_attempt
FROM control c FULL OUTER JOIN outputs o USING (attempt_id);

CREATE OR REPLACE TEMP TABLE marks AS
WITH firsts AS (
  SELECT attempt_id,
    -- client
    first_point(ts_ns, clock, event_id, seq, name = 'attempt.created') AS created,
    first_point(ts_ns, clock, event_id, seq, name = 'attempt.sent') AS sent,
    first_point(ts_ns, clock, event_id, seq, name = 'attempt.first_byte') AS first_byte_ev,
    first_point(ts_ns, clock, event_id, seq, name = 'attempt.done') AS done,
    arg_min(struct_pack(ns := ts_ns, clock := clock, eid := event_id, name := name), (ts_ns, seq, event_id))
        FILTER (WHERE name IN ('attempt.done', 'attempt.timeout', 'attempt.cancel', 'attempt.error')) AS client_end,
    first_point(ts_ns, clock, event_id, seq, name = 'attempt.cancel') AS client_cancel,
    list(DISTINCT name ORDER BY name) FILTER (WHERE name IN ('attempt.done', 'attempt.timeout', 'attempt.cancel', 'attempt.error')) AS client_terminals,
    -- server / engine
    first_point(ts_ns, clock, event_id, seq, name = 'server.received') AS received,
    first_point(ts_ns, clock, event_id, seq, name = 'server.rejected') AS rejected,
    last_point(ts_ns, clock, event_id, seq, name = 'server.done') AS server_done,
    first_point(ts_ns, clock, event_id, seq, name = 'server.disconnect') AS disconnect,
    first_point(ts_ns, clock, event_id, seq, name = 'engine.enqueued') AS enqueued,
    first_point(ts_ns, clock, event_id, seq, name = 'engine.scheduled') AS scheduled,
    arg_max(struct_pack(ns := ts_ns, clock := clock, eid := event_id, reason := reason), (ts_ns, seq, event_id)) FILTER (WHERE name = 'engine.finished') AS finished,
    first_point(ts_ns, clock, event_id, seq, name = 'engine.cancel_received') AS cancel_received,
    first_point(ts_ns, clock, event_id, seq, name = 'engine.cancel_effective') AS cancel_effective,
    last_point(ts_ns, clock, event_id, seq, name = 'engine.scheduled') AS last_scheduled,
    last_point(ts_ns, clock, event_id, seq, name = 'engine.preempted') AS last_preempted,
    last_point(ts_ns, clock, event_id, seq, name = 'kv.release') AS kv_release,
    last_point(ts_ns, clock, event_id, seq, name = 'kv.free') AS kv_free,
    last_point(ts_ns, clock, event_id, seq, name = 'mem.returned') AS mem_returned,
    count(*) FILTER (WHERE name IN ('kv.alloc', 'kv.prefix_hit')) AS n_kv_alloc,
    -- counts
    arg_max(usage_completion, (ts_ns, seq, event_id)) FILTER (WHERE name = 'attempt.done') AS n_tokens_usage,
    arg_max(usage_prompt, (ts_ns, seq, event_id)) FILTER (WHERE name = 'attempt.done') AS n_prompt_usage,
    max(value) FILTER (WHERE name = 'engine.enqueued') AS n_prompt_engine,
    -- of those, the tokens its prefix cache served at its first admission (engine.prefill attrs.cached_tokens):
    -- not computed. A recompute after a preemption finds its own blocks in the cache: those are not prompt tokens
    -- served again (the counters leave them out too)
    sum(TRY_CAST(json_extract_string(attrs, '$.cached_tokens') AS BIGINT))
      FILTER (WHERE name = 'engine.prefill'
              AND NOT coalesce(TRY_CAST(json_extract_string(attrs, '$.recompute') AS BOOLEAN), false))
      AS n_prompt_cached,
    -- the prefill tokens it computed (engine.prefill values, recomputation after a preemption included)
    sum(value) FILTER (WHERE name = 'engine.prefill') AS n_prefill_computed,
    arg_max(reason, (ts_ns, seq, event_id)) FILTER (WHERE name = 'attempt.done') AS client_finish_reason,
    count(*) FILTER (WHERE name = 'engine.preempted') AS preemptions,
    coalesce(sum(value) FILTER (WHERE name = 'engine.preempted'), 0) AS recomputed_tokens,
    count(*) FILTER (WHERE name = 'spec.round') AS spec_rounds,
    sum(json_bigint(attrs, '$.forward_passes')) FILTER (WHERE name = 'spec.round') AS spec_forward_passes,
    sum(json_bigint(attrs, '$.drafted')) FILTER (WHERE name = 'spec.round') AS spec_drafted_tokens,
    sum(json_bigint(attrs, '$.accepted')) FILTER (WHERE name = 'spec.round') AS spec_accepted_tokens,
    arg_max(verdict_correct, (ts_ns, seq, event_id)) FILTER (WHERE name = 'verdict') AS correct
  FROM ev WHERE attempt_id IS NOT NULL
  GROUP BY attempt_id
), toks AS (
  SELECT attempt_id,
    first_point(ts_ns, clock, event_id, seq, true) AS first_token,
    min(step_id) AS first_token_step,
    sum(value) AS n_tokens_engine,
    count(DISTINCT choice) AS n_choices_engine
  FROM ev_tok WHERE attempt_id IS NOT NULL
  GROUP BY attempt_id
), outs AS (  -- the attempt's firsts: the first of its choices' (choice_outs)
  SELECT attempt_id,
    point_of(arg_min(first_chunk, (first_chunk.ns, first_chunk.sq, first_chunk.eid)) FILTER (WHERE first_chunk IS NOT NULL)) AS first_chunk,
    sum(n_chunks)::BIGINT AS n_chunks,
    count(*) FILTER (WHERE has_output) AS n_choices_output,
    point_of(arg_min(first_content, (first_content.ns, first_content.sq, first_content.eid)) FILTER (WHERE first_content IS NOT NULL)) AS first_content,
    point_of(arg_min(first_visible, (first_visible.ns, first_visible.sq, first_visible.eid)) FILTER (WHERE first_visible IS NOT NULL)) AS first_visible,
    point_of(arg_min(first_write, (first_write.ns, first_write.sq, first_write.eid)) FILTER (WHERE first_write IS NOT NULL)) AS first_write
  FROM choice_outs
  GROUP BY attempt_id
), prefill_end AS (
  -- the last prefill chunk computed before the first token
  SELECT p.attempt_id,
         last_point(p.ts_ns, p.clock, p.event_id, p.seq, true) AS prefill_end
  FROM ev p LEFT JOIN toks t USING (attempt_id)
  WHERE p.name = 'engine.prefill' AND (t.first_token IS NULL OR p.ts_ns <= t.first_token.ns)
  GROUP BY p.attempt_id
)
SELECT a.attempt_id, f.* EXCLUDE (attempt_id, done),
       -- the earliest client terminal decides: a done after a timeout (or a cancel) is not a completion
       CASE WHEN f.client_end.name = 'attempt.done' THEN f.done END AS done,
       o.first_content, o.first_visible, o.first_write, pe.prefill_end,
       t.first_token, t.first_token_step,
       -- an attempt the engine finished without committing a token (cancelled while queued) made 0
       CASE WHEN t.n_tokens_engine IS NULL AND f.finished IS NOT NULL THEN 0 ELSE t.n_tokens_engine END AS n_tokens_engine,
       coalesce(o.n_chunks, 0) AS n_chunks,
       coalesce(f.first_byte_ev, o.first_chunk) AS first_byte,
       coalesce(f.server_done, f.rejected, point_of(f.finished),
                f.cancel_effective) AS server_end,
       coalesce(t.n_tokens_engine, CASE WHEN f.finished IS NOT NULL THEN 0 END, f.n_tokens_usage) AS n_output_tokens,
       -- an attempt's prompt length, the one definition: the engine's count (engine.enqueued's value),
       -- else the usage the client received with its last attempt.done (a black-box server)
       coalesce(f.n_prompt_engine, f.n_prompt_usage) AS n_prompt_tokens,
       nullif(greatest(coalesce(t.n_choices_engine, 0), coalesce(o.n_choices_output, 0)), 0) AS n_choices
FROM (SELECT attempt_id FROM attempt_ids) a
LEFT JOIN firsts f USING (attempt_id) LEFT JOIN toks t USING (attempt_id)
LEFT JOIN outs o USING (attempt_id) LEFT JOIN prefill_end pe USING (attempt_id);

-- Per-choice milestones (n > 1: docs/LEDGER.md "choice_metrics"). A choice exists where an engine
-- token or an output-bearing chunk / write names it. It ends at its own finish chunk (finish write)
-- when another choice finishes after it; the last one ends where the attempt does, as for n = 1.
CREATE OR REPLACE TEMP TABLE choice_marks AS
WITH tok AS (
  SELECT attempt_id, choice,
         first_point(ts_ns, clock, event_id, seq, true) AS first_token,
         sum(value) AS n_tokens_engine
  FROM ev_tok WHERE attempt_id IS NOT NULL GROUP BY attempt_id, choice
), out AS (
  SELECT attempt_id, choice, point_of(first_content) AS first_content, finish_chunk, finish_write, has_output
  FROM choice_outs
), c AS (
  SELECT coalesce(t.attempt_id, o.attempt_id) AS attempt_id, coalesce(t.choice, o.choice) AS choice,
         t.first_token, t.n_tokens_engine, o.first_content, o.finish_chunk, o.finish_write
  FROM tok t FULL OUTER JOIN (SELECT * FROM out WHERE has_output) o USING (attempt_id, choice)
)
SELECT c.attempt_id, c.choice, c.first_token, c.first_content,
       -- with one choice the attempt's count is the choice's (usage included); with several only the engine's per-choice count
       coalesce(c.n_tokens_engine, CASE WHEN m.n_choices = 1 THEN m.n_output_tokens END) AS n_tokens,
       CASE WHEN c.finish_chunk.ns < max(c.finish_chunk.ns) OVER (PARTITION BY c.attempt_id)
            THEN c.finish_chunk ELSE m.done END AS client_end,
       CASE WHEN c.finish_write.ns < max(c.finish_write.ns) OVER (PARTITION BY c.attempt_id)
            THEN c.finish_write
            WHEN m.server_done IS NOT NULL OR m.finished IS NOT NULL THEN m.server_end END AS server_end
FROM c JOIN marks m USING (attempt_id);

-- @gaps: conflicting client terminal events (the earliest decides every client figure).
CREATE OR REPLACE TEMP TABLE marks_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO marks_gaps
SELECT 'attempt', attempt_id, 'client_status, e2e_client_ms, tpot_ms, on_time, good (the earliest terminal decides)',
       'one terminal event per attempt from the client',
       format('the client recorded {}; the earliest, {} ({}), decides', array_to_string(client_terminals, ' and '),
              client_end.name, client_end.eid)
FROM marks WHERE len(client_terminals) > 1;
