-- KV holds: which physical blocks each attempt held, from when to when, from that attempt's own KV
-- events (task scope, so a shard computes its tasks' holds); ledger/kv_holding.sql splits each block's
-- bytes among the attempts holding it at once (docs/LEDGER.md "The resource account").
--
-- scope: task
-- reads: ev, events
-- creates: kv_holds, clock_ends
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

-- the first and last event on each clock (a hold never released ends at the last; a prediction's registration
-- is compared with the first): two rows per clock, each naming its event (any one of them on a tie), so a
-- sharded build's shards keep the rows of the events they own and their minimum and maximum are the run's
-- (docs/SCALE.md)
CREATE OR REPLACE TEMP TABLE clock_ends AS
WITH ends AS MATERIALIZED (  -- one scan of the events for both edges
  SELECT clock, arg_min(event_id, ts_ns) AS first_id, min(ts_ns) AS first_ns,
         arg_max(event_id, ts_ns) AS last_id, max(ts_ns) AS last_ns
  FROM events GROUP BY clock
)
SELECT clock, 'first' AS edge, first_id AS event_id, first_ns AS ts_ns FROM ends
UNION ALL
SELECT clock, 'last', last_id, last_ns FROM ends;
