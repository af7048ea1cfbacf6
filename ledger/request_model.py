"""The request-level model: each attempt's TTFT and TPOT predicted from the steps it was in (the
schedule that happened), against the measured ones, the residual split by where it arose.

With engine steps (our engine): the queue is the steps that ran between the attempt's enqueue and its
first step; the prefill window its steps up to the one that gave its first token; the decode window
the rest. A step's predicted time is the run's step fit (step_fit_points), a gap's is the fit's
inter-step term; the bound is the sum of the steps' lower bounds. Without steps (a peer such as
vLLM, whose spans are per request): the attempt alone, its prompt as one prefill and each output
token as one decode step at its context ("solo": a lower bound, since sharing a batch only adds
work), with queue and inter-step host time unknown.
"""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa

from inferledger.costmodel import StepRow, stage_bounds, step_work
from inferledger.costmodel.fit import StepFit
from inferledger.costmodel.roofs import run_roofs
from inferledger.ledger.tables import StageTable, gap_table
from inferledger.probes.model_shape import ShapeError

READS = ("step_model", "steps", "step_attribution", "step_fit", "step_fit_points", "marks", "request_metrics")
CREATES = ("request_model", "request_model_gaps")
SCOPE = "rollup"  # over the run's steps and attempts together (docs/SCALE.md)
PUBLIC = ("request_model",)

_SCHEDULE = """
WITH gp AS (SELECT max(value) FILTER (WHERE name = 'gap_alpha_ms') AS a,
                   max(value) FILTER (WHERE name = 'gap_ms_per_seq') AS b,
                   max(value) FILTER (WHERE name = 'gap_covered_num_seqs_lo') AS lo,
                   max(value) FILTER (WHERE name = 'gap_covered_num_seqs_hi') AS hi FROM step_fit),
sm AS (SELECT m.step_id, m.measured_ms, m.gap_after_ms, m.bound_ms, p.predicted_ms, st.start_ns, st.clock,
              CASE WHEN gp.a IS NULL THEN 0  -- a fit without a gap term predicts none
                   WHEN gp.b IS NOT NULL THEN gp.a + gp.b * m.num_seqs
                   -- the per-sequence term unknown (one batch size in training): known at that batch size only
                   WHEN m.num_seqs BETWEEN gp.lo AND gp.hi THEN gp.a END AS pred_gap_ms
       FROM step_model m JOIN steps st ON st.step_id = m.step_id
       LEFT JOIN step_fit_points p ON p.step_id = m.step_id, gp),
att AS (SELECT attempt_id, min(step_id) AS s1, max(step_id) AS z FROM step_attribution GROUP BY attempt_id),
tok AS (SELECT attempt_id, first_token_step AS f FROM marks WHERE first_token_step IS NOT NULL),
enq AS (SELECT attempt_id, enqueued.ns AS a_ns, enqueued.clock AS clock FROM marks WHERE enqueued IS NOT NULL),
w AS (SELECT att.attempt_id, sm.*,
             CASE WHEN sm.step_id < att.s1 THEN 'queue' WHEN sm.step_id <= tok.f THEN 'prefill' ELSE 'decode' END AS win,
             CASE WHEN sm.step_id < att.s1 THEN 'queue' WHEN sm.step_id < tok.f THEN 'prefill'
                  WHEN sm.step_id < att.z THEN 'decode' END AS gap_win
      FROM att JOIN tok USING (attempt_id) JOIN enq USING (attempt_id)
      JOIN sm ON sm.clock = enq.clock AND ((sm.step_id < att.s1 AND sm.start_ns >= enq.a_ns)
                                           OR sm.step_id BETWEEN att.s1 AND att.z))
SELECT attempt_id,
  sum(predicted_ms + pred_gap_ms) FILTER (WHERE win = 'queue') AS q_pred,
  sum(bound_ms) FILTER (WHERE win = 'queue') AS q_bound,
  count(*) FILTER (WHERE win = 'queue') AS q_steps,
  sum(predicted_ms) FILTER (WHERE win = 'prefill') AS p_pred, sum(measured_ms) FILTER (WHERE win = 'prefill') AS p_meas,
  sum(bound_ms) FILTER (WHERE win = 'prefill') AS p_bound,
  sum(predicted_ms) FILTER (WHERE win = 'decode') AS d_pred, sum(measured_ms) FILTER (WHERE win = 'decode') AS d_meas,
  sum(bound_ms) FILTER (WHERE win = 'decode') AS d_bound, count(*) FILTER (WHERE win = 'decode') AS d_steps,
  coalesce(sum(pred_gap_ms) FILTER (WHERE gap_win = 'prefill'), 0) AS pg_pred,
  coalesce(sum(gap_after_ms) FILTER (WHERE gap_win = 'prefill'), 0) AS pg_meas,
  coalesce(sum(pred_gap_ms) FILTER (WHERE gap_win = 'decode'), 0) AS dg_pred,
  coalesce(sum(gap_after_ms) FILTER (WHERE gap_win = 'decode'), 0) AS dg_meas,
  -- a gap the fit cannot predict (its batch size is not the one the gap term was trained on) makes its sum unknown
  coalesce(bool_or(pred_gap_ms IS NULL) FILTER (WHERE win = 'queue'), false) AS q_gap_unknown,
  coalesce(bool_or(pred_gap_ms IS NULL) FILTER (WHERE gap_win = 'prefill'), false) AS pg_unknown,
  coalesce(bool_or(pred_gap_ms IS NULL) FILTER (WHERE gap_win = 'decode'), false) AS dg_unknown
FROM w GROUP BY attempt_id
"""
_ATTEMPTS = """
SELECT r.attempt_id, r.ttft_server_ms, r.ttft_client_ms, r.tpot_server_ms, r.queue_ms, r.prefill_ms, r.decode_ms,
       r.n_output_tokens, coalesce(r.n_choices, 1) AS n_choices, m.n_prompt_tokens AS prompt
FROM request_metrics r JOIN marks m USING (attempt_id)
WHERE r.ttft_server_ms IS NOT NULL
ORDER BY r.attempt_id
"""

