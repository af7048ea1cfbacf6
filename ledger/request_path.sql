-- One request's path across the layers, for every attempt whose server / engine side an engine
-- reported (docs/LEDGER.md "Reported evidence").
--
-- scope: task
-- reads: intervals, request_metrics
-- creates: request_path

-- One request's path across the layers, for every attempt whose server / engine side was reported:
-- client queue -> uplink -> front end -> engine queue -> prefill -> downlink of the first token, then
-- decode. Client and link nodes are ours (link ones derived through the clock mapping, ± eps_ms);
-- front end, queue, prefill and decode rest on the engine's report. `share_of_e2e` is the node's part
-- of the client's E2E (NULL when that is unknown, e.g. a timeout).
-- @table request_path: one row per node of the path of each attempt whose server side an engine
--   reported: client_queue, uplink, front_end, queue, prefill, downlink_first, decode
--   (docs/LEDGER.md "Reported evidence")
-- @column step: the node's place on the path, 1 to 7
-- @column layer: client, link, server or engine
-- @column node: the interval's name (intervals.name)
-- @column dur_ms: its duration (intervals.dur_ms)
-- @column eps_ms: its ± ms (link nodes across clocks)
-- @column label: measured, derived or unknown (intervals.label)
-- @column evidence: observed (client and link nodes) or reported (server and engine nodes)
-- @column share_of_e2e: dur_ms / e2e_client_ms (NULL when the client E2E is unknown)
CREATE OR REPLACE TABLE request_path AS
WITH nodes AS (
  SELECT * FROM (VALUES (1, 'client', 'client_queue'), (2, 'link', 'uplink'), (3, 'server', 'front_end'),
                        (4, 'engine', 'queue'), (5, 'engine', 'prefill'), (6, 'link', 'downlink_first'),
                        (7, 'engine', 'decode')) AS t(step, stream, name)
)
SELECT getvariable('run_id') AS run_id, i.attempt_id, n.step, n.stream AS layer, n.name AS node, i.dur_ms, i.eps_ms,
       i.label, CASE WHEN n.stream IN ('server', 'engine') THEN 'reported' ELSE 'observed' END AS evidence,
       i.dur_ms / nullif(r.e2e_client_ms, 0) AS share_of_e2e
FROM intervals i
JOIN nodes n ON n.stream = i.stream AND n.name = i.name
JOIN request_metrics r ON r.attempt_id = i.attempt_id
WHERE r.server_evidence = 'reported'
ORDER BY i.attempt_id, n.step;
