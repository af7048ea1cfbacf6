"""vLLM's `llm_request` span as server and engine events: the engine's account of each request.

vLLM (0.32, v1 engine) ends one SERVER span per finished request. Its start is the request's arrival
(Unix ns, the API server's time.time()); its attributes carry durations in seconds:
`gen_ai.latency.time_to_first_token` (arrival -> first token seen by the API server, wall clock),
`time_in_queue`, `time_in_model_prefill`, `time_in_model_decode` (engine-core monotonic
differences), `e2e` (arrival -> finish, wall) and `gen_ai.usage.prompt_tokens` / `completion_tokens`.

Mapped here on the `wall:<host>` clock of the vLLM host:
  server.received  = span start (arrival)
  engine.token     = arrival + time_to_first_token (value 1: the first token)
  engine.scheduled = first token - time_in_model_prefill        (engine-core difference, anchored
  engine.enqueued  = scheduled - time_in_queue                   at the first token)
  engine.token     = first token + time_in_model_decode (value completion_tokens - 1, attrs.aggregate:
                     the span gives no per-token times, so these tokens are known only by their last)
  engine.finished  = arrival + e2e (value completion_tokens)
Every event carries attrs.evidence = "reported" and attrs.reporter (e.g. "vllm-0.32.0"): vLLM's
report about itself, not our observation. server.received keeps every span attribute, the resource
and the scope; a span of any other name becomes a span.start / span.end pair with its attributes.
vLLM ends no span for a request it aborted (a client that disconnected): such an attempt gets a gap.

Join: by the trace id of the `traceparent` the client sent (collectors.evidence.trace_context) and by
`gen_ai.request.id` (`chatcmpl-<x-request-id>`, our attempt id). A span joining no attempt and an
attempt with no span each get a gap row. A span that came more than once (same trace and span id: an
exporter's retry, a file concatenated twice) is mapped once, with one gap naming its copies. Spans
whose fields a run cannot hold (collectors.evidence.otlp_checks) never reach the mapping: reading a file
returns them as refusals by line (collectors.evidence.otlp_file), which an import refuses or keeps as gaps.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from inferledger.collectors.evidence.otlp_checks import LAT, REQUEST_SPAN, dumps
from inferledger.collectors.evidence.otlp_decode import Span
from inferledger.collectors.evidence.trace_context import trace_ids_for
from inferledger.probes.probe import wall_clock

ID_PREFIXES = ("chatcmpl-", "cmpl-")  # vLLM's prefixes before the client's x-request-id
SPAN_GAP_NEEDS = ("vLLM's llm_request span for this attempt (serve with --otlp-traces-endpoint and a receiver "
                  "that outlives the export; vLLM ends no span for a request it aborted)")


def span_gap_needs(reporter: str) -> str:
    """What would close an attempt's missing span, said of the server the target answered as: vLLM's
    own span for a vLLM; for another server (llama.cpp, ours, one that did not say), that it is no
    vLLM and what it would take, not a vLLM setting it has not got."""
    if reporter.startswith("vllm-"):
        return SPAN_GAP_NEEDS
    said = "did not say what it is (no GET /version or /props)" if reporter == "unknown" else f"answered as {reporter}"
    return (f"an {REQUEST_SPAN} span for this attempt: the target {said}, not vLLM, and only vLLM's is read as the "
            "engine's account (a server exporting its own spans joins nothing; capture it without --otlp-port, or "
            "with --server RUN for our own server's events)")


def attempt_of_request_id(request_id: str | None) -> str | None:
    """Our attempt id inside vLLM's request id (`chatcmpl-<x-request-id>`), else the id itself."""
    if not request_id:
        return None
    for prefix in ID_PREFIXES:
        if request_id.startswith(prefix):
            return request_id[len(prefix):]
    return request_id


@dataclass
class SpanJoin:
    rows: list[dict] = field(default_factory=list)
    gaps: list[dict] = field(default_factory=list)
    spans: int = 0
    request_spans: int = 0
    joined: int = 0
    unjoined_spans: int = 0
    attempts_without_span: int = 0
    duplicate_spans: int = 0  # copies of a span already mapped, not mapped again
    joined_by: Counter = field(default_factory=Counter)
    other_span_names: Counter = field(default_factory=Counter)

    def summary(self) -> dict:
        """`spans`: distinct spans mapped (each copy of one counted in `duplicate_spans` instead)."""
        return {"spans": self.spans, "llm_request_spans": self.request_spans, "joined": self.joined,
                "unjoined_spans": self.unjoined_spans, "attempts_without_span": self.attempts_without_span,
                "duplicate_spans": self.duplicate_spans, "joined_by": dict(self.joined_by),
                "other_span_names": dict(self.other_span_names)}

    def add_gap(self, row: dict) -> None:
        """A gap row whose id is never one already given (two spans may share a span id across traces)."""
        taken = {g["gap_id"] for g in self.gaps}
        base, k = row["gap_id"], 1
        while row["gap_id"] in taken:
            k += 1
            row = {**row, "gap_id": f"{base}:{k}"}
        self.gaps.append(row)


