"""The workload model beside every engine step: work, lower bound, measured time, residual.

Each step's batch rows (step_attribution: kind, tokens, context before) become the model's StepRows;
a prefill row gives logits when its attempt committed a token in that step (engine.token), decode
gives one, verify one per token. The shape is the manifest's model block, the roofs are peaks: the
device's spec entry, else the best of the run's microbenchmarks (docs/MODEL.md "Roofs"). What is
unknown stays NULL with a row in step_model_gaps (read by the gap register).
"""
from __future__ import annotations

import pyarrow as pa

from inferledger.costmodel import StepRow, stage_bounds, step_work
from inferledger.costmodel.roofs import run_roofs
from inferledger.ledger.tables import StageTable, gap_table
from inferledger.probes.model_shape import ShapeError
from inferledger.probes.run_folder import MANIFEST_FILE

READS = ("steps", "step_attribution", "sampled_prefills")
CREATES = ("step_model", "step_model_gaps")
SCOPE = "rollup"  # over the run's steps and attempts together (docs/SCALE.md)
PUBLIC = ("step_model",)

LINEAR_STAGES = ("embed", "qkv", "o_proj", "gate_up", "down")
EPSILON_MS = 0.005  # a step is faster than its bound only beyond this (the clock's resolution and jitter)

_STEPS = """
SELECT st.step_id, st.step_ms, st.start_ns, st.end_ns, st.clock, st.mode, st.contention_ms, st.cpu_ms, st.blocked_ms,
       lead(st.start_ns) OVER (PARTITION BY st.clock ORDER BY st.start_ns) AS next_start_ns,
       lead(st.step_id) OVER (PARTITION BY st.clock ORDER BY st.start_ns) AS next_step_id
FROM steps st
ORDER BY st.clock, st.start_ns
"""
_ROWS = """
SELECT a.step_id, a.kind, a.tokens, a.context_before, s.attempt_id IS NOT NULL AS sampled, a.attempt_id
FROM step_attribution a
LEFT JOIN sampled_prefills s ON s.step_id = a.step_id AND s.attempt_id = a.attempt_id
ORDER BY a.step_id, a.attempt_id
"""

