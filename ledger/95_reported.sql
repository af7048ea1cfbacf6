-- Stage 9b: SLO-miss causes an engine's span can tell, and the gaps of reported evidence
-- (docs/LEDGER.md "Reported evidence"). Runs after the diagnosis and the gap register.

-- A span splits the server's time into queue, prefill and decode but sees no engine step: for an
-- attempt whose engine figures are reported, interference and stalls are unknown (NULL, not 0), and
-- the dominant cause is the largest of the phases the span and the client measure.
ALTER TABLE slo_misses ADD COLUMN prefill_ms DOUBLE;
ALTER TABLE slo_misses ADD COLUMN decode_ms DOUBLE;
ALTER TABLE slo_misses ADD COLUMN cause_evidence VARCHAR;
UPDATE slo_misses SET prefill_ms = r.prefill_ms, decode_ms = r.decode_ms,
       cause_evidence = CASE WHEN r.server_evidence = 'reported' THEN 'reported' ELSE 'observed' END
FROM request_metrics r WHERE slo_misses.attempt_id = r.attempt_id AND r.server_evidence IS NOT NULL;
UPDATE slo_misses SET
  prefill_interference_ms = NULL, decode_stall_ms = NULL,
  -- a response the client never received whole has no transfer: not applicable (as in 80_diagnosis), not unknown
  dominant_cause = CASE
    WHEN client_queue_ms IS NULL OR server_queue_ms IS NULL OR prefill_ms IS NULL
         OR (transfer_client_ms IS NULL AND client_status = 'completed') THEN 'unknown'
    ELSE CASE greatest(client_queue_ms, server_queue_ms, prefill_ms, coalesce(decode_ms, 0), coalesce(transfer_client_ms, 0))
      WHEN 0 THEN NULL
      WHEN server_queue_ms THEN 'server_queue'
      WHEN client_queue_ms THEN 'client_queue'
      WHEN prefill_ms THEN 'prefill'
      WHEN decode_ms THEN 'decode'
      ELSE 'transfer_client' END END
WHERE cause_evidence = 'reported';

-- Gaps of reported evidence the ledger finds: engine-layer token gaps a span cannot give, and a
-- counter that went down between scrapes (the engine restarted: its run delta is unknown).
INSERT INTO gaps
SELECT getvariable('run_id'), 'reported:itl', 'run', NULL, 'itl (engine layer), itl_engine_max_ms',
       'per-token engine events (a span reports the first and the last token only)',
       format('{} attempt(s) with tokens reported by {} as a span', count(*), string_agg(DISTINCT reporter, ', ')), 'ledger'
FROM attempt_evidence WHERE aggregate_tokens HAVING count(*) > 0
UNION ALL
SELECT getvariable('run_id'), format('reported:counter:{}', metric), 'run', metric, format('reported_counters.run_delta ({})', metric),
       'a scrape series in which the counter does not go down (no engine restart during the run)',
       format('{} went down between scrapes', metric), 'ledger'
FROM reported_counters WHERE went_down;

-- One request's path across the layers, for every attempt whose server / engine side was reported:
-- client queue -> uplink -> front end -> engine queue -> prefill -> downlink of the first token, then
-- decode. Client and link nodes are ours (link ones derived through the clock mapping, ± eps_ms);
-- front end, queue, prefill and decode rest on the engine's report. `share_of_e2e` is the node's part
-- of the client's E2E (NULL when that is unknown, e.g. a timeout).
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
