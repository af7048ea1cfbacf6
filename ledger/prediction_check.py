"""The registered prediction held against the run (docs/LEDGER.md "prediction_registration and
prediction_check").

A capture registers a prediction before its load: RUN/prediction.json, with its sha256 and the
registration time on the host's monotonic clock in manifest.json `prediction`. This stage checks the
file against that hash and the prediction format, tells whether the registration predates the run's
first event on the same clock, and matches each attempt to a predicted request shape by the prompt
tokens it computed (engine.enqueued's value less the engine.prefill cached_tokens its prefix cache
served): its own class's shape (the class the client dealt its task) when that shape's computed
prompt (prompt less cached) is not longer than the attempt's, so the shape's lower bounds stay
bounds, and none when it is longer; an attempt whose class the run does not name, or the prediction
does not list, to the shape whose computed prompt is the longest not longer than its own (of equal
ones, the first the file lists); an attempt that computed fewer tokens than every shape is matched
to none. A missing, altered or
malformed file is a gap, never a check.
"""
from __future__ import annotations

import hashlib
import json

from inferledger.costmodel.prediction import PredictionError, fit_range_note, load, read_file
import pyarrow as pa

from inferledger.ledger.tables import StageTable, gap_table
from inferledger.probes.model_shape import ShapeError, shape_differences
from inferledger.probes.run_dir import PREDICTION_FILE
from inferledger.probes.run_folder import MANIFEST_FILE, engine_differences

READS = ("clock_ends", "marks", "request_metrics", "tasks", "quantile_linear")
CREATES = ("prediction_shapes", "prediction_registration", "prediction_check", "prediction_check_gaps")
SCOPE = "rollup"  # over the run's steps and attempts together (docs/SCALE.md)
PUBLIC = ("prediction_registration", "prediction_check")
# @gaps: a registered prediction that is missing, changed after registration, not of the prediction format
#   or made for another run (its workload sha256, model shape or device not the run's), or a prediction.json
#   the manifest does not register; a fit range whose busy end lies outside the batch sizes its fit was trained
#   on where a per-sequence term was unknown (held at 0); a step fit trained on another engine than the run's
#   (its model shape, dtype included, device or threads), whose ranges are not checked
GAPS = gap_table("prediction_check")

_SHAPE_COLS = ("class", "prompt_tokens", "cached_tokens", "output_tokens", "ttft_lower_ms", "ttft_sustained_low_ms",
               "ttft_sustained_high_ms", "ttft_fit_low_ms", "ttft_fit_high_ms", "tpot_lower_ms",
               "tpot_sustained_low_ms", "tpot_sustained_high_ms", "tpot_fit_low_ms", "tpot_fit_high_ms")
SHAPES = StageTable("prediction_shapes", (("class", pa.string()), *((c, pa.int64()) for c in _SHAPE_COLS[1:4]),
                                     *((c, pa.float64()) for c in _SHAPE_COLS[4:]), ("ord", pa.int64())), temp=True)


def _registered(run) -> tuple[dict | None, dict | None, list[tuple[str, str, str]]]:
    """(the manifest's prediction block, the checked document, gap rows (affects, needs, detail))."""
    block = run.manifest.registered_prediction  # None also where the capture said why it registered none
    path = run.run_dir / PREDICTION_FILE
    affects = "prediction_registration, prediction_check"
    if not isinstance(block, dict):
        if path.exists():
            return None, None, [(affects, "the manifest's prediction block (sha256, registration time)",
                                 f"{PREDICTION_FILE} is in the run directory but {MANIFEST_FILE} registers none")]
        return None, None, []
    if not path.is_file():
        return block, None, [(affects, f"the registered {PREDICTION_FILE}",
                              f"{MANIFEST_FILE} registers a prediction (sha256 {block.get('sha256')}) but "
                              f"{PREDICTION_FILE} is missing")]
    try:
        data = read_file(path, "a prediction")  # bounded: the file is read whole to be hashed and parsed
    except PredictionError as exc:
        return block, None, [(affects, "a prediction file of the inferledger.prediction format", str(exc))]
    digest = hashlib.sha256(data).hexdigest()
    if digest != block.get("sha256"):
        return block, None, [(affects, f"the {PREDICTION_FILE} that was registered",
                              f"{PREDICTION_FILE} has sha256 {digest}, {MANIFEST_FILE} registered "
                              f"{block.get('sha256')}: the file was changed after registration")]
    try:
        doc = load(data, PREDICTION_FILE)
    except PredictionError as exc:
        return block, None, [(affects, "a prediction file of the inferledger.prediction format", str(exc))]
    wrong = _not_this_run(doc, run.manifest)
    if wrong:
        return block, None, [(affects, "a prediction made for this run's workload, model shape and device",
                              f"{PREDICTION_FILE} was made for another run: {'; '.join(wrong)}")]
    return block, doc, []


