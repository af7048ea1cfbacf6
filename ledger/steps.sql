-- Step attribution: each engine step's time is charged to the attempts in its batch in proportion to
-- the tokens each processed in that step (policy 'by_tokens'); shares add up to the step's time
-- (docs/LEDGER.md "step_attribution").
--
-- scope: engine
-- reads: ev
-- creates: steps, step_attribution, steps_gaps
--
-- contention_ms: the time the step waited for a CPU (docs/MODEL.md "Contention"). The step thread's
-- own run-queue wait (step.end attrs.wait_ns), plus the part of its sleep that its intra-op workers'
-- run-queue wait explains: torch's parallel sections end at a barrier where the step thread sleeps
-- (OMP_WAIT_POLICY=PASSIVE, as the command line sets) until its slowest worker arrives, so a worker
-- held off a CPU holds the step; counted at most the step thread's sleep (step − its on-CPU time
-- attrs.cpu_ns − its wait: time on a CPU was not spent waiting) and at most the workers' largest wait
-- (attrs.workers_wait_ns_max; sleep beyond it is the workers' own work, a lock or the GIL).
-- cpu_ms = step_ms − contention_ms: the step as it would have run uncontended. Both NULL (a
-- steps_gaps row) where step.end carries no cpu_ns / wait_ns (schedstat hidden, an older run,
-- another writer) or the wait is longer than the step.
-- blocked_ms: where the step ran on its thread alone (attrs.workers = 0), its sleep: the step less its
-- on-CPU time and its run-queue wait (floored at 0), time it waited on neither a CPU nor its own work:
-- a lock, in a Python server almost always the interpreter lock another thread of the process held
-- (the front end tokenising a prompt, an embedded load client). NULL where the step had intra-op
-- workers (its sleep at their barriers is their work too, which cannot be told from a lock's) or
-- where contention_ms is; a steps_gaps row says so. Part of cpu_ms (the step as it would have run
-- on an idle host still meets its own process's locks).
CREATE OR REPLACE TEMP TABLE steps AS
WITH raw AS (
  SELECT s.step_id, s.ts_ns AS start_ns, e.ts_ns AS end_ns, s.clock, (e.ts_ns - s.ts_ns) / 1e6 AS step_ms,
         json_extract_string(s.attrs, '$.replica_id') AS replica_id,
         s.attrs AS start_attrs, e.ts_ns - s.ts_ns AS step_ns,
         TRY_CAST(json_extract(e.attrs, '$.cpu_ns') AS BIGINT) AS cpu_ns,
         TRY_CAST(json_extract(e.attrs, '$.wait_ns') AS BIGINT) AS wait_ns,
         coalesce(TRY_CAST(json_extract(e.attrs, '$.workers_wait_ns_max') AS BIGINT), 0) AS workers_wait_ns,  -- none: no workers
         TRY_CAST(json_extract(e.attrs, '$.workers') AS BIGINT) AS workers,
         json_extract_string(e.attrs, '$.mode') AS mode, json_extract_string(e.attrs, '$.engine_id') AS engine_id
  FROM ev s JOIN ev e ON e.step_id = s.step_id AND e.name = 'step.end' AND e.clock = s.clock
  WHERE s.name = 'step.start'
), waited AS (
  -- the sleep floored at 0: an on-CPU figure read from schedstat (a writer's other than ours) lags a tick
  SELECT *, CASE WHEN cpu_ns >= 0 AND wait_ns >= 0 AND wait_ns <= step_ns
                 THEN wait_ns + least(greatest(workers_wait_ns, 0), greatest(step_ns - cpu_ns - wait_ns, 0)) END AS contention_ns
  FROM raw
)
SELECT step_id, start_ns, end_ns, clock, step_ms, start_attrs, replica_id, mode, engine_id, workers,
       contention_ns / 1e6 AS contention_ms, (step_ns - contention_ns) / 1e6 AS cpu_ms,
       CASE WHEN contention_ns IS NOT NULL AND workers = 0 THEN greatest(step_ns - cpu_ns - wait_ns, 0) / 1e6 END AS blocked_ms
FROM waited;

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
-- @column replica_id: the replica whose engine ran the step (step.start attrs.replica_id, a capture joining
--   several `serve --out` folders); NULL with one engine
CREATE OR REPLACE TABLE step_attribution AS
WITH items AS (
  SELECT st.step_id, st.step_ms, st.start_ns, st.end_ns, st.clock, st.replica_id, unnest(from_json(json_extract(st.start_attrs, '$.batch'), '[["JSON"]]')) AS item
  FROM steps st WHERE json_extract(st.start_attrs, '$.batch') IS NOT NULL
), parsed AS (
  SELECT step_id, step_ms, start_ns, end_ns, clock, replica_id, json_extract_string(item[1], '$') AS attempt_id, json_extract_string(item[2], '$') AS kind,
         TRY_CAST(json_extract_string(item[3], '$') AS DOUBLE) AS tokens,
         TRY_CAST(json_extract_string(item[4], '$') AS BIGINT) AS context_before
  FROM items
)
SELECT getvariable('run_id') AS run_id, step_id, attempt_id, kind, tokens, context_before, step_ms,
       step_ms * tokens / nullif(sum(tokens) OVER (PARTITION BY step_id), 0) AS share_ms, 'by_tokens' AS policy,
       start_ns, end_ns, clock, replica_id
FROM parsed
ORDER BY step_id, attempt_id;

-- @gaps: a step whose batch lists 0 tokens in all (its time cannot be shared by tokens); steps without
-- schedstat figures on their step.end, or with a wait longer than the step (contention_ms, cpu_ms unknown).
CREATE OR REPLACE TEMP TABLE steps_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO steps_gaps
SELECT 'step', step_id::VARCHAR, 'step_attribution share_ms, energy_shares',
       'the tokens each attempt processed in the step (step.start attrs.batch)',
       'the step''s batch lists 0 tokens in all: its time cannot be shared by tokens'
FROM step_attribution GROUP BY step_id HAVING sum(tokens) = 0;
-- one row per engine instance (step.end attrs.engine_id), as the sharded build sees each engine apart
INSERT INTO steps_gaps
SELECT 'run', engine_id, 'steps contention_ms, cpu_ms, blocked_ms; step_model contention_ms, cpu_ms, blocked_ms',
       'step.end attrs.cpu_ns and wait_ns: the step thread''s on-CPU time and run-queue wait from Linux schedstat (/proc/self/task/<tid>/schedstat)',
       count(*) FILTER (WHERE contention_ms IS NULL) || ' of ' || count(*) || ' step(s) without on-CPU and wait figures '
       || '(or a wait longer than the step): schedstat hidden by the kernel, or a writer that does not record it; '
       || 'their contention is unknown, not 0'
FROM steps GROUP BY engine_id HAVING count(*) FILTER (WHERE contention_ms IS NULL) > 0;
-- a step with intra-op workers: its sleep holds their work at its barriers, not only locks; a step whose
-- step.end names no worker count: which it was is not known (blocked_ms unknown either way)
INSERT INTO steps_gaps
SELECT 'run', engine_id, 'steps blocked_ms; step_model blocked_ms; attempt_causes blocked_ms',
       'a step run on its thread alone (step.end attrs.workers = 0), whose sleep is a lock''s',
       concat_ws('; ',
         CASE WHEN count(*) FILTER (WHERE workers > 0) > 0 THEN count(*) FILTER (WHERE workers > 0)
           || ' step(s) ran with intra-op workers: the step thread''s sleep at their barriers is their work as '
           || 'well as any lock, and the two cannot be told apart' END,
         CASE WHEN count(*) FILTER (WHERE workers IS NULL OR workers < 0) > 0
           THEN count(*) FILTER (WHERE workers IS NULL OR workers < 0)
           || ' step(s) recorded no worker count (step.end attrs.workers missing or not a count)' END)
       || ': their time blocked on a lock is unknown, not 0'
FROM steps WHERE contention_ms IS NOT NULL AND blocked_ms IS NULL GROUP BY engine_id;
