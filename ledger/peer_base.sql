-- The per-attempt inputs of the peers' definitions (ledger/peer_views.sql, docs/LEDGER.md "peer_views"):
-- the client events of each attempt the client saw complete, read once per task.
--
-- What an imported tool kept decides which rows its events can feed (attempt.done attrs.chunks):
--   absent      our own client: every chunk, with its kinds
--   content     AIPerf: every content chunk, no role / finish / usage chunk
--   first_last  GuideLLM: the first and the last content chunk only
--   choices     vLLM bench: every chunk with choices, kinds unknown (no server to label them)
--   labelled    vLLM bench joined with the server: every chunk with choices, kinds from its server write
-- Tokens: the importing tool's own count when it kept one (attrs.reported_output_tokens; AIPerf
-- re-tokenises the text), else the server's (attempts.n_output_tokens).
--
-- Each row is one attempt's: its chunk times, and its samples of the pooled-gap rows as lists (the
-- gaps between its chunks with choices, vLLM bench's ITL; its client and server gaps in itl), so the
-- rollups, peer_views and peer_comparison, read one row per attempt and never an event (docs/SCALE.md).
--
-- scope: task
-- reads: ev_out, ev, attempts, itl, figures
-- creates: peer_base, peer_reporters

CREATE OR REPLACE TEMP TABLE peer_base AS
WITH c AS (
  SELECT attempt_id,
         min(ts_ns) FILTER (WHERE choices_bearing) AS first_choices_ns,
         max(ts_ns) FILTER (WHERE choices_bearing) AS last_choices_ns,
         min(ts_ns) FILTER (WHERE output_bearing) AS first_content_ns,
         max(ts_ns) FILTER (WHERE output_bearing) AS last_content_ns,
         -- the times in order: sorting the bare values lists them as an ORDER BY ts_ns, seq does (a tie on
         -- ts_ns lists the same value twice whichever seq comes first), without an ordered aggregate's sort per group
         list_sort(list(ts_ns) FILTER (WHERE choices_bearing)) AS choices_ts
  FROM ev_out WHERE name = 'attempt.chunk' GROUP BY attempt_id
), client_gaps AS (  -- the attempt's gaps per layer in itl's order: choice by choice, each in idx order
  SELECT attempt_id, list(gap_ms ORDER BY choice, idx) FILTER (WHERE layer = 'client') AS gaps_ms,
         list(gap_ms ORDER BY choice, idx) FILTER (WHERE layer = 'server') AS server_gaps_ms
  FROM itl WHERE layer IN ('client', 'server') AND gap_ms IS NOT NULL GROUP BY attempt_id
), sent AS (
  SELECT attempt_id, TRY_CAST(json_extract_string(attrs, '$.pacing_error_ms') AS DOUBLE) AS pacing_error_ms
  FROM ev WHERE name = 'attempt.sent'
  QUALIFY row_number() OVER (PARTITION BY attempt_id ORDER BY ts_ns, seq, event_id) = 1
), done AS (
  SELECT attempt_id, json_extract_string(attrs, '$.chunks') AS chunks,
         TRY_CAST(json_extract_string(attrs, '$.reported_output_tokens') AS BIGINT) AS n_reported
  FROM ev WHERE name = 'attempt.done' AND source = 'client'
  QUALIFY row_number() OVER (PARTITION BY attempt_id ORDER BY ts_ns, seq, event_id) = 1
), refused AS (  -- request_metrics' impossible-order rule: an attempt with a client figure it refuses
  SELECT DISTINCT split_part(subject_id, '#', 1) AS attempt_id FROM figures
  WHERE impossible AND figure IN ('ttft_client', 'ttft_first_byte', 'ttft_visible', 'e2e_client', 'client_span',
                                  'choice_ttft_client', 'choice_decode_client')
), kept AS (
  SELECT b.attempt_id, b.chunks, b.n_reported,
         b.chunks IS NULL OR b.chunks IN ('content', 'first_last', 'labelled') AS content_ok,
         b.chunks IS NULL OR b.chunks IN ('choices', 'labelled') AS choices_ok,
         b.chunks IS NULL OR b.chunks IN ('content', 'labelled') AS every_content_ok
  FROM done b
)
SELECT a.attempt_id, a.sent_ns, a.client_end_ns AS done_ns, a.n_output_tokens AS n,
       coalesce(k.n_reported, a.n_output_tokens) AS n_tool,
       CASE WHEN k.choices_ok THEN c.first_choices_ns END AS first_choices_ns,
       CASE WHEN k.choices_ok THEN c.last_choices_ns END AS last_choices_ns,
       CASE WHEN k.content_ok THEN c.first_content_ns END AS first_content_ns,
       CASE WHEN k.content_ok THEN c.last_content_ns END AS last_content_ns,
       k.choices_ok, k.every_content_ok, s.pacing_error_ms, r.attempt_id IS NOT NULL AS refused,
       -- vLLM bench's ITL samples: the gaps between consecutive chunks with choices (ms)
       CASE WHEN k.choices_ok IS NOT FALSE
            THEN list_transform(range(1, len(c.choices_ts)), lambda i: (c.choices_ts[i + 1] - c.choices_ts[i]) / 1e6)
       END AS choice_gaps_ms,
       -- our ITL samples: the attempt's client gaps in itl, where the tool kept every content chunk
       CASE WHEN k.every_content_ok IS NOT FALSE THEN g.gaps_ms END AS content_gaps_ms,
       -- the engine's ITL samples of the same attempt (itl's server gaps), for peer_comparison
       g.server_gaps_ms
FROM attempts a JOIN c USING (attempt_id) LEFT JOIN sent s USING (attempt_id) LEFT JOIN kept k USING (attempt_id)
LEFT JOIN refused r USING (attempt_id) LEFT JOIN client_gaps g USING (attempt_id)
WHERE a.client_status = 'completed' AND a.sent_ns IS NOT NULL;


-- who reported each send, when a load tool did (peer_views_gaps names it, peer_comparison marks its
-- rows imported): one row per attempt.sent with a reporter or reported evidence
CREATE OR REPLACE TEMP TABLE peer_reporters AS
SELECT event_id, attempt_id, source, json_extract_string(attrs, '$.evidence') AS evidence,
       json_extract_string(attrs, '$.reporter') AS reporter
FROM ev WHERE name = 'attempt.sent'
  AND (json_extract_string(attrs, '$.reporter') IS NOT NULL OR json_extract_string(attrs, '$.evidence') = 'reported');