def _fit_of_another_engine(doc: dict, manifest) -> list[tuple[str, str, str]]:
    """A step fit trained on another engine than the run's (its model shape, dtype included, its device or its
    threads, as the fit records its run's): its ranges are that engine's, so they are dropped from `doc` (the
    run is held to the roofs' range) with a gap row saying why."""
    fit = (doc.get("roofs") or {}).get("fit")
    differ = engine_differences(fit.get("engine") if isinstance(fit, dict) else None, manifest.engine,
                                "the step fit's run")
    if not differ:
        return []
    for r in doc["requests"]:
        for key in ("ttft_expected_ms", "tpot_expected_ms"):
            (r.get(key) or {}).pop("fit", None)
    return [("prediction_check ttft_fit_low_ms, ttft_fit_high_ms, tpot_fit_low_ms, tpot_fit_high_ms",
             "a step fit trained on a run of this run's engine (its model at its dtype, device and threads)",
             f"{PREDICTION_FILE}'s step fit was trained on another engine: {'; '.join(differ)}: its ranges are "
             "that engine's and are not checked here")]


def _not_this_run(doc: dict, manifest) -> list[str]:
    """How the prediction's workload (sha256), model shape and device differ from the run's: a workload
    or shape the run records and the prediction does not name cannot be shown to be the run's, and
    differs; what the run does not say, or a device either side does not name, is not compared."""
    out = []
    theirs, ours = (doc.get("workload") or {}).get("sha256"), manifest.block("workload").get("sha256")
    if ours and theirs != ours:
        out.append(f"workload sha256 {theirs[:12]}… is not the run's {ours[:12]}…" if theirs else
                   f"it names no workload sha256 (the run's: {ours[:12]}…)")
    try:
        shape = manifest.model_shape().to_dict()
    except ShapeError:
        shape = None
    predicted = doc.get("model_shape") or {}
    if shape is not None and not predicted:
        out.append("it names no model shape (the run's: " + ", ".join(
            f"{k} {v!r}" for k, v in shape.items() if k != "source") + ")")
    elif shape is not None:
        differ = shape_differences(shape, predicted, "the run's")
        if differ:
            out.append("model shape " + ", ".join(differ))
    theirs, ours = (doc.get("device") or {}).get("name"), manifest.device_name
    if theirs and ours and theirs != ours:
        out.append(f"device {theirs!r} is not the run's {ours!r}")
    return out


def _range(r: dict, key: str, kind: str) -> list:
    v = (r.get(key) or {}).get(kind)
    return list(v) if v else [None, None]


def _fit_blind_spots(doc: dict) -> list[tuple[str, str, str]]:
    """Gap rows for a fit range whose busy end (the batch limit) lies outside the batch sizes its fit was
    trained on, where a per-sequence term could not be fitted: the end leaves that cost out (held at 0)."""
    try:
        note = fit_range_note(doc)
    except (TypeError, ValueError, KeyError):
        return [("prediction_check ttft_fit_high_ms, tpot_fit_high_ms", "a step fit block of the prediction format",
                 f"{PREDICTION_FILE}: roofs.fit is not a step fit this version reads; its ranges are checked as given")]
    return [] if note is None else [
        ("prediction_check ttft_fit_high_ms, tpot_fit_high_ms",
         "a fit trained on steps of more than one batch size (`predict --fit` of a run that batched)",
         f"the fit range's busy end: {note} (a run above that end may not have missed it)")]


def build(con, run=None) -> None:
    block, doc, gaps = _registered(run) if run is not None else (None, None, [])
    if doc is not None:  # a fit of another engine is not checked; else what its busy end leaves out
        gaps += _fit_of_another_engine(doc, run.manifest) or _fit_blind_spots(doc)
    GAPS.store(con, [("run", PREDICTION_FILE, affects, needs, detail) for affects, needs, detail in gaps])
    SHAPES.store(con, [(r["class"], r["prompt_tokens"], r.get("cached_tokens", 0), r["output_tokens"],
                        r["ttft_lower_ms"], *_range(r, "ttft_expected_ms", "sustained"),
                        *_range(r, "ttft_expected_ms", "fit"), r["tpot_lower_ms"],
                        *_range(r, "tpot_expected_ms", "sustained"), *_range(r, "tpot_expected_ms", "fit"), i)
                       for i, r in enumerate(doc["requests"] if doc is not None else [])])
    reg = (block or {}).get("registered") or {}
    ok = doc is not None
    con.execute(PREDICTION_REGISTRATION, [ok, block.get("sha256") if block else None,
                                          block.get("source") if block else None, reg.get("clock"),
                                          reg.get("mono_ns"), reg.get("wall_ns"),
                                          json.dumps(doc["roofs"]) if ok else None, block is not None])
    con.execute(PREDICTION_CHECK)


