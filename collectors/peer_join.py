"""Joining a load tool's requests with a server-side run directory, and the clock mapping between them.

The server run is any run directory (ours from `serve --out` or capture, or vLLM's evidence imported
from OTLP): its server/engine events are keyed by attempt id. A tool's request joins the server
attempt whose id equals its key; failing that, the key with a `chatcmpl-` / `cmpl-` prefix added or
removed (an OpenAI response id against a raw id). Every rule used is recorded; a request that joins
nothing becomes a gap.

The mapping tool clock -> server clock is estimated from the joined requests, never assumed: the
server saw each request after the tool sent it (offset <= received - sent) and the tool saw each
chunk after the server wrote the first one (offset >= first write - first chunk). The offset is the
middle of the tightest interval over all requests and epsilon its half width; a true bound while the
two clocks tick at the same rate over the run. An empty interval (the bounds contradict) gives no
mapping and a gap.
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from inferledger.collectors.peer_records import PeerRequest

SERVER_SOURCES = ("server", "engine")
PREFIXES = ("chatcmpl-", "cmpl-")
OUTPUT_NAMES = ("server.write", "engine.token")


class ServerRunError(ValueError):
    """The --server folder is not a run directory."""


@dataclass
class ServerAttempt:
    attempt_id: str
    clock: str
    first_ns: int  # the earliest server/engine event: after the client sent
    first_write_ns: int | None = None  # the first server.write (else engine.token): before any client chunk
    writes: list[tuple[int, list[str]]] = field(default_factory=list)  # server.write (ts, kinds), in order
    tokens: int | None = None  # engine.token sum


@dataclass
class ServerRun:
    path: Path
    manifest: dict
    events: list  # pyarrow tables of events/part-*.parquet
    samples: list
    clocks: list[dict]
    tasks: list[dict]
    gaps: list[dict]
    attempts: dict[str, ServerAttempt]


def _table_rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist() if path.exists() else []


def load(path: Path) -> ServerRun:
    path = Path(path)
    parts = sorted((path / "events").glob("part-*.parquet"))
    if not path.is_dir() or not parts:
        raise ServerRunError(f"{path}: not a run directory (no events/part-*.parquet); pass the folder given "
                             "to `inferledger serve --out` or a captured or imported run")
    manifest = json.loads((path / "manifest.json").read_text()) if (path / "manifest.json").exists() else {}
    events = [pq.read_table(p) for p in parts]
    samples = [pq.read_table(p) for p in sorted((path / "samples").glob("part-*.parquet"))]
    run = ServerRun(path, manifest, events, samples, _table_rows(path / "clocks.parquet"),
                    _table_rows(path / "tasks.parquet"), _table_rows(path / "gaps.parquet"), {})
    run.attempts = _attempts(events)
    return run


def _attempts(tables: list) -> dict[str, ServerAttempt]:
    rows = defaultdict(list)
    for t in tables:
        cols = t.select(["source", "name", "ts_ns", "seq", "clock", "attempt_id", "value", "attrs"]).to_pylist()
        for r in cols:
            if r["attempt_id"] is not None and r["source"] in SERVER_SOURCES:
                rows[r["attempt_id"]].append(r)
    out = {}
    for aid, evs in rows.items():
        clock = Counter(e["clock"] for e in evs).most_common(1)[0][0]
        evs = sorted((e for e in evs if e["clock"] == clock), key=lambda e: (e["ts_ns"], e["seq"]))
        a = ServerAttempt(aid, clock, evs[0]["ts_ns"])
        toks = [e for e in evs if e["name"] == "engine.token"]
        for e in evs:
            if e["name"] == "server.write":
                kinds = (json.loads(e["attrs"] or "{}")).get("kinds") or []
                a.writes.append((e["ts_ns"], kinds))
        first_out = [e["ts_ns"] for e in evs if e["name"] in OUTPUT_NAMES]
        a.first_write_ns = a.writes[0][0] if a.writes else (min(first_out) if first_out else None)
        a.tokens = int(sum(e["value"] or 0 for e in toks)) if toks else None
        out[aid] = a
    return out


def match(key: str, server_ids) -> tuple[str | None, str]:
    """(server attempt id, rule) for a tool's key; (None, why) when nothing matches."""
    if key in server_ids:
        return key, "exact"
    for p in PREFIXES:
        if key.startswith(p) and key[len(p):] in server_ids:
            return key[len(p):], f"without the {p} prefix"
        if p + key in server_ids:
            return p + key, f"with the {p} prefix"
    return None, "no server attempt has this id"


def index_prefix(n: int, server_ids) -> str | None:
    """The prefix P with P + str(i) a server attempt id for the most i in range(n) (vLLM bench sends
    x-request-id = prefix + dataset index, and records no id): None when no server id ends in an index."""
    counts: Counter = Counter()
    for sid in server_ids:
        m = re.fullmatch(r"(.*?)(0|[1-9][0-9]*)", sid)
        if m and int(m.group(2)) < n:
            counts[m.group(1)] += 1
    return counts.most_common(1)[0][0] if counts else None


@dataclass
class Mapping:
    from_clock: str
    to_clock: str
    offset_ns: int | None
    epsilon_ns: int | None
    n: int
    lo_ns: int | None = None
    hi_ns: int | None = None
    problem: str | None = None

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("from_clock", "to_clock", "offset_ns", "epsilon_ns", "n",
                                              "lo_ns", "hi_ns", "problem")}


def estimate(pairs: list[tuple[PeerRequest, ServerAttempt]], from_clock: str) -> Mapping | None:
    """The tool clock -> server clock mapping from the joined requests (t_server = t_tool + offset)."""
    if not pairs:
        return None
    to_clock = Counter(s.clock for _r, s in pairs).most_common(1)[0][0]
    his = [s.first_ns - r.sent_ns for r, s in pairs if s.clock == to_clock]
    los = [s.first_write_ns - r.chunks[0][0] for r, s in pairs
           if s.clock == to_clock and r.chunks and s.first_write_ns is not None]
    m = Mapping(from_clock, to_clock, None, None, len(his))
    m.hi_ns = min(his)
    m.lo_ns = max(los) if los else None
    if m.lo_ns is None:
        m.problem = "no joined request has both a tool chunk and a server write: only an upper bound on the offset"
    elif m.lo_ns > m.hi_ns:
        m.problem = (f"the bounds contradict (offset >= {m.lo_ns} ns from the chunks, <= {m.hi_ns} ns from the "
                     "sends): the clocks drifted or the join is wrong")
    else:
        m.offset_ns = (m.lo_ns + m.hi_ns) // 2
        m.epsilon_ns = max(1, m.hi_ns - m.offset_ns)
    return m


def relabel_by_writes(req: PeerRequest, s: ServerAttempt) -> bool:
    """Give a tool's chunks the kinds of the server writes they are, when the tool kept every message
    with choices (vLLM bench) and the counts agree; False (left unknown) otherwise."""
    writes = [k for _ts, k in s.writes if not set(k) & {"usage", "done"}]
    own = [i for i, (_ts, kinds) in enumerate(req.chunks) if kinds is None]
    if not writes or len(own) != len(writes):
        return False
    for i, kinds in zip(own, writes):
        known = [k for k in kinds if k in ("content", "reasoning", "tool_call", "finish")]
        req.chunks[i] = (req.chunks[i][0], known)  # a role chunk becomes [] (choices, no content)
    return True
