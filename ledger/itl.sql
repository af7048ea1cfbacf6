-- Inter-token latency: the gaps between consecutive output-bearing events of one choice, per layer
-- (docs/LEDGER.md "itl"). A chunk is not a token: a chunk of several tokens is one gap.
--
-- scope: task
-- reads: ev_out, ev_tok, attempt_evidence
-- creates: itl

-- @table itl: one row per gap between consecutive output-bearing events of one choice, per layer
--   (docs/LEDGER.md "itl"); a chunk with several tokens is still one gap
-- @column layer: client (attempt.chunk with content, reasoning or tool_call), server (server.write of
--   those kinds) or engine (engine.token); an attempt whose tokens a span reported has no engine rows
-- @column idx: 1, 2, ... per (attempt, layer, choice)
-- @column gap_ms: event idx − event idx−1, on the events' own clock
-- @column tokens: the later event's value (the tokens it carried; NULL when it says none)
-- @column choice: the choice (attrs.choice; absent = 0) both events belong to
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
