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
), follows AS (  -- each output's predecessor within its attempt, layer and choice. A window, not each group's
                 -- outputs as one ordered list: DuckDB spills a window's partitions under its memory limit, while
                 -- an ordered list aggregate holds every group's rows at once (a 30 M-event run failed at 1 GB
                 -- that way, and 100 M at 3 GiB)
  SELECT attempt_id, layer, choice, ts_ns, value, lag(ts_ns) OVER w AS prev_ns, row_number() OVER w AS n
  FROM outputs WHERE attempt_id IS NOT NULL
  WINDOW w AS (PARTITION BY attempt_id, layer, choice ORDER BY ts_ns, seq)
)
SELECT getvariable('run_id') AS run_id, attempt_id, layer, (n - 1)::INTEGER AS idx,
       (ts_ns - prev_ns) / 1e6 AS gap_ms, value AS tokens, choice
FROM follows WHERE n > 1;  -- millions of rows: left unsorted (order by attempt_id, layer, choice, idx to browse)
