"""`inferledger import --from TOOL`: a load tool's per-request output -> a run directory of client events,
optionally merged with a server-side run and joined per request (collectors/peers/join.py).

The readers (one module per tool) check every field they use and refuse a malformed record with
file:line (or file:JSON path) and the field; strict mode writes nothing then, lenient mode keeps each
refused record as a gap. The tool's output and the server run are read and checked whole before
anything is written, and the run is built in a hidden sibling folder renamed to --out at the end
(collectors/rundir/out_dir.py), so a refusal or a failure part-way leaves nothing at --out. The manifest
names the tool, its version, its command line when the output records it, the join and the clock
mapping with its epsilon.
"""
from __future__ import annotations

import hashlib
import importlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from inferledger.collectors.peers import join as peer_join
from inferledger.collectors.rundir.out_dir import OutDirError, RunExistsError, building_run_dir, check_new_run_dir
from inferledger.collectors.peers.records import RecordError, events_of
from inferledger.collectors.rundir.writer import RunWriter, write_table_atomic
from inferledger.probes.events import GAP_SCHEMA

# --from value -> (reader module, clock domain of its timestamps, clock kind, display name in peer_views)
TOOLS = {
    "aiperf": ("aiperf", "wall:aiperf-client", "wall", "AIPerf"),
    "vllm-bench": ("vllm_bench", "perf:vllm-bench", "perf_counter", "vLLM bench"),
    "guidellm": ("guidellm", "wall:guidellm-client", "wall", "GuideLLM"),
}
MAX_LISTED = 50


class PeerRecordsError(ValueError):
    """Records refused in strict mode; `.errors` holds every RecordError."""

    def __init__(self, errors: list[RecordError]) -> None:
        self.errors = errors
        shown = [str(e) for e in errors[:MAX_LISTED]] + ([f"... and {len(errors) - MAX_LISTED} more"]
                                                         if len(errors) > MAX_LISTED else [])
        super().__init__(f"{len(errors)} record(s) refused, nothing was written:\n" + "\n".join(shown))


class _Tool(NamedTuple):
    """The tool an import reads: its --from name, the clock domain of its timestamps and that clock's
    kind, and the reporter its events are attributed to."""
    name: str
    clock: str
    clock_kind: str
    reporter: str


@dataclass
class PeerImportResult:
    run_id: str
    out: Path
    tool: str
    version: str | None
    records: int = 0
    events: int = 0
    refused: int = 0
    joined: int = 0
    unjoined: int = 0
    server_events: int = 0
    mapping: dict | None = None
    key_rules: dict = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    refused_join: str | None = None  # why a join by position was not kept


def _gap(run_id: str, gap_id: str, scope: str, subject: str, affects: str, needs: str, detail: str) -> dict:
    return {"run_id": run_id, "gap_id": gap_id, "scope": scope, "subject_id": subject, "affects": affects,
            "needs": needs, "detail": detail[:500]}


def _unique_ids(reqs) -> list[str]:
    """A key seen again is the server's next attempt of it (`id#2`, as the server names a reused x-request-id)."""
    seen: Counter = Counter()
    ids = []
    for r in reqs:
        seen[r.key] += 1
        ids.append(r.key if seen[r.key] == 1 else f"{r.key}#{seen[r.key]}")
    return ids


