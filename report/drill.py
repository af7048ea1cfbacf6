"""Drill-down data for single attempts: every interval of every stream, every event with its attrs (as text,
not JSON), the output events (client chunks, server writes, engine tokens) as times on the report's axis,
its four accounts, its figures and its causes of delay (attempt_causes).

The page draws one attempt at a time from this data (report/assets.py, PAGE_JS); strings travel as data and
reach the page through textContent, or escaped where plotly renders them.
"""
from __future__ import annotations

import json
from collections import defaultdict

from inferledger.report.read import num

OUTPUT_EVENTS = {"attempt.chunk": "client", "server.write": "server", "engine.token": "engine"}
METRIC_COLUMNS = ("ttft_client_ms", "ttft_first_byte_ms", "ttft_visible_ms", "ttft_server_ms", "e2e_client_ms",
                  "e2e_server_ms", "queue_ms", "prefill_ms", "decode_ms", "tpot_ms", "tpot_server_ms",
                  "itl_client_max_ms", "itl_server_max_ms", "itl_engine_max_ms", "preemptions", "recomputed_tokens",
                  "release_after_cancel_ms", "uplink_ms", "downlink_first_ms", "n_output_tokens", "n_chunks",
                  "correct", "on_time", "good", "server_evidence", "server_reporter")
# attempt_causes as the drill-down shows it: the verdict, each cause, the attempt's own work, the evidence
CAUSE_COLUMNS = ("late", "missed", "deadline_ms", "dominant_cause", "client_queue_ms", "server_queue_ms",
                 "prefill_interference_ms", "preemption_ms", "decode_stall_ms", "host_contention_ms", "transport_ms",
                 "client_ms", "spec_rejected_ms", "prefill_ms", "decode_ms", "blocked_ms", "cause_evidence")
ATTRS_CHARS = 600  # an event's attrs shown in the drill-down are cut here (the ledger keeps them whole)


def attrs_text(attrs: str | None) -> str:
    """An event's attrs for people, not JSON: `key: value; key: value`, a list's items comma-separated, an
    object inside as `(key value, key value)`; cut at ATTRS_CHARS."""
    if not attrs:
        return ""
    try:
        d = json.loads(attrs)
    except ValueError:
        text = attrs
    else:
        text = "; ".join(f"{k}: {_plain(v)}" for k, v in d.items()) if isinstance(d, dict) else _plain(d)
    return text if len(text) <= ATTRS_CHARS else text[:ATTRS_CHARS] + " …"


def _plain(v, depth: int = 0) -> str:
    if isinstance(v, dict):
        return "(" + ", ".join(f"{k} {_plain(x, depth + 1)}" for k, x in v.items()) + ")"
    if isinstance(v, list):
        inner = ", ".join(_plain(x, depth + 1) for x in v) if depth == 0 else " ".join(_plain(x, depth + 1) for x in v)
        return inner if depth == 0 else f"[{inner}]"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"{v:g}" if isinstance(v, float) else str(v)


def drill_ids(sample: list[tuple[str, str]], limit: int) -> list[str]:
    """The attempts that get a drill-down: all sampled ones when they fit, the chosen-for-a-reason first."""
    if len(sample) <= limit:
        return [aid for aid, _ in sample]
    first = [aid for aid, why in sample if why != "even spread by arrival"][: limit // 2]
    rest = [aid for aid, _ in sample if aid not in set(first)]
    step = max(1, len(rest) // max(1, limit - len(first)))
    return first + rest[::step][: limit - len(first)]


def drill(rv, tb, ids: list[str], reasons: dict[str, str]) -> list[dict]:
    if not ids:
        return []
    p = {"ids": ids}
    pick = "attempt_id IN (SELECT unnest($ids::VARCHAR[]))"
    by: dict[str, dict] = {aid: {"id": aid, "why": reasons.get(aid, ""), "iv": [], "ev": [],
                                 "out": defaultdict(list), "metrics": {}, "acct": {}, "causes": None}
                           for aid in ids}
    for aid, stream, name, kind, clock, s, e, label, eps, on_path, dur in rv.all(
            "SELECT attempt_id, stream, name, kind, clock, start_ns, end_ns, label, eps_ms, on_path, dur_ms "
            f"FROM intervals WHERE {pick} ORDER BY attempt_id, stream, start_ns NULLS LAST, name", p):
        by[aid]["iv"].append([stream, name, kind, _r(tb.ms(s, clock)), _r(tb.ms(e, clock)), label, num(eps),
                              bool(on_path), clock, num(dur)])
    for aid, name, source, ns, clock, value, attrs, eid in rv.all(
            "SELECT attempt_id, name, source, ts_ns, clock, value, attrs, event_id FROM events "
            f"WHERE {pick} AND name NOT IN ('attempt.chunk', 'server.write', 'engine.token') "
            "ORDER BY attempt_id, clock, ts_ns, seq", p):
        by[aid]["ev"].append([_r(tb.ms(ns, clock)), name, source, clock, str(ns), num(value), attrs_text(attrs), eid])
    cols = rv.all("SELECT attempt_id, name, ts_ns, clock FROM events "
                  f"WHERE {pick} AND name IN ('attempt.chunk', 'server.write', 'engine.token') "
                  "ORDER BY attempt_id, ts_ns, seq", p)
    off_axis = defaultdict(int)
    for aid, name, ns, clock in cols:
        t = tb.ms(ns, clock)
        if t is None:
            off_axis[aid] += 1
        else:
            by[aid]["out"][OUTPUT_EVENTS[name]].append(round(t, 3))
    mcols = ", ".join(METRIC_COLUMNS)
    for row in rv.all(f"SELECT attempt_id, {mcols} FROM request_metrics WHERE {pick}", p):
        by[row[0]]["metrics"] = {k: (num(v) if isinstance(v, float) else v) for k, v in zip(METRIC_COLUMNS, row[1:])}
    for aid, *acct in rv.all("SELECT attempt_id, task_id, request_id, attempt_index, client_status, server_status, "
                             f"task_outcome, resource_status FROM accounts WHERE {pick}", p):
        by[aid]["acct"] = dict(zip(("task_id", "request_id", "attempt_index", "client_status", "server_status",
                                    "task_outcome", "resource_status"), acct))
    if rv.has("attempt_causes"):
        for aid, *causes in rv.all(f"SELECT attempt_id, {', '.join(CAUSE_COLUMNS)} FROM attempt_causes WHERE {pick}", p):
            by[aid]["causes"] = {k: (num(v) if isinstance(v, float) else v) for k, v in zip(CAUSE_COLUMNS, causes)}
    for aid, d in by.items():
        d["out"] = dict(d["out"])
        d["off_axis_outputs"] = off_axis.get(aid, 0)
    return [by[aid] for aid in ids]


def _r(x):
    return None if x is None else round(x, 6)