REQUEST_MODEL = StageTable("request_model", (
    ("attempt_id", pa.string()), ("basis", pa.string()), ("ttft_measured_ms", pa.float64()),
    ("ttft_predicted_ms", pa.float64()), ("ttft_bound_ms", pa.float64()), ("ttft_error_pct", pa.float64()),
    ("tpot_measured_ms", pa.float64()), ("tpot_predicted_ms", pa.float64()), ("tpot_bound_ms", pa.float64()),
    ("tpot_error_pct", pa.float64()), ("queue_steps", pa.int64()), ("residual_queue_ms", pa.float64()),
    ("residual_prefill_ms", pa.float64()), ("residual_decode_ms", pa.float64()),
    ("residual_host_ms", pa.float64()), ("transport_ms", pa.float64())), order="attempt_id")
# @gaps: no engine steps (a peer's per-request spans); no shape, roofs or declared fit for the solo model; the
#   solo TTFT bound, which cannot count the prompt tokens a peer served from its prefix cache; host time
#   between steps of a batch size the fit's gap term was not trained on, with its per-sequence term unknown
GAPS = gap_table("request_model")


def _named(con, sql: str) -> list[SimpleNamespace]:
    """A query's rows, each with its columns as attributes."""
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [SimpleNamespace(**dict(zip(names, r))) for r in cur.fetchall()]


def _sub(a, b):
    return a - b if a is not None and b is not None else None


def _pct(pred, meas):
    return (pred - meas) / meas * 100 if pred is not None and meas else None


def _per_token(ms, n_output, n_choices):
    per_choice = (n_output or 0) / (n_choices or 1)
    return ms / (per_choice - 1) if ms is not None and per_choice > 1 else None