PREDICTION_REGISTRATION = """
CREATE OR REPLACE TABLE prediction_registration AS
WITH reg AS (SELECT ?::BOOLEAN AS valid, ?::VARCHAR AS sha256, ?::VARCHAR AS source, ?::VARCHAR AS clock,
                    ?::BIGINT AS registered_ns, ?::BIGINT AS registered_wall_ns, ?::VARCHAR AS roofs,
                    ?::BOOLEAN AS registered),
first AS (SELECT min(c.ts_ns) AS first_event_ns FROM clock_ends c, reg WHERE c.clock = reg.clock AND c.edge = 'first')
SELECT getvariable('run_id') AS run_id, sha256, source, valid, clock, registered_ns, registered_wall_ns,
       first_event_ns, (first_event_ns - registered_ns) / 1e6 AS lead_ms,
       CASE WHEN NOT valid OR first_event_ns IS NULL OR registered_ns IS NULL THEN NULL
            ELSE registered_ns < first_event_ns END AS predates_data,
       roofs
FROM reg, first WHERE registered
"""

PREDICTION_CHECK = """
CREATE OR REPLACE TABLE prediction_check AS
WITH prompt AS (  -- the prompt tokens the engine computed: its own count less those its prefix cache served
  SELECT attempt_id, (n_prompt_engine - coalesce(n_prompt_cached, 0))::BIGINT AS computed_tokens
  FROM marks WHERE n_prompt_engine IS NOT NULL),
task_class AS (  -- the workload class the client dealt each task (tasks.task_class)
  SELECT task_id, task_class FROM tasks WHERE task_class IS NOT NULL),
cand AS (  -- the shapes whose bound assumes no more computed tokens than the attempt computed
  SELECT m.attempt_id, p.computed_tokens, m.ttft_server_ms, m.tpot_server_ms, c.task_class,
         c.task_class IN (SELECT class FROM prediction_shapes) AS class_predicted,
         s.class, s.prompt_tokens - s.cached_tokens AS shape_computed, s.ord
  FROM request_metrics m JOIN prompt p USING (attempt_id) LEFT JOIN task_class c USING (task_id)
  JOIN prediction_shapes s ON s.prompt_tokens - s.cached_tokens <= p.computed_tokens),
matched AS (
  -- its own class's shape where the run says which class it is and the prediction has that class (a
  -- session's later turns, longer, stay with their class; none when its class's shape assumes more
  -- computed tokens); else the one that assumes the most (equal: the first listed)
  SELECT attempt_id, any_value(computed_tokens) AS computed_tokens, any_value(ttft_server_ms) AS ttft_server_ms,
         any_value(tpot_server_ms) AS tpot_server_ms,
         CASE WHEN coalesce(any_value(class_predicted), false) THEN any_value(class) FILTER (WHERE class = task_class)
              ELSE arg_max(class, [shape_computed, -ord]) END AS class
  FROM cand GROUP BY attempt_id)
SELECT getvariable('run_id') AS run_id, s.class, s.prompt_tokens, s.cached_tokens, s.output_tokens,
       count(m.attempt_id) AS n_attempts,
       s.ttft_lower_ms, s.ttft_sustained_low_ms, s.ttft_sustained_high_ms, s.ttft_fit_low_ms, s.ttft_fit_high_ms,
       count(m.ttft_server_ms) AS n_ttft,
       quantile_linear(m.ttft_server_ms, 0.5) AS ttft_p50_ms, min(m.ttft_server_ms) AS ttft_min_ms,
       count(*) FILTER (WHERE m.ttft_server_ms < s.ttft_lower_ms) AS ttft_below_bound,
       count(*) FILTER (WHERE m.ttft_server_ms BETWEEN s.ttft_sustained_low_ms AND s.ttft_sustained_high_ms)
         AS ttft_in_sustained,
       s.tpot_lower_ms, s.tpot_sustained_low_ms, s.tpot_sustained_high_ms, s.tpot_fit_low_ms, s.tpot_fit_high_ms,
       count(m.tpot_server_ms) AS n_tpot,
       quantile_linear(m.tpot_server_ms, 0.5) AS tpot_p50_ms, min(m.tpot_server_ms) AS tpot_min_ms,
       count(*) FILTER (WHERE m.tpot_server_ms < s.tpot_lower_ms) AS tpot_below_bound,
       count(*) FILTER (WHERE m.tpot_server_ms BETWEEN s.tpot_sustained_low_ms AND s.tpot_sustained_high_ms)
         AS tpot_in_sustained
FROM prediction_shapes s LEFT JOIN matched m USING (class)
GROUP BY ALL ORDER BY s.prompt_tokens, any_value(s.ord)
"""

