-- Device time: one row per device.step event, a step's time on the device's own clock (engine scope,
-- so each engine's shard keeps its own); ledger/run_metrics.sql sums them and reads no event
-- (docs/SCALE.md).
--
-- scope: engine
-- reads: ev
-- creates: device_steps
CREATE OR REPLACE TEMP TABLE device_steps AS
SELECT event_id, step_id, clock, value AS device_ms FROM ev WHERE name = 'device.step';
