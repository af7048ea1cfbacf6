"""vLLM bench (`vllm bench serve --save-result --save-detailed`) result JSON -> PeerRequest.

The detailed result holds parallel lists, one entry per request in dataset order: `start_times`
(time.perf_counter() seconds: a clock of its own, `perf:vllm-bench`), `ttfts`, `itls` (a list per
request), `latencies` (seconds), `input_lens`, `output_lens` (usage, else re-tokenised), `errors`.
There are no ids in it, although vLLM bench sent `x-request-id` = prefix + index: the key of request
i is its index, and the join (collectors/peers/join.py `index_prefix`) finds the prefix among the
server's attempt ids. vLLM bench keeps every message with `choices` (its TTFT is taken at the first,
the role chunk for openai-chat) but not which of them carry content: the chunks are `choices` of
unknown kinds until the join labels them from the server's writes.
"""
from __future__ import annotations

import math
from pathlib import Path

from inferledger.collectors.peers.records import (PeerRequest, RecordError, check_times, count, finite,
                                                 read_json_document, seconds_to_ns)

TOOL = "vllm-bench"
LISTS = ("start_times", "ttfts", "itls", "latencies", "output_lens")
OPTIONAL_LISTS = ("errors", "input_lens")  # written by 0.32; when present, one entry per request too
SUMMARY_PREFIXES = ("mean_", "median_", "p50_", "p90_", "p99_")


def find_result(path: Path) -> Path:
    if path.is_dir():
        found = [p for p in sorted(path.glob("*.json")) if b'"start_times"' in p.read_bytes()[:10_000_000]]
        if not found:
            raise FileNotFoundError(f"{path}: no vLLM bench result with per-request lists (--save-detailed) here")
        return found[0]
    return path


def _request(doc: dict, i: int, where: str) -> PeerRequest:
    error = doc["errors"][i] if doc.get("errors") is not None else ""
    if error is not None and not isinstance(error, str):
        raise RecordError(where, f"errors[{i}]", f"must be a string, got {type(error).__name__}")
    start = finite(doc["start_times"][i], where, f"start_times[{i}]")
    req = PeerRequest(key=str(i), where=where, key_rule="prefix+index", sent_ns=seconds_to_ns(start),
                      chunks_kept="choices")
    ttft = finite(doc["ttfts"][i], where, f"ttfts[{i}]", nullable=True)
    latency = finite(doc["latencies"][i], where, f"latencies[{i}]", nullable=True)
    itls, n = doc["itls"][i], doc["output_lens"][i]
    input_len = count(doc["input_lens"][i], where, f"input_lens[{i}]", nullable=True) if doc.get("input_lens") is not None else None
    if error or not ttft:
        req.status, req.error = "error", str(error or "no chunk with choices")
        req.end_ns = req.sent_ns + seconds_to_ns(latency) if latency else None
        return check_times(req)
    if not isinstance(itls, list):
        raise RecordError(where, f"itls[{i}]", f"must be a list of seconds, got {type(itls).__name__}")
    t = req.sent_ns + seconds_to_ns(ttft)
    req.chunks.append((t, None))
    for j, gap in enumerate(itls):
        t += seconds_to_ns(finite(gap, where, f"itls[{i}][{j}]"))
        req.chunks.append((t, None))
    if latency is None:
        raise RecordError(where, f"latencies[{i}]", "must be a number, got null")
    # latency ends at the last message with choices (0.32): the same instant, re-derived for the check
    req.end_ns = req.sent_ns + seconds_to_ns(latency)
    n = count(n, where, f"output_lens[{i}]")
    req.tool_output_tokens, req.token_rule = n, "usage, else re-tokenised (vLLM bench)"
    req.figures = {"ttft_s": ttft, "latency_s": latency, "n_itls": len(itls), "output_len": n, "input_len": input_len}
    return check_times(req)


def _lists(doc: dict, path: Path) -> int:
    """The number of requests, once every per-request list is there with one entry each."""
    for name in LISTS:
        if not isinstance(doc.get(name), list):
            raise RecordError(f"{path}:$.{name}", name, "missing: save the result with --save-result --save-detailed")
    n = len(doc["start_times"])
    for name in LISTS + OPTIONAL_LISTS:
        v = doc.get(name)
        if name in OPTIONAL_LISTS and v is None:
            continue
        if not isinstance(v, list):
            raise RecordError(f"{path}:$.{name}", name, f"must be a list, got {type(v).__name__}")
        if len(v) != n:
            raise RecordError(f"{path}:$.{name}", name, f"has {len(v)} entries, start_times has {n}")
    return n


def read(path: Path) -> tuple[list[PeerRequest], list[RecordError], dict]:
    path = find_result(path)
    doc = read_json_document(path)
    if not isinstance(doc, dict):
        raise RecordError(f"{path}:1", "(document)", "not a vLLM bench result object")
    reqs, errors = [], []
    for i in range(_lists(doc, path)):
        where = f"{path}:$.start_times[{i}]"
        try:
            reqs.append(_request(doc, i, where))
        except RecordError as exc:
            errors.append(exc)
    version = doc.get("vllm_version") or doc.get("version")
    # the printed summary, as vLLM bench wrote it; a figure it could not compute (NaN) is unknown here
    summary = {k: v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
               for k, v in doc.items() if k.startswith(SUMMARY_PREFIXES)}
    meta = {"tool": TOOL, "version": version if isinstance(version, str) else None, "file": str(path),
            "command": doc.get("command") or doc.get("args"), "summary": summary}
    return reqs, errors, meta
