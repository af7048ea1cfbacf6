-- KV holding: ∫M(t)dt per attempt, each physical block counted once. An attempt holds a block from
-- the kv.alloc / kv.prefix_hit that names it to its next kv.release (or to the copy-on-write that
-- replaced it); while several attempts hold one block, its bytes are split equally among them
-- (policy 'equal_split'), so the attempts' integrals add up to the physical total (docs/LEDGER.md
-- "The resource account").
--
-- The holds themselves are each attempt's own (ledger/kv_holds.sql, task scope); this rollup reads
-- them and no event.
--
-- scope: rollup
-- reads: kv_holds, clock_ends
-- creates: kv_integral, kv_holding_gaps
CREATE OR REPLACE TEMP TABLE kv_integral AS
WITH last_on_clock AS (SELECT clock, max(ts_ns) AS last_ns FROM clock_ends WHERE edge = 'last' GROUP BY clock),
holds AS (  -- a hold never released ends when the run closed: the last event on the hold's own clock
  SELECT h.attempt_id, h.block, h.start_ns, coalesce(h.end_ns, l.last_ns) AS end_ns
  FROM kv_holds h JOIN last_on_clock l USING (clock)
), pts AS (
  SELECT block, start_ns AS t FROM holds UNION SELECT block, end_ns FROM holds
), segs AS (
  SELECT block, t AS t0, lead(t) OVER (PARTITION BY block ORDER BY t) AS t1 FROM pts
), covered AS (
  SELECT s.block, s.t0, s.t1, h.attempt_id, count(*) OVER (PARTITION BY s.block, s.t0) AS holders
  FROM segs s JOIN holds h ON h.block = s.block AND h.start_ns <= s.t0 AND h.end_ns >= s.t1
  WHERE s.t1 IS NOT NULL AND s.t1 > s.t0
)
SELECT attempt_id, sum((t1 - t0) / holders) / 1e9 * getvariable('kv_block_bytes') / 2^30 AS kv_gib_s,
       sum(t1 - t0) / 1e9 AS block_s_unshared
FROM covered GROUP BY attempt_id;

-- @gaps: KV events without the bytes of a block (every GiB·s figure is unknown).
CREATE OR REPLACE TEMP TABLE kv_holding_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO kv_holding_gaps
SELECT 'run', NULL, 'kv_gib_s, ghost_kv_gib_s', 'the KV block size in bytes (manifest model.kv_bytes_per_token and engine_config.block_size)',
       'the run holds KV events but its manifest does not declare the bytes of a block'
WHERE getvariable('kv_block_bytes') IS NULL AND EXISTS (SELECT 1 FROM kv_holds);
