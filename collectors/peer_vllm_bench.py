"""vLLM bench (`vllm bench serve --save-result --save-detailed`) result JSON -> PeerRequest.

The detailed result holds parallel lists, one entry per request in dataset order: `start_times`
(time.perf_counter() seconds: a clock of its own, `perf:vllm-bench`), `ttfts`, `itls` (a list per
request), `latencies` (seconds), `input_lens`, `output_lens` (usage, else re-tokenised), `errors`.
There are no ids in it, although vLLM bench sent `x-request-id` = prefix + index: the key of request
i is its index, and the join (collectors/peer_join.py `index_prefix`) finds the prefix among the
server's attempt ids. vLLM bench keeps every message with `choices` (its TTFT is taken at the first,
the role chunk for openai-chat) but not which of them carry content: the chunks are `choices` of
unknown kinds until the join labels them from the server's writes.
"""
from __future__ import annotations

from pathlib import Path

from inferledger.collectors.peer_records import PeerRequest, RecordError, read_json_document, seconds_to_ns

TOOL = "vllm-bench"
LISTS = ("start_times", "ttfts", "itls", "latencies", "output_lens")
NUM = (int, float)


def find_result(path: Path) -> Path:
    if path.is_dir():
        found = [p for p in sorted(path.glob("*.json")) if '"start_times"' in p.read_text()[:10_000_000]]
        if not found:
            raise FileNotFoundError(f"{path}: no vLLM bench result with per-request lists (--save-detailed) here")
        return found[0]
    return path


def _num(v, where: str, name: str):
    if isinstance(v, bool) or not isinstance(v, NUM) or v != v:
        raise RecordError(where, name, f"must be a number, got {type(v).__name__} {str(v)[:40]!r}")
    return v


def _request(doc: dict, i: int, where: str) -> PeerRequest:
    error = (doc.get("errors") or [""] * (i + 1))[i] if isinstance(doc.get("errors"), list) else ""
    start = _num(doc["start_times"][i], where, f"start_times[{i}]")
    req = PeerRequest(key=str(i), where=where, key_rule="prefix+index", sent_ns=seconds_to_ns(start),
                      chunks_kept="choices")
    ttft, latency = doc["ttfts"][i], doc["latencies"][i]
    itls, n = doc["itls"][i], doc["output_lens"][i]
    if error or not ttft:
        req.status, req.error = "error", str(error or "no chunk with choices")
        req.end_ns = req.sent_ns + seconds_to_ns(_num(latency, where, f"latencies[{i}]")) if latency else None
        return req
    ttft = _num(ttft, where, f"ttfts[{i}]")
    if not isinstance(itls, list):
        raise RecordError(where, f"itls[{i}]", f"must be a list of seconds, got {type(itls).__name__}")
    t = req.sent_ns + seconds_to_ns(ttft)
    req.chunks.append((t, None))
    for j, gap in enumerate(itls):
        t += seconds_to_ns(_num(gap, where, f"itls[{i}][{j}]"))
        req.chunks.append((t, None))
    # latency ends at the last message with choices (0.32): the same instant, re-derived for the check
    req.end_ns = req.sent_ns + seconds_to_ns(_num(latency, where, f"latencies[{i}]"))
    if isinstance(n, bool) or not isinstance(n, int):
        raise RecordError(where, f"output_lens[{i}]", f"must be an integer, got {n!r}")
    req.tool_output_tokens, req.token_rule = n, "usage, else re-tokenised (vLLM bench)"
    req.figures = {"ttft_s": ttft, "latency_s": latency, "n_itls": len(itls), "output_len": n,
                   "input_len": (doc.get("input_lens") or [None] * (i + 1))[i]}
    return req


def read(path: Path) -> tuple[list[PeerRequest], list[RecordError], dict]:
    path = find_result(path)
    doc = read_json_document(path)
    if not isinstance(doc, dict):
        raise RecordError(f"{path}:1", "(document)", "not a vLLM bench result object")
    for name in LISTS:
        if not isinstance(doc.get(name), list):
            raise RecordError(f"{path}:$.{name}", name, "missing: save the result with --save-result --save-detailed")
    n = len(doc["start_times"])
    for name in LISTS:
        if len(doc[name]) != n:
            raise RecordError(f"{path}:$.{name}", name, f"has {len(doc[name])} entries, start_times has {n}")
    reqs, errors = [], []
    for i in range(n):
        where = f"{path}:$.start_times[{i}]"
        try:
            reqs.append(_request(doc, i, where))
        except RecordError as exc:
            errors.append(exc)
    meta = {"tool": TOOL, "version": doc.get("vllm_version") or doc.get("version"), "file": str(path),
            "command": doc.get("command") or doc.get("args"),
            "summary": {k: doc.get(k) for k in doc if k.startswith(("mean_", "median_", "p50_", "p90_", "p99_"))}}
    return reqs, errors, meta