def _ns(seconds) -> int | None:
    return None if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) else int(round(seconds * 1e9))


class _Emitter:
    def __init__(self, run_id: str, host: str, reporter: str) -> None:
        self.run_id, self.host, self.reporter, self.clock = run_id, host, reporter, wall_clock(host)
        self.seq = 0
        self.rows: list[dict] = []

    def emit(self, name: str, source: str, ts_ns: int, sp: Span, ids: dict, /, value=None, **attrs) -> None:
        body = {"evidence": "reported", "reporter": self.reporter, "trace_id": sp.trace_id,
                "span_id": sp.span_id, **attrs}
        self.rows.append({"run_id": self.run_id, "event_id": f"otlp:{sp.span_id}:{self.seq}", "seq": self.seq,
                          "source": source, "host": self.host, "name": name, "ts_ns": int(ts_ns),
                          "clock": self.clock, "task_id": ids.get("task_id"), "session_id": ids.get("session_id"),
                          "request_id": ids.get("request_id"), "attempt_id": ids.get("attempt_id"), "step_id": None,
                          "value": None if value is None else float(value),
                          "attrs": dumps(body)})
        self.seq += 1


def _request_events(em: _Emitter, span: Span, ids: dict, joined_by: str) -> None:
    a = span.attributes
    arrival = span.start_unix_ns
    ttft, queue, prefill = _ns(a.get(LAT + "time_to_first_token")), _ns(a.get(LAT + "time_in_queue")), \
        _ns(a.get(LAT + "time_in_model_prefill"))
    decode, e2e = _ns(a.get(LAT + "time_in_model_decode")), _ns(a.get(LAT + "e2e"))
    n_prompt, n_out = a.get("gen_ai.usage.prompt_tokens"), a.get("gen_ai.usage.completion_tokens")
    em.emit("server.received", "server", arrival, span, ids, joined_by=joined_by, otel_span=span.name,
            otel=a, otel_resource=span.resource, otel_scope=span.scope, otel_status=span.status,
            otel_end_unix_ns=span.end_unix_ns)
    has_token = isinstance(n_out, int) and n_out >= 1 and ttft is not None and ttft > 0
    if has_token:
        first = arrival + ttft
        if prefill is not None:
            scheduled = first - prefill
            if queue is not None:
                em.emit("engine.enqueued", "engine", scheduled - queue, span, ids, value=n_prompt,
                        anchor="engine.scheduled - time_in_queue")
            em.emit("engine.scheduled", "engine", scheduled, span, ids, anchor="first token - time_in_model_prefill")
        em.emit("engine.token", "engine", first, span, ids, value=1, anchor="arrival + time_to_first_token")
        if n_out > 1 and decode is not None:
            em.emit("engine.token", "engine", first + decode, span, ids, value=n_out - 1, aggregate=True,
                    anchor="first token + time_in_model_decode")
    if e2e is not None:
        em.emit("engine.finished", "engine", arrival + e2e, span, ids, value=n_out, anchor="arrival + e2e")


