-- Ghost load: server work after the client stopped waiting, or after a router gave up on its try (a
-- router.try with an error: a timeout, a dropped connection) while the replica went on (same clock or
-- mapped, by the clock rule; docs/LEDGER.md "reconciliation").
--
-- scope: task
-- reads: attempts, marks, clock_conv, ev_tok, ev
-- creates: ghost
CREATE OR REPLACE TEMP TABLE ghost AS
WITH gave_up AS (
  SELECT a.attempt_id, a.server_end_ns, a.server_clock, m.client_end.ns + c.offset_ns AS gave_up_ns  -- in the server's clock
  FROM attempts a JOIN marks m USING (attempt_id)
  JOIN clock_conv c ON c.from_clock = m.client_end.clock AND c.to_clock = a.server_clock
  WHERE a.client_status IN ('timeout', 'cancelled', 'error') AND a.server_end_ns IS NOT NULL
  UNION ALL
  SELECT a.attempt_id, a.server_end_ns, a.server_clock,
         arg_min(json_extract(e.attrs, '$.end_ns')::BIGINT + c.offset_ns, e.event_id) AS gave_up_ns
  FROM attempts a JOIN ev e ON e.attempt_id = a.attempt_id AND e.name = 'router.try'
    AND json_extract_string(e.attrs, '$.error') IS NOT NULL
  JOIN clock_conv c ON c.from_clock = e.clock AND c.to_clock = a.server_clock
  WHERE a.client_status IS NULL AND a.server_end_ns IS NOT NULL
  GROUP BY a.attempt_id, a.server_end_ns, a.server_clock
)
SELECT g.attempt_id, g.gave_up_ns, (g.server_end_ns - g.gave_up_ns) / 1e6 AS ghost_ms,
       -- tokens after the give-up on the same clock (the engine saw the attempt: none is a known 0)
       (SELECT CASE WHEN count(*) = 0 THEN 0 ELSE sum(t.value) END FROM ev_tok t
        WHERE t.attempt_id = g.attempt_id AND t.clock = g.server_clock AND t.ts_ns > g.gave_up_ns) AS ghost_tokens
FROM gave_up g WHERE g.server_end_ns > g.gave_up_ns;
