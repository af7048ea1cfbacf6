"""Importing an E0 archive (docs/EVENTS.md "E0 archives"): JSON Lines, one event a line, into a run folder.

Two passes: the first checks the `clock.domain` lines (a domain may be declared after its first
use), the second every other line; good lines become event, clock or task rows. Strict mode writes
nothing unless every line is good; lenient mode writes the good rows and registers each refused line
in gaps.parquet. The run is built in a hidden sibling folder and renamed to `out` at the end
(collectors/rundir/out_dir.py), so a failure part-way leaves nothing there. Everything an archive says is
evidence of strength "declared".
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path

import pyarrow as pa

from inferledger.collectors.rundir.out_dir import OutDirError, RunExistsError, building_run_dir, check_new_run_dir
from inferledger.collectors.rundir.writer import RunWriter, write_table_atomic
from inferledger.probes.events import EVENT_SCHEMA, GAP_SCHEMA, VOCABULARY, count_problem, missing_requirements

IMPORTER_VERSION = "1"
MAX_LISTED = 50  # refusals listed in an ArchiveError message; all of them stay on `.refusals`
CONTRACT_KEYS = ("deadline_ms", "required", "on_missing", "max_attempts", "expected")
EVENT_COLUMNS = tuple(EVENT_SCHEMA.names)
STRING_COLUMNS = ("run_id", "event_id", "source", "host", "name", "clock",
                  "task_id", "session_id", "request_id", "attempt_id")
INT64 = (-(2**63), 2**63 - 1)
# Times and clock offsets are differenced, mapped and summed in int64 by the ledger: keeping each
# within ±2^61 ns (±73 years around the clock's zero; Unix time until 2043) keeps every such result
# inside int64. Epsilons are bounds on an error: half of that span is already absurd.
TS_SPAN = (-(2**61), 2**61)
EPS_MAX = 2**60
MAX_DEPTH = 32  # nesting of objects and arrays in one line; an event needs 3 or 4
_SURROGATE = re.compile("[\ud800-\udfff]")
__all__ = ["ArchiveError", "ImportResult", "OutDirError", "RunExistsError", "import_archive"]


class ArchiveError(ValueError):
    """The archive has refused lines (strict mode); `.refusals` holds every (line_no, reason)."""

    def __init__(self, archive: Path, refusals: list[tuple[int, str]]) -> None:
        self.archive, self.refusals = archive, refusals
        shown = [f"{archive}:{n}: {reason}" for n, reason in refusals[:MAX_LISTED]]
        if len(refusals) > MAX_LISTED:
            shown.append(f"... and {len(refusals) - MAX_LISTED} more refused lines")
        super().__init__(f"{archive}: {len(refusals)} line(s) refused, nothing was written "
                         "(fix them, or pass --lenient to import the rest and register these as gaps):\n"
                         + "\n".join(shown))


@dataclass
class ImportResult:
    run_id: str
    out: Path
    lines: int = 0  # non-blank lines read
    events: int = 0
    clocks: int = 0  # domain and mapping rows
    tasks: int = 0
    refused: int = 0
    refusals: list[tuple[int, str]] = field(default_factory=list)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and INT64[0] <= v <= INT64[1]


def _kind(v) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object", type(None): "null"}.get(type(v), type(v).__name__)


class _Unreadable(ValueError):
    """A number JSON does not allow, or one no column can hold."""


def _constant(token: str):
    raise _Unreadable(f"{token} is not a JSON number (NaN and infinities have no JSON spelling; "
                      "a NaN deadline is an unreadable contract): write null for an unknown")


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _Unreadable(f"the number {text[:40]} overflows a double: write a smaller number or null")
    return v


def _out_of_span(v, path: str) -> list[str]:
    """Numbers no column or figure can hold: every number of an event fits int64 (ns, tokens, bytes)."""
    if isinstance(v, bool) or v is None:
        return []
    if isinstance(v, (int, float)):
        return [] if INT64[0] <= v <= INT64[1] else [f"{path} = {json.dumps(v)[:40]} is outside the int64 span "
                                                     "(±9.2e18): no figure can hold it"]
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    return [r for k, x in items for r in _out_of_span(x, f"{path}.{k}" if isinstance(v, dict) else f"{path}[{k}]")]


def _tree_problem(obj, limit: int) -> str | None:
    """Why no column can hold this object: nesting past `limit`, or a lone UTF-16 surrogate (which JSON's
    \\u escapes can spell but UTF-8, and so Parquet, cannot)."""
    stack = [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return f"the string {v[:40]!r} holds a lone UTF-16 surrogate: not valid Unicode"
        elif isinstance(v, (dict, list)):
            if d > limit:
                return f"nested deeper than {limit} levels of objects and arrays"
            if isinstance(v, dict):
                stack.extend((k, d) for k in v)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return None


def _parse(raw: bytes) -> tuple[dict | None, str | None]:
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_constant, parse_float=_finite)
    except UnicodeDecodeError:
        return None, "not valid UTF-8"
    except _Unreadable as exc:
        return None, str(exc)
    except RecursionError:
        return None, f"nested deeper than {MAX_DEPTH} levels of objects and arrays"
    except ValueError as exc:
        return None, f"not JSON ({exc.msg} at column {exc.colno})" if hasattr(exc, "msg") else f"not JSON ({exc})"
    if not isinstance(obj, dict):
        return None, f"not a JSON object (got a JSON {_kind(obj)})"
    problem = _tree_problem(obj, MAX_DEPTH)
    return (None, problem) if problem else (obj, None)


class _Archive:
    """What the lines of one archive declared so far, and the checks that use it."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.domains: dict[str, tuple[int, str | None, str | None]] = {}  # clock -> (line, host, kind)
        self.maps: list[tuple[int, str, str, int, int]] = []
        self.event_ids: dict[str, int] = {}
        self.contracts: dict[str, tuple[int, dict]] = {}
        self.seq: dict[str, int] = {}  # next sequence number per source
        self.seq_of: dict[int, int] = {}  # line -> the sequence number it took
        self.owners: dict[str, tuple[int, str | None, str | None]] = {}  # attempt -> (line, task, request)

    def declare(self, n: int, obj: dict) -> str | None:
        clock, attrs = obj.get("clock"), obj.get("attrs") or {}
        if not isinstance(clock, str):
            return f"clock must be a string, got a JSON {_kind(clock)}"
        host, kind = attrs.get("host"), attrs.get("kind")
        for key, v in (("attrs.host", host), ("attrs.kind", kind)):
            if v is not None and not isinstance(v, str):
                return f"{key} must be a string, got a JSON {_kind(v)}"
        if clock in self.domains:
            line, h0, k0 = self.domains[clock]
            if (h0, k0) != (host, kind):
                return f"clock '{clock}' already declared on line {line} with host {h0!r}, kind {k0!r}"
            return None
        self.domains[clock] = (n, host, kind)
        return None

    def check(self, n: int, obj: dict) -> list[str]:
        """The reasons to refuse line n (empty when it is good)."""
        name, src = obj.get("name"), obj.get("source")
        if isinstance(src, str) and src and name not in ("clock.domain", "clock.map"):
            # A refused line uses up its sequence number too, so the gap in seq shows the lost event.
            self.seq_of[n] = self.seq.get(src, 0)
            self.seq[src] = self.seq_of[n] + 1
        if not isinstance(name, str) or name not in VOCABULARY:
            return [f"unknown event name {name!r} (not in the vocabulary, see docs/EVENTS.md)"
                    if name is not None else "missing `name`"]
        attrs = obj.get("attrs")
        if attrs is not None and not isinstance(attrs, dict):
            return [f"attrs must be a JSON object, got a JSON {_kind(attrs)}"]
        attrs = attrs or {}
        reasons = [f"unknown field '{k}'" + "".join(f" (did you mean '{m}'?)" for m in get_close_matches(k, EVENT_COLUMNS, 1))
                   for k in obj if k not in EVENT_COLUMNS]
        reasons += [f"missing {req}, required by {name}" for req in missing_requirements(obj)]
        if name == "clock.domain":
            return reasons or [r for r in [self.declare(n, obj)] if r]
        if name == "clock.map":
            return reasons or self.check_map(n, attrs)
        for col in STRING_COLUMNS:
            v = obj.get(col)
            if v is not None and not isinstance(v, str):
                reasons.append(f"{col} must be a string, got a JSON {_kind(v)}")
        for col in ("step_id", "seq"):
            if obj.get(col) is not None and not _is_int(obj[col]):
                reasons.append(f"{col} must be an integer, got {json.dumps(obj[col])}")
        v = obj.get("value")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            reasons.append(f"value must be a number, got a JSON {_kind(v)}")
        reasons += _out_of_span(v, "value") + _out_of_span(attrs, "attrs")
        if not reasons and (why := count_problem(name, v)):
            reasons.append(why)
        if obj.get("ts_ns") is None:
            reasons.append("ts_ns missing (integer nanoseconds in the event's clock)")
        elif not _is_int(obj["ts_ns"]):
            reasons.append(f"ts_ns must be an integer number of nanoseconds, got {json.dumps(obj['ts_ns'])}")
        elif not TS_SPAN[0] <= obj["ts_ns"] <= TS_SPAN[1]:
            reasons.append(f"ts_ns {obj['ts_ns']} is outside ±2^61 ns, where differences of times stay exact")
        clock = obj.get("clock")
        if not src:
            reasons.append("source missing (who emitted the event: client, server, engine ...)")
        if not clock:
            reasons.append("clock missing (the clock domain ts_ns is in)")
        elif isinstance(clock, str) and clock not in self.domains:
            reasons.append(f"clock '{clock}' is never declared by a clock.domain line")
        if obj.get("run_id") not in (None, self.run_id):
            reasons.append(f"run_id {obj['run_id']!r} differs from the run being imported "
                           f"({self.run_id!r}): pass --run-id or drop the field")
        contract = None
        if name == "task.start" and any(k in attrs for k in CONTRACT_KEYS):
            contract = {k: attrs[k] for k in CONTRACT_KEYS if k in attrs}
            reasons += self.check_contract(obj.get("task_id"), contract)
        if name == "verdict" and not isinstance(attrs.get("correct"), bool):
            reasons.append("verdict needs attrs.correct: true or false")
        eid = obj.get("event_id") or f"{src}:L{n}"
        if not reasons and eid in self.event_ids:
            reasons.append(f"duplicate event_id '{eid}' (first on line {self.event_ids[eid]})")
        if not reasons:
            reasons += self.check_owner(n, obj)
        if not reasons:
            self.event_ids[eid] = n
            if contract is not None:
                self.contracts.setdefault(obj["task_id"], (n, contract))
        return reasons

    def check_owner(self, n: int, obj: dict) -> list[str]:
        """One attempt belongs to one task and one request: a second owner is a collision of ids."""
        aid = obj.get("attempt_id")
        if aid is None:
            return []
        line, task, request = self.owners.get(aid, (n, None, None))
        for col, known in (("task_id", task), ("request_id", request)):
            v = obj.get(col)
            if v is not None and known is not None and v != known:
                return [f"attempt_id '{aid}' belongs to {col.removesuffix('_id')} '{known}' (line {line}); this "
                        f"line puts it under '{v}': give each attempt its own id"]
        self.owners[aid] = (line, task or obj.get("task_id"), request or obj.get("request_id"))
        return []

    def check_map(self, n: int, a: dict) -> list[str]:
        reasons = []
        for key in ("offset_ns", "epsilon_ns"):
            if not _is_int(a.get(key)):
                reasons.append(f"attrs.{key} must be an integer number of nanoseconds, got {json.dumps(a.get(key))}")
        if _is_int(a.get("epsilon_ns")) and a["epsilon_ns"] < 0:
            reasons.append("attrs.epsilon_ns must not be negative")
        if _is_int(a.get("epsilon_ns")) and a["epsilon_ns"] > EPS_MAX:
            reasons.append(f"attrs.epsilon_ns {a['epsilon_ns']} is above 2^60 ns (36 years): not a bound on anything")
        if _is_int(a.get("offset_ns")) and not TS_SPAN[0] <= a["offset_ns"] <= TS_SPAN[1]:
            reasons.append(f"attrs.offset_ns {a['offset_ns']} is outside ±2^61 ns, where mapped times stay exact")
        for key in ("from", "to"):
            c = a.get(key)
            if not isinstance(c, str):
                reasons.append(f"attrs.{key} must be a clock name (string)")
            elif c not in self.domains:
                reasons.append(f"clock.map references undeclared clock '{c}' (attrs.{key})")
        if a.get("method") is not None and not isinstance(a["method"], str):
            reasons.append("attrs.method must be a string")
        if reasons:
            return reasons
        src, dst, off, eps = a["from"], a["to"], a["offset_ns"], a["epsilon_ns"]
        if src == dst:
            return [f"clock.map from clock '{src}' to itself"]
        for line, f0, t0, o0, e0 in self.maps:
            if (f0, t0) == (src, dst) and abs(off - o0) > eps + e0:
                return [f"clock.map {src} -> {dst} contradicts line {line}: offsets {off} and {o0} ns "
                        f"differ by more than the epsilons together ({eps + e0} ns)"]
            if (f0, t0) == (dst, src) and abs(off + o0) > eps + e0:
                return [f"clock.map {src} -> {dst} contradicts the reverse mapping on line {line}: "
                        f"offset {off} ns is not -({o0}) ns within {eps + e0} ns"]
        self.maps.append((n, src, dst, off, eps))
        return []

    def check_contract(self, task_id, c: dict) -> list[str]:
        reasons = []
        d, req, om, ma = (c.get(k) for k in ("deadline_ms", "required", "on_missing", "max_attempts"))
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float)) or d < 0):
            reasons.append(f"attrs.deadline_ms must be a non-negative number, got {json.dumps(d)}")
        if req is not None and not (isinstance(req, list) and all(isinstance(r, str) for r in req)):
            reasons.append("attrs.required must be a list of request ids (strings)")
        if om is not None and om not in ("failure", "partial_success"):
            reasons.append(f"attrs.on_missing must be 'failure' or 'partial_success', got {json.dumps(om)}")
        if ma is not None and not (_is_int(ma) and ma >= 1):
            reasons.append(f"attrs.max_attempts must be an integer >= 1, got {json.dumps(ma)}")
        first = self.contracts.get(task_id)
        if not reasons and first is not None and first[1] != c:
            reasons.append(f"task '{task_id}' already has a different contract (line {first[0]})")
        return reasons

    def event_row(self, n: int, obj: dict) -> dict:
        row = {c: obj.get(c) for c in EVENT_COLUMNS}
        row["run_id"] = self.run_id
        row["event_id"] = obj.get("event_id") or f"{obj['source']}:L{n}"
        row["seq"] = obj["seq"] if obj.get("seq") is not None else self.seq_of[n]
        row["host"] = obj.get("host") or (self.domains[obj["clock"]][1] or "unknown")
        row["value"] = None if obj.get("value") is None else float(obj["value"])
        row["attrs"] = json.dumps(obj.get("attrs") or {}, separators=(",", ":"), sort_keys=True)
        return row