def import_peer(tool: str, path: Path, out: Path, *, server: Path | None = None, lenient: bool = False,
                run_id: str | None = None, tool_version: str | None = None) -> PeerImportResult:
    if tool not in TOOLS:
        raise ValueError(f"--from {tool!r}: expected one of {', '.join(TOOLS)}")
    modname, clock, kind, _display = TOOLS[tool]
    reader = importlib.import_module(f"inferledger.collectors.peers.{modname}")
    path, out = Path(path), Path(out)
    check_new_run_dir(out)
    srv = peer_join.load(server) if server is not None else None
    reqs, errors, meta = reader.read(path)
    if errors and not lenient:
        raise PeerRecordsError(errors)
    version = meta.get("version") or tool_version  # what the output records wins over what is said
    if tool_version and meta.get("version") and tool_version != meta["version"]:
        meta["tool_version_given"] = tool_version
    reporter = f"{tool}-{version or 'unknown'}"
    run_id = run_id or out.resolve().name
    res = PeerImportResult(run_id, out, tool, version, records=len(reqs) + len(errors), refused=len(errors),
                           refusals=[str(e) for e in errors])
    if tool == "vllm-bench":  # keys are dataset indexes: the prefix is found among the server's ids
        prefix, why = peer_join.index_prefix(len(reqs), srv.attempts) if srv is not None else (None, None)
        meta["request_id_prefix"] = prefix = prefix or "vllm-bench-"
        if srv is not None and prefix == "vllm-bench-":
            meta["request_id_prefix_problem"] = why
        for r in reqs:
            r.key = prefix + r.key
    ids = _unique_ids(reqs)
    gaps = [_gap(run_id, f"peer-record:{i}", "import", e.where, "that request and every figure that needs it",
                 f"fix {e.where}: field {e.field_name}", e.problem) for i, e in enumerate(errors)]
    joined_ids = {}
    if srv is not None:
        joined_ids = _join(res, reqs, ids, srv, clock, gaps, run_id, prefix_problem=meta.get("request_id_prefix_problem"))
    for r in reqs:  # chunks no join labelled: choices of unknown kinds ([]), never counted as content
        if r.chunks_kept == "choices":
            if r.chunks and all(k is not None for _t, k in r.chunks):
                r.chunks_kept = "labelled"
            else:
                r.chunks = [(t, [] if k is None else k) for t, k in r.chunks]
    src = Path(meta["file"])
    manifest = {
        "source": "peer-import", "tool": tool, "tool_version": version, "reporter": reporter,
        "command": _plain(meta.get("command")),
        "input": {"path": str(src.resolve()), "sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
                  **{k: v for k, v in meta.items() if k not in ("tool", "version", "file", "command")}},
        "counts": None,
        "join": {"key_rules": res.key_rules, "server_run": str(server) if server else None},
        "clock": {"tool_clock": clock, "kind": kind, "mapping": res.mapping},
        "server_manifest": srv.manifest if srv is not None else None,
        # what the ledger reads from a manifest (KV block bytes, SLOs) comes from the server's run
        **{k: srv.manifest[k] for k in ("model", "engine_config", "slo") if srv is not None and k in srv.manifest},
        "lenient": lenient,
        "evidence": {"events": "reported", "server_events": "as in the server run", "clock_mapping": "estimated"},
    }
    attempts = [joined_ids.get(aid, aid) for aid in ids]  # a joined request takes its server attempt's id
    with building_run_dir(out) as staging:
        _write(staging, _Tool(tool, clock, kind, reporter), reqs, attempts, srv, res, gaps, manifest)
    return res


def _plain(v):
    """A command line as the tool recorded it, kept only when it is plain JSON (no NaN, no infinity)."""
    try:
        json.dumps(v, allow_nan=False)
    except ValueError:
        return None
    return v


