-- The gap register: what is missing, which figures it leaves NULL, what would close it (docs/LEDGER.md
-- "gaps"). Every module that can leave a figure NULL declares why beside what it computes, in its own
-- `<module>_gaps` table of one shape (ledger/tables.py); this module is their union, numbered, and the
-- collectors' rows (gaps.parquet) as they were written. It derives no gap itself (ledger/modules.py
-- holds it to that: it reads the gap tables and nothing else).
--
-- scope: rollup
-- reads: attempts_gaps, choice_metrics_gaps, critical_path_gaps, energy_gaps, energy_shares_gaps,
--        figures_gaps, kv_holding_gaps, latency_gaps, layers_gaps, load_gaps, marks_gaps, peer_views_gaps,
--        prediction_check_gaps, replicas_gaps, reported_gaps, request_model_gaps, run_diagnosis_gaps, run_metrics_gaps, slo_misses_gaps, step_fit_gaps,
--        step_model_gaps, steps_gaps, streams_gaps, window_gaps, gaps_file
-- creates: gaps

-- @table gaps: one row per gap: what is missing, which figures it leaves NULL, what would close it
--   (docs/LEDGER.md "gaps")
-- @column gap_id: deterministic: scope:subject:n for the ledger's rows, reported:... for reported
--   evidence, the collector's own id for its rows
-- @column scope: run, import, attempt, task, clock, energy, step, otlp (a reported span), event
-- @column subject_id: what the gap is about: an attempt, task, step or event id, a part file, a metric
--   (NULL for the run)
-- @column affects: the figures (columns, tables) it leaves NULL or changes
-- @column needs: what would close it
-- @column detail: what was found, naming events and files
-- @column origin: ledger (found by the rebuild) or collector (gaps.parquet, written at capture or import)
CREATE OR REPLACE TABLE gaps AS
WITH declared AS (
  SELECT 'attempts' AS module, * FROM attempts_gaps
  UNION ALL SELECT 'choice_metrics', * FROM choice_metrics_gaps
  UNION ALL SELECT 'critical_path', * FROM critical_path_gaps
  UNION ALL SELECT 'energy', * FROM energy_gaps
  UNION ALL SELECT 'energy_shares', * FROM energy_shares_gaps
  UNION ALL SELECT 'figures', * FROM figures_gaps
  UNION ALL SELECT 'kv_holding', * FROM kv_holding_gaps
  UNION ALL SELECT 'latency', * FROM latency_gaps
  UNION ALL SELECT 'layers', * FROM layers_gaps
  UNION ALL SELECT 'load', * FROM load_gaps
  UNION ALL SELECT 'marks', * FROM marks_gaps
  UNION ALL SELECT 'peer_views', * FROM peer_views_gaps
  UNION ALL SELECT 'prediction_check', * FROM prediction_check_gaps
  UNION ALL SELECT 'replicas', * FROM replicas_gaps
  UNION ALL SELECT 'reported', * FROM reported_gaps
  UNION ALL SELECT 'request_model', * FROM request_model_gaps
  UNION ALL SELECT 'run_diagnosis', * FROM run_diagnosis_gaps
  UNION ALL SELECT 'run_metrics', * FROM run_metrics_gaps
  UNION ALL SELECT 'slo_misses', * FROM slo_misses_gaps
  UNION ALL SELECT 'step_fit', * FROM step_fit_gaps
  UNION ALL SELECT 'step_model', * FROM step_model_gaps
  UNION ALL SELECT 'steps', * FROM steps_gaps
  UNION ALL SELECT 'streams', * FROM streams_gaps
  UNION ALL SELECT 'window', * FROM window_gaps
), numbered AS (
  -- the rows of reported evidence keep the ids docs/LEDGER.md "Reported evidence" names: reported:itl
  -- (latency), reported:counter:<metric> and reported:timings:<attempt> (reported); every other row is
  -- scope:subject:n
  SELECT scope, subject_id, affects, needs, detail,
         CASE module WHEN 'latency' THEN 'reported:itl'
                     WHEN 'reported' THEN format(CASE scope WHEN 'attempt' THEN 'reported:timings:{}'
                                                 ELSE 'reported:counter:{}' END, subject_id)
                     ELSE format('{}:{}:{}', scope, coalesce(subject_id, '-'),
                                 row_number() OVER (PARTITION BY module IN ('latency', 'reported'), scope, subject_id
                                                    ORDER BY affects, detail)) END AS gap_id
  FROM declared
)
SELECT getvariable('run_id') AS run_id, gap_id, scope, subject_id, affects, needs, detail, 'ledger' AS origin
FROM numbered
UNION ALL
SELECT getvariable('run_id'), gap_id, scope, subject_id, affects, needs, detail, 'collector' FROM gaps_file
ORDER BY origin, gap_id;
