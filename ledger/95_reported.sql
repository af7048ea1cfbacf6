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
  dominant_cause = CASE
    WHEN client_queue_ms IS NULL OR server_queue_ms IS NULL OR prefill_ms IS NULL OR transfer_client_ms IS NULL
      THEN 'unknown'
    WHEN greatest(client_queue_ms, server_queue_ms, prefill_ms, coalesce(decode_ms, 0), transfer_client_ms) = 0 THEN NULL
    WHEN greatest(client_queue_ms, server_queue_ms, prefill_ms, coalesce(decode_ms, 0), transfer_client_ms) = server_queue_ms
      THEN 'server_queue'
    WHEN greatest(client_queue_ms, server_queue_ms, prefill_ms, coalesce(decode_ms, 0), transfer_client_ms) = client_queue_ms
      THEN 'client_queue'
    WHEN greatest(client_queue_ms, server_queue_ms, prefill_ms, coalesce(decode_ms, 0), transfer_client_ms) = prefill_ms
      THEN 'prefill'
    WHEN greatest(client_queue_ms, server_queue_ms, prefill_ms, coalesce(decode_ms, 0), transfer_client_ms) = decode_ms
      THEN 'decode'
    ELSE 'transfer_client' END
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