def _write_row(w: RunWriter, ar: _Archive, res: ImportResult, n: int, obj: dict) -> None:
    name, attrs = obj["name"], obj.get("attrs") or {}
    if name == "clock.domain":
        if ar.domains[obj["clock"]][0] == n:  # a repeated identical declaration adds no row
            w.clock_domain(obj["clock"], host=attrs.get("host"), kind=attrs.get("kind"))
            res.clocks += 1
    elif name == "clock.map":
        w.clock_map(attrs["from"], attrs["to"], attrs["offset_ns"], attrs["epsilon_ns"], attrs.get("method"))
        res.clocks += 1
    else:
        w.emit(ar.event_row(n, obj))
        res.events += 1
        first = ar.contracts.get(obj.get("task_id")) if name == "task.start" else None
        if first is not None and first[0] == n:
            c, exp = first[1], first[1].get("expected")
            w.task(obj["task_id"], deadline_ms=None if c.get("deadline_ms") is None else float(c["deadline_ms"]),
                   required=c.get("required"), on_missing=c.get("on_missing"), max_attempts=c.get("max_attempts"),
                   expected=exp if exp is None or isinstance(exp, str) else json.dumps(exp, sort_keys=True),
                   contract=c)
            res.tasks += 1


def import_archive(archive: Path, out: Path, *, run_id: str | None = None, lenient: bool = False) -> ImportResult:
    """Import an E0 JSONL archive into the run directory `out` (which must not hold a run yet)."""
    archive, out = Path(archive), Path(out)
    check_new_run_dir(out)
    data = archive.read_bytes()  # FileNotFoundError names the path
    run_id = run_id or out.resolve().name
    res = ImportResult(run_id=run_id, out=out)
    parsed: list[tuple[int, bytes, dict | None, str | None]] = []
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            parsed.append((n, raw, *_parse(raw)))
    res.lines = len(parsed)
    ar, refused, good = _Archive(run_id), {}, []
    # Two passes: clock.domain lines first, since a declaration may come after the clock's first use.
    for first_pass in (True, False):
        for n, _raw, obj, why in parsed:
            if first_pass != (obj is not None and obj.get("name") == "clock.domain"):
                continue
            reasons = [why] if why else ar.check(n, obj)
            if reasons:
                refused[n] = "; ".join(reasons)
            else:
                good.append((n, obj))
    good.sort(key=lambda item: item[0])
    res.refusals = sorted(refused.items())
    res.refused = len(res.refusals)
    if res.refusals and not lenient:
        raise ArchiveError(archive, res.refusals)
    raws = {n: raw for n, raw, _o, _w in parsed}
    gaps = [{"run_id": run_id, "gap_id": f"import:L{n}", "scope": "import", "subject_id": f"line {n}",
             "affects": "the event on that line and every figure that needs it",
             "needs": f"fix line {n}: {reason}",
             "detail": raws[n].decode("utf-8", "replace")[:500]} for n, reason in res.refusals]
    with building_run_dir(out) as staging:  # checked again there: another process may have written meanwhile
        with RunWriter(staging, run_id) as w:
            for n, obj in good:
                _write_row(w, ar, res, n, obj)
        write_table_atomic(pa.Table.from_pylist(gaps, schema=GAP_SCHEMA), staging / "gaps.parquet")
        w.write_manifest({
            "source": "e0-import",
            "archive": {"path": str(archive.resolve()), "sha256": hashlib.sha256(data).hexdigest()},
            "counts": {k: getattr(res, k) for k in ("lines", "events", "clocks", "tasks", "refused")},
            "importer": {"module": __name__, "version": IMPORTER_VERSION, "lenient": lenient},
            "clocks": {c: {"host": h, "kind": k} for c, (_n, h, k) in ar.domains.items()},
            "evidence": {k: "declared" for k in ("default", "events", "clocks", "tasks", "hosts")},
        })
    return res
