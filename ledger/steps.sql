-- Step attribution: each engine step's time is charged to the attempts in its batch in proportion to
-- the tokens each processed in that step (policy 'by_tokens'); shares add up to the step's time
-- (docs/LEDGER.md "step_attribution").
--
-- reads: ev
-- creates: steps, step_attribution
CREATE OR REPLACE TEMP TABLE steps AS
SELECT s.step_id, s.ts_ns AS start_ns, e.ts_ns AS end_ns, (e.ts_ns - s.ts_ns) / 1e6 AS step_ms, s.attrs AS start_attrs
FROM ev s JOIN ev e ON e.step_id = s.step_id AND e.name = 'step.end' AND e.clock = s.clock
WHERE s.name = 'step.start';

CREATE OR REPLACE TABLE step_attribution AS
WITH items AS (
  SELECT st.step_id, st.step_ms, unnest(from_json(json_extract(st.start_attrs, '$.batch'), '[["JSON"]]')) AS item
  FROM steps st WHERE json_extract(st.start_attrs, '$.batch') IS NOT NULL
), parsed AS (
  SELECT step_id, step_ms, json_extract_string(item[1], '$') AS attempt_id, json_extract_string(item[2], '$') AS kind,
         TRY_CAST(json_extract_string(item[3], '$') AS DOUBLE) AS tokens
  FROM items
)
SELECT getvariable('run_id') AS run_id, step_id, attempt_id, kind, tokens, step_ms,
       step_ms * tokens / nullif(sum(tokens) OVER (PARTITION BY step_id), 0) AS share_ms, 'by_tokens' AS policy
FROM parsed
ORDER BY step_id, attempt_id;
