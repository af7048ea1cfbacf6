"""A run as OpenTelemetry spans, built with opentelemetry-sdk: one span per attempt carrying the GenAI
semantic-convention attributes (gen_ai.*), and a child span per stage interval of every stream.

Time: spans are in nanoseconds of the attempt's own clock (its client stream's, else its server or
engine stream's); stages on other clocks are converted through a direct `clocks` mapping, or left out
and counted in `inferledger.stages_not_exported`. When a mapping from that clock to a `wall:*` domain
exists the spans are in Unix time; otherwise they stay on the monotonic clock and each attempt span
says so in `inferledger.time_base` (a monotonic reading is never turned into wall time by guesswork).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from inferledger.report.clocks import mappings

FAILED_CLIENT = {"timeout", "error"}
FAILED_SERVER = {"failed", "rejected"}


@dataclass
class OtlpStats:
    attempts: int = 0
    spans: int = 0
    stages_not_exported: int = 0


def _model(manifest: dict | None) -> str | None:
    m = manifest or {}
    if m.get("served_model_name"):
        return str(m["served_model_name"])
    path = (m.get("model") or {}).get("path") if isinstance(m.get("model"), dict) else None
    return Path(path).name if path else None


def _attempt_rows(rv) -> list[tuple]:
    return rv.all(
        "WITH ev AS (SELECT attempt_id, "
        "  arg_min(attrs, (ts_ns, seq)) FILTER (WHERE name = 'server.received') AS received_attrs, "
        "  arg_min(value, (ts_ns, seq)) FILTER (WHERE name = 'engine.enqueued') AS prompt_tokens, "
        "  arg_max(attrs, (ts_ns, seq)) FILTER (WHERE name = 'attempt.done') AS done_attrs "
        "  FROM events WHERE name IN ('server.received', 'engine.enqueued', 'attempt.done') AND attempt_id IS NOT NULL "
        "  GROUP BY attempt_id) "
        "SELECT a.attempt_id, a.task_id, a.request_id, a.session_id, a.attempt_index, a.client_status, a.server_status, "
        "a.resource_status, a.finish_reason, a.n_output_tokens, r.ttft_client_ms, r.ttft_server_ms, r.e2e_client_ms, "
        "r.e2e_server_ms, r.tpot_ms, r.good, ev.received_attrs, ev.prompt_tokens, ev.done_attrs "
        "FROM attempts a JOIN request_metrics r USING (attempt_id) LEFT JOIN ev USING (attempt_id) ORDER BY a.attempt_id")


def _json(text) -> dict:
    try:
        v = json.loads(text) if text else {}
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def _gen_ai(row, model: str | None) -> tuple[str, dict]:
    (aid, task, req, session, index, cs, ss, rs, finish, n_out, ttft_c, ttft_s, e2e_c, e2e_s, tpot, good,
     received, prompt_tokens, done) = row
    rec, done = _json(received), _json(done)
    endpoint = str(rec.get("endpoint") or "")
    operation = "chat" if "chat" in endpoint else "text_completion" if "completions" in endpoint else None
    system = "inferledger" if ss != "unknown" else "openai_compatible"
    usage = done.get("usage") if isinstance(done.get("usage"), dict) else {}
    prompt = prompt_tokens if prompt_tokens is not None else usage.get("prompt_tokens")
    attrs = {"gen_ai.system": system, "gen_ai.provider.name": system, "gen_ai.operation.name": operation,
             "gen_ai.request.model": model, "gen_ai.response.model": model,
             "gen_ai.usage.output_tokens": n_out, "gen_ai.usage.input_tokens": None if prompt is None else int(prompt),
             "gen_ai.response.finish_reasons": [finish] if finish else None,
             "gen_ai.request.stream": rec.get("stream") if isinstance(rec.get("stream"), bool) else None,
             "inferledger.attempt_id": aid, "inferledger.task_id": task, "inferledger.request_id": req,
             "inferledger.session_id": session, "inferledger.attempt_index": index,
             "inferledger.client_status": cs, "inferledger.server_status": ss, "inferledger.resource_status": rs,
             "inferledger.ttft_client_ms": ttft_c, "inferledger.ttft_server_ms": ttft_s,
             "inferledger.e2e_client_ms": e2e_c, "inferledger.e2e_server_ms": e2e_s, "inferledger.tpot_ms": tpot,
             "inferledger.good": good}
    name = f"{operation} {model}" if operation and model else f"gen_ai attempt {aid}"
    return name, {k: v for k, v in attrs.items() if v is not None}


def _parent(received: dict):
    """The client's W3C trace context, when the server recorded one: the attempt span joins that trace."""
    tid, sid = received.get("trace_id"), received.get("parent_span_id")
    try:
        ctx = SpanContext(int(tid, 16), int(sid, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    except (TypeError, ValueError):
        return None
    return trace.set_span_in_context(NonRecordingSpan(ctx)) if ctx.is_valid else None


def emit_spans(rv, exporter: SpanExporter, *, batch_size: int = 512) -> OtlpStats:
    """Build every span with the SDK and hand them to `exporter` in batches (none dropped)."""
    maps = mappings(rv.led)
    walls = {a: (b, off) for (a, b), (off, _eps) in maps.items() if b.startswith("wall:")}
    model = _model(rv.manifest)
    buffer = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "inferledger", "inferledger.run": rv.name}))
    provider.add_span_processor(SimpleSpanProcessor(buffer))
    tracer = provider.get_tracer("inferledger.export")
    stages: dict[str, list[tuple]] = {}
    for r in rv.all("SELECT attempt_id, stream, name, kind, clock, start_ns, end_ns, label, eps_ms, on_path "
                    "FROM intervals WHERE start_ns IS NOT NULL ORDER BY attempt_id, start_ns, stream, name"):
        stages.setdefault(r[0], []).append(r)
    stats = OtlpStats()

    def drain(final=False):
        spans = buffer.get_finished_spans()
        if len(spans) >= batch_size or (final and spans):
            buffer.clear()
            for i in range(0, len(spans), batch_size):
                if exporter.export(spans[i:i + batch_size]) != SpanExportResult.SUCCESS:
                    raise RuntimeError(f"the span exporter {type(exporter).__name__} refused a batch")
            stats.spans += len(spans)

    for row in _attempt_rows(rv):
        aid = row[0]
        ivs = stages.get(aid, [])
        clock = next((r[4] for st in ("client", "server", "engine") for r in ivs if r[1] == st), None)
        if clock is None:
            clock = ivs[0][4] if ivs else None
        wall, base = walls.get(clock, (None, 0)) if clock else (None, 0)
        placed, skipped = [], 0
        for r in ivs:
            off = 0 if r[4] == clock else maps.get((r[4], clock), (None,))[0]
            if off is None:
                skipped += 1
            else:
                placed.append((r, r[5] + off + base, r[6] + off + base))
        if not placed:
            stats.stages_not_exported += skipped
            continue
        name, attrs = _gen_ai(row, model)
        attrs["inferledger.clock"] = clock
        attrs["inferledger.time_base"] = f"unix ns via {wall}" if wall else f"monotonic ns of {clock} (not Unix time)"
        if skipped:
            attrs["inferledger.stages_not_exported"] = skipped
        t0, t1 = min(p[1] for p in placed), max(p[2] for p in placed)
        root = tracer.start_span(name, context=_parent(_json(row[16])), kind=SpanKind.CLIENT, start_time=t0,
                                 attributes=attrs)
        if row[5] in FAILED_CLIENT or row[6] in FAILED_SERVER:
            root.set_attribute("error.type", row[5] if row[5] in FAILED_CLIENT else row[6])
            root.set_status(Status(StatusCode.ERROR, f"client {row[5]}, server {row[6]}"))
        ctx = trace.set_span_in_context(root)
        for r, s, e in placed:
            child_attrs = {k: v for k, v in {
                "inferledger.stream": r[1], "inferledger.stage": r[2], "inferledger.kind": r[3],
                "inferledger.label": r[7], "inferledger.eps_ms": r[8], "inferledger.on_path": r[9],
                "inferledger.clock": r[4]}.items() if v is not None}
            if e < s:  # a derived figure below zero within its epsilon: a span cannot end before it starts
                child_attrs["inferledger.dur_ms"] = (e - s) / 1e6
                e = s
            child = tracer.start_span(f"{r[1]}.{r[2]}", context=ctx, start_time=s, attributes=child_attrs)
            child.end(end_time=e)
        root.end(end_time=t1)
        stats.attempts += 1
        stats.stages_not_exported += skipped
        drain()
    drain(final=True)
    provider.shutdown()
    return stats
