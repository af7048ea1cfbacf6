"""Which OTLP spans a run can hold: every field the span mapping and the ledger read, checked first.

A span is refused, with the field named, when its ids are not OTLP's (16-byte trace id, 8-byte span
id, not all zero), its times do not fit the events' int64 nanoseconds or it ends before it starts, an
attribute is nested deeper than `MAX_ATTRIBUTE_DEPTH`, or, for vLLM's `llm_request`, a field the
mapping uses has the wrong type: latencies must be finite, non-negative numbers of seconds whose
moment still fits int64, token counts non-negative integers up to 2^53 (an event's value is a
float64, which holds integers exactly only that far), the request id a string. A field that is
absent is unknown (no event is made from it), never refused. Values the mapping does not use are
kept as sent; `json_safe` spells a non-finite double as OTLP/JSON does ("NaN", "Infinity").
"""
from __future__ import annotations

import json
import math

REQUEST_SPAN = "llm_request"
LAT = "gen_ai.latency."
LATENCIES = tuple(LAT + k for k in ("time_to_first_token", "time_in_queue", "time_in_model_prefill",
                                    "time_in_model_decode", "time_in_model_inference", "e2e"))
TOKENS = ("gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens")
REQUEST_ID = "gen_ai.request.id"
INT64_MAX = 2**63 - 1
MAX_TOKENS = 2**53
MAX_ATTRIBUTE_DEPTH = 16  # 3 protobuf messages a level: well inside protobuf's 100, so a kept line reads back


def _depth(value) -> int:
    """Nesting depth of a plain attribute value (lists and dicts), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def json_attribute_problem(attributes) -> str | None:
    """An OTLP/JSON attribute list nested deeper than `MAX_ATTRIBUTE_DEPTH` (checked before protobuf
    parses it, whose own limit would name no attribute), or None."""
    for kv in attributes if isinstance(attributes, list) else []:
        if not isinstance(kv, dict):
            continue
        deepest, stack = 0, [(kv.get("value"), 0)]
        while stack and deepest <= MAX_ATTRIBUTE_DEPTH:
            v, d = stack.pop()
            deepest = max(deepest, d)
            for key in ("arrayValue", "kvlistValue"):
                inner = v.get(key) if isinstance(v, dict) else None
                values = inner.get("values") if isinstance(inner, dict) else None
                for x in values if isinstance(values, list) else []:
                    stack.append((x.get("value") if key == "kvlistValue" and isinstance(x, dict) else x, d + 1))
        if deepest > MAX_ATTRIBUTE_DEPTH:
            return f"attribute {kv.get('key')}: nested deeper than {MAX_ATTRIBUTE_DEPTH} levels"
    return None


def _kind(v) -> str:
    return {bool: "a boolean", str: "a string", float: "a double", int: "an integer"}.get(type(v), type(v).__name__)


def _seconds_problem(key: str, v, start_ns: int) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"{key}: {v!r} is {_kind(v)}, expected a number of seconds"
    if not math.isfinite(v) or v < 0:
        return f"{key}: {v!r} is not a finite, non-negative number of seconds"
    if start_ns + v * 1e9 > INT64_MAX:
        return f"{key}: {v!r} s after the span's start is past the int64 nanosecond range"
    return None


def _tokens_problem(key: str, v) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return f"{key}: {v!r} is {_kind(v)}, expected an integer token count"
    if not 0 <= v <= MAX_TOKENS:
        return f"{key}: {v} is outside 0 to 2^53"
    return None


def _id_problem(key: str, hex_id: str, n_bytes: int) -> str | None:
    if len(hex_id) != 2 * n_bytes or not hex_id.strip("0"):
        return f"{key}: {hex_id!r} is not {n_bytes} bytes, or is all zero"
    return None


def span_problem(span) -> str | None:
    """Why a flattened span (collectors.evidence.otlp_decode.Span) cannot enter a run, or None."""
    problem = _id_problem("traceId", span.trace_id, 16) or _id_problem("spanId", span.span_id, 8)
    if problem:
        return problem
    if not 0 < span.start_unix_ns <= INT64_MAX:
        return f"startTimeUnixNano: {span.start_unix_ns} is outside 1 to 2^63-1 ns"
    if not span.start_unix_ns <= span.end_unix_ns <= INT64_MAX:
        return f"endTimeUnixNano: {span.end_unix_ns} is before the start ({span.start_unix_ns}) or past 2^63-1 ns"
    for key, value in span.attributes.items():
        if _depth(value) > MAX_ATTRIBUTE_DEPTH:
            return f"attribute {key}: nested deeper than {MAX_ATTRIBUTE_DEPTH} levels"
    if span.name != REQUEST_SPAN:
        return None
    a = span.attributes
    if a.get(REQUEST_ID) is not None and not isinstance(a[REQUEST_ID], str):
        return f"{REQUEST_ID}: {a[REQUEST_ID]!r} is {_kind(a[REQUEST_ID])}, expected a string"
    for key in LATENCIES:
        if a.get(key) is not None and (problem := _seconds_problem(key, a[key], span.start_unix_ns)):
            return problem
    for key in TOKENS:
        if a.get(key) is not None and (problem := _tokens_problem(key, a[key])):
            return problem
    return None


def json_safe(obj):
    """`obj` with every non-finite float spelt as OTLP/JSON spells it, so json.dumps writes strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def dumps(obj) -> str:
    """Compact strict JSON; the walk of `json_safe` only when a non-finite float is in it."""
    try:
        return json.dumps(obj, separators=(",", ":"), sort_keys=True, allow_nan=False, default=str)
    except ValueError:
        return json.dumps(json_safe(obj), separators=(",", ":"), sort_keys=True, default=str)
