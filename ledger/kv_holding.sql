-- KV holding: ∫M(t)dt per attempt, each physical block counted once. An attempt holds a block from
-- the kv.alloc / kv.prefix_hit that names it to its next kv.release (or to the copy-on-write that
-- replaced it); while several attempts hold one block, its bytes are split equally among them
-- (policy 'equal_split'), so the attempts' integrals add up to the physical total (docs/LEDGER.md
-- "The resource account").
--
-- scope: rollup
-- reads: ev, events
-- creates: kv_holds, kv_integral, kv_holding_gaps
-- @table kv_holds: one row per attempt × physical KV block it held: from the kv.alloc or kv.prefix_hit
--   that names the block to the attempt's next kv.release (or the copy-on-write that replaced it)
--   (docs/LEDGER.md "The resource account")
-- @column block: the physical block id (kv.alloc / kv.prefix_hit attrs.blocks)
-- @column how: alloc (taken from the pool) or prefix_hit (a cached block reused)
-- @column clock: the clock of the hold's events
-- @column start_ns: when the attempt took the block, ns on clock
-- @column end_ns: its kv.release (or the copy-on-write that replaced the block); NULL while held at the end
-- @column freed_ns: the attempt's kv.free that put the block back in the pool (the last reference
--   released); NULL when its release left the block held by others, or it was never released
CREATE OR REPLACE TABLE kv_holds AS
WITH acq AS (
  SELECT attempt_id, ts_ns, clock, seq, event_id, CASE WHEN name = 'kv.alloc' THEN 'alloc' ELSE 'prefix_hit' END AS how,
         unnest(from_json(coalesce(json_extract(attrs, '$.blocks'), '[]'), '["BIGINT"]')) AS block
  FROM ev WHERE name IN ('kv.alloc', 'kv.prefix_hit') AND attempt_id IS NOT NULL
), rel AS (
  SELECT attempt_id, ts_ns, clock FROM ev WHERE name = 'kv.release' AND attempt_id IS NOT NULL
), cow AS (
  SELECT attempt_id, ts_ns, clock, TRY_CAST(json_extract_string(pair, '$[0]') AS BIGINT) AS block
  FROM (SELECT attempt_id, ts_ns, clock, unnest(from_json(json_extract(attrs, '$.copy_on_write'), '["JSON"]')) AS pair
        FROM ev WHERE name = 'kv.alloc' AND json_extract(attrs, '$.copy_on_write') IS NOT NULL)
), freed AS (
  SELECT attempt_id, ts_ns, clock, unnest(from_json(coalesce(json_extract(attrs, '$.blocks'), '[]'), '["BIGINT"]')) AS block
  FROM ev WHERE name = 'kv.free' AND attempt_id IS NOT NULL
), holds AS (
  SELECT a.attempt_id, a.block, a.how, a.clock, a.ts_ns AS start_ns,
         least((SELECT min(r.ts_ns) FROM rel r WHERE r.attempt_id = a.attempt_id AND r.clock = a.clock AND r.ts_ns >= a.ts_ns),
               (SELECT min(c.ts_ns) FROM cow c WHERE c.attempt_id = a.attempt_id AND c.clock = a.clock AND c.block = a.block
                                                AND c.ts_ns > a.ts_ns))
           AS end_ns
  FROM acq a
)
SELECT getvariable('run_id') AS run_id, h.*,
       (SELECT min(f.ts_ns) FROM freed f WHERE f.attempt_id = h.attempt_id AND f.clock = h.clock AND f.block = h.block
                                           AND f.ts_ns >= h.end_ns) AS freed_ns
FROM holds h
ORDER BY h.attempt_id, h.start_ns, h.block;

CREATE OR REPLACE TEMP TABLE kv_integral AS
WITH last_on_clock AS (SELECT clock, max(ts_ns) AS last_ns FROM events GROUP BY clock),
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
