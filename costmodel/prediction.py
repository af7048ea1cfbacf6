"""A prediction made before a run: per request shape, TTFT and TPOT lower bounds and expected ranges;
per planned batch, the step's bound (docs/MODEL.md "Prediction").

Every figure is a step of the workload model on labelled roofs:
- TTFT lower bound: the request's prefill alone in one step (its uncached prompt tokens after the
  cached prefix) on the **peak** roofs. Batching it with others, or cutting it into chunks, only adds
  work, so no schedule reaches its first token sooner (queueing and transport come on top).
- TPOT lower bound: one decode step of the request alone at its shortest context (the prompt) on
  the peak roofs.
- Expected range, `sustained`: the same steps on the **sustained** roofs (the microbenchmarks'
  medians), from the request alone (low end) to the request at the batch limit (high end: its
  prefill beside `max_batch - 1` decode rows; its last token in a full batch of decodes).
- Expected range, `fit`: the same two steps through a step-time fit of an earlier run (its fixed
  per-step time and effective rates, plus its host time between steps for TPOT).
"""
from __future__ import annotations

import json
import math
import os

from inferledger.probes.model_shape import MAX_CONTEXT, ModelShape

from .bounds import stage_bounds
from .roofs import Roof, Roofs
from .work import StepRow, step_work

SCHEMA = "inferledger.prediction/1"
RANGE_KINDS = ("sustained", "fit")


class PredictionError(ValueError):
    """A prediction file that is not one: the message names the file and the field."""


def sustained_roofs(device_params: dict | None) -> Roofs | None:
    """The microbenchmarks' medians as roofs (statistic `sustained`), None without both."""
    params = device_params or {}
    mem, mm = params.get("memcpy_gbps") or {}, params.get("matmul_tflops") or {}
    if not all(isinstance(f.get("median"), (int, float)) and f["median"] > 0 for f in (mem, mm)):
        return None
    return Roofs(Roof("compute", float(mm["median"]), "TFLOP/s", "microbenchmark", "sustained",
                      "the median of the capture-start matmul repeats at the fastest shape"),
                 Roof("memory", float(mem["median"]), "GB/s", "microbenchmark", "sustained",
                      "the median of the capture-start stream repeats"))


def _no_constant(token: str):
    raise ValueError(f"{token} is not a JSON number (strict JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a double: not a finite number")
    return value


MAX_FILE_BYTES = 16 << 20  # a prediction or device-parameters file (a few KiB; one shape a class)


def read_file(path, what: str) -> bytes:
    """The bytes of a prediction or device-parameters file at most MAX_FILE_BYTES long (refused before
    it is read: JSON takes several times its size in memory), else PredictionError naming the file."""
    try:
        size = os.stat(path).st_size
        if size > MAX_FILE_BYTES:
            raise PredictionError(f"{path}: {size} bytes: {what} is at most {MAX_FILE_BYTES} bytes")
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise PredictionError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None


