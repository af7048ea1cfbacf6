-- Per-choice metrics of an n > 1 request (docs/LEDGER.md "choice_metrics"), and the attempt's TPOT
-- over its choices, token-weighted.
--
-- scope: task
-- reads: figures, itl, choice_marks, attempts, marks
-- creates: choice_metrics, choice_tpot, choice_metrics_gaps

-- Per choice: its token count, TTFTs, TPOTs and largest gaps. TPOT = its decode span / (tokens − 1).
-- @table choice_metrics: one row per attempt × choice (n > 1 returns n sequences; docs/LEDGER.md
--   "choice_metrics"); an n = 1 attempt has one row, choice 0
-- @column choice: the choice number (attrs.choice; absent = 0)
-- @column n_output_tokens: the choice's engine.token values; with one choice the attempt's count
--   (usage included); with several and no engine tokens NULL, with a gap
-- @column ttft_client_ms: the choice's first content chunk − sent
-- @column ttft_server_ms: the choice's first token − enqueued
-- @column decode_client_ms: the choice's end − its first content chunk: its own finish chunk when another
--   choice finishes later, else attempt.done
-- @column decode_server_ms: the choice's end − its first token: its own finish write when another choice
--   finishes later, else the server end
-- @column tpot_ms: decode_client_ms / (n_output_tokens − 1) for a choice the client saw complete; NULL
--   with ≤ 1 token or without its TTFT
-- @column tpot_server_ms: decode_server_ms / (n_output_tokens − 1) where the server completed
-- @column itl_client_max_ms: the choice's largest client-layer itl.gap_ms
-- @column itl_server_max_ms: the choice's largest server-layer itl.gap_ms
-- @column itl_engine_max_ms: the choice's largest engine-layer itl.gap_ms (NULL when a span reported
--   its tokens)
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

-- @gaps: several choices without a per-choice token count (usage counts all choices together).
CREATE OR REPLACE TEMP TABLE choice_metrics_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO choice_metrics_gaps
SELECT 'attempt', attempt_id, 'choice_metrics n_output_tokens and tpot, tpot_ms, tpot_server_ms',
       'engine.token events with attrs.choice (usage counts all choices together; a chunk is not a token)',
       format('{} choices without a per-choice token count', count(*))
FROM choice_metrics WHERE n_output_tokens IS NULL AND attempt_id IN (SELECT attempt_id FROM marks WHERE n_choices > 1)
GROUP BY attempt_id;
