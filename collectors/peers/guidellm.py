"""GuideLLM (`guidellm run ... --output kind=json`) per-request records -> PeerRequest.

GuideLLM sends no request id; each record carries the response id the server gave it
(`chatcmpl-<attempt id>` from `inferledger serve`), which is the join key. Its timings are Unix
seconds (time.time()), so its clock domain is a wall clock of the host it ran on. It keeps only the
first and the last token iteration of a stream, not every chunk: the events carry those two chunks,
and `attempt.done` says so (`attrs.chunks = "first_last"`), so no per-chunk figure is made from them.
"""
from __future__ import annotations

import json
from pathlib import Path

from inferledger.collectors.peers.records import (PeerRequest, RecordError, check_times, count, finite, need,
                                                 read_json_document, seconds_to_ns, section)

TOOL = "guidellm"
STATUSES = (("successful", "completed"), ("incomplete", "cancelled"), ("errored", "error"))
RESPONSE_PREFIXES = ("chatcmpl-", "cmpl-")


def find_output(path: Path) -> Path:
    if path.is_dir():
        found = sorted(path.glob("*.json"))
        if not found:
            raise FileNotFoundError(f"{path}: no GuideLLM JSON output (*.json) in this folder")
        return found[0]
    return path


FIGURES = ("time_to_first_token_ms", "inter_token_latency_ms", "time_per_output_token_ms", "request_latency")


def _meta(report: dict, where: str) -> tuple[str | None, object]:
    """(version, command) from the report's metadata; `metadata.version` is its schema's number, not GuideLLM's."""
    meta, args = section(report, "metadata", where), report.get("args")
    version = meta.get("guidellm_version")
    if version is not None and not isinstance(version, str):
        raise RecordError(where, "metadata.guidellm_version", f"must be a string, got {type(version).__name__}")
    if version is None:
        version = next((v for v in ((args or {}).get("version") if isinstance(args, dict) else None, meta.get("version"))
                        if isinstance(v, str)), None)
    return version, meta.get("command") or args


def _key(rec: dict, where: str) -> tuple[str, str]:
    rid = need(rec, "response_id", where, (str,), nullable=True) if "response_id" in rec else None
    if rid:
        for p in RESPONSE_PREFIXES:
            if rid.startswith(p):
                return rid[len(p):], "response id (chatcmpl-<id>)"
        return rid, "response id"
    # fallback: GuideLLM's own request id (never seen by the server): the request cannot join
    rid = need(rec, "request_id", where, (str,))
    if not rid:
        raise RecordError(where, "request_id", "empty (and no response_id)")
    return rid, "guidellm request_id (no response id: no join)"


def _request(rec: dict, where: str, status: str) -> PeerRequest:
    info = need(rec, "info", where, (dict,))
    t = need(info, "timings", where, (dict,), prefix="info.")
    num = (int, float)
    start = need(t, "request_start", where, num, prefix="info.timings.")
    end = need(t, "request_end", where, num, prefix="info.timings.", nullable=status != "completed")
    first = need(t, "first_token_iteration", where, num, prefix="info.timings.", nullable=status != "completed")
    last = need(t, "last_token_iteration", where, num, prefix="info.timings.", nullable=status != "completed")
    out = need(rec, "output_metrics", where, (dict,))
    inp = section(rec, "input_metrics", where)
    tokens = count(out.get("total_tokens"), where, "output_metrics.total_tokens", nullable=True)
    iterations = count(t.get("token_iterations"), where, "info.timings.token_iterations", nullable=True)
    prompt = count(inp.get("total_tokens"), where, "input_metrics.total_tokens", nullable=True)
    key, rule = _key(rec, where)
    req = PeerRequest(key=key, where=where, key_rule=rule, sent_ns=seconds_to_ns(start), status=status,
                      chunks_kept="first_last")
    if first is not None:
        req.chunks.append((seconds_to_ns(first), ["content"]))
    if last is not None and last != first:
        req.chunks.append((seconds_to_ns(last), ["content"]))
    req.end_ns = seconds_to_ns(end) if end is not None else None
    # GuideLLM's count: the usage it received, else one token per iteration
    req.tool_output_tokens = tokens if tokens is not None else (iterations or None)
    req.token_rule = "usage" if tokens is not None else "token iterations"
    if tokens is not None:
        req.usage = {"completion_tokens": tokens, "prompt_tokens": prompt}
    if status == "error":
        err = rec.get("error") or info.get("error") or "errored"
        req.error = (err if isinstance(err, str) else json.dumps(err))[:300]
    req.figures = {k: finite(rec[k], where, k, nullable=True) for k in FIGURES if k in rec}
    req.figures["token_iterations"] = iterations
    return check_times(req)


def read(path: Path) -> tuple[list[PeerRequest], list[RecordError], dict]:
    """Records of every benchmark in the file (one, for the command in samples/peers)."""
    path = find_output(path)
    report = read_json_document(path)
    benches = report.get("benchmarks") if isinstance(report, dict) else None
    if not isinstance(benches, list) or not benches:
        raise RecordError(f"{path}:1", "benchmarks", "missing or empty: not a GuideLLM JSON report")
    version, command = _meta(report, f"{path}:1")
    reqs, errors = [], []
    for b, bench in enumerate(benches):
        groups = bench.get("requests") if isinstance(bench, dict) else None
        if not isinstance(groups, dict):
            errors.append(RecordError(f"{path}:$.benchmarks[{b}]", "requests", "missing (run with the JSON output)"))
            continue
        for group, status in STATUSES:
            records = groups.get(group)
            if records is not None and not isinstance(records, list):
                errors.append(RecordError(f"{path}:$.benchmarks[{b}].requests", group,
                                          f"must be a list of records, got {type(records).__name__}"))
                continue
            for i, rec in enumerate(records or []):
                where = f"{path}:$.benchmarks[{b}].requests.{group}[{i}]"
                try:
                    reqs.append(_request(rec, where, status))
                except RecordError as exc:
                    errors.append(exc)
    meta = {"tool": TOOL, "version": version, "file": str(path), "command": command}
    return reqs, errors, meta
