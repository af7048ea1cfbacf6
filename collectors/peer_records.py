"""A load tool's per-request record, tool-neutral, and the `attempt.*` client events it becomes.

Each tool's reader (collectors/peer_aiperf.py, peer_vllm_bench.py, peer_guidellm.py) turns one record
into a `PeerRequest` or a `RecordError` naming file:line and field. The events carry the tool's own
clock domain and `attrs.evidence = "reported"`, `attrs.reporter = "<tool>-<version>"`: they are the
tool's account of what it saw, not our observation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction

EVIDENCE = "reported"


class RecordError(ValueError):
    """One record of a tool's output is missing a field or carries a malformed one."""

    def __init__(self, where: str, field_name: str, problem: str) -> None:
        self.where, self.field_name, self.problem = where, field_name, problem
        super().__init__(f"{where}: field {field_name}: {problem}")


@dataclass
class PeerRequest:
    """What a tool recorded of one request, on the tool's clock (integer ns)."""

    key: str  # the id the join uses: the attempt id the server saw (see docs/PEERS.md "Load tools")
    where: str  # file:line (or file:index) of the record, for messages and gaps
    key_rule: str  # how the key was obtained: x-request-id, prefix+index, response id ...
    sent_ns: int
    chunks: list[tuple[int, list[str] | None]] = field(default_factory=list)  # (ts_ns, kinds; None = unknown)
    end_ns: int | None = None
    status: str = "completed"  # completed | error | cancelled
    error: str | None = None
    usage: dict | None = None  # the server's usage as the tool received it
    tool_output_tokens: int | None = None  # the tool's own output-token count
    token_rule: str | None = None  # how the tool counted them: usage, retokenised, iterations ...
    figures: dict = field(default_factory=dict)  # the tool's own per-request figures (ms), as it wrote them
    chunks_kept: str = "content"  # which chunks the tool kept: content, first_last, choices, labelled (ledger/peer_views.sql)


def read_json_document(path) -> object:
    """A tool's whole-file JSON output; RecordError naming the file and line where it does not parse."""
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise RecordError(f"{path}:{getattr(exc, 'lineno', 1)}", "(document)", f"not JSON ({exc})") from exc


def seconds_to_ns(v: float) -> int:
    """Exact: the float's own value times 1e9, rounded to the nearest ns (no float product)."""
    return round(Fraction(v) * 1_000_000_000)


def ms_to_ns(v: float) -> int:
    return round(Fraction(v) * 1_000_000)


def events_of(req: PeerRequest, *, attempt_id: str, clock: str, host: str, reporter: str) -> list[dict]:
    """The client events of one request, in the order they happened."""
    base = {"source": "client", "host": host, "clock": clock, "request_id": attempt_id, "attempt_id": attempt_id}
    tag = {"evidence": EVIDENCE, "reporter": reporter}
    rows = [{**base, "name": "attempt.sent", "ts_ns": req.sent_ns, "attrs": {**tag, "record": req.where}}]
    for ts, kinds in req.chunks:
        attrs = dict(tag) if kinds is None else {**tag, "kinds": kinds}
        rows.append({**base, "name": "attempt.chunk", "ts_ns": ts, "attrs": attrs})
    end = req.end_ns if req.end_ns is not None else (req.chunks[-1][0] if req.chunks else req.sent_ns)
    done = {**tag, "reported": req.figures, "reported_output_tokens": req.tool_output_tokens,
            "reported_token_rule": req.token_rule, "join_key_rule": req.key_rule, "chunks": req.chunks_kept}
    if req.status == "completed":
        if req.usage is not None:
            done["usage"] = req.usage
        rows.append({**base, "name": "attempt.done", "ts_ns": end, "attrs": done})
    elif req.status == "cancelled":
        rows.append({**base, "name": "attempt.cancel", "ts_ns": end, "attrs": done})
    else:
        rows.append({**base, "name": "attempt.error", "ts_ns": end, "attrs": {**done, "error": req.error}})
    return rows


def need(obj: dict, key: str, where: str, kinds: tuple[type, ...], *, prefix: str = "", nullable=False):
    """obj[key] checked for type: the one place a reader refuses a record."""
    name = f"{prefix}{key}"
    if not isinstance(obj, dict):
        raise RecordError(where, prefix.rstrip(".") or "record", "must be a JSON object")
    if key not in obj:
        raise RecordError(where, name, "missing")
    v = obj[key]
    if v is None and nullable:
        return None
    if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
        want = " or ".join(k.__name__ for k in kinds)
        raise RecordError(where, name, f"must be {want}, got {type(v).__name__} {str(v)[:40]!r}")
    if isinstance(v, (int, float)) and not isinstance(v, bool) and (v != v or v in (float("inf"), float("-inf"))):
        raise RecordError(where, name, f"must be a finite number, got {v}")
    return v