# @table request_model: one row per attempt with a server TTFT: predicted and measured TTFT and TPOT
#   given the schedule that happened, and the residual split by source (docs/LEDGER.md "request_model")
# @column attempt_id: the attempt
# @column basis: schedule (the engine steps it was in) or solo (no steps in the run: the attempt alone)
# @column ttft_measured_ms: request_metrics.ttft_server_ms
# @column ttft_predicted_ms: queue + prefill steps + the gaps between them, each step at the step fit
#   (solo: its prompt as one step at the fit; NULL without a fit, or where a gap's batch size is not the one
#   the fit's gap term was trained on and step_fit gap_ms_per_seq is unknown)
# @column ttft_bound_ms: the same steps at their lower bounds, gaps at 0
# @column ttft_error_pct: (predicted − measured) / measured × 100
# @column tpot_measured_ms: request_metrics.tpot_server_ms
# @column tpot_predicted_ms: the decode window's predicted steps and gaps / (tokens per choice − 1) (NULL as
#   ttft_predicted_ms where a gap cannot be predicted)
# @column tpot_bound_ms: the decode window's bounds / (tokens per choice − 1)
# @column tpot_error_pct: (predicted − measured) / measured × 100
# @column queue_steps: engine steps that ran between its enqueue and its first step
# @column residual_queue_ms: measured queue_ms − predicted queue (NULL for solo: no schedule)
# @column residual_prefill_ms: measured − predicted time of the prefill window's steps
# @column residual_decode_ms: measured − predicted time of the decode window's steps
# @column residual_host_ms: measured − predicted host time between the attempt's steps (NULL for solo)
# @column transport_ms: ttft_client_ms − ttft_server_ms (the client's view minus the server's)
def build(con, run) -> None:
    manifest = run.manifest
    sched = {r.attempt_id: r for r in _named(con, _SCHEDULE)}
    have_steps = con.execute("SELECT count(*) FROM step_model").fetchone()[0] > 0
    solo = None if have_steps else _Solo.of(manifest)
    recs, gaps, unknown_gap_attempts = [], [], 0
    for a in _named(con, _ATTEMPTS):
        rec = {"attempt_id": a.attempt_id, "ttft_measured_ms": a.ttft_server_ms, "tpot_measured_ms": a.tpot_server_ms,
               "transport_ms": _sub(a.ttft_client_ms, a.ttft_server_ms)}
        s = sched.get(a.attempt_id)
        if s is not None:
            known = s.p_pred is not None
            q_known, gaps_known = known and not s.q_gap_unknown, not (s.pg_unknown or s.dg_unknown)
            unknown_gap_attempts += s.q_gap_unknown or not gaps_known
            rec.update(basis="schedule", queue_steps=s.q_steps,
                       ttft_predicted_ms=(s.q_pred or 0) + s.p_pred + s.pg_pred
                       if q_known and not s.pg_unknown else None,
                       ttft_bound_ms=(s.q_bound or 0) + s.p_bound if s.p_bound is not None else None,
                       tpot_predicted_ms=_per_token(s.d_pred + s.dg_pred, a.n_output_tokens, a.n_choices)
                       if s.d_pred is not None and not s.dg_unknown else None,
                       tpot_bound_ms=_per_token(s.d_bound, a.n_output_tokens, a.n_choices),
                       residual_queue_ms=_sub(a.queue_ms, s.q_pred or 0) if q_known else None,
                       residual_prefill_ms=_sub(s.p_meas, s.p_pred), residual_decode_ms=_sub(s.d_meas, s.d_pred),
                       residual_host_ms=(s.pg_meas + s.dg_meas) - (s.pg_pred + s.dg_pred)
                       if known and gaps_known else None)
        elif solo is not None and a.prompt:
            rec.update(solo.predict(int(a.prompt), a.n_output_tokens, a.n_choices, a.prefill_ms, a.decode_ms))
        rec["ttft_error_pct"] = _pct(rec.get("ttft_predicted_ms"), a.ttft_server_ms)
        rec["tpot_error_pct"] = _pct(rec.get("tpot_predicted_ms"), a.tpot_server_ms)
        recs.append(rec)
    if unknown_gap_attempts:
        gaps.append(("run", None, "request_model ttft_predicted_ms, tpot_predicted_ms, their error_pct, "
                     "residual_queue_ms, residual_host_ms", "training steps of more than one batch size with host "
                     "time after them (the step fit's gap_ms_per_seq)",
                     f"{unknown_gap_attempts} attempt(s) ran in steps of a batch size the step fit's host-time term "
                     "was not trained on, and its time per sequence is unknown: their predictions that add that "
                     "host time are unknown"))
    if not have_steps and recs:
        gaps.append(("run", None, "step_model, model_residuals, step_fit; request_model residual_queue_ms, "
                     "residual_host_ms (basis solo)", "per-step events (batch composition, step start and end)",
                     "the run has no engine steps: a peer's spans are per request (vLLM reports queue, prefill "
                     "and decode times and token counts, not its batches, step times or host time between steps)"))
        if solo is not None and solo.roofs is not None:
            gaps.append(("run", None, "request_model ttft_bound_ms (basis solo)",
                         "the prompt tokens the server served from its prefix cache, per request",
                         "the solo TTFT bound computes every prompt token: a request whose prefix the server "
                         "had cached computes fewer, and can run faster than this bound"))
        if solo is None or solo.reason:
            gaps.append(("run", None, "request_model predicted and bound columns", "the served model's shape "
                         "(manifest model_shape, declared) and roofs or a step fit (manifest step_fit)",
                         solo.reason if solo is not None else "no shape"))
    REQUEST_MODEL.store(con, recs)
    GAPS.store(con, gaps)