# @table step_model: one row per engine step: the work its batch implies, the lower bound on the
#   run's peak roofs, the measured time and the residual (docs/LEDGER.md "step_model", docs/MODEL.md)
# @column step_id: the engine step
# @column mode: how the step ran (step.end attrs.mode: eager, padded, graph, graph_capture, compiled, compiling,
#   simulated)
# @column num_seqs: sequences in the batch
# @column tokens: tokens computed (padding not counted)
# @column prefill_tokens: of those, tokens of prefill rows
# @column context_tokens: the rows' tokens in KV before the step, summed (NULL when a row lacks it)
# @column flops_linear: FLOPs of the linear layers and the LM head (a multiply-add is 2 FLOP)
# @column flops_attention: FLOPs of the score and value products over the causal context
# @column flops: flops_linear + flops_attention
# @column bytes_weights: weight bytes read (each weight once per step; the embedding's gathered rows)
# @column bytes_kv_read: KV bytes read for the context before the step
# @column bytes_kv_write: KV bytes written for the step's tokens
# @column bytes_act: activation bytes read and written by the GEMMs and attention
# @column bytes: the four byte columns summed
# @column intensity: flops / bytes (FLOP per byte)
# @column bound_linear_ms: the lower bounds of the embedding and the per-layer linear stages, summed
# @column bound_attention_ms: the attention stage's lower bound
# @column bound_lm_head_ms: the LM head stage's lower bound
# @column bound_ms: the step's lower bound: max(F/P, Q/B) per serial stage, summed over stages
# @column aggregated_bound_ms: max(total F / P, total Q / B): looser, for comparison only
# @column binding_roof: the roof behind most of bound_ms: compute or memory
# @column roof_source: where the roofs came from: spec, microbenchmark or assumption (peak figures)
# @column roof_compute_tflops: the compute roof used (peak)
# @column roof_memory_gbps: the memory roof used (peak)
# @column measured_ms: step.end − step.start
# @column contention_ms: the time the step waited for a CPU (steps.contention_ms): the step thread's run-queue
#   wait plus the part of its sleep at the parallel sections' barriers that its workers' wait explains
#   (docs/MODEL.md "Contention"); NULL with a gap where the step's step.end has no schedstat figures
# @column cpu_ms: measured_ms − contention_ms: the step as it would have run uncontended (steps.cpu_ms)
# @column blocked_ms: of cpu_ms, the time the step's thread slept on a lock, neither on a CPU nor waiting for
#   one (steps.blocked_ms: in a Python server almost always the interpreter lock another thread of the process
#   held); NULL with a gap where the step had intra-op workers or contention_ms is NULL (docs/MODEL.md "Contention")
# @column residual_ms: measured_ms − bound_ms
# @column residual_pct: residual_ms / bound_ms × 100
# @column gap_after_ms: host time from this step's end to the next step's start while the engine had
#   work across it (an attempt of this step goes on in the next); NULL for the last step and where none
#   goes on (then wait_after_ms)
# @column wait_after_ms: the time to the next step's start where no attempt of this step goes on in it:
#   the engine waited for arrivals, or admitted only new work, in between (not host overhead)
# @column beats_bound: measured_ms is below bound_ms by more than 0.005 ms (a bound was beaten: the
#   roof named in beaten_roof is wrong for this step)
# @column beaten_roof: the binding roof with its source and value, where beats_bound
def build(con, run) -> None:
    manifest = run.manifest
    gaps: list[tuple] = []
    shape = roofs = None
    try:
        shape = manifest.model_shape()
    except ShapeError as exc:
        gaps.append(("run", None, "step_model flops, bytes, bounds (all columns of the model)",
                     f"the model's shape in {MANIFEST_FILE} (model.architecture, model.dtype)", str(exc)))
    if shape is not None:
        roofs, why = run_roofs(manifest)
        if roofs is None:
            gaps.append(("run", None, "step_model bound_* columns, binding_roof, residual_ms, residual_pct",
                         "a spec entry for the device or the capture's microbenchmarks (manifest device_params)", why))
    rows_by_step: dict[int, list] = {}
    attempts: dict[int, set] = {}
    for step_id, kind, tokens, ctx, sampled, attempt_id in con.execute(_ROWS).fetchall():
        rows_by_step.setdefault(step_id, []).append((kind, tokens, ctx, sampled))
        attempts.setdefault(step_id, set()).add(attempt_id)
    out, no_context = [], 0
    for step_id, step_ms, _, end_ns, _, mode, contention, cpu, blocked, next_start, next_step in con.execute(_STEPS).fetchall():
        items = rows_by_step.get(step_id, [])
        known = bool(items) and all(c is not None and t is not None for _, t, c, _ in items)
        no_context += bool(items) and not known
        to_next = (next_start - end_ns) / 1e6 if next_start is not None else None
        # host time only while the engine had work across the gap: an attempt of this step goes on in
        # the next; else the engine waited for arrivals (or admitted only new work) in between
        busy = bool(attempts.get(step_id, set()) & attempts.get(next_step, set()))
        gap_after, wait_after = (to_next, None) if busy else (None, to_next)
        rec = {"step_id": step_id, "mode": mode, "num_seqs": len(items) or None,
               "tokens": int(sum(t or 0 for _, t, _, _ in items)) if items else None,
               "prefill_tokens": int(sum(t or 0 for k, t, _, _ in items if k == "prefill")) if items else None,
               "context_tokens": int(sum(c for _, _, c, _ in items)) if known else None,
               "measured_ms": step_ms, "contention_ms": contention, "cpu_ms": cpu, "blocked_ms": blocked,
               "gap_after_ms": gap_after, "wait_after_ms": wait_after}
        if shape is not None and known:
            rows = [StepRow(k, int(t), int(c), logit_rows=None if k != "prefill" else int(bool(s)))
                    for k, t, c, s in items]
            rec.update(_work(shape, rows, roofs, step_ms))
            if rec.get("beats_bound"):
                gaps.append(_beaten(rec))
        out.append(rec)
    if no_context:
        gaps.append(("run", None, "step_model flops, bytes, bounds of those steps",
                     "step.start batch rows with each row's context_before (4 items)",
                     f"{no_context} step(s) list batch rows without the context before the step"))
    STEP_MODEL.store(con, out)
    GAPS.store(con, gaps)


