"""A load tool's per-request record, tool-neutral, and the `attempt.*` client events it becomes.

Each tool's reader (collectors/peers/aiperf.py, vllm_bench.py, guidellm.py) turns one record
into a `PeerRequest` or a `RecordError` naming file:line and field. The events carry the tool's own
clock domain and `attrs.evidence = "reported"`, `attrs.reporter = "<tool>-<version>"`: they are the
tool's account of what it saw, not our observation.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction

EVIDENCE = "reported"
MAX_DEPTH = 32  # nesting of a tool's JSON; the tools' own documents need 9 at most (GuideLLM's report)
MAX_TOKENS = 2**31 - 1  # a token count every integer column of the ledger holds; no request has more
TS_SPAN_NS = 2**61  # times stay within ±2^61 ns, where the ledger's differences and sums stay in int64
_SURROGATE = re.compile("[\ud800-\udfff]")


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


def parse_json(data: bytes, path, *, line: int = 1, what: str = "(document)") -> object:
    """One JSON document (a whole file, or one line of a JSON Lines file starting at `line`), checked for
    what no later step can hold: invalid UTF-8, nesting past MAX_DEPTH, a lone surrogate in a string.
    NaN and infinities parse as floats and are refused by the field that uses them (`finite`)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = line + data[:exc.start].count(b"\n")
        raise RecordError(f"{path}:{at}", "(encoding)", f"not valid UTF-8 (byte 0x{data[exc.start]:02x}); "
                          "write the file as UTF-8") from None
    try:
        obj = json.loads(text)
    except RecursionError:
        raise RecordError(f"{path}:{line}", what, f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        at = line + getattr(exc, "lineno", 1) - 1
        raise RecordError(f"{path}:{at}", what, f"not JSON ({exc})") from None
    _check_tree(obj, f"{path}:{line}")
    return obj


def _check_tree(obj, where: str) -> None:
    stack = [(obj, 1, "$")]
    while stack:
        v, depth, at = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                raise RecordError(where, at, "a string with a lone UTF-16 surrogate (not valid Unicode)")
        elif isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise RecordError(where, "(document)", f"nested deeper than {MAX_DEPTH} levels")
            if isinstance(v, dict):
                for k, x in v.items():
                    if _SURROGATE.search(k):
                        raise RecordError(where, at, "a key with a lone UTF-16 surrogate (not valid Unicode)")
                    stack.append((x, depth + 1, f"{at}.{k}"))
            else:
                stack.extend((x, depth + 1, f"{at}[{i}]") for i, x in enumerate(v))


def read_json_document(path) -> object:
    """A tool's whole-file JSON output; RecordError naming the file and line where it cannot be read."""
    return parse_json(path.read_bytes(), path)


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


def _describe(v) -> str:
    return f"{type(v).__name__} {str(v)[:40]!r}"


def need(obj: dict, key: str, where: str, kinds: tuple[type, ...], *, prefix: str = "", nullable=False):
    """obj[key] checked for type (and a number for finiteness): the one place a reader refuses a field."""
    name = f"{prefix}{key}"
    if not isinstance(obj, dict):
        raise RecordError(where, prefix.rstrip(".") or "record", f"must be a JSON object, got {_describe(obj)}")
    if key not in obj:
        raise RecordError(where, name, "missing")
    v = obj[key]
    if v is None and nullable:
        return None
    if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
        want = " or ".join(k.__name__ for k in kinds)
        raise RecordError(where, name, f"must be {want}, got {_describe(v)}")
    if isinstance(v, float) and not math.isfinite(v):
        raise RecordError(where, name, f"must be a finite number, got {v}")
    return v


def section(obj: dict, key: str, where: str, *, prefix: str = "") -> dict:
    """An optional JSON object (absent or null: empty); any other type is refused."""
    v = obj.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise RecordError(where, f"{prefix}{key}", f"must be a JSON object, got {_describe(v)}")
    return v


def finite(v, where: str, name: str, *, nullable=False):
    """A JSON number that is not NaN or an infinity (a tool writes those for what it could not measure)."""
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RecordError(where, name, f"must be a number, got {_describe(v)}")
    if isinstance(v, float) and not math.isfinite(v):
        raise RecordError(where, name, f"must be a finite number, got {v}")
    return v


def count(v, where: str, name: str, *, nullable=False) -> int | None:
    """A token count: a JSON integer, 0 <= n <= MAX_TOKENS (24.9 or -24 tokens are no count)."""
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RecordError(where, name, f"must be an integer number of tokens, got {_describe(v)}")
    if not 0 <= v <= MAX_TOKENS:
        raise RecordError(where, name, f"must be between 0 and {MAX_TOKENS} tokens, got {v}")
    return v


def check_times(req: PeerRequest) -> PeerRequest:
    """Every time of the request within ±TS_SPAN_NS (a huge start or gap would overflow the ledger's int64)."""
    times = [("sent", req.sent_ns)] + [(f"chunk {k}", t) for k, (t, _kinds) in enumerate(req.chunks)]
    times += [("end", req.end_ns)] if req.end_ns is not None else []
    for what, t in times:
        if not -TS_SPAN_NS <= t <= TS_SPAN_NS:
            raise RecordError(req.where, f"({what} time)", f"{t} ns is outside ±2^61 ns: a start, TTFT or gap "
                              "of the record is far outside any real run")
    return req
