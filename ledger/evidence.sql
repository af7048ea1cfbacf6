-- Whose account each attempt's server / engine figures rest on: our probes' (observed), an engine's
-- report about itself (reported, docs/EVENTS.md "Evidence strength") or a run on the simulated clock
-- (simulated), and who gave it.
--
-- scope: task
-- reads: events
-- creates: attempt_evidence

CREATE OR REPLACE TEMP TABLE attempt_evidence AS
SELECT attempt_id,
       CASE WHEN bool_or(json_extract_string(attrs, '$.evidence') = 'reported') THEN 'reported'
            WHEN bool_or(json_extract_string(attrs, '$.evidence') = 'simulated') THEN 'simulated'
            ELSE 'observed' END AS evidence,
       max(json_extract_string(attrs, '$.reporter')) AS reporter,
       bool_or(name = 'engine.token' AND json_extract_string(attrs, '$.aggregate') = 'true') AS aggregate_tokens
FROM events
WHERE attempt_id IS NOT NULL AND (name LIKE 'server.%' OR name LIKE 'engine.%')
GROUP BY attempt_id;