def _work(shape, rows, roofs, step_ms) -> dict:
    w = step_work(shape, rows)
    rec = {"flops_linear": w.linear_flops, "flops_attention": w.attention_flops, "flops": w.flops,
           "bytes_weights": w.weight_bytes, "bytes_kv_read": w.kv_read_bytes, "bytes_kv_write": w.kv_write_bytes,
           "bytes_act": w.act_bytes, "bytes": w.bytes, "intensity": w.intensity}
    if roofs is None:
        return rec
    b = stage_bounds(w, roofs)
    bound = b.bound_ms
    roof = roofs.compute if b.binding == "compute" else roofs.memory
    beats = step_ms is not None and step_ms < bound - EPSILON_MS
    rec.update({"bound_linear_ms": sum(b.stage(n).bound_ms for n in LINEAR_STAGES),
                "bound_attention_ms": b.stage("attention").bound_ms, "bound_lm_head_ms": b.stage("lm_head").bound_ms,
                "bound_ms": bound, "aggregated_bound_ms": b.aggregated_ms, "binding_roof": b.binding,
                "roof_source": roofs.memory.source, "roof_compute_tflops": roofs.compute.value,
                "roof_memory_gbps": roofs.memory.value,
                "residual_ms": step_ms - bound if step_ms is not None else None,
                "residual_pct": (step_ms - bound) / bound * 100 if step_ms is not None and bound > 0 else None,
                "beats_bound": beats if step_ms is not None else None,
                "beaten_roof": f"{roof.quantity} {roof.value:g} {roof.unit} ({roof.source} {roof.statistic})" if beats else None})
    return rec


def _beaten(rec: dict) -> tuple:
    """The gap row of a step faster than its lower bound: the roof it beat is wrong for it."""
    by = rec["bound_ms"] - rec["measured_ms"]
    return ("step", str(rec["step_id"]), "step_model bound_ms (not a lower bound for this step)",
            f"a correct {rec['binding_roof']} roof (the best microbenchmark of an idle moment, or the spec)",
            f"step {rec['step_id']} ran {rec['measured_ms']:.3f} ms, {by:.3f} ms ({by / rec['bound_ms'] * 100:.1f} %) "
            f"below its bound {rec['bound_ms']:.3f} ms on the {rec['beaten_roof']} roof: that roof is wrong")


STEP_MODEL = StageTable("step_model", (
    ("step_id", pa.int64()), ("mode", pa.string()), ("num_seqs", pa.int64()), ("tokens", pa.int64()),
    ("prefill_tokens", pa.int64()), ("context_tokens", pa.int64()), ("flops_linear", pa.float64()),
    ("flops_attention", pa.float64()), ("flops", pa.float64()), ("bytes_weights", pa.float64()),
    ("bytes_kv_read", pa.float64()), ("bytes_kv_write", pa.float64()), ("bytes_act", pa.float64()),
    ("bytes", pa.float64()), ("intensity", pa.float64()), ("bound_linear_ms", pa.float64()),
    ("bound_attention_ms", pa.float64()), ("bound_lm_head_ms", pa.float64()), ("bound_ms", pa.float64()),
    ("aggregated_bound_ms", pa.float64()), ("binding_roof", pa.string()), ("roof_source", pa.string()),
    ("roof_compute_tflops", pa.float64()), ("roof_memory_gbps", pa.float64()), ("measured_ms", pa.float64()),
    ("contention_ms", pa.float64()), ("cpu_ms", pa.float64()), ("blocked_ms", pa.float64()),
    ("residual_ms", pa.float64()), ("residual_pct", pa.float64()), ("gap_after_ms", pa.float64()),
    ("wait_after_ms", pa.float64()), ("beats_bound", pa.bool_()), ("beaten_roof", pa.string()),
), order="step_id")
# @gaps: no model shape or no roofs in the manifest; batch rows without their context; a step faster than its
#   lower bound (one row per step: the roof it beat, by how much)
GAPS = gap_table("step_model")

