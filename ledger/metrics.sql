-- Inter-token latency per layer, the per-choice metrics and the per-attempt metrics (docs/LEDGER.md
-- "request_metrics", "itl", "choice_metrics").
--
-- reads: ev_out, ev_tok, figures, choice_marks, attempts, marks, attempt_ids, contracts, attempt_evidence
-- creates: itl, choice_metrics, choice_tpot, fig_wide, itl_max, request_metrics

CREATE OR REPLACE TABLE itl AS
WITH outputs AS (  -- gaps within one choice: the choices of an n > 1 request stream side by side
  SELECT attempt_id, 'client' AS layer, choice, ts_ns, seq, value FROM ev_out WHERE name = 'attempt.chunk' AND output_bearing
  UNION ALL SELECT attempt_id, 'server', choice, ts_ns, seq, value FROM ev_out WHERE name = 'server.write' AND output_bearing
  -- a span gives the first token and the last one, not each token: the tokens between are one
  -- aggregate engine.token, so engine-layer gaps of such an attempt are unknown, not one decode-long gap
  UNION ALL SELECT attempt_id, 'engine', choice, ts_ns, seq, value FROM ev_tok
  WHERE attempt_id NOT IN (SELECT attempt_id FROM attempt_evidence WHERE aggregate_tokens)
), ordered AS (  -- each attempt's outputs per layer as one ordered list: small sorts, no global window
  SELECT attempt_id, layer, choice, list(struct_pack(t := ts_ns, v := value) ORDER BY ts_ns, seq) AS xs
  FROM outputs WHERE attempt_id IS NOT NULL GROUP BY attempt_id, layer, choice
), positions AS (
  SELECT attempt_id, layer, choice, xs, unnest(range(2, len(xs) + 1)) AS i FROM ordered
)
SELECT getvariable('run_id') AS run_id, attempt_id, layer, (i - 1)::INTEGER AS idx,
       (xs[i].t - xs[i - 1].t) / 1e6 AS gap_ms, xs[i].v AS tokens, choice
FROM positions;  -- millions of rows: left unsorted (order by attempt_id, layer, choice, idx to browse)

-- Per choice: its token count, TTFTs, TPOTs and largest gaps. TPOT = its decode span / (tokens − 1).
CREATE OR REPLACE TABLE choice_metrics AS
WITH f AS (
  SELECT split_part(subject_id, '#', 1) AS attempt_id, TRY_CAST(split_part(subject_id, '#', 2) AS INTEGER) AS choice,
         max(ms) FILTER (WHERE figure = 'choice_ttft_client') AS ttft_client_ms,
         max(ms) FILTER (WHERE figure = 'choice_ttft_server') AS ttft_server_ms,
         max(ms) FILTER (WHERE figure = 'choice_decode_client') AS decode_client_ms,
         max(ms) FILTER (WHERE figure = 'choice_decode_server') AS decode_server_ms
  FROM figures WHERE figure LIKE 'choice\_%' ESCAPE '\' GROUP BY subject_id
), g AS (
  SELECT attempt_id, choice,
         max(gap_ms) FILTER (WHERE layer = 'client') AS itl_client_max_ms,
         max(gap_ms) FILTER (WHERE layer = 'server') AS itl_server_max_ms,
         max(gap_ms) FILTER (WHERE layer = 'engine') AS itl_engine_max_ms
  FROM itl GROUP BY attempt_id, choice
)
SELECT getvariable('run_id') AS run_id, c.attempt_id, c.choice, c.n_tokens::BIGINT AS n_output_tokens,
       f.ttft_client_ms, f.ttft_server_ms, f.decode_client_ms, f.decode_server_ms,
       -- a TPOT needs its TTFT: a choice whose first output is not after the send has neither
       CASE WHEN a.client_status = 'completed' AND c.n_tokens > 1 AND f.ttft_client_ms IS NOT NULL
            THEN f.decode_client_ms / (c.n_tokens - 1) END AS tpot_ms,
       CASE WHEN a.server_status = 'completed' AND c.n_tokens > 1 AND f.ttft_server_ms IS NOT NULL
            THEN f.decode_server_ms / (c.n_tokens - 1) END AS tpot_server_ms,
       g.itl_client_max_ms, g.itl_server_max_ms, g.itl_engine_max_ms
FROM choice_marks c JOIN attempts a USING (attempt_id)
LEFT JOIN f USING (attempt_id, choice) LEFT JOIN g USING (attempt_id, choice)
ORDER BY c.attempt_id, c.choice;