def map_spans(spans: list[Span], *, run_id: str, host: str, reporter: str, attempts: dict[str, dict] | None,
              trace_salt: str | None = None) -> SpanJoin:
    """Events and gap rows for `spans`. `attempts`: the client's attempts (id -> task/request/session
    ids) to join with, or None for a server-only run (spans keep the attempt id vLLM names)."""
    spans, out = _distinct(spans, run_id)
    em = _Emitter(run_id, host, reporter)
    by_trace = {}
    if attempts is not None and trace_salt is not None:
        by_trace = {trace_ids_for(aid, trace_salt)[0]: aid for aid in attempts}
    seen: set[str] = set()
    trace_attempt: dict[str, str] = {}  # other spans of a joined trace join the same attempt
    for span in sorted(spans, key=lambda s: (s.name != REQUEST_SPAN, s.start_unix_ns, s.span_id)):
        rid = attempt_of_request_id(span.attributes.get("gen_ai.request.id"))
        if span.name == REQUEST_SPAN:
            out.request_spans += 1
            via_trace = by_trace.get(span.trace_id)
            via_id = rid if attempts is None or rid in attempts else None
            if via_trace and via_id and via_trace != via_id:
                out.add_gap(_gap(run_id, f"otlp:conflict:{span.span_id}", "otlp", span.span_id,
                                     f"traceparent names {via_trace}, gen_ai.request.id names {via_id}"))
                via_trace = via_id = None
            aid = via_trace or via_id
            joined_by = "+".join(k for k, v in (("traceparent", via_trace), ("gen_ai.request.id", via_id)) if v)
            if aid is None or aid in seen:
                out.unjoined_spans += 1
                why = "a second span for one attempt" if aid in seen else "no attempt has its trace id or request id"
                aid = f"otlp:{span.span_id}"  # kept as a server-only attempt, not dropped
                out.add_gap(_gap(run_id, f"otlp:unjoined:{span.span_id}", "otlp", span.span_id,
                                     f"{why} (gen_ai.request.id={span.attributes.get('gen_ai.request.id')!r}, "
                                     f"trace {span.trace_id})"))
                joined_by = "none"
            else:
                out.joined += 1
                out.joined_by[joined_by] += 1
                seen.add(aid)
                trace_attempt[span.trace_id] = aid
            ids = {"attempt_id": aid, **((attempts or {}).get(aid) or {})}
            _request_events(em, span, ids, joined_by)
        else:
            out.other_span_names[span.name] += 1
            aid = trace_attempt.get(span.trace_id) or by_trace.get(span.trace_id)
            ids = {"attempt_id": aid, **((attempts or {}).get(aid) or {})} if aid else {}
            common = {"span": span.name, "stream": "otlp", "otel": span.attributes, "otel_kind": span.kind,
                      "otel_resource": span.resource, "otel_scope": span.scope, "otel_status": span.status,
                      "parent_span_id": span.parent_span_id}
            em.emit("span.start", "otlp", span.start_unix_ns, span, ids, **common)
            em.emit("span.end", "otlp", span.end_unix_ns, span, ids, span=span.name, stream="otlp")
    if attempts is not None:
        for aid in sorted(set(attempts) - seen):
            out.attempts_without_span += 1
            out.add_gap({"run_id": run_id, "gap_id": f"otlp:no-span:{aid}", "scope": "attempt", "subject_id": aid,
                             "affects": "server_status, ttft_server_ms, queue_ms, prefill_ms, decode_ms, ghost load",
                             "needs": span_gap_needs(reporter), "detail": "the engine reported no span for this attempt"})
    out.rows = em.rows
    return out


def _distinct(spans: list[Span], run_id: str) -> tuple[list[Span], SpanJoin]:
    """Each (trace id, span id) once, the first copy kept; one gap per span that came more than once."""
    first: dict[tuple[str, str], Span] = {}
    copies: dict[tuple[str, str], list[Span]] = {}
    for sp in spans:
        key = (sp.trace_id, sp.span_id)
        if key in first:
            copies.setdefault(key, [first[key]]).append(sp)
        else:
            first[key] = sp
    out = SpanJoin(spans=len(first), duplicate_spans=len(spans) - len(first))
    for (trace_id, span_id), group in copies.items():
        same = all(sp == group[0] for sp in group)
        lines = [sp.line for sp in group if sp.line is not None]
        where = f" (lines {', '.join(map(str, lines))})" if lines else ""
        out.add_gap({"run_id": run_id, "gap_id": f"otlp:duplicate:{span_id}", "scope": "otlp", "subject_id": span_id,
                     "affects": "nothing: the span is counted once",
                     "needs": "each span exported once (a retried export or a file concatenated twice repeats it)",
                     "detail": f"span {span_id} of trace {trace_id} came in {len(group)} copies{where}, " +
                               ("identical: counted once" if same else
                                "that differ: the first" + (f" (line {lines[0]})" if lines else "") + " was kept")})
    return list(first.values()), out


def _gap(run_id: str, gap_id: str, scope: str, subject: str, detail: str) -> dict:
    return {"run_id": run_id, "gap_id": gap_id, "scope": scope, "subject_id": subject,
            "affects": "the span's server and engine events join no client attempt",
            "needs": "the client's traceparent or x-request-id on the request (inferledger capture sends both)",
            "detail": detail}
