"""The event contract: the Arrow schemas of a run directory (events, samples, clocks, tasks, gaps)
and the event vocabulary.

Everything that writes or reads a run directory goes through these definitions. The vocabulary is
documented for people in docs/EVENTS.md; a test keeps that page and `VOCABULARY` in step.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

EVENT_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("clock", pa.string(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("session_id", pa.string()),
        pa.field("request_id", pa.string()),
        pa.field("attempt_id", pa.string()),
        pa.field("step_id", pa.int64()),
        pa.field("value", pa.float64()),
        pa.field("attrs", pa.string()),
    ]
)

SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("clock", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("device", pa.string()),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("unit", pa.string(), nullable=False),
    ]
)

# Clock domains and the mappings between them (docs/EVENTS.md "Clock domains"). A domain row has
# `clock` set and no `from_clock`; a mapping row says t_to = t_from + offset_ns, give or take epsilon_ns.
CLOCK_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("clock", pa.string()),
        pa.field("host", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("from_clock", pa.string()),
        pa.field("to_clock", pa.string()),
        pa.field("offset_ns", pa.int64()),
        pa.field("epsilon_ns", pa.int64()),
        pa.field("method", pa.string()),
    ]
)

# Task contracts, expected answers and the checker's verdicts, one row per task.
TASK_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("deadline_ms", pa.float64()),
        pa.field("required", pa.string()),  # JSON list of request ids
        pa.field("on_missing", pa.string()),
        pa.field("max_attempts", pa.int64()),
        pa.field("expected", pa.string()),
        pa.field("contract", pa.string()),  # the whole contract as JSON
    ]
)

ID_COLUMNS = ("task_id", "session_id", "request_id", "attempt_id")


@dataclass(frozen=True)
class EventKind:
    name: str
    source: str  # the emitter that normally writes it (documentation; not enforced)
    requires: tuple[str, ...]  # id columns (or attrs.<key>) that must be present
    meaning: str
    value: str = ""  # what `value` carries, if anything


def _k(name, source, requires, meaning, value=""):
    return EventKind(name, source, tuple(requires), meaning, value)


_KINDS = [
    # client: the load generator's view, on its own clock
    _k("task.start", "client", ["task_id"], "a task begins; attrs may carry its contract (deadline_ms, required, on_missing, max_attempts)"),
    _k("task.end", "client", ["task_id"], "the task's last request finished or was given up"),
    _k("arrival.planned", "client", ["task_id"], "when the arrival process meant the task (or request) to arrive; deadlines count from here"),
    _k("attempt.created", "client", ["request_id", "attempt_id"], "the client created an attempt (may wait in the client's own queue)"),
    _k("attempt.sent", "client", ["attempt_id"], "the request's bytes were handed to the socket"),
    _k("attempt.first_byte", "client", ["attempt_id"], "the first response byte arrived"),
    _k("attempt.chunk", "client", ["attempt_id"], "one stream event received; attrs.kinds is a subset of content, reasoning, tool_call, finish, usage; attrs.choice = the choice index it carries (n > 1; absent: choice 0)", "tokens the chunk carries when the server says so"),
    _k("attempt.done", "client", ["attempt_id"], "the response completed; attrs.usage may carry the server's token counts"),
    _k("attempt.timeout", "client", ["attempt_id"], "the client gave up waiting (says nothing about the server)"),
    _k("attempt.cancel", "client", ["attempt_id"], "the client cancelled the attempt (disconnect or explicit)"),
    _k("attempt.error", "client", ["attempt_id"], "transport or HTTP error; attrs.status, attrs.error"),
    _k("tool.start", "tool", ["task_id"], "an external tool call began (attrs.tool)"),
    _k("tool.end", "tool", ["task_id"], "an external tool call ended"),
    # router: its own spans of the upstream tries (capture --router-traces)
    _k("router.try", "router", ["attempt_id"], "one upstream try a router sent a replica, stamped at its start "
       "(the router's span); attrs.replica_id, attrs.worker, attrs.status (HTTP) or attrs.error, attrs.end_ns; a try "
       "the client never saw carries attrs.parent_attempt_id"),
    # server: the HTTP front end
    _k("server.received", "server", ["attempt_id"], "the front end parsed the request"),
    _k("server.rejected", "server", ["attempt_id"], "the front end refused it (attrs.status: 400, 429, 503 ...)"),
    _k("server.write", "server", ["attempt_id"], "one stream event handed to the socket (stamped at the hand-off); attrs.choice = its choice index (n > 1; absent: choice 0)", "tokens in that event"),
    _k("server.done", "server", ["attempt_id"], "the response was completed by the server"),
    _k("server.disconnect", "server", ["attempt_id"], "the server saw the client disconnect"),
    # engine
    _k("engine.enqueued", "engine", ["attempt_id"], "the engine accepted the request into its waiting queue "
       "(again after a preemption, where an engine's trace says so: that wait is the preemption's)", "prompt tokens"),
    _k("engine.scheduled", "engine", ["attempt_id"], "the request entered a batch (first time or on resume)"),
    _k("engine.prefill", "engine", ["attempt_id"], "a prefill chunk was computed; attrs.cached_tokens", "tokens computed"),
    _k("engine.token", "engine", ["attempt_id"], "tokens committed to one choice of the request in one step (can exceed 1 with speculative decoding); attrs.choice = the choice index (n > 1; absent: choice 0)", "tokens"),
    _k("engine.preempted", "engine", ["attempt_id"], "the request was preempted; attrs.recompute_tokens", "tokens to recompute"),
    _k("engine.cancel_received", "engine", ["attempt_id"], "the engine learned of the cancellation"),
    _k("engine.cancel_effective", "engine", ["attempt_id"], "first iteration boundary with no work scheduled for the request"),
    _k("engine.finished", "engine", ["attempt_id"], "the request left the engine; attrs.reason: stop, length, cancelled, error", "output tokens"),
    _k("step.start", "engine", ["step_id"], "an engine iteration began; attrs: engine_id (the engine instance); attrs.batch: one [attempt_id, kind, tokens, context_before] per sequence (kind prefill / decode / verify; context_before: its tokens already in KV before this step; older runs: 3 items), token budget"),
    _k("step.end", "engine", ["step_id"], "an engine iteration ended; attrs: engine_id, padded size, mode eager / padded / graph / graph_capture (the step captured a graph) / compiled (the CPU step ran its inductor-compiled decoder stack) / compiling (it did, and compiled that graph first: its time holds the compile) / simulated (the simulated clock's runner); where Linux schedstat is readable: cpu_ns and wait_ns (the step thread's on-CPU time and run-queue wait over the step), workers (its intra-op workers read), workers_wait_ns_max (their largest run-queue wait over the step, capped at it; absent without workers)", "tokens processed"),
    _k("spec.round", "engine", ["attempt_id"], "one speculative round for a request; attrs.drafted, attrs.accepted, attrs.forward_passes", "tokens committed"),
    # resources
    _k("kv.alloc", "engine", ["attempt_id"], "KV blocks allocated to the request; attrs.blocks (physical ids)", "blocks"),
    _k("kv.prefix_hit", "engine", ["attempt_id"], "cached prefix blocks reused; attrs.blocks, attrs.tokens", "blocks"),
    _k("kv.release", "engine", ["attempt_id"], "the request holds no more references to KV blocks", "blocks"),
    _k("kv.free", "engine", ["attempt_id"], "the request's blocks are back in the free pool, device work on them done", "blocks"),
    _k("mem.returned", "engine", [], "memory returned to the device allocator", "bytes"),
    # device
    _k("device.step", "device", ["step_id"], "a step's device time on a CUDA clock; attrs.end_ns", "device milliseconds"),
    # any source
    _k("span.start", "any", ["attrs.span"], "an explicit interval begins; attrs: span, stream, parent, after"),
    _k("span.end", "any", ["attrs.span"], "an explicit interval ends"),
    # archive-only records
    _k("clock.domain", "any", ["clock"], "declares a clock domain; attrs.host, attrs.kind"),
    _k("clock.map", "any", ["attrs.from", "attrs.to", "attrs.offset_ns", "attrs.epsilon_ns"], "t_to = t_from + offset_ns, give or take epsilon_ns"),
    _k("verdict", "checker", ["attempt_id"], "the checker's judgement of an attempt's answer: attrs.correct"),
]

VOCABULARY: dict[str, EventKind] = {k.name: k for k in _KINDS}

# Events whose value is a token count (docs/EVENTS.md): a whole number from 0 to MAX_COUNT, summed and cast
# to integers by the ledger; writers and importers refuse any other value, the ledger refuses a run holding one.
COUNT_EVENTS = ("engine.token", "engine.prefill", "engine.enqueued", "engine.preempted", "engine.finished")
MAX_COUNT = 2 ** 53  # the largest count a float64 value holds exactly


def count_problem(name: str, value) -> str | None:
    """Why `value` cannot be the token count of a `name` event (None when it can, or `name` counts nothing)."""
    if name not in COUNT_EVENTS or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or not 0 <= value <= MAX_COUNT \
            or value != int(value):
        return f"value {value!r} of {name} is not a token count (a whole number from 0 to {MAX_COUNT})"
    return None


CLIENT_TERMINAL = ("attempt.done", "attempt.timeout", "attempt.cancel", "attempt.error")

# Evidence strength of an event's content (`attrs.evidence`; absent = observed). Another program's
# account of itself (an engine's span, its /metrics, its per-request response metrics, a load tool's
# report) is `reported` and names its `attrs.reporter` ("<tool>-<version>", e.g. "vllm-0.32.0").
EVIDENCE = {
    "observed": "stamped by our own probes or client at the moment it happened, on a declared clock",
    "reported": "another program's account of itself, taken as it says (attrs.reporter names it); its times are "
                "the reporter's own readings, placed on its host's clock",
    "declared": "written by hand or by an archive (inferledger import of an E0 archive), not measured by us",
}


def evidence_of(attrs: dict | None) -> str:
    """The evidence strength of an event from its attrs (observed when not said)."""
    return (attrs or {}).get("evidence") or "observed"


def missing_requirements(row: dict) -> list[str]:
    """Names of the ids or attrs the row's event kind requires but lacks (empty when complete)."""
    kind = VOCABULARY.get(row.get("name"))
    if kind is None:
        return []
    attrs = row.get("attrs")
    if isinstance(attrs, str):
        try:
            attrs = json.loads(attrs) if attrs else {}
        except ValueError:
            attrs = {}
    if not isinstance(attrs, dict):
        attrs = {}
    out = []
    for req in kind.requires:
        if req.startswith("attrs."):
            if attrs.get(req[6:]) in (None, ""):
                out.append(req)
        elif row.get(req) in (None, ""):
            out.append(req)
    if attrs.get("evidence") == "reported" and attrs.get("reporter") in (None, ""):
        out.append("attrs.reporter")  # a report names its reporter
    return out