-- The attempt's TPOT over its choices, token-weighted: Σ decode spans / Σ (tokens − 1) over the choices
-- with more than one token (= the n = 1 formula for one choice); unknown when any such choice's span
-- or any choice's count is unknown.
CREATE OR REPLACE TEMP TABLE choice_tpot AS
SELECT attempt_id,
       CASE WHEN count(*) FILTER (WHERE n_output_tokens IS NULL) = 0
                 AND count(*) FILTER (WHERE n_output_tokens > 1 AND decode_client_ms IS NULL) = 0
                 AND count(*) FILTER (WHERE n_output_tokens > 1 AND ttft_client_ms IS NULL) = 0
            THEN sum(decode_client_ms) FILTER (WHERE n_output_tokens > 1)
                 / nullif(sum(n_output_tokens - 1) FILTER (WHERE n_output_tokens > 1), 0) END AS tpot_ms,
       CASE WHEN count(*) FILTER (WHERE n_output_tokens IS NULL) = 0
                 AND count(*) FILTER (WHERE n_output_tokens > 1 AND decode_server_ms IS NULL) = 0
                 AND count(*) FILTER (WHERE n_output_tokens > 1 AND ttft_server_ms IS NULL) = 0
            THEN sum(decode_server_ms) FILTER (WHERE n_output_tokens > 1)
                 / nullif(sum(n_output_tokens - 1) FILTER (WHERE n_output_tokens > 1), 0) END AS tpot_server_ms
FROM choice_metrics GROUP BY attempt_id;

CREATE OR REPLACE TEMP TABLE fig_wide AS
SELECT subject_id AS attempt_id,
  max(ms) FILTER (WHERE figure = 'ttft_client') AS ttft_client_ms,
  max(ms) FILTER (WHERE figure = 'ttft_first_byte') AS ttft_first_byte_ms,
  max(ms) FILTER (WHERE figure = 'ttft_visible') AS ttft_visible_ms,
  max(ms) FILTER (WHERE figure = 'ttft_server') AS ttft_server_ms,
  max(ms) FILTER (WHERE figure = 'e2e_client') AS e2e_client_ms,
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

CREATE OR REPLACE TABLE request_metrics AS
SELECT getvariable('run_id') AS run_id, a.attempt_id, a.task_id, a.request_id,
  f.ttft_client_ms, f.ttft_first_byte_ms, f.ttft_visible_ms, f.ttft_server_ms,
  f.e2e_client_ms, f.e2e_server_ms, f.client_span_ms,
  f.queue_ms, f.prefill_ms, f.decode_ms,
  CASE WHEN a.client_status = 'completed' AND f.e2e_client_ms IS NOT NULL THEN ct.tpot_ms END AS tpot_ms,
  CASE WHEN a.server_status = 'completed' AND f.e2e_server_ms IS NOT NULL THEN ct.tpot_server_ms END AS tpot_server_ms,
  x.itl_client_max_ms, x.itl_server_max_ms, x.itl_engine_max_ms,
  -- engine counts are counts only where the engine left evidence; otherwise unknown
  CASE WHEN i.n_server_events > 0 THEN m.preemptions END::BIGINT AS preemptions,
  CASE WHEN i.n_server_events > 0 THEN m.recomputed_tokens END::BIGINT AS recomputed_tokens,
  f.release_after_cancel_ms, f.release_after_cancel_eps_ms, f.release_after_cancel_label,
  f.uplink_ms, f.uplink_eps_ms, f.uplink_label,
  f.downlink_first_ms, f.downlink_first_eps_ms, f.downlink_first_label,
  CASE WHEN i.n_server_events > 0 THEN m.spec_rounds END::BIGINT AS spec_rounds, m.spec_forward_passes::BIGINT AS spec_forward_passes,
  m.spec_drafted_tokens::BIGINT AS spec_drafted_tokens, m.spec_accepted_tokens::BIGINT AS spec_accepted_tokens,
  a.n_output_tokens, a.n_chunks, m.n_choices::INTEGER AS n_choices,
  m.correct,
  CASE WHEN c.deadline_ms IS NULL THEN NULL ELSE f.done_since_reference_ms <= c.deadline_ms END AS on_time,
  -- good = completed at the client AND correct AND (with a deadline) on time; SQL's three-valued AND
  -- keeps a missing verdict, or an unknown time against a deadline, NULL unless another part is false.
  -- An attempt still open when the run closed is unknown too. tasks (60_tasks.sql) reads this column.
  CASE WHEN a.client_status IS NULL OR a.client_status = 'unterminated' THEN NULL
       WHEN a.client_status <> 'completed' THEN false
       ELSE m.correct AND (CASE WHEN c.deadline_ms IS NULL THEN true
                                ELSE f.done_since_reference_ms <= c.deadline_ms END) END AS good,
  f.done_since_reference_ms,
  e.evidence AS server_evidence, e.reporter AS server_reporter
FROM attempts a
JOIN marks m USING (attempt_id)
JOIN attempt_ids i USING (attempt_id)
LEFT JOIN fig_wide f USING (attempt_id)
LEFT JOIN itl_max x USING (attempt_id)
LEFT JOIN choice_tpot ct USING (attempt_id)
LEFT JOIN contracts c ON c.task_id = a.task_id
LEFT JOIN attempt_evidence e USING (attempt_id)
ORDER BY a.attempt_id;

