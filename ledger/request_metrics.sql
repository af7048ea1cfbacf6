-- The per-attempt metrics: each figure of `figures` in its column, the largest gaps, the counts, and
-- whether the attempt was good (docs/LEDGER.md "request_metrics").
--
-- scope: task
-- reads: figures, itl, choice_tpot, attempts, marks, attempt_ids, contracts, attempt_evidence, reported_timings
-- creates: fig_wide, itl_max, request_metrics

CREATE OR REPLACE TEMP TABLE fig_wide AS
SELECT subject_id AS attempt_id,
  max(ms) FILTER (WHERE figure = 'ttft_client') AS ttft_client_ms,
  max(ms) FILTER (WHERE figure = 'ttft_first_byte') AS ttft_first_byte_ms,
  max(ms) FILTER (WHERE figure = 'ttft_visible') AS ttft_visible_ms,
  max(ms) FILTER (WHERE figure = 'ttft_server') AS ttft_server_ms,
  max(ms) FILTER (WHERE figure = 'e2e_client') AS e2e_client_ms,
  max(label) FILTER (WHERE figure = 'e2e_client') AS e2e_client_label,
  max(ms) FILTER (WHERE figure = 'client_span') AS client_span_ms,
  max(ms) FILTER (WHERE figure = 'e2e_server') AS e2e_server_ms,
  max(ms) FILTER (WHERE figure = 'queue') AS queue_ms,
  max(ms) FILTER (WHERE figure = 'prefill') AS prefill_ms,
  max(ms) FILTER (WHERE figure = 'decode') AS decode_ms,
  max(ms) FILTER (WHERE figure = 'release_after_cancel') AS release_after_cancel_ms,
  max(eps_ms) FILTER (WHERE figure = 'release_after_cancel') AS release_after_cancel_eps_ms,
  max(label) FILTER (WHERE figure = 'release_after_cancel') AS release_after_cancel_label,
  max(ms) FILTER (WHERE figure = 'uplink') AS uplink_ms,
  max(eps_ms) FILTER (WHERE figure = 'uplink') AS uplink_eps_ms,
  max(label) FILTER (WHERE figure = 'uplink') AS uplink_label,
  max(ms) FILTER (WHERE figure = 'downlink_first') AS downlink_first_ms,
  max(eps_ms) FILTER (WHERE figure = 'downlink_first') AS downlink_first_eps_ms,
  max(label) FILTER (WHERE figure = 'downlink_first') AS downlink_first_label,
  max(ms) FILTER (WHERE figure = 'since_reference') AS done_since_reference_ms
FROM figures WHERE subject_id IN (SELECT attempt_id FROM marks)
GROUP BY subject_id;

CREATE OR REPLACE TEMP TABLE itl_max AS
SELECT attempt_id,
  max(gap_ms) FILTER (WHERE layer = 'client') AS itl_client_max_ms,
  max(gap_ms) FILTER (WHERE layer = 'server') AS itl_server_max_ms,
  max(gap_ms) FILTER (WHERE layer = 'engine') AS itl_engine_max_ms
FROM itl GROUP BY attempt_id;

