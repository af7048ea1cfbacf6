"""Joining a load tool's requests with a server-side run (collectors/peers/server.py reads it), and the
clock mapping between them.

A tool's request joins the server attempt whose id equals its key; failing that, the key with a
`chatcmpl-` / `cmpl-` prefix added or removed (an OpenAI response id against a raw id). vLLM bench
writes no ids: its requests join by prefix + dataset index, a join by position that must prove
itself (`index_prefix`: ids that follow vLLM bench's scheme; `estimate`: one clock offset that
holds for every joined pair). Every rule used is recorded; a request that joins nothing is a gap.

The mapping tool clock -> server clock is estimated from the joined requests, never assumed: the
server saw each request after the tool sent it (offset <= received - sent) and the tool saw each
chunk after the server wrote the first one (offset >= first write - first chunk). The offset is the
middle of the tightest interval over all requests and epsilon its half width; a true bound while the
two clocks tick at the same rate over the run. An empty interval (the bounds contradict), or fewer
than MIN_JOINS requests that bound it, gives no mapping and a gap.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from inferledger.collectors.peers.records import PeerRequest
from inferledger.collectors.peers.server import ServerAttempt, ServerRun, ServerRunError, load  # noqa: F401

PREFIXES = ("chatcmpl-", "cmpl-")
MIN_JOINS = 3  # joined requests a mapping needs: one or two agree with any offset by chance
BENCH_PREFIX = re.compile(r"bench-[0-9a-f]{8}-")  # vLLM bench's default --request-id-prefix


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


def index_prefix(n: int, server_ids) -> tuple[str | None, str]:
    """(P, why): the prefix P with P + str(i) a server attempt id for the most i in range(n) (vLLM bench
    sends x-request-id = prefix + dataset index, and records no id). P must follow vLLM bench's scheme:
    its default `bench-<8 hex>-`, or a prefix of the user's naming every one of the n indexes; else None."""
    counts: Counter = Counter()
    for sid in server_ids:
        m = re.fullmatch(r"(.*?)(0|[1-9][0-9]*)", sid)
        if m and int(m.group(2)) < n:
            counts[m.group(1)] += 1
    for prefix, named in counts.most_common():
        if BENCH_PREFIX.fullmatch(prefix) or named == n >= MIN_JOINS:
            return prefix, f"{prefix}<index> names {named} of the {n} requests"
    return None, (f"no server attempt id is vLLM bench's bench-<8 hex>-<index> (nor one prefix followed by "
                  f"every index 0..{n - 1}): the server run is not the one vLLM bench drove")


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
    if len(his) < MIN_JOINS:
        m.problem = (f"only {len(his)} joined request(s) on the server's clock: a mapping needs at least "
                     f"{MIN_JOINS} whose bounds agree")
    elif m.lo_ns is None:
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
