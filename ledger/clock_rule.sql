-- The clock rule's conversions (docs/LEDGER.md "Clock rule"): identity per domain (measured; simulated
-- on a sim: clock) and each mapping in both directions (derived ± epsilon). Every stage converts through this table.
--
-- scope: run
-- reads: events, clocks
-- creates: clock_conv

CREATE OR REPLACE TEMP TABLE clock_conv AS
WITH domains AS (
  SELECT DISTINCT clock FROM events
  UNION SELECT clock FROM clocks WHERE clock IS NOT NULL
), maps AS (
  SELECT from_clock, to_clock, offset_ns, epsilon_ns FROM clocks WHERE from_clock IS NOT NULL
  UNION ALL
  SELECT to_clock, from_clock, -offset_ns, epsilon_ns FROM clocks WHERE from_clock IS NOT NULL
)
SELECT clock AS from_clock, clock AS to_clock, 0::BIGINT AS offset_ns, 0::BIGINT AS eps_ns,
       CASE WHEN clock LIKE 'sim:%' THEN 'simulated' ELSE 'measured' END AS label FROM domains  -- a sim: clock measures nothing
UNION ALL
SELECT from_clock, to_clock, offset_ns, eps_ns, 'derived' FROM (
  SELECT from_clock, to_clock, offset_ns, epsilon_ns AS eps_ns FROM maps WHERE from_clock <> to_clock
  QUALIFY row_number() OVER (PARTITION BY from_clock, to_clock ORDER BY epsilon_ns, offset_ns) = 1);