def render_evidence_markdown() -> str:
    """docs/EVENTS.md's evidence-strength table, generated from EVIDENCE."""
    return "| evidence | meaning |\n| --- | --- |\n" + "".join(f"| `{k}` | {v} |\n" for k, v in EVIDENCE.items())


def render_markdown() -> str:
    """docs/EVENTS.md's vocabulary table, generated from VOCABULARY."""
    lines = ["| name | source | requires | meaning | value |", "| --- | --- | --- | --- | --- |"]
    for k in _KINDS:
        req = ", ".join(f"`{r}`" for r in k.requires) or "-"
        lines.append(f"| `{k.name}` | {k.source} | {req} | {k.meaning} | {k.value or '-'} |")
    return "\n".join(lines) + "\n"

# The gap register: what is missing, which figures it affects, what would close it. Collectors write
# the gaps they know of (gaps.parquet: refused archive lines, black-box targets, absent sensors); the
# ledger adds the gaps it finds while rebuilding.
GAP_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("gap_id", pa.string(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),  # run, import, attempt, task, clock, energy ...
        pa.field("subject_id", pa.string()),  # attempt id, line number, clock pair ...
        pa.field("affects", pa.string(), nullable=False),  # the figures left NULL
        pa.field("needs", pa.string(), nullable=False),  # what would close the gap
        pa.field("detail", pa.string()),
    ]
)
