"""The W3C trace context the load client sends, derived from the attempt id so it can be joined back.

An engine that honours `traceparent` (vLLM does) puts its own span into the client's trace; with
ids computed from (salt, attempt id) the collector finds the attempt of a span from its trace id
alone, without the engine echoing any of our ids. The salt (the run id) keeps two runs' traces apart.
"""
from __future__ import annotations

import hashlib


def trace_ids_for(attempt_id: str, salt: str) -> tuple[str, str]:
    """(trace_id: 32 hex, parent span_id: 16 hex) of the attempt's client span."""
    digest = hashlib.sha256(f"{salt}\x1f{attempt_id}".encode()).hexdigest()
    trace_id, span_id = digest[:32], digest[32:48]
    # all-zero ids are invalid in W3C trace context; a sha256 prefix of zeros is astronomically unlikely
    return trace_id, span_id


def traceparent_for(attempt_id: str, salt: str) -> str:
    trace_id, span_id = trace_ids_for(attempt_id, salt)
    return f"00-{trace_id}-{span_id}-01"
