"""Who a request is: its attempt, request, task and session ids, from the client's headers or generated.

The ids travel into every server and engine event of the request (`Ids.columns` to the engine,
`Ids.event_ids` to the server's own events) and back to the
client in the response headers (`Ids.headers`); a W3C traceparent is parsed, never guessed.
"""
from __future__ import annotations

import re
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property

from inferledger.probes.probe import EventIds

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
ID_HEADERS = ("x-request-id", "x-inferledger-request-id", "x-inferledger-attempt-id", "x-inferledger-task-id",
              "x-inferledger-session-id")


@dataclass
class Ids:
    request_id: str
    attempt_id: str
    task_id: str | None = None
    session_id: str | None = None
    client_request_id: str | None = None  # the client's x-request-id, echoed back
    trace: dict = field(default_factory=dict)
    problem: tuple[str, str] | None = None  # (header, message) of an unusable id header

    def columns(self) -> dict:
        return {"request_id": self.request_id, "attempt_id": self.attempt_id, "task_id": self.task_id,
                "session_id": self.session_id}

    @cached_property
    def event_ids(self) -> EventIds:
        return EventIds(self.task_id, self.session_id, self.request_id, self.attempt_id)

    def headers(self) -> dict:
        return {"x-request-id": self.client_request_id or self.request_id, "x-inferledger-attempt-id": self.attempt_id}


def parse_traceparent(value: str | None) -> dict:
    """W3C trace context: version-traceid-parentid-flags. Invalid values are kept apart, never guessed."""
    if not value:
        return {}
    m = _TRACEPARENT.match(value.strip().lower())
    if not m or m.group(1) == "ff" or set(m.group(2)) == {"0"} or set(m.group(3)) == {"0"}:
        return {"traceparent_invalid": value[:80]}
    return {"trace_id": m.group(2), "parent_span_id": m.group(3), "trace_flags": m.group(4)}


class IdAssigner:
    """attempt id = x-inferledger-attempt-id, else x-request-id, else generated; an id a client sends again
    gets #2, #3 ... (a retry under one x-request-id is a new attempt of the same request; two clients, or
    two captures, sending one attempt id stay two attempts, as one attempt id names one attempt); request
    id = x-inferledger-request-id, else x-request-id, else the attempt id."""

    def __init__(self, remember: int = 100_000) -> None:
        self._seen: OrderedDict[str, int] = OrderedDict()
        self.remember = remember

    def _unique(self, sent: str) -> str:
        """`sent` the first time it is seen, then `sent#2`, `sent#3` ... (the last `remember` ids kept)."""
        if sent in self._seen:
            self._seen[sent] += 1
            self._seen.move_to_end(sent)
            return f"{sent}#{self._seen[sent]}"
        self._seen[sent] = 1
        if len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        return sent

    def assign(self, headers) -> Ids:
        got, problem = {}, None
        for name in ID_HEADERS:
            v = (headers.get(name) or "").strip()
            if v and (len(v) > 256 or not v.isprintable()):
                problem = (name, f"header {name} must be 1 to 256 printable characters")
            elif v:
                got[name] = v
        xrid = got.get("x-request-id")
        sent = got.get("x-inferledger-attempt-id") or xrid
        aid = self._unique(sent) if sent is not None else f"srv-{uuid.uuid4().hex}"
        return Ids(request_id=got.get("x-inferledger-request-id") or xrid or aid, attempt_id=aid,
                   task_id=got.get("x-inferledger-task-id"), session_id=got.get("x-inferledger-session-id"),
                   client_request_id=xrid, trace=parse_traceparent(headers.get("traceparent")), problem=problem)