def strict_json(data: bytes | str, where: str):
    """`data` parsed as strict JSON (no NaN / Infinity tokens, no nesting deep enough to overflow the
    parser); PredictionError naming `where` otherwise."""
    try:
        return json.loads(data, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise PredictionError(f"{where}: nested too deeply to be a prediction or device parameters") from None
    except ValueError as exc:
        raise PredictionError(f"{where}: not valid JSON ({exc})") from None


def load(data: bytes | str, where: str) -> dict:
    """A prediction file's bytes, parsed strictly and checked (`check`)."""
    return check(strict_json(data, where), where)


def _first_non_finite(v, path: str = "") -> str | None:
    if isinstance(v, float) and not math.isfinite(v):
        return f"{path} = {v}"
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        found = _first_non_finite(x, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}".lstrip("."))
        if found:
            return found
    return None


def dumps(doc: dict) -> str:
    """The prediction as strict JSON; PredictionError naming the first figure that is NaN or infinite."""
    try:
        return json.dumps(doc, indent=1, allow_nan=False)
    except ValueError:
        raise PredictionError(f"prediction: {_first_non_finite(doc)}: not a finite number, so not strict JSON; "
                              f"check the roofs and device parameters it was computed from") from None


def _check_roofs(peak: Roofs, sustained: Roofs | None) -> None:
    """Every roof finite and positive, and no sustained rate above its peak (a median cannot exceed
    the peak it is the median of: such roofs would put an expected range below its own lower bound)."""
    for kind, roofs in (("peak", peak), ("sustained", sustained)):
        for roof in (roofs.compute, roofs.memory) if roofs is not None else ():
            if isinstance(roof.value, bool) or not isinstance(roof.value, (int, float)) \
                    or not math.isfinite(roof.value) or roof.value <= 0:
                raise PredictionError(f"roofs.{kind}.{roof.quantity} = {roof.value!r}: expected a finite number > 0 "
                                      f"({roof.source}: {roof.label})")
    for name in ("compute", "memory"):
        high, mid = getattr(peak, name), getattr(sustained, name) if sustained is not None else None
        if mid is not None and mid.value > high.value:
            raise PredictionError(f"roofs.sustained.{name} = {mid.value:g} {mid.unit} is above roofs.peak.{name} = "
                                  f"{high.value:g} {high.unit} ({mid.source}: {mid.label}): a sustained rate cannot "
                                  f"exceed its peak; measure the device again")


def request_shapes(classes) -> list[dict]:
    """[{class, prompt_tokens, cached_tokens, output_tokens, weight}] from (name, prompt tokens, shared
    prefix tokens, max tokens, weight) tuples; a class without a prompt length is left out."""
    return [{"class": n, "prompt_tokens": int(p), "cached_tokens": int(min(c or 0, p - 1)),
             "output_tokens": int(o), "weight": float(w)} for n, p, c, o, w in classes if p]


def _step(shape: ModelShape, rows: list[StepRow], roofs: Roofs) -> dict:
    work = step_work(shape, rows)
    bound = stage_bounds(work, roofs)
    return {"bound_ms": bound.bound_ms, "binding": bound.binding, "flops": work.flops, "bytes": work.bytes,
            "intensity": work.intensity, "stages_ms": {s.name: s.bound_ms for s in bound.stages}}


def _steps(r: dict, max_batch: int) -> dict[str, list[StepRow]]:
    p, c, o = r["prompt_tokens"], r["cached_tokens"], r["output_tokens"]
    prefill = StepRow("prefill", p - c, c)
    return {"prefill_alone": [prefill],
            "prefill_busy": [prefill] + [StepRow("decode", 1, p + o // 2)] * (max_batch - 1),
            "decode_alone": [StepRow("decode", 1, p)],
            "decode_busy": [StepRow("decode", 1, p + o - 1)] * max_batch}


def predict(shape: ModelShape, shapes: list[dict], peak: Roofs, *, max_batch: int, sustained: Roofs | None = None,
            fit=None, workload: dict | None = None, device: dict | None = None) -> dict:
    """The prediction document (schema SCHEMA) for request `shapes` (request_shapes) on `peak` roofs."""
    if not shapes:
        raise PredictionError("prediction: the workload declares no request shape with a prompt length "
                              "(classes need prompt_tokens)")
    _check_roofs(peak, sustained)
    requests = []
    for r in shapes:
        steps = _steps(r, max_batch)
        out = {**r, "ttft_lower_ms": _step(shape, steps["prefill_alone"], peak)["bound_ms"],
               "tpot_lower_ms": _step(shape, steps["decode_alone"], peak)["bound_ms"],
               "ttft_expected_ms": {}, "tpot_expected_ms": {}}
        if sustained is not None:
            ms = {k: _step(shape, rows, sustained)["bound_ms"] for k, rows in steps.items()}
            out["ttft_expected_ms"]["sustained"] = [ms["prefill_alone"], ms["prefill_busy"]]
            out["tpot_expected_ms"]["sustained"] = [ms["decode_alone"], ms["decode_busy"]]
        if fit is not None:
            ms = {k: fit.predict_ms(step_work(shape, rows)) for k, rows in steps.items()}
            gap = {k: fit.predict_gap_ms(len(rows)) or 0.0 for k, rows in steps.items()}
            out["ttft_expected_ms"]["fit"] = [ms["prefill_alone"], ms["prefill_busy"]]
            out["tpot_expected_ms"]["fit"] = [ms["decode_alone"] + gap["decode_alone"],
                                              ms["decode_busy"] + gap["decode_busy"]]
        requests.append(out)
    weight = sum(r["weight"] for r in shapes) or 1.0
    context = round(sum(r["weight"] * (r["prompt_tokens"] + r["output_tokens"] / 2) for r in shapes) / weight)
    batches = sorted({1 << i for i in range(int(math.log2(max_batch)) + 1)} | {max_batch})
    steps = [{"kind": "decode", "batch": b, "tokens": b, "context_tokens": b * context,
              **_step(shape, [StepRow("decode", 1, context)] * b, peak)} for b in batches]
    steps += [{"kind": "prefill", "class": r["class"], "batch": 1, "tokens": r["prompt_tokens"] - r["cached_tokens"],
               "context_tokens": r["cached_tokens"],
               **_step(shape, [StepRow("prefill", r["prompt_tokens"] - r["cached_tokens"], r["cached_tokens"])], peak)}
              for r in shapes]
    return {"schema": SCHEMA, "workload": workload or {}, "model_shape": shape.to_dict(), "max_batch": max_batch,
            "device": device or {},
            "roofs": {"peak": peak.to_dict(), "sustained": sustained.to_dict() if sustained else None,
                      "fit": fit.to_dict() if fit is not None else None},
            "requests": requests, "steps": steps}


def fit_range_note(doc: dict) -> str | None:
    """What a prediction's step-fit ranges leave out at their busy end, a step of `max_batch` sequences
    (`StepFit.blind_spot_note`); None without a fit or where nothing is left out. TypeError, ValueError or
    KeyError for a fit block this version does not read."""
    from .fit import StepFit

    block = (doc.get("roofs") or {}).get("fit")
    return StepFit.from_dict(block).blind_spot_note(int(doc["max_batch"])) if block else None


def _field(doc, path: str, where: str, kind, check=None, why: str = ""):
    v = doc
    for key in path.replace("]", "").replace("[", ".").split("."):
        try:
            v = v[int(key)] if isinstance(v, list) else v[key]
        except (KeyError, IndexError, TypeError, ValueError):
            raise PredictionError(f"{where}: field {path} is missing") from None
    if not isinstance(v, kind) or isinstance(v, bool) or (isinstance(v, float) and not math.isfinite(v)) \
            or (check is not None and not check(v)):
        raise PredictionError(f"{where}: field {path} = {v!r}: expected {why}")
    return v


def check(doc, where: str) -> dict:
    """`doc` if it is a prediction of this schema; else PredictionError naming `where` and the field."""
    if not isinstance(doc, dict):
        raise PredictionError(f"{where}: not a JSON object")
    _field(doc, "schema", where, str, lambda s: s == SCHEMA, f"{SCHEMA!r}")
    _field(doc, "max_batch", where, int, lambda n: 1 <= n <= MAX_CONTEXT, f"an integer in 1..{MAX_CONTEXT}")
    for key in ("compute", "memory"):
        _field(doc, f"roofs.peak.{key}.value", where, (int, float), lambda x: x > 0, "a positive number")
        _field(doc, f"roofs.peak.{key}.source", where, str, lambda s: bool(s), "a source label")
    reqs = _field(doc, "requests", where, list, lambda v: len(v) > 0, "a non-empty list")
    named = set()
    for i in range(len(reqs)):
        _field(doc, f"requests[{i}].class", where, str, lambda c: c not in named,
               "a class name no other request shape has (an attempt is held to its class's shape)")
        named.add(reqs[i]["class"])
        for key in ("prompt_tokens", "output_tokens"):
            _field(doc, f"requests[{i}].{key}", where, int, lambda n: 1 <= n <= MAX_CONTEXT,
                   f"an integer in 1..{MAX_CONTEXT} (tokens of one request)")
        if "cached_tokens" in reqs[i]:
            _field(doc, f"requests[{i}].cached_tokens", where, int, lambda n: 0 <= n < reqs[i]["prompt_tokens"],
                   "an integer in 0..prompt_tokens - 1 (the prompt tokens a prefix cache serves)")
        for key in ("ttft_lower_ms", "tpot_lower_ms"):
            _field(doc, f"requests[{i}].{key}", where, (int, float), lambda x: x >= 0, "a number >= 0")
        for key in ("ttft_expected_ms", "tpot_expected_ms"):
            ranges = _field(doc, f"requests[{i}].{key}", where, dict, why="an object of ranges")
            for kind in ranges:
                _field(doc, f"requests[{i}].{key}.{kind}", where, list,
                       lambda v: kind in RANGE_KINDS and len(v) == 2 and all(
                           isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
                       and 0 <= v[0] <= v[1], f"[low, high], finite, with 0 <= low <= high under one of {RANGE_KINDS}")
            bound = reqs[i][key.replace("expected", "lower")]
            low = (ranges.get("sustained") or [bound])[0]
            if low < bound * (1 - 1e-9):  # the sustained roofs are at most the peaks: no range starts below the bound
                raise PredictionError(f"{where}: field requests[{i}].{key}.sustained = {ranges['sustained']}: starts "
                                      f"below its own lower bound {key.replace('expected', 'lower')} = {bound}")
    for key in ("workload", "model_shape", "device"):
        if key in doc:
            _field(doc, key, where, dict, why="an object")
    if "sha256" in doc.get("workload", {}):
        _field(doc, "workload.sha256", where, str, why="the workload's sha256")
    return doc