class _Solo:
    """One attempt alone on the declared shape: bounds on the run's roofs, predictions at a declared fit."""

    def __init__(self, shape, roofs, fit, reason):
        self.shape, self.roofs, self.fit, self.reason = shape, roofs, fit, reason

    @classmethod
    def of(cls, manifest) -> "_Solo | None":
        try:
            shape = manifest.model_shape()
        except ShapeError as exc:
            return cls(None, None, None, str(exc))
        roofs, why = run_roofs(manifest)
        fit = StepFit.from_dict(manifest.step_fit) if manifest.step_fit is not None else None
        reason = None if roofs is not None or fit is not None else f"{why}; and no declared step fit (manifest step_fit)"
        return cls(shape, roofs, fit, reason)

    def _steps(self, prompt: int, n_out: int | None, n_choices: int):
        per_choice = int((n_out or 0) / (n_choices or 1))
        pre = step_work(self.shape, [StepRow("prefill", prompt, 0)])
        decodes = [step_work(self.shape, [StepRow("decode", 1, prompt + i)]) for i in range(max(per_choice - 1, 0))]
        return pre, decodes, per_choice

    def predict(self, prompt, n_out, n_choices, prefill_ms, decode_ms) -> dict:
        if self.shape is None:
            return {"basis": "solo"}
        pre, decodes, per_choice = self._steps(prompt, n_out, n_choices)
        out = {"basis": "solo"}
        if self.roofs is not None:
            out["ttft_bound_ms"] = stage_bounds(pre, self.roofs).bound_ms
            if per_choice > 1:
                out["tpot_bound_ms"] = sum(stage_bounds(w, self.roofs).bound_ms for w in decodes) / (per_choice - 1)
        if self.fit is not None:
            p_pred = self.fit.predict_ms(pre)
            d_pred = sum(self.fit.predict_ms(w) for w in decodes)
            out.update(ttft_predicted_ms=p_pred, residual_prefill_ms=_sub(prefill_ms, p_pred),
                       residual_decode_ms=_sub(decode_ms, d_pred) if decodes else None,
                       tpot_predicted_ms=d_pred / (per_choice - 1) if per_choice > 1 else None)
        return out

