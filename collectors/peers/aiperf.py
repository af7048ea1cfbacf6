"""AIPerf (`aiperf profile`) `profile_export.jsonl` records -> PeerRequest.

One JSON object per line: `metadata` (x_request_id: the id AIPerf sent as a header, which our
server takes as the attempt id; request_start_ns / request_end_ns: Unix ns, so AIPerf's clock domain
is a wall clock) and `metrics` (each `{"value", "unit"}`: time_to_first_token, inter_chunk_latency as
a list, request_latency, output_sequence_length: AIPerf re-tokenises the text it received, so its
count is its own, carried as `reported_output_tokens`). The content chunks are rebuilt at
start + TTFT + the running sum of the inter-chunk latencies; AIPerf keeps content responses only.

A cancelled record (`was_cancelled`, AIPerf 0.13) is made when AIPerf cancels the request, and its
wall clock is read then: `request_start_ns` is the instant of the cancel, and the end is that plus
the perf-counter time from the send to the cancel. The send is therefore placed at
`request_start_ns - (request_end_ns - request_start_ns)` and the cancel at `request_start_ns`, each
where AIPerf really observed it (docs/PEERS.md "Cancelled requests").
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from inferledger.collectors.peers.records import (PeerRequest, RecordError, check_times, count, finite, need,
                                                 parse_json, section)

TOOL = "aiperf"
RECORDS = "profile_export.jsonl"
SUMMARY = "profile_export_aiperf.json"
TO_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "sec": 1_000_000_000}
TOKENS = ("output_sequence_length", "input_sequence_length", "usage_completion_tokens", "usage_prompt_tokens")
KEPT = ("time_to_first_token", "time_to_second_token", "inter_token_latency", "request_latency") + TOKENS


def find_records(path: Path) -> Path:
    if path.is_dir():
        found = sorted(path.rglob(RECORDS))
        if not found:
            raise FileNotFoundError(f"{path}: no {RECORDS} under this folder (aiperf --artifact-dir)")
        return found[0]
    return path


def _metric(metrics: dict, tag: str, where: str) -> dict | None:
    """metrics[tag] as `{"value", "unit"}`, or None when AIPerf did not write it."""
    if metrics.get(tag) is None:
        return None
    m = metrics[tag]
    need(m, "value", where, (int, float, list), prefix=f"metrics.{tag}.")
    return m


def _ns(v, scale: int, where: str, name: str) -> int:
    x = finite(v, where, name) * scale
    if not math.isfinite(x):
        raise RecordError(where, name, f"{v} overflows when converted to ns")
    return round(x)


def _time_ns(metrics: dict, tag: str, where: str, *, optional=False) -> list[int] | int | None:
    m = _metric(metrics, tag, where)
    if m is None:
        if optional:
            return None
        raise RecordError(where, f"metrics.{tag}", "missing")
    unit = need(m, "unit", where, (str,), prefix=f"metrics.{tag}.")
    if unit not in TO_NS:
        raise RecordError(where, f"metrics.{tag}.unit", f"unknown time unit {unit!r} (ns, us, ms, s)")
    name = f"metrics.{tag}.value"
    if isinstance(m["value"], list):
        return [_ns(x, TO_NS[unit], where, f"{name}[{i}]") for i, x in enumerate(m["value"])]
    return _ns(m["value"], TO_NS[unit], where, name)


def _tokens(metrics: dict, tag: str, where: str) -> int | None:
    m = _metric(metrics, tag, where)
    return None if m is None else count(m["value"], where, f"metrics.{tag}.value")


def _request(obj: dict, where: str) -> PeerRequest:
    meta = need(obj, "metadata", where, (dict,))
    metrics = section(obj, "metrics", where)
    start = need(meta, "request_start_ns", where, (int,), prefix="metadata.")
    end = need(meta, "request_end_ns", where, (int,), prefix="metadata.")
    xrid = need(meta, "x_request_id", where, (str,), prefix="metadata.")
    if not xrid:
        raise RecordError(where, "metadata.x_request_id", "empty")
    cancelled = meta.get("was_cancelled", False)
    if not isinstance(cancelled, bool):
        raise RecordError(where, "metadata.was_cancelled", f"must be true or false, got {cancelled!r}")
    err = obj.get("error")
    status = "cancelled" if cancelled else "error" if err else "completed"
    req = PeerRequest(key=xrid, where=where, key_rule="x-request-id", sent_ns=start, end_ns=end, status=status)
    if cancelled:  # the record's wall clock was read at the cancel (module docstring)
        req.sent_ns, req.end_ns = start - (end - start), start
    if status == "error":
        req.error = err if isinstance(err, str) else json.dumps(err)[:300]
    if status == "completed":
        ttft = _time_ns(metrics, "time_to_first_token", where)
        icl = _time_ns(metrics, "inter_chunk_latency", where, optional=True) or []
        if not isinstance(ttft, int):
            raise RecordError(where, "metrics.time_to_first_token.value", "must be a number, got a list")
        t = start + ttft
        req.chunks.append((t, ["content"]))
        for gap in icl if isinstance(icl, list) else [icl]:
            t += gap
            req.chunks.append((t, ["content"]))
        req.tool_output_tokens = _tokens(metrics, "output_sequence_length", where)
        req.token_rule = "re-tokenised from the text (AIPerf's tokenizer)"
        usage = _tokens(metrics, "usage_completion_tokens", where)
        if usage is not None:
            req.usage = {"completion_tokens": usage, "prompt_tokens": _tokens(metrics, "usage_prompt_tokens", where)}
    for k in KEPT:
        m = _metric(metrics, k, where)
        if m is not None:
            v = count(m["value"], where, f"metrics.{k}.value") if k in TOKENS else finite(m["value"], where, f"metrics.{k}.value")
            req.figures[k] = v
    if cancelled:
        req.figures.update(request_start_ns=start, request_end_ns=end)  # as AIPerf wrote them
    return check_times(req)


def _summary(path: Path, meta: dict) -> None:
    """Version and command line from AIPerf's summary, each checked for type."""
    s = parse_json(path.read_bytes(), path)
    where = f"{path}:1"
    if not isinstance(s, dict):
        raise RecordError(where, "(document)", f"not an AIPerf summary object (got a JSON {type(s).__name__})")
    version = s.get("aiperf_version") or section(s, "metadata", where).get("aiperf_version")
    command = section(s, "run_info", where).get("cli_command") or s.get("cli_command")
    for name, v in (("aiperf_version", version), ("run_info.cli_command", command)):
        if v is not None and not isinstance(v, str):
            raise RecordError(where, name, f"must be a string, got {type(v).__name__}")
    meta.update(version=version, command=command, summary_file=str(path))


def read(path: Path) -> tuple[list[PeerRequest], list[RecordError], dict]:
    records = find_records(path)
    reqs, errors = [], []
    for n, raw in enumerate(records.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{records}:{n}"
        try:
            obj = parse_json(raw, records, line=n, what="(line)")
            reqs.append(_request(obj, where))
        except RecordError as exc:
            errors.append(exc)
    meta = {"tool": TOOL, "version": None, "file": str(records), "command": None}
    summary = records.with_name(SUMMARY)
    if summary.exists():
        _summary(summary, meta)
    return reqs, errors, meta
