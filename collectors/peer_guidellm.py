"""GuideLLM (`guidellm run ... --output kind=json`) per-request records -> PeerRequest.

GuideLLM sends no request id; each record carries the response id the server gave it
(`chatcmpl-<attempt id>` from `inferledger serve`), which is the join key. Its timings are Unix
seconds (time.time()), so its clock domain is a wall clock of the host it ran on. It keeps only the
first and the last token iteration of a stream, not every chunk: the events carry those two chunks,
and `attempt.done` says so (`attrs.chunks = "first_last"`), so no per-chunk figure is made from them.
"""
from __future__ import annotations

from pathlib import Path

from inferledger.collectors.peer_records import PeerRequest, RecordError, need, read_json_document, seconds_to_ns

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


def version_of(report: dict) -> str | None:
    meta = report.get("metadata") or {}
    return meta.get("guidellm_version") or (report.get("args") or {}).get("version") or meta.get("version")


def _key(rec: dict, where: str) -> tuple[str, str]:
    rid = rec.get("response_id")
    if isinstance(rid, str) and rid:
        for p in RESPONSE_PREFIXES:
            if rid.startswith(p):
                return rid[len(p):], "response id (chatcmpl-<id>)"
        return rid, "response id"
    # fallback: GuideLLM's own request id (never seen by the server): the request cannot join
    return need(rec, "request_id", where, (str,)), "guidellm request_id (no response id: no join)"


def _request(rec: dict, where: str, status: str) -> PeerRequest:
    info = need(rec, "info", where, (dict,))
    t = need(info, "timings", where, (dict,), prefix="info.")
    num = (int, float)
    start = need(t, "request_start", where, num, prefix="info.timings.")
    end = need(t, "request_end", where, num, prefix="info.timings.", nullable=status != "completed")
    first = need(t, "first_token_iteration", where, num, prefix="info.timings.", nullable=status != "completed")
    last = need(t, "last_token_iteration", where, num, prefix="info.timings.", nullable=status != "completed")
    out = need(rec, "output_metrics", where, (dict,))
    inp = rec.get("input_metrics") or {}
    tokens = out.get("total_tokens")
    iterations = t.get("token_iterations")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
        raise RecordError(where, "output_metrics.total_tokens", f"must be an integer, got {tokens!r}")
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
        req.usage = {"completion_tokens": tokens, "prompt_tokens": inp.get("total_tokens")}
    if status == "error":
        req.error = str(rec.get("error") or info.get("error") or "errored")
    req.figures = {k: rec.get(k) for k in ("time_to_first_token_ms", "inter_token_latency_ms",
                                          "time_per_output_token_ms", "request_latency") if k in rec}
    req.figures["token_iterations"] = iterations
    return req


def read(path: Path) -> tuple[list[PeerRequest], list[RecordError], dict]:
    """Records of every benchmark in the file (one, for the command in samples/peers)."""
    path = find_output(path)
    report = read_json_document(path)
    benches = report.get("benchmarks") if isinstance(report, dict) else None
    if not isinstance(benches, list) or not benches:
        raise RecordError(f"{path}:1", "benchmarks", "missing or empty: not a GuideLLM JSON report")
    reqs, errors = [], []
    for b, bench in enumerate(benches):
        groups = (bench or {}).get("requests")
        if not isinstance(groups, dict):
            errors.append(RecordError(f"{path}:$.benchmarks[{b}]", "requests", "missing (run with the JSON output)"))
            continue
        for group, status in STATUSES:
            for i, rec in enumerate(groups.get(group) or []):
                where = f"{path}:$.benchmarks[{b}].requests.{group}[{i}]"
                try:
                    reqs.append(_request(rec, where, status))
                except RecordError as exc:
                    errors.append(exc)
    meta = {"tool": TOOL, "version": version_of(report), "file": str(path),
            "command": (report.get("metadata") or {}).get("command") or report.get("args")}
    return reqs, errors, meta
