-- Energy over the observation window, from raw counters (docs/ENERGY.md). Each counter sample is
-- placed in the window's clock by the clock rule; RAPL deltas unwrap at max_energy_range_uj; an NVML
-- counter that goes down (driver reload) invalidates its device's window.
--
-- scope: rollup
-- reads: samples, window_bounds, clock_conv, attempt_ids
-- creates: counter_deltas, window_energy, power_check, energy_gaps
CREATE OR REPLACE TEMP TABLE counter_deltas AS
WITH s AS (
  SELECT sm.metric, sm.device, sm.ts_ns + c.offset_ns AS t, sm.value,
         lag(sm.value) OVER w AS prev, lag(sm.ts_ns + c.offset_ns) OVER w AS prev_t
  FROM samples sm JOIN window_bounds wb ON true
  JOIN clock_conv c ON c.from_clock = sm.clock AND c.to_clock = wb.clock
  WHERE sm.metric IN ('gpu_energy_mj', 'cpu_package_energy_uj', 'cpu_dram_energy_uj')
  WINDOW w AS (PARTITION BY sm.metric, sm.device ORDER BY sm.ts_ns)
), ranges AS (
  SELECT device, max(value) AS max_range FROM samples WHERE metric = 'rapl_max_energy_range_uj' GROUP BY device
)
SELECT s.metric, s.device, s.prev_t, s.t,
       CASE WHEN s.value >= s.prev THEN s.value - s.prev
            WHEN s.metric LIKE 'cpu_%' AND r.max_range IS NOT NULL THEN r.max_range - s.prev + s.value END AS delta,
       s.value < s.prev AS went_down
FROM s LEFT JOIN ranges r USING (device)
WHERE s.prev IS NOT NULL;

-- Window energy (J) per metric. A counter only says what was spent between two samples, so a delta
-- is spread evenly over its interval: the part of it inside the window counts (a delta straddling an
-- edge is apportioned by the time it overlaps, i.e. the counter is interpolated at the edge), the
-- part before the window feeds the idle power. The idle term is that power times the time the window
-- energy covers, so both terms stand on the same time base.
CREATE OR REPLACE TEMP TABLE window_energy AS
WITH d AS (
  SELECT d.*, d.t - d.prev_t AS dur,
         greatest(least(d.t, wb.t1) - greatest(d.prev_t, wb.t0), 0) AS inside_ns,
         greatest(least(d.t, wb.t0) - d.prev_t, 0) AS before_ns,
         wb.t0, wb.t1, CASE WHEN d.metric = 'gpu_energy_mj' THEN 1e3 ELSE 1e6 END AS per_j
  FROM counter_deltas d, window_bounds wb
)
SELECT metric,
       count(DISTINCT device) AS devices,
       sum(delta * inside_ns / nullif(dur, 0)) FILTER (WHERE inside_ns > 0) / any_value(per_j) AS energy_j,
       bool_or(went_down AND metric = 'gpu_energy_mj' AND t >= t0 AND prev_t <= t1)
         OR bool_or(delta IS NULL AND t >= t0 AND prev_t <= t1) AS invalid,
       -- per device the covered time is the same; the window's is that of one device
       sum(inside_ns) / nullif(count(DISTINCT device), 0) AS covered_ns,
       sum(delta * before_ns / nullif(dur, 0)) FILTER (WHERE before_ns > 0)
         / nullif(sum(before_ns) FILTER (WHERE before_ns > 0), 0) * count(DISTINCT device)
         * 1e9 / any_value(per_j) AS idle_w
FROM d
GROUP BY metric;

CREATE OR REPLACE TEMP TABLE power_check AS
WITH p AS (
  SELECT sm.ts_ns + c.offset_ns AS t, sm.value, sm.device,
         lag(sm.ts_ns + c.offset_ns) OVER (PARTITION BY sm.device ORDER BY sm.ts_ns) AS prev_t,
         lag(sm.value) OVER (PARTITION BY sm.device ORDER BY sm.ts_ns) AS prev
  FROM samples sm JOIN window_bounds wb ON true JOIN clock_conv c ON c.from_clock = sm.clock AND c.to_clock = wb.clock
  WHERE sm.metric = 'gpu_power_instant_mw'
), clipped AS (  -- each segment cut to the window, the power interpolated linearly at a cut
  SELECT greatest(p.prev_t, wb.t0) AS a, least(p.t, wb.t1) AS b, p.prev, p.value, p.prev_t, p.t
  FROM p, window_bounds wb WHERE p.prev_t IS NOT NULL AND p.t > p.prev_t AND p.t > wb.t0 AND p.prev_t < wb.t1
)
SELECT sum(((prev + (value - prev) * (a - prev_t) / (t - prev_t)) + (prev + (value - prev) * (b - prev_t) / (t - prev_t)))
           / 2 * (b - a)) / 1e12 AS gpu_power_integrated_j  -- mW x ns -> J
FROM clipped;

-- @gaps: no counter samples (the ledger never reports 0 J for "not measured"); samples no mapping brings
--   to the window's clock; a counter that went down or a RAPL wrap that could not be unwrapped.
CREATE OR REPLACE TEMP TABLE energy_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO energy_gaps
SELECT 'energy', NULL, 'energy_gpu_j, energy_cpu_j, energy_per_good_j',
       'an energy source: NVML (GPU driver) or read access to RAPL powercap (see inferledger doctor)',
       'the run has no energy counter samples'
WHERE NOT EXISTS (SELECT 1 FROM samples WHERE metric LIKE '%energy%') AND EXISTS (SELECT 1 FROM attempt_ids)
UNION ALL
SELECT 'clock', NULL, 'energy_gpu_j, energy_cpu_j, energy_dram_j, idle_gpu_j, idle_cpu_j, energy_per_good_j',
       format('a clock.map between {} and {}', sm.clock, wb.clock),
       format('{} energy samples on {} cannot be placed in the window''s clock {}', count(*), sm.clock, wb.clock)
FROM samples sm, window_bounds wb
WHERE sm.metric IN ('gpu_energy_mj', 'cpu_package_energy_uj', 'cpu_dram_energy_uj') AND wb.clock IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM clock_conv c WHERE c.from_clock = sm.clock AND c.to_clock = wb.clock)
GROUP BY sm.clock, wb.clock
UNION ALL
SELECT 'energy', metric, CASE WHEN metric LIKE 'gpu%' THEN 'energy_gpu_j, energy_per_good_j' ELSE 'energy_cpu_j, energy_per_good_j' END,
       'a window without a counter reset (NVML restarts after a driver reload) and with RAPL wrap ranges',
       'the counter went down inside the observation window, or a RAPL wrap could not be unwrapped'
FROM window_energy WHERE invalid;
