-- Step attribution: each engine step's time is charged to the attempts in its batch in proportion to
-- the tokens each processed in that step (policy 'by_tokens'); shares add up to the step's time
-- (docs/LEDGER.md "step_attribution").
--
-- scope: engine
-- reads: ev
-- creates: steps, step_attribution, steps_gaps
--
-- contention_ms: the run-queue wait of the step's critical compute thread over the step, the larger
-- of the step thread's wait (step.end attrs.wait_ns) and its intra-op workers' largest
-- (attrs.workers_wait_ns_max): every parallel section ends at a barrier where the step thread waits
-- for its slowest worker, so one worker's wait delays the step as much as the step thread's own
-- (docs/MODEL.md "Contention"). cpu_ms = step_ms − contention_ms: the step as it would have run
-- uncontended. Both NULL (a steps_gaps row) where step.end carries no wait_ns (schedstat hidden, an
-- older run, another writer) or the wait exceeds the step.
CREATE OR REPLACE TEMP TABLE steps AS
WITH raw AS (
  SELECT s.step_id, s.ts_ns AS start_ns, e.ts_ns AS end_ns, s.clock, (e.ts_ns - s.ts_ns) / 1e6 AS step_ms,
         s.attrs AS start_attrs,
         -- no wait_ns: unknown (greatest would skip a NULL); no workers: the step thread's wait alone
         CASE WHEN TRY_CAST(json_extract(e.attrs, '$.wait_ns') AS BIGINT) IS NOT NULL
              THEN greatest(TRY_CAST(json_extract(e.attrs, '$.wait_ns') AS BIGINT),
                            coalesce(TRY_CAST(json_extract(e.attrs, '$.workers_wait_ns_max') AS BIGINT), 0)) / 1e6
         END AS wait_ms
  FROM ev s JOIN ev e ON e.step_id = s.step_id AND e.name = 'step.end' AND e.clock = s.clock
  WHERE s.name = 'step.start'
)
SELECT step_id, start_ns, end_ns, clock, step_ms, start_attrs,
       CASE WHEN wait_ms <= step_ms THEN wait_ms END AS contention_ms,
       CASE WHEN wait_ms <= step_ms THEN step_ms - wait_ms END AS cpu_ms
FROM raw;

-- @table step_attribution: one row per engine step × attempt in its batch (docs/LEDGER.md
--   "step_attribution")
-- @column step_id: the engine step
-- @column kind: what the attempt did in the step (prefill, decode, ...: step.start attrs.batch)
-- @column tokens: the tokens it processed in the step
-- @column context_before: its tokens already in KV before this step's (step.start batch item 4; NULL
--   in runs whose batch rows have 3 items)
-- @column step_ms: step.end − step.start
-- @column share_ms: step_ms × its tokens / the step's tokens (NULL when the batch lists 0 tokens)
-- @column policy: how the step was shared: by_tokens
-- @column start_ns: step.start, ns on clock
-- @column end_ns: step.end, ns on clock
-- @column clock: the clock of the step's events
CREATE OR REPLACE TABLE step_attribution AS
WITH items AS (
  SELECT st.step_id, st.step_ms, st.start_ns, st.end_ns, st.clock, unnest(from_json(json_extract(st.start_attrs, '$.batch'), '[["JSON"]]')) AS item
  FROM steps st WHERE json_extract(st.start_attrs, '$.batch') IS NOT NULL
), parsed AS (
  SELECT step_id, step_ms, start_ns, end_ns, clock, json_extract_string(item[1], '$') AS attempt_id, json_extract_string(item[2], '$') AS kind,
         TRY_CAST(json_extract_string(item[3], '$') AS DOUBLE) AS tokens,
         TRY_CAST(json_extract_string(item[4], '$') AS BIGINT) AS context_before
  FROM items
)
SELECT getvariable('run_id') AS run_id, step_id, attempt_id, kind, tokens, context_before, step_ms,
       step_ms * tokens / nullif(sum(tokens) OVER (PARTITION BY step_id), 0) AS share_ms, 'by_tokens' AS policy,
       start_ns, end_ns, clock
FROM parsed
ORDER BY step_id, attempt_id;

-- @gaps: a step whose batch lists 0 tokens in all (its time cannot be shared by tokens); steps without
-- run-queue figures on their step.end, or with a wait longer than the step (contention_ms, cpu_ms unknown).
CREATE OR REPLACE TEMP TABLE steps_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO steps_gaps
SELECT 'step', step_id::VARCHAR, 'step_attribution share_ms, energy_shares',
       'the tokens each attempt processed in the step (step.start attrs.batch)',
       'the step''s batch lists 0 tokens in all: its time cannot be shared by tokens'
FROM step_attribution GROUP BY step_id HAVING sum(tokens) = 0;
INSERT INTO steps_gaps
SELECT 'run', NULL, 'steps contention_ms, cpu_ms; step_model contention_ms, cpu_ms',
       'step.end attrs.wait_ns: the step thread''s run-queue wait from Linux schedstat (/proc/self/task/<tid>/schedstat)',
       count(*) || ' of ' || (SELECT count(*) FROM steps) || ' step(s) without a run-queue wait no longer than the step: '
       || 'schedstat hidden by the kernel, or a writer that does not record it; their contention is unknown, not 0'
FROM steps WHERE contention_ms IS NULL HAVING count(*) > 0;
