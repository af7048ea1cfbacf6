-- Each attempt's share of the window's energy: the window total split by its share of engine step time
-- (itself split by tokens processed per step), so the shares add up to the total.
--
-- scope: rollup
-- reads: step_attribution, run_metrics
-- creates: energy_shares, energy_shares_gaps
-- @table energy_shares: one row per attempt with engine step time, when the window's energy is known
--   (docs/LEDGER.md "energy_shares")
-- @column fraction: the attempt's share of the attributed engine step time (step_attribution share_ms)
-- @column gpu_j: run_metrics.energy_gpu_j × fraction
-- @column cpu_j: run_metrics.energy_cpu_j × fraction
CREATE OR REPLACE TABLE energy_shares AS
WITH busy AS (SELECT attempt_id, sum(share_ms) AS ms FROM step_attribution GROUP BY attempt_id),
tot AS (SELECT sum(ms) AS ms FROM busy)
SELECT getvariable('run_id') AS run_id, b.attempt_id, b.ms / nullif(tot.ms, 0) AS fraction,
       r.energy_gpu_j * b.ms / nullif(tot.ms, 0) AS gpu_j, r.energy_cpu_j * b.ms / nullif(tot.ms, 0) AS cpu_j
FROM busy b, tot, run_metrics r
WHERE r.energy_gpu_j IS NOT NULL OR r.energy_cpu_j IS NOT NULL
ORDER BY b.attempt_id;

-- @gaps: attributed steps that took no time (or had no token shares): the energy cannot be split.
CREATE OR REPLACE TEMP TABLE energy_shares_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO energy_shares_gaps
SELECT 'run', NULL, 'energy_shares fraction, gpu_j, cpu_j',
       'engine steps that take time (step.start before step.end)',
       'the attributed engine steps took 0 ms in all (or had no token shares): the window energy cannot be split by step time'
WHERE EXISTS (SELECT 1 FROM energy_shares WHERE fraction IS NULL);