-- @table request_metrics: one row per attempt: its latencies at each observation layer, its counts and
--   whether it was good (docs/LEDGER.md "request_metrics"); a figure whose events are missing, on
--   clocks no mapping joins, or in an impossible order is NULL with a gap
-- @column task_id: the attempt's task
-- @column request_id: the attempt's request
-- @column ttft_client_ms: first chunk with content, reasoning or a tool call − sent (client)
-- @column ttft_first_byte_ms: first byte (attempt.first_byte, else the first chunk) − sent (client)
-- @column ttft_visible_ms: first chunk with answer content − sent (client)
-- @column ttft_server_ms: first engine.token − engine.enqueued (engine)
-- @column e2e_client_ms: attempt.done − sent, for an attempt the client saw complete (client)
-- @column e2e_server_ms: (server.done, else engine.finished) − engine.enqueued (server)
-- @column client_span_ms: the earliest client terminal − (created, else sent), whatever the terminal:
--   how long the client held the attempt (client)
-- @column queue_ms: first engine.scheduled − engine.enqueued (engine)
-- @column prefill_ms: first engine.token − first engine.scheduled (engine); without engine events, an
--   engine's reported prefill duration placed inside the client's interval (reported_timings)
-- @column decode_ms: engine.finished − first engine.token (engine); without engine events, an engine's
--   reported decode duration placed inside the client's interval (reported_timings)
-- @column tpot_ms: Σ choice_metrics.decode_client_ms / Σ (tokens − 1) over the choices with more than
--   one token, for an attempt the client saw complete; one choice: (done − first content) /
--   (n_output_tokens − 1); NULL when a choice's count or span is unknown (client)
-- @column tpot_server_ms: the same over decode_server_ms, where server_status is completed (server)
-- @column itl_client_max_ms: the largest client-layer itl.gap_ms, over all choices
-- @column itl_server_max_ms: the largest server-layer itl.gap_ms
-- @column itl_engine_max_ms: the largest engine-layer itl.gap_ms (NULL when a span reported the tokens)
-- @column preemptions: engine.preempted events; NULL without server or engine events
-- @column recomputed_tokens: the sum of engine.preempted values (tokens to recompute); NULL as preemptions
-- @column prompt_tokens: its prompt's length (marks.n_prompt_tokens: the engine's count, else the usage the client
--   received); NULL when neither said it
-- @column prompt_tokens_cached: of those, the tokens its engine's prefix cache served at its first admission
--   (marks.n_prompt_cached); NULL without the engine's count
-- @column prefill_tokens_computed: the prefill tokens its engine computed (marks.n_prefill_computed: recomputation
--   after a preemption included); NULL without the engine's count
-- @column release_after_cancel_ms: last kv.free − the earliest cancel evidence (attempt.cancel when its
--   clock compares with kv.free's, else engine.cancel_received); signed: blocks freed before the
--   cancel arrived give a negative delay
-- @column release_after_cancel_eps_ms: its ± ms (the mapping's epsilon; 0 on one clock)
-- @column release_after_cancel_label: measured, derived, simulated (a sim: clock), or unknown (clocks no mapping joins); NULL
--   without a cancel and a kv.free
-- @column uplink_ms: (server.received, else engine.enqueued) − sent, across clocks by the clock rule (link)
-- @column uplink_eps_ms: its ± ms
-- @column uplink_label: measured, derived, unknown (no mapping) or impossible; NULL when an event is missing
-- @column downlink_first_ms: first content chunk − (first server.write, else first engine.token) (link)
-- @column downlink_first_eps_ms: its ± ms
-- @column downlink_first_label: measured, derived, unknown or impossible; NULL when an event is missing
-- @column spec_rounds: speculative-decoding rounds (spec.round events); NULL without server or engine events
-- @column spec_forward_passes: the sum of spec.round attrs.forward_passes; NULL when none carried it
-- @column spec_drafted_tokens: the sum of spec.round attrs.drafted
-- @column spec_accepted_tokens: the sum of spec.round attrs.accepted
-- @column n_output_tokens: the server's count (attempts.n_output_tokens)
-- @column n_chunks: the client's chunks of any kind (attempts.n_chunks)
-- @column n_choices: the choices that left an engine token or an output-bearing chunk or write; NULL when none did
-- @column replica_id: as attempts.replica_id: the replica that served it (NULL with one server)
-- @column correct: the last verdict of the attempt (attrs.correct); NULL without one
-- @column on_time: done_since_reference_ms ≤ the task's deadline_ms; NULL without a deadline or a done,
--   and when the done's own E2E is refused (a done before sent, clocks no mapping joins)
-- @column good: correct AND on time (with a deadline), for an attempt the client saw complete; false
--   when the client ended it otherwise; NULL without client events, while unterminated or in flight, or when a
--   part is unknown and none is false (docs/LEDGER.md "request_metrics")
-- @column done_since_reference_ms: attempt.done − the task's reference (arrival.planned, else
--   task.start, else its first attempt's created or sent)
-- @column server_evidence: observed (our engine's probes), reported (an engine's account of itself, e.g.
--   a vLLM span, llama.cpp's per-response timings), simulated (a run on the simulated clock: the real scheduler, no model compute) or NULL
--   (no server or engine event)
-- @column server_reporter: who reported it (attrs.reporter, e.g. vllm-0.32.0; reported_timings.reporter, e.g.
--   llamacpp-b0-unknown)
CREATE OR REPLACE TABLE request_metrics AS
SELECT getvariable('run_id') AS run_id, a.attempt_id, a.task_id, a.request_id,
  f.ttft_client_ms, f.ttft_first_byte_ms, f.ttft_visible_ms, f.ttft_server_ms,
  f.e2e_client_ms, f.e2e_server_ms, f.client_span_ms,
  f.queue_ms,
  -- llama.cpp reports durations only (reported_timings): taken where they fit the client's interval
  coalesce(f.prefill_ms, CASE WHEN t.inside_client THEN t.prefill_reported_ms END) AS prefill_ms,
  coalesce(f.decode_ms, CASE WHEN t.inside_client THEN t.decode_reported_ms END) AS decode_ms,
  CASE WHEN a.client_status = 'completed' AND f.e2e_client_ms IS NOT NULL THEN ct.tpot_ms END AS tpot_ms,
  CASE WHEN a.server_status = 'completed' AND f.e2e_server_ms IS NOT NULL THEN ct.tpot_server_ms END AS tpot_server_ms,
  x.itl_client_max_ms, x.itl_server_max_ms, x.itl_engine_max_ms,
  -- engine counts are counts only where the engine left evidence; otherwise unknown
  CASE WHEN i.n_server_events > 0 THEN m.preemptions END::BIGINT AS preemptions,
  CASE WHEN i.n_server_events > 0 THEN m.recomputed_tokens END::BIGINT AS recomputed_tokens,
  m.n_prompt_tokens::BIGINT AS prompt_tokens,
  CASE WHEN m.n_prompt_engine IS NOT NULL THEN coalesce(m.n_prompt_cached, 0) END::BIGINT AS prompt_tokens_cached,
  CASE WHEN m.n_prompt_engine IS NOT NULL THEN coalesce(m.n_prefill_computed, 0) END::BIGINT AS prefill_tokens_computed,
  f.release_after_cancel_ms, f.release_after_cancel_eps_ms, f.release_after_cancel_label,
  f.uplink_ms, f.uplink_eps_ms, f.uplink_label,
  f.downlink_first_ms, f.downlink_first_eps_ms, f.downlink_first_label,
  CASE WHEN i.n_server_events > 0 THEN m.spec_rounds END::BIGINT AS spec_rounds, m.spec_forward_passes::BIGINT AS spec_forward_passes,
  m.spec_drafted_tokens::BIGINT AS spec_drafted_tokens, m.spec_accepted_tokens::BIGINT AS spec_accepted_tokens,
  a.n_output_tokens, a.n_chunks, m.n_choices::INTEGER AS n_choices, a.replica_id,
  m.correct,
  -- a done whose own E2E is refused (before its send, clocks no mapping joins) is not on time either
  CASE WHEN c.deadline_ms IS NULL OR f.e2e_client_label IN ('impossible', 'unknown') THEN NULL
       ELSE f.done_since_reference_ms <= c.deadline_ms END AS on_time,
  -- good = completed at the client AND correct AND (with a deadline) on time; SQL's three-valued AND
  -- keeps a missing verdict, or an unknown time against a deadline, NULL unless another part is false.
  -- An attempt still open when the run closed is unknown too. tasks.sql reads this column.
  CASE WHEN a.client_status IS NULL OR a.client_status IN ('unterminated', 'in_flight') THEN NULL
       WHEN a.client_status <> 'completed' THEN false
       ELSE m.correct AND (CASE WHEN c.deadline_ms IS NULL THEN true
                                WHEN f.e2e_client_label IN ('impossible', 'unknown') THEN NULL
                                ELSE f.done_since_reference_ms <= c.deadline_ms END) END AS good,
  f.done_since_reference_ms,
  coalesce(e.evidence, t.evidence) AS server_evidence, coalesce(e.reporter, t.reporter) AS server_reporter
FROM attempts a
JOIN marks m USING (attempt_id)
JOIN attempt_ids i USING (attempt_id)
LEFT JOIN fig_wide f USING (attempt_id)
LEFT JOIN itl_max x USING (attempt_id)
LEFT JOIN choice_tpot ct USING (attempt_id)
LEFT JOIN contracts c ON c.task_id = a.task_id
LEFT JOIN attempt_evidence e USING (attempt_id)
LEFT JOIN reported_timings t USING (attempt_id)
ORDER BY a.attempt_id;