# @table prediction_registration: the run's registered prediction, one row when manifest.json registers
#   one (docs/LEDGER.md "prediction_registration and prediction_check")
# @column sha256: the registered file's sha256, as manifest.json prediction.sha256 holds it
# @column source: where the prediction came from: the file given to capture --prediction, or the capture's own
# @column valid: prediction.json is there, matches sha256, is of the prediction format and was made for this
#   run's workload, model shape and device (else a gap row says which)
# @column clock: the clock of registered_ns (the capture host's monotonic clock)
# @column registered_ns: the registration time, ns on clock
# @column registered_wall_ns: the same moment in Unix time, ns
# @column first_event_ns: the run's first event on clock (any source)
# @column lead_ms: first_event_ns − registered_ns: how long before the data the prediction was fixed
# @column predates_data: registered_ns < first_event_ns; NULL when the file is not valid or no event is on clock
# @column roofs: the prediction's roofs (peak, sustained, fit) with their source labels, as JSON

# @table prediction_check: one row per predicted request shape: the prediction beside the run's attempts
#   of that shape (docs/LEDGER.md "prediction_registration and prediction_check")
# @column class: the workload class the shape is
# @column prompt_tokens: the shape's prompt tokens; an attempt belongs to its own class's shape (task.start
#   attrs.task_class) when that shape's computed prompt (prompt_tokens − cached_tokens) is not longer than the
#   attempt's computed prompt (engine.enqueued value less engine.prefill attrs.cached_tokens: tokens its prefix
#   cache served are not computed), to none when it is; an attempt of no known or predicted class to the
#   shape whose computed prompt is the longest not longer than its own
# @column cached_tokens: the shape's prefix assumed cached (its class's shared prefix)
# @column output_tokens: the shape's output tokens (max_tokens)
# @column n_attempts: the attempts matched to the shape
# @column ttft_lower_ms: predicted TTFT lower bound (the prefill alone on the peak roofs)
# @column ttft_sustained_low_ms: predicted TTFT range on the sustained roofs, low end (the request alone)
# @column ttft_sustained_high_ms: its high end (the prefill beside a full batch of decodes)
# @column ttft_fit_low_ms: predicted TTFT range through an earlier run's step fit, low end; NULL without a fit
#   or with a fit trained on another engine than the run's (a gap row)
# @column ttft_fit_high_ms: its high end
# @column n_ttft: matched attempts with a ttft_server_ms
# @column ttft_p50_ms: the median of their request_metrics.ttft_server_ms
# @column ttft_min_ms: the smallest of them
# @column ttft_below_bound: attempts whose ttft_server_ms is below ttft_lower_ms (the bound did not hold)
# @column ttft_in_sustained: attempts whose ttft_server_ms lies in the sustained range
# @column tpot_lower_ms: predicted TPOT lower bound (one decode step alone at the prompt's context, peak roofs)
# @column tpot_sustained_low_ms: predicted TPOT range on the sustained roofs, low end (the request alone)
# @column tpot_sustained_high_ms: its high end (its last token in a full batch of decodes)
# @column tpot_fit_low_ms: predicted TPOT range through an earlier run's step fit (with its between-step
#   host time), low end; NULL without a fit
# @column tpot_fit_high_ms: its high end
# @column n_tpot: matched attempts with a tpot_server_ms
# @column tpot_p50_ms: the median of their request_metrics.tpot_server_ms
# @column tpot_min_ms: the smallest of them
# @column tpot_below_bound: attempts whose tpot_server_ms is below tpot_lower_ms
# @column tpot_in_sustained: attempts whose tpot_server_ms lies in the sustained range