def _join(res: PeerImportResult, reqs, ids, srv, clock: str, gaps: list, run_id: str, *,
          prefix_problem: str | None) -> dict[str, str]:
    """Join each request to its server attempt and estimate the mapping; {tool id: server attempt id}.

    A join by position (vLLM bench's prefix + index) is kept only when it proves itself: one mapping,
    from at least MIN_JOINS of its pairs, holds for every one of them; otherwise none of it is kept."""
    pairs, joined, rules = [], {}, {}
    for r, aid in zip(reqs, ids):
        sid, rule = peer_join.match(aid, srv.attempts)
        if sid is None and prefix_problem:
            rule = f"{rule}: {prefix_problem}"
        rules[aid] = f"{r.key_rule}, {rule}"
        if sid is not None:
            joined[aid] = sid
            pairs.append((r, srv.attempts[sid]))
    mapping = peer_join.estimate(pairs, clock)
    positional = bool(pairs) and all(r.key_rule == "prefix+index" for r, _s in pairs)
    if positional and (mapping is None or mapping.offset_ns is None):
        why = f"the join by prefix + index did not prove itself: {mapping.problem}"
        for aid in joined:
            rules[aid] = f"prefix+index, refused ({why})"
        joined, pairs = {}, []
        mapping.problem, res.refused_join = why, why
    for r, aid in zip(reqs, ids):
        res.key_rules[rules[aid]] = res.key_rules.get(rules[aid], 0) + 1
        if aid in joined:
            if positional:
                peer_join.relabel_by_writes(r, srv.attempts[joined[aid]])
            continue
        gaps.append(_gap(run_id, f"peer-join:{aid}", "attempt", aid, "the server's account of this request",
                         f"a server attempt with id {aid!r} ({r.key_rule})", f"{r.where}: {rules[aid]}"))
    res.joined, res.unjoined = len(joined), len(reqs) - len(joined)
    res.mapping = mapping.as_dict() if mapping else None
    if mapping is None or mapping.offset_ns is None:
        why = "no request joined" if mapping is None else mapping.problem
        gaps.append(_gap(run_id, "peer-clock", "run", clock, "every difference between the tool's and the "
                         "server's timestamps", f"a mapping {clock} -> server clock", why))
    return joined


def _write(out: Path, tool: _Tool, reqs, attempts: list[str], srv, res: PeerImportResult, gaps: list,
           manifest: dict) -> None:
    run_id, clock, reporter = res.run_id, tool.clock, tool.reporter
    with RunWriter(out, run_id) as w:
        w.clock_domain(clock, host=clock.split(":", 1)[1], kind=tool.clock_kind)
        seq = 0
        for r, attempt in zip(reqs, attempts):
            for i, row in enumerate(events_of(r, attempt_id=attempt, clock=clock, host=clock.split(":", 1)[1],
                                              reporter=reporter)):
                w.emit({**row, "run_id": run_id, "event_id": f"{tool.name}:{attempt}:{i}", "seq": seq,
                        "task_id": None, "session_id": None, "step_id": None, "value": None,
                        "attrs": json.dumps(row["attrs"], separators=(",", ":"), sort_keys=True)})
                seq += 1
                res.events += 1
        if srv is not None:
            for t in srv.events:
                for row in t.to_pylist():
                    w.emit({**row, "run_id": run_id})
                    res.server_events += 1
            for t in srv.samples:
                for row in t.to_pylist():
                    w.sample(**{k: v for k, v in row.items() if k != "run_id"})
            for c in srv.clocks:
                if c.get("from_clock") is None:
                    w.clock_domain(c["clock"], host=c.get("host"), kind=c.get("kind"))
                else:
                    w.clock_map(c["from_clock"], c["to_clock"], c["offset_ns"], c["epsilon_ns"], c.get("method"))
            for t in srv.tasks:  # the server run's task contracts, unchanged
                w.task(t["task_id"], deadline_ms=t.get("deadline_ms"), max_attempts=t.get("max_attempts"),
                       required=json.loads(t["required"]) if t.get("required") else None,
                       on_missing=t.get("on_missing"), expected=t.get("expected"),
                       contract=json.loads(t["contract"]) if t.get("contract") else None)
            gaps += [{**g, "run_id": run_id} for g in srv.gaps]
            m = res.mapping
            if m and m.get("offset_ns") is not None:
                w.clock_map(clock, m["to_clock"], m["offset_ns"], m["epsilon_ns"],
                            f"estimated from the join of {m['n']} requests (sent before received, first "
                            "chunk after first write)")
    write_table_atomic(pa.Table.from_pylist(gaps, schema=GAP_SCHEMA), out / "gaps.parquet")
    manifest["counts"] = {k: getattr(res, k) for k in ("records", "events", "refused", "joined", "unjoined",
                                                         "server_events")}
    w.write_manifest(manifest)


__all__ = ["TOOLS", "OutDirError", "PeerImportResult", "PeerRecordsError", "RunExistsError", "import_peer"]
