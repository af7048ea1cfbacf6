"""AIPerf (`aiperf profile`) `profile_export.jsonl` records -> PeerRequest.

One JSON object per line: `metadata` (x_request_id: the id AIPerf sent as a header, which our
server takes as the attempt id; request_start_ns / request_end_ns: Unix ns, so AIPerf's clock domain
is a wall clock) and `metrics` (each `{"value", "unit"}`: time_to_first_token, inter_chunk_latency as
a list, request_latency, output_sequence_length: AIPerf re-tokenises the text it received, so its
count is its own, carried as `reported_output_tokens`). The content chunks are rebuilt at
start + TTFT + the running sum of the inter-chunk latencies; AIPerf keeps content responses only.
"""
from __future__ import annotations

import json
from pathlib import Path

from inferledger.collectors.peer_records import PeerRequest, RecordError, need

TOOL = "aiperf"
RECORDS = "profile_export.jsonl"
SUMMARY = "profile_export_aiperf.json"
TO_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "sec": 1_000_000_000}
KEPT = ("time_to_first_token", "time_to_second_token", "inter_token_latency", "request_latency",
        "output_sequence_length", "input_sequence_length", "usage_completion_tokens", "usage_prompt_tokens")


def find_records(path: Path) -> Path:
    if path.is_dir():
        found = sorted(path.rglob(RECORDS))
        if not found:
            raise FileNotFoundError(f"{path}: no {RECORDS} under this folder (aiperf --artifact-dir)")
        return found[0]
    return path


def _metric_ns(metrics: dict, tag: str, where: str, *, optional=False) -> list[int] | int | None:
    if tag not in metrics:
        if optional:
            return None
        raise RecordError(where, f"metrics.{tag}", "missing")
    m = metrics[tag]
    value = need(m, "value", where, (int, float, list), prefix=f"metrics.{tag}.")
    unit = need(m, "unit", where, (str,), prefix=f"metrics.{tag}.")
    if unit not in TO_NS:
        raise RecordError(where, f"metrics.{tag}.unit", f"unknown time unit {unit!r} (ns, us, ms, s)")
    scale = TO_NS[unit]
    if isinstance(value, list):
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
            raise RecordError(where, f"metrics.{tag}.value", "must be a list of numbers")
        return [round(x * scale) for x in value]
    return round(value * scale)


def _request(obj: dict, where: str) -> PeerRequest:
    meta = need(obj, "metadata", where, (dict,))
    metrics = obj.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise RecordError(where, "metrics", "must be a JSON object")
    start = need(meta, "request_start_ns", where, (int,), prefix="metadata.")
    end = need(meta, "request_end_ns", where, (int,), prefix="metadata.")
    xrid = need(meta, "x_request_id", where, (str,), prefix="metadata.")
    cancelled = bool(meta.get("was_cancelled"))
    err = obj.get("error")
    status = "cancelled" if cancelled else "error" if err else "completed"
    req = PeerRequest(key=xrid, where=where, key_rule="x-request-id", sent_ns=start, end_ns=end, status=status)
    if status == "error":
        req.error = json.dumps(err)[:300] if not isinstance(err, str) else err
    if status == "completed":
        ttft = _metric_ns(metrics, "time_to_first_token", where)
        icl = _metric_ns(metrics, "inter_chunk_latency", where, optional=True) or []
        if not isinstance(icl, list):
            icl = [icl]
        t = start + ttft
        req.chunks.append((t, ["content"]))
        for gap in icl:
            t += gap
            req.chunks.append((t, ["content"]))
        osl = metrics.get("output_sequence_length")
        n = need(osl, "value", where, (int, float), prefix="metrics.output_sequence_length.") if osl else None
        req.tool_output_tokens = None if n is None else int(n)
        req.token_rule = "re-tokenised from the text (AIPerf's tokenizer)"
        usage = (metrics.get("usage_completion_tokens") or {}).get("value")
        if isinstance(usage, int):
            req.usage = {"completion_tokens": usage,
                         "prompt_tokens": (metrics.get("usage_prompt_tokens") or {}).get("value")}
    req.figures = {k: metrics[k].get("value") for k in KEPT if isinstance(metrics.get(k), dict)}
    return req


def read(path: Path) -> tuple[list[PeerRequest], list[RecordError], dict]:
    records = find_records(path)
    reqs, errors = [], []
    for n, raw in enumerate(records.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{records}:{n}"
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            errors.append(RecordError(where, "(line)", f"not JSON ({exc})"))
            continue
        try:
            reqs.append(_request(obj, where))
        except RecordError as exc:
            errors.append(exc)
    meta = {"tool": TOOL, "version": None, "file": str(records), "command": None}
    summary = records.with_name(SUMMARY)
    if summary.exists():
        try:
            s = json.loads(summary.read_text())
            meta["version"] = (s.get("aiperf_version") or (s.get("metadata") or {}).get("aiperf_version"))
            meta["command"] = (s.get("run_info") or {}).get("cli_command") or s.get("cli_command")
            meta["summary_file"] = str(summary)
        except ValueError:
            pass
    return reqs, errors, meta
