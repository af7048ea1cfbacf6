-- Per-replica accounts of a deployment capture (a router in front of `serve --out` folders and replicas
-- declared by URL and kind): attempts, the router's own count of what it sent each worker, busy time,
-- queue, KV use, prefix-cache hits, balance (docs/LEDGER.md "replicas").
--
-- scope: rollup
-- reads: attempts, marks, request_metrics, step_attribution, kv_holds, samples, quantile_linear, declared_replicas,
--   reported_timings, reported_spans, attempt_ids, window_bounds
-- creates: replica_reported, replicas, replicas_gaps

-- @table replicas: one row per replica of a deployment capture (attempts.replica_id, a replica the manifest's
--   deployment declares, or a worker the router's counters name); empty for a run of one server (docs/LEDGER.md
--   "replicas")
-- @column replica_id: the replica (its `serve --out` folder's server id, or a --replica's host:port), or a router
--   worker's URL when no declared replica is that worker
-- @column kind: ours (a `serve --out` folder, or --replica URL=ours), vllm, llamacpp or blackbox, as the manifest's
--   deployment declares it; ours for a replica whose events are in the run without one; NULL for a worker only
--   the router names
-- @column attempts: its rows in attempts (attempts.replica_id): the client attempts it answered and the upstream
--   tries it got that the client never saw; NULL for a replica no attempt names (declared by URL and placed by
--   no evidence, or only the router's worker)
-- @column client_attempts: of those, the client's attempts (attempts.client_attempt); NULL without client events
-- @column unseen_tries: of those, the router's tries the client never saw (parent_attempt_id set)
-- @column server_completed: of those, server_status completed
-- @column router_sent: the router's vllm_router_processed_requests_total for this worker, its last scrape
--   minus its first (a labelled counter is exported from its first increment: absent in a first scrape
--   that answered, it was 0); NULL without two router scrapes (capture --router-metrics)
-- @column router_agrees: attempts = router_sent; NULL when either is unknown. False when the router sent this replica
--   tries the run does not hold (a replica killed: the tries it refused, and those it received after its last
--   flush), with a gap naming the replica
-- @column router_failures: the router's vllm_router_cb_outcomes_total{outcome="failure"} for this worker over the
--   load (last scrape − first; 0 when the counter never appeared): upstream tries that failed there (refused
--   connections, resets; a 429 the router retried counts as a success); NULL without two router scrapes
-- @column breaker_opens: the router's circuit-breaker transitions to open for this worker over the load
--   (vllm_router_cb_state_transitions_total{to="open"}, last scrape − first; 0 when none appeared); NULL
--   without two router scrapes
-- @column busy_ms: the time its engine had at least one attempt in prefill or decode, by busy_evidence:
--   observed, Σ step_ms of its engine's steps in the run (a `serve --out` folder's, copied from it: the window of
--   this run's attempts there); reported, for a vllm or llamacpp replica, the union of the intervals its engine's
--   own reports place its attempts' prefill and decode in (llama.cpp: each response's timings, prompt_ms +
--   predicted_ms, ending at the client's done on the client's clock; vLLM: each span's prefill + decode from its
--   engine.scheduled on the span's clock), known only when every attempt it served has such an interval (inside
--   the client's interval, reported_timings.inside_client), all on one clock, and no attempt it may have served
--   is missing (its router count agrees, or every attempt of the run has its replica); NULL otherwise, with a gap
--   (its /metrics seconds counters add up overlapping requests, so they are no busy time)
-- @column busy_evidence: observed (our engine's own steps) or reported (the engine's report about itself) for a
--   known busy_ms; NULL with it
-- @column balance: busy_ms over the mean busy_ms of the replicas (1 for an even spread); the busiest replica's
--   is the run's balance figure; NULL on every row when one replica's busy_ms is unknown (a mean over some of
--   them is no mean of the deployment)
-- @column balance_evidence: what the balance's busy times are, the same on every row: observed, reported, or
--   observed and reported (a mean over our engine's steps and an engine's own reports); NULL with balance
-- @column queue_p50_ms: the median queue_ms (engine.enqueued → first scheduled) of its attempts
-- @column queue_p99_ms: the 99th percentile of the same
-- @column waiting_max: the most requests waiting in its queue at one scrape of its own /metrics
--   (vllm:num_requests_waiting, llamacpp:requests_deferred); NULL without its scrapes (a `serve --out` replica's
--   queue is queue_p50_ms, queue_p99_ms)
-- @column prefix_hit_blocks: KV blocks its attempts took from its prefix cache (kv_holds how prefix_hit); NULL
--   for a replica whose engine's events are not in the run (any but a `serve --out` replica)
-- @column prefix_hit_attempts: its attempts that took at least one cached block; NULL likewise
-- @column prefix_hit_tokens: prompt tokens its own counters say it took from its prefix cache over the run
--   (last scrape − first of vllm:prefix_cache_hits_total, llamacpp:prompt_tokens_cached_total); NULL without
--   two scrapes of such a counter, or when it went down. A `serve --out` replica's is scraped by the capture
--   (docs/CAPTURE.md "A deployment"); one without is NULL with a gap
-- @column prefix_query_tokens: prompt tokens its own counters say it looked up in its prefix cache over the run
--   (last scrape − first of vllm:prefix_cache_queries_total); prefix_hit_tokens / prefix_query_tokens is its hit
--   rate as its counters say it; NULL like prefix_hit_tokens (and for llama.cpp, which exports no such counter)
-- @column prompt_tokens: Σ prompt tokens of its attempts as its engine counted them (marks.n_prompt_engine); NULL
--   for a replica whose engine's events are not in the run, or when one of its completed attempts has no count
-- @column event_cached_tokens: prompt tokens its engine's events say its prefix cache served its attempts when
--   each first entered the batch (Σ marks.n_prompt_cached: recomputes after a preemption left out, as the
--   counters leave them out); NULL for a replica whose engine's events are not in the run
-- @column event_hit_rate: event_cached_tokens / prompt_tokens, its prefix cache's hit rate over the run's
--   attempts as its engine's events say it; NULL when either is unknown or no prompt token was counted
-- @column prefix_counter_agrees: prefix_hit_tokens = event_cached_tokens: its own counter and its engine's events
--   say the same; NULL when either is unknown. False when it served lookups the run's attempts do not hold
--   (another client's requests between the scrapes)
-- @column kv_blocks_used_max: the most KV blocks its engine held at once, from its engine's samples in the
--   run (kv_blocks_used, device = the replica); NULL without them
-- @column kv_usage_max: the largest KV-cache usage fraction (0 to 1) its own /metrics reported
--   (vllm:kv_cache_usage_perc, or vllm:gpu_cache_usage_perc); NULL without such a gauge (llama.cpp exports none)
-- Each vllm or llamacpp replica's busy time as its engine's own reports place it (replicas.busy_ms with
-- busy_evidence reported): its attempts' reported prefill + decode as intervals, and their union.
CREATE OR REPLACE TEMP TABLE replica_reported AS
WITH placed AS (  -- each attempt's prefill and decode as its engine reported them, placed as one interval
  SELECT a.replica_id, a.attempt_id, a.client_clock AS clock,  -- llama.cpp: its timings end at the client's done
         a.client_end_ns - round(t.engine_ms * 1e6)::BIGINT AS start_ns, a.client_end_ns AS end_ns
  FROM attempts a JOIN reported_timings t USING (attempt_id)
  WHERE a.replica_id IS NOT NULL AND t.inside_client AND a.client_end_ns IS NOT NULL
  UNION ALL
  SELECT a.replica_id, a.attempt_id, m.scheduled.clock,  -- vLLM: its span's prefill + decode from engine.scheduled
         m.scheduled.ns, m.scheduled.ns + round((s.prefill_reported_ms + s.decode_reported_ms) * 1e6)::BIGINT
  FROM attempts a JOIN reported_spans s USING (attempt_id) JOIN marks m USING (attempt_id)
  WHERE a.replica_id IS NOT NULL AND m.scheduled.ns IS NOT NULL
    AND s.prefill_reported_ms IS NOT NULL AND s.decode_reported_ms IS NOT NULL
), islands AS (  -- a new island where an interval starts after every earlier one of its replica ended
  SELECT replica_id, start_ns, end_ns,
         sum(CASE WHEN start_ns > prev_end THEN 1 ELSE 0 END) OVER (PARTITION BY replica_id ORDER BY start_ns, end_ns
                                                                    ROWS UNBOUNDED PRECEDING) AS island
  FROM (SELECT *, coalesce(max(end_ns) OVER (PARTITION BY replica_id ORDER BY start_ns, end_ns
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), -1) AS prev_end
        FROM placed)
)
SELECT p.replica_id, u.busy_ns, p.n_placed, p.n_clocks
FROM (SELECT replica_id, count(DISTINCT attempt_id) AS n_placed, count(DISTINCT clock) AS n_clocks
      FROM placed GROUP BY replica_id) p
JOIN (SELECT replica_id, sum(island_ns) AS busy_ns FROM (
        SELECT replica_id, max(end_ns) - min(start_ns) AS island_ns FROM islands GROUP BY replica_id, island
      ) GROUP BY replica_id) u USING (replica_id);

CREATE OR REPLACE TABLE replicas AS
WITH served AS (
  SELECT replica_id, count(*) AS attempts,
         CASE WHEN (SELECT has_client FROM window_bounds) THEN count(*) FILTER (WHERE client_attempt) END AS client_attempts,
         count(*) FILTER (WHERE parent_attempt_id IS NOT NULL) AS unseen_tries,
         count(*) FILTER (WHERE server_status = 'completed') AS server_completed
  FROM attempts WHERE replica_id IS NOT NULL GROUP BY replica_id
), router AS (  -- the router's two scrapes (before and after the load): the counter's difference per worker
  SELECT min(ts_ns) AS first_ns, max(ts_ns) AS last_ns FROM samples WHERE source = 'vllm-router'
), worker_counts AS (  -- each labelled counter per worker: its last scrape minus its first
  SELECT s.device AS replica_id, s.metric,
         max(s.value) FILTER (WHERE s.ts_ns = r.last_ns) - coalesce(max(s.value) FILTER (WHERE s.ts_ns = r.first_ns), 0)
           AS delta
  FROM samples s, router r
  WHERE s.source = 'vllm-router' AND s.device IS NOT NULL AND r.first_ns < r.last_ns
  GROUP BY s.device, s.metric
), processed AS (
  SELECT replica_id, delta AS router_sent,
         (SELECT coalesce(sum(w.delta), 0) FROM worker_counts w WHERE w.replica_id = p.replica_id
            AND w.metric = 'vllm_router_cb_outcomes_total{outcome="failure"}') AS router_failures,
         (SELECT coalesce(sum(w.delta), 0) FROM worker_counts w WHERE w.replica_id = p.replica_id
            AND w.metric LIKE 'vllm\_router\_cb\_state\_transitions\_total{%to="open"%}' ESCAPE '\') AS breaker_opens
  FROM worker_counts p WHERE metric = 'vllm_router_processed_requests_total'
), busy AS (
  SELECT replica_id, sum(step_ms) AS busy_ms FROM (
    SELECT DISTINCT replica_id, step_id, step_ms FROM step_attribution WHERE replica_id IS NOT NULL
  ) GROUP BY replica_id
), queue AS (
  SELECT replica_id, quantile_linear(queue_ms, 0.5) AS queue_p50_ms, quantile_linear(queue_ms, 0.99) AS queue_p99_ms
  FROM request_metrics WHERE replica_id IS NOT NULL GROUP BY replica_id
), hits AS (
  SELECT a.replica_id, count(*) AS prefix_hit_blocks, count(DISTINCT h.attempt_id) AS prefix_hit_attempts
  FROM kv_holds h JOIN attempts a USING (attempt_id) WHERE h.how = 'prefix_hit' AND a.replica_id IS NOT NULL
  GROUP BY a.replica_id
), cached AS (  -- its attempts' prompt tokens and those its prefix cache served at first admission (marks)
  SELECT a.replica_id, sum(m.n_prompt_cached)::BIGINT AS event_cached_tokens,
         CASE WHEN count(*) FILTER (WHERE a.server_status = 'completed' AND m.n_prompt_engine IS NULL) = 0
              THEN sum(m.n_prompt_engine)::BIGINT END AS prompt_tokens
  FROM attempts a JOIN marks m USING (attempt_id) WHERE a.replica_id IS NOT NULL
  GROUP BY a.replica_id
), kv AS (
  SELECT device AS replica_id, max(value) AS kv_blocks_used_max FROM samples
  WHERE source = 'engine' AND metric = 'kv_blocks_used' AND device IS NOT NULL GROUP BY device
), declared AS (  -- the manifest's deployment: replica id -> kind
  SELECT replica_id, kind FROM declared_replicas()
), own AS (  -- each replica's own /metrics (capture --replica), per replica (device)
  SELECT device AS replica_id, metric, ts_ns, value, lag(value) OVER (PARTITION BY device, metric ORDER BY ts_ns) AS prev
  FROM samples WHERE source IN ('vllm-metrics', 'llamacpp-metrics', 'inferledger-metrics') AND device IS NOT NULL
), gauges AS (
  SELECT replica_id,
         max(value) FILTER (WHERE metric IN ('vllm:num_requests_waiting', 'llamacpp:requests_deferred')) AS waiting_max,
         max(value) FILTER (WHERE metric IN ('vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc')) AS kv_usage_max
  FROM own GROUP BY replica_id
), counters AS (
  SELECT replica_id,
         CASE WHEN count(*) FILTER (WHERE hit) >= 2 AND NOT coalesce(bool_or(value < prev) FILTER (WHERE hit), false)
              THEN arg_max(value, ts_ns) FILTER (WHERE hit) - arg_min(value, ts_ns) FILTER (WHERE hit)
         END AS prefix_hit_tokens,
         CASE WHEN count(*) FILTER (WHERE NOT hit) >= 2 AND NOT coalesce(bool_or(value < prev) FILTER (WHERE NOT hit), false)
              THEN arg_max(value, ts_ns) FILTER (WHERE NOT hit) - arg_min(value, ts_ns) FILTER (WHERE NOT hit)
         END AS prefix_query_tokens
  FROM (SELECT *, metric <> 'vllm:prefix_cache_queries_total' AS hit FROM own
        WHERE metric IN ('vllm:prefix_cache_hits_total', 'llamacpp:prompt_tokens_cached_total',
                         'vllm:prefix_cache_queries_total'))
  GROUP BY replica_id
), ids AS (
  SELECT replica_id FROM served UNION SELECT replica_id FROM processed UNION SELECT replica_id FROM busy
  UNION SELECT replica_id FROM declared
), acc AS (
  SELECT ids.replica_id, coalesce(dc.kind, CASE WHEN s.attempts IS NOT NULL THEN 'ours' END) AS kind,
         s.attempts, s.client_attempts, s.unseen_tries, s.server_completed,
         p.router_sent::BIGINT AS router_sent, s.attempts = p.router_sent AS router_agrees,
         p.router_failures::BIGINT AS router_failures, p.breaker_opens::BIGINT AS breaker_opens,
         s.attempts IS NOT NULL AND coalesce(dc.kind, 'ours') = 'ours' AS steps_here,  -- its engine's events are in the run
         b.busy_ms,
         -- its engine's own reports place every attempt it served, on one clock, and none it may have served is missing
         dc.kind IN ('vllm', 'llamacpp') AND rr.n_placed = s.attempts AND rr.n_clocks = 1
           AND coalesce(s.attempts = p.router_sent, (SELECT count(*) FROM attempts WHERE replica_id IS NULL) = 0)
           AS reported_whole,
         rr.busy_ns / 1e6 AS reported_busy_ms, q.queue_p50_ms, q.queue_p99_ms, g.waiting_max::BIGINT AS waiting_max,
         h.prefix_hit_blocks, h.prefix_hit_attempts,
         c.prefix_hit_tokens::BIGINT AS prefix_hit_tokens, c.prefix_query_tokens::BIGINT AS prefix_query_tokens,
         ct.event_cached_tokens, ct.prompt_tokens,
         kv.kv_blocks_used_max::BIGINT AS kv_blocks_used_max, g.kv_usage_max
  FROM ids LEFT JOIN served s USING (replica_id) LEFT JOIN processed p USING (replica_id)
  LEFT JOIN busy b USING (replica_id) LEFT JOIN queue q USING (replica_id) LEFT JOIN hits h USING (replica_id)
  LEFT JOIN kv USING (replica_id) LEFT JOIN declared dc USING (replica_id) LEFT JOIN gauges g USING (replica_id)
  LEFT JOIN counters c USING (replica_id) LEFT JOIN cached ct USING (replica_id)
  LEFT JOIN replica_reported rr USING (replica_id)
), shown AS (
  SELECT * EXCLUDE (busy_ms, prefix_hit_blocks, prefix_hit_attempts, event_cached_tokens, prompt_tokens,
                    reported_whole, reported_busy_ms),
         CASE WHEN steps_here THEN prompt_tokens END AS prompt_tokens,
         CASE WHEN steps_here THEN coalesce(busy_ms, 0) WHEN reported_whole THEN reported_busy_ms END AS busy_ms,
         CASE WHEN steps_here THEN 'observed' WHEN reported_whole THEN 'reported' END AS busy_evidence,
         CASE WHEN steps_here THEN coalesce(event_cached_tokens, 0) END AS event_cached_tokens,
         CASE WHEN steps_here THEN coalesce(prefix_hit_blocks, 0) END AS prefix_hit_blocks,
         CASE WHEN steps_here THEN coalesce(prefix_hit_attempts, 0) END AS prefix_hit_attempts
  FROM acc
)
SELECT getvariable('run_id') AS run_id, replica_id, kind, attempts, client_attempts, unseen_tries,
  server_completed, router_sent, router_agrees, router_failures, breaker_opens, busy_ms, busy_evidence,
  CASE WHEN count(busy_ms) OVER () = count(*) OVER () THEN busy_ms / nullif(avg(busy_ms) OVER (), 0) END AS balance,
  CASE WHEN count(busy_ms) OVER () = count(*) OVER () AND avg(busy_ms) OVER () > 0
       THEN CASE WHEN count(*) FILTER (WHERE busy_evidence = 'reported') OVER () = 0 THEN 'observed'
                 WHEN count(*) FILTER (WHERE busy_evidence = 'observed') OVER () = 0 THEN 'reported'
                 ELSE 'observed and reported' END END AS balance_evidence,
  queue_p50_ms, queue_p99_ms, waiting_max, prefix_hit_blocks, prefix_hit_attempts, prefix_hit_tokens,
  prefix_query_tokens, prompt_tokens, event_cached_tokens,
  event_cached_tokens / nullif(prompt_tokens, 0) AS event_hit_rate,
  prefix_hit_tokens = event_cached_tokens AS prefix_counter_agrees,
  kv_blocks_used_max, kv_usage_max
FROM shown
ORDER BY replica_id;

-- @gaps: a replica whose engine's events are not in the run (declared by URL, or a worker only the router
--   names): its attempts (when no evidence places them), busy time (so every row's balance: unless a vllm or
--   llamacpp replica's own reports place every attempt it served, the detail saying which attempts they do not),
--   queue, KV use and prefix hits, each where its kind cannot say them; a replica the router's counters do not name while router
--   samples exist (router_sent unknown); a replica the router sent more tries than the run holds (router_agrees
--   false: the tries missing are rows no one recorded, so reconciliation's unseen_tries and attempts_per_request
--   are unknown too); a replica whose engine's events are in the run but whose own prefix-cache counter was not
--   scraped twice (prefix_hit_tokens unknown, so whether its counter agrees).
CREATE OR REPLACE TEMP TABLE replicas_gaps (scope VARCHAR, subject_id VARCHAR, affects VARCHAR, needs VARCHAR, detail VARCHAR);
INSERT INTO replicas_gaps
SELECT 'run', replica_id, 'replicas ' || unknown || format(' of {}', replica_id),
       'the replica''s own events per attempt: its `serve --out` folder given to the capture as --server',
       CASE WHEN kind IS NULL THEN format('the router sent {} request(s) to {}, but no declared replica is that worker',
                                          coalesce(router_sent::VARCHAR, 'an unknown number of'), replica_id)
            ELSE format('replica {} ({}) is declared by URL: its engine''s steps are not in the run{}{}{}', replica_id,
                        kind, CASE WHEN attempts IS NULL THEN ', nor which attempts it served'
                                   WHEN coalesce(n_routed, 0) = attempts
                                   THEN format(' (its {} attempt(s) are placed by the router''s spans of their tries)',
                                               attempts)
                                   WHEN kind = 'llamacpp' AND coalesce(n_routed, 0) = 0
                                   THEN format(' (its {} attempt(s) are placed by the timings llama.cpp answered with)',
                                               attempts)
                                   WHEN kind = 'llamacpp'
                                   THEN format(' (its {} attempt(s) are placed by the router''s spans of their tries, {} '
                                               'by the timings llama.cpp answered with)', attempts, attempts - n_routed)
                                   ELSE format(' (its {} attempt(s) are placed by its own spans)', attempts) END,
                        CASE kind WHEN 'blackbox' THEN ', and it reports nothing of its own'
                                  WHEN 'llamacpp' THEN '; its /metrics have no KV usage gauge' ELSE '' END,
                        CASE WHEN busy_ms IS NOT NULL
                             THEN '; its busy_ms is the union of the prefill and decode its engine reported (busy_evidence '
                                  'reported)'
                             WHEN kind NOT IN ('vllm', 'llamacpp') OR attempts IS NULL THEN ''
                             WHEN coalesce(n_placed, 0) < attempts
                             THEN format('; its busy time is unknown: {} of its {} attempt(s) have no reported prefill and '
                                         'decode placed inside the client''s interval', attempts - coalesce(n_placed, 0),
                                         attempts)
                             WHEN n_clocks > 1 THEN '; its busy time is unknown: its reports lie on more than one clock'
                             ELSE '; its busy time is unknown: the run may lack attempts it served (the router''s count '
                                  'does not agree, or attempts of the run name no replica)' END) END
FROM (SELECT r.*, rr.n_placed, rr.n_clocks, rt.n_routed,  -- what the replica cannot say, listed once
             concat_ws(', ', CASE WHEN attempts IS NULL THEN 'attempts' END,
                       CASE WHEN busy_ms IS NULL THEN 'busy_ms, balance (every replica''s)' END,
                       CASE WHEN queue_p50_ms IS NULL AND waiting_max IS NULL THEN 'queue_p50_ms, waiting_max' END,
                       CASE WHEN kv_blocks_used_max IS NULL AND kv_usage_max IS NULL
                            THEN 'kv_blocks_used_max, kv_usage_max' END,
                       CASE WHEN prefix_hit_tokens IS NULL THEN 'prefix_hit_blocks, prefix_hit_tokens' END) AS unknown
      FROM replicas r LEFT JOIN replica_reported rr USING (replica_id)
      LEFT JOIN (SELECT a.replica_id, count(*) AS n_routed  -- placed by the router's spans
                 FROM attempts a JOIN attempt_ids i USING (attempt_id) WHERE i.router_replica_id = a.replica_id
                 GROUP BY 1) rt USING (replica_id)
      WHERE busy_evidence IS DISTINCT FROM 'observed')
WHERE unknown <> ''  -- a replica whose own reports say everything leaves no row
UNION ALL
SELECT 'run', replica_id, 'replicas router_sent, router_agrees',
       'vllm_router_processed_requests_total{worker} for this replica in two router scrapes',
       format('replica {} served {} attempt(s) but the router''s scrapes name no worker that is it', replica_id, attempts)
FROM replicas WHERE router_sent IS NULL AND attempts IS NOT NULL
  AND (SELECT count(DISTINCT ts_ns) FROM samples WHERE source = 'vllm-router') >= 2
UNION ALL
SELECT 'run', replica_id,
       format('the rows of attempts for {} (one per try the router sent it), so reconciliation unseen_tries, '
              'attempts_per_request', replica_id),
       CASE WHEN by_url THEN 'the router''s spans of every try (capture --router-traces): they name each try''s replica'
            ELSE 'every try the replica received in its `serve --out` folder (a replica that is not killed flushes at '
                 'its stop)' END,
       format('the router sent {} {} tr{} over the load ({} failed there, its breaker opened {} time(s)); the run '
              'holds {} attempt(s) of it: {}', replica_id, router_sent, CASE WHEN router_sent = 1 THEN 'y' ELSE 'ies' END,
              router_failures, breaker_opens, coalesce(attempts, 0),
              CASE WHEN router_sent <= coalesce(attempts, 0) THEN 'more than the router counted'
                   WHEN by_url  -- declared by URL: only the router's spans (or one llama.cpp's timings) place its attempts
                   THEN format('{} are not placed on it ({} attempt(s) of the run name no replica: no span of the router '
                               'names theirs)', router_sent - coalesce(attempts, 0), unplaced)
                   ELSE format('{} are in no folder (refused by a dead replica, or received after its last flush)',
                               router_sent - attempts) END)
FROM (SELECT *, kind IN ('vllm', 'llamacpp', 'blackbox') AS by_url,
             (SELECT count(*) FROM attempts WHERE replica_id IS NULL) AS unplaced FROM replicas)
WHERE NOT router_agrees
UNION ALL
SELECT 'run', replica_id, format('replicas prefix_hit_tokens, prefix_query_tokens, prefix_counter_agrees of {}', replica_id),
       'two scrapes of the replica''s /metrics with vllm:prefix_cache_hits_total: a server that exports it, whose '
       '`serve --out` manifest names its port (server.port), answering the capture before and after the load',
       format('replica {} (a `serve --out` folder) has its engine''s events in the run ({} cached prompt token(s) at '
              'first admission), but no two scrapes of its own prefix-cache counter', replica_id, event_cached_tokens)
FROM replicas WHERE busy_evidence = 'observed' AND prefix_hit_tokens IS NULL;
