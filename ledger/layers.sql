-- The run's observation layers: the client's, and the server's or engine's (docs/LEDGER.md "Unknown is
-- NULL"). A layer the whole run lacks (black-box capture: no server events) is one run-scope gap; a
-- single attempt missing a layer its peers have is one attempt-scope gap. Over the whole run: whether
-- the peers have it is a question about every attempt.
--
-- scope: rollup
-- reads: attempt_ids
-- creates: layers_gaps

-- @gaps: a layer (client; server or engine) the whole run lacks, or one attempt lacks while its peers
--   have it (the client layer of an attempt that is no router's try: attempts.client_attempt NULL)
CREATE OR REPLACE TEMP TABLE layers_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO layers_gaps
SELECT 'run', NULL, 'ttft_client_ms, e2e_client_ms, tpot_ms, client_status, client_attempt, good; run_metrics n_good, '
                  || 'n_completed, n_client_attempts, n_unjudged, '
                  || 'goodput_rps, completed_rps, output_tokens, output_tok_s, prompt_tokens, total_tok_s, '
                  || 'computed_tok_s, attempted_rps, arrival_rps, mean_in_system, little_rel_err; reconciliation completed, '
                  || 'cancelled, timed_out, '
                  || 'errored, ghost_attempts, ghost_ms, ghost_tokens; replicas client_attempts',
       'client events (capture with the inferledger client, or import the client''s trace)',
       'the run has no client events'
WHERE NOT EXISTS (SELECT 1 FROM attempt_ids WHERE client_attempt) AND EXISTS (SELECT 1 FROM attempt_ids)
UNION ALL
SELECT 'run', NULL, 'ttft_server_ms, e2e_server_ms, queue_ms, prefill_ms, decode_ms, server_status',
       'server or engine events (black-box target: the server exports none)',
       'the run has no server or engine events'
WHERE NOT EXISTS (SELECT 1 FROM attempt_ids WHERE n_server_events > 0) AND EXISTS (SELECT 1 FROM attempt_ids)
UNION ALL
SELECT 'attempt', attempt_id, 'server_status and the server-side metrics',
       'the server''s events for this attempt (were its ids propagated?)', 'no server or engine event carries this attempt id'
FROM attempt_ids WHERE n_server_events = 0 AND n_client_events > 0
  AND EXISTS (SELECT 1 FROM attempt_ids WHERE n_server_events > 0)
UNION ALL
SELECT 'attempt', attempt_id, 'client_status, client_attempt and the client-side metrics',
       'the client''s events for this attempt', 'no client event carries this attempt id'
FROM attempt_ids WHERE client_attempt IS NULL AND n_server_events > 0  -- a router's try (false) has none to miss
  AND EXISTS (SELECT 1 FROM attempt_ids WHERE client_attempt);
