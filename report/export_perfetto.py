"""A run as a Chrome trace-event JSON file that ui.perfetto.dev (and chrome://tracing) opens.

Layout: one process per time axis. The reference clock and every clock the ledger maps onto it share
process 1 (mapped points converted by the `clocks` mapping, as the ledger converts them); each clock
with no mapping gets its own process with its own time origin, named as such, so unmapped domains
never share an axis. In a process: a thread per attempt and stream (client, server, engine, link,
explicit spans) whose intervals are complete ("X") slices, overlapping spans pushed to extra threads
so slices nest; an "engine steps" thread; counter tracks ("C") for KV blocks and every other sample
metric; a flow ("s" → "f") from the client's attempt.sent to the server's receipt. Timestamps are
µs from the axis origin as floats, so nanoseconds survive as the fractional part.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from inferledger.report.clocks import build_timebase

STREAM_ORDER = {"client": 0, "link": 1, "server": 2, "engine": 3}
INSTANTS = ("attempt.cancel", "attempt.timeout", "attempt.error", "engine.preempted", "engine.cancel_received",
            "engine.cancel_effective", "server.disconnect", "server.rejected")
OUTPUT_EVENTS = {"attempt.chunk": "client", "server.write": "server", "engine.token": "engine"}
MAX_OUTPUT_INSTANTS = 200_000  # beyond this the per-token instants are left out (metadata says so)


class _Axes:
    """pid per time axis; ts in µs from that axis's origin."""

    def __init__(self, rv) -> None:
        self.tb = build_timebase(rv.led)
        clocks = [c for (c,) in rv.all("SELECT DISTINCT clock FROM events WHERE clock IS NOT NULL "
                                       "UNION SELECT DISTINCT clock FROM samples WHERE clock IS NOT NULL ORDER BY 1")]
        mins = dict(rv.all("SELECT clock, min(ts_ns) FROM (SELECT clock, ts_ns FROM events UNION ALL "
                           "SELECT clock, ts_ns FROM samples) GROUP BY clock"))
        self.pid: dict[str, int] = {}
        self.origin: dict[str, int] = {}
        self.offset: dict[str, int] = {}
        self.names: dict[int, str] = {}
        ref = self.tb.ref
        mapped = [c for c in clocks if self.tb.aligned(c)]
        for c in mapped:
            self.pid[c], self.origin[c], self.offset[c] = 1, self.tb.origin_ns, self.tb.offset(c)
        if ref is not None:
            others = [c for c in mapped if c != ref]
            self.names[1] = f"clock {ref}" + (f" (+ mapped: {', '.join(others)})" if others else "")
        for c in clocks:
            if c not in self.pid:
                self.pid[c], self.origin[c], self.offset[c] = len(self.names) + 1, mins.get(c) or 0, 0
                self.names[self.pid[c]] = f"clock {c}: no mapping to {ref}, own time origin (not aligned)"

    def us(self, ns: int, clock: str) -> float:
        return (ns + self.offset[clock] - self.origin[clock]) / 1000.0


class _Trace:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.tids: dict[tuple[int, str], int] = {}
        self.sort: dict[tuple[int, int], int] = {}

    def tid(self, pid: int, name: str, sort: int) -> int:
        key = (pid, name)
        if key not in self.tids:
            self.tids[key] = len(self.tids) + 1
            self.sort[(pid, self.tids[key])] = sort
        return self.tids[key]

    def metadata(self, names: dict[int, str]) -> list[dict]:
        meta = []
        for pid, name in sorted(names.items()):
            meta.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}})
            meta.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": pid}})
        for (pid, name), tid in self.tids.items():
            meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
            meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                         "args": {"sort_index": self.sort[(pid, tid)]}})
        return meta


def _lanes(items: list[tuple]) -> list[int]:
    """Lane per (start, end, on_path): on-path slices first, each into the first lane it does not
    partially overlap (disjoint or nested), so every lane nests."""
    lanes: list[list[tuple]] = []
    out = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (not items[i][2], items[i][0], -items[i][1])):
        s, e, _ = items[i]
        for k, lane in enumerate(lanes):
            if all(e2 <= s or e <= s2 or (s2 <= s and e <= e2) or (s <= s2 and e2 <= e) for s2, e2 in lane):
                lane.append((s, e))
                out[i] = k
                break
        else:
            lanes.append([(s, e)])
            out[i] = len(lanes) - 1
    return out


def build_trace(rv) -> dict:
    ax, tr = _Axes(rv), _Trace()
    order = {aid: i for i, (aid,) in enumerate(rv.all(
        "SELECT attempt_id FROM attempts ORDER BY coalesce(sent_ns, enqueued_ns), attempt_id"))}
    lane_tid: dict[tuple[str, str], tuple[int, int]] = {}  # (attempt, stream) -> its main lane
    per: dict[tuple[str, str, int], list[tuple]] = defaultdict(list)
    for row in rv.all("SELECT attempt_id, stream, name, kind, clock, start_ns, end_ns, label, eps_ms, on_path, "
                      "start_event, end_event FROM intervals WHERE start_ns IS NOT NULL ORDER BY ALL"):
        clock = row[4]
        per[(row[0], row[1], ax.pid[clock])].append((ax.us(row[5], clock), ax.us(row[6], clock), row))
    for (aid, stream, pid), rows in per.items():
        lanes = _lanes([(t0, t1, bool(r[9])) for t0, t1, r in rows])
        for (t0, t1, r), lane in zip(rows, lanes):
            name, kind, clock, label, eps, on_path, se, ee = r[2], r[3], r[4], r[7], r[8], r[9], r[10], r[11]
            tname = f"{aid} · {stream}" + (f" (overlap {lane})" if lane else "")
            tid = tr.tid(pid, tname, order.get(aid, 0) * 100 + STREAM_ORDER.get(stream, 5) * 10 + lane)
            if lane == 0:
                lane_tid[(aid, stream)] = (pid, tid)
            args = {"attempt_id": aid, "label": label, "eps_ms": eps, "on_path": bool(on_path),
                    "start_event": se, "end_event": ee, "clock": clock}
            if r[6] < r[5]:  # a derived interval below zero within its epsilon: drawn as zero length
                args["dur_ms"] = (r[6] - r[5]) / 1e6
            tr.events.append({"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": f"{stream},{kind}",
                              "ts": t0, "dur": max(0, r[6] - r[5]) / 1000.0, "args": args})
    _task_spans(rv, ax, tr, len(order))
    _flows(rv, ax, tr, lane_tid)
    _instants(rv, ax, tr, lane_tid)
    n_out = _outputs(rv, ax, tr, lane_tid)
    _steps(rv, ax, tr)
    _counters(rv, ax, tr)
    meta = {"run": rv.name, "generator": "inferledger export --as perfetto", "reference_clock": ax.tb.ref,
            "axes": {ax.names[p]: {"pid": p, "origin_ns": str(o)} for c, p in ax.pid.items()
                     for o in [ax.origin[c]]},
            "output_event_instants": n_out}
    tr.events.sort(key=lambda e: e["ts"])  # stable: a flow's "s" stays before its "f" at equal times
    return {"traceEvents": tr.metadata(ax.names) + tr.events, "displayTimeUnit": "ns", "metadata": meta}


def _task_spans(rv, ax, tr, n_attempts: int) -> None:
    """Spans and tool calls a task logged without an attempt id (paired as the critical path pairs them)."""
    rows = rv.all(
        "WITH s AS (SELECT task_id, coalesce(json_extract_string(attrs, '$.span'), json_extract_string(attrs, '$.tool'), "
        "  'tool') AS span, name LIKE 'tool.%' AS tool, name IN ('span.start', 'tool.start') AS is_start, "
        "  coalesce(json_extract_string(attrs, '$.stream'), CASE WHEN name LIKE 'tool.%' THEN 'tool' ELSE source END) "
        "  AS stream, ts_ns, clock, seq, event_id FROM events WHERE task_id IS NOT NULL AND attempt_id IS NULL "
        "  AND name IN ('span.start', 'span.end', 'tool.start', 'tool.end')), "
        "n AS (SELECT *, row_number() OVER (PARTITION BY task_id, tool, span, is_start ORDER BY ts_ns, seq, event_id) "
        "  AS k FROM s) "
        "SELECT a.task_id, a.stream, a.span, a.tool, a.ts_ns, a.clock, b.ts_ns, b.clock FROM n a JOIN n b "
        "ON b.task_id = a.task_id AND b.tool = a.tool AND b.span = a.span AND b.k = a.k AND NOT b.is_start "
        "WHERE a.is_start AND b.ts_ns >= a.ts_ns ORDER BY a.task_id, a.ts_ns, a.span")
    per: dict[tuple, list] = defaultdict(list)
    for task, stream, span, tool, s_ns, s_clock, e_ns, e_clock in rows:
        if ax.pid[s_clock] == ax.pid[e_clock]:
            per[(task, stream, ax.pid[s_clock])].append((ax.us(s_ns, s_clock), ax.us(e_ns, e_clock), span, tool))
    for i, ((task, stream, pid), items) in enumerate(per.items()):
        for (t0, t1, span, tool), lane in zip(items, _lanes([(a, b, True) for a, b, _s, _t in items])):
            tid = tr.tid(pid, f"task {task} · {stream}" + (f" ({lane})" if lane else ""), (n_attempts + i) * 100 + lane)
            tr.events.append({"ph": "X", "pid": pid, "tid": tid, "name": span, "cat": "tool" if tool else "span",
                              "ts": t0, "dur": t1 - t0, "args": {"task_id": task}})


def _flows(rv, ax, tr, lane_tid) -> None:
    rows = rv.all(
        "SELECT attempt_id, arg_min(ts_ns, (ts_ns, seq)) FILTER (WHERE name = 'attempt.sent'), "
        "arg_min(clock, (ts_ns, seq)) FILTER (WHERE name = 'attempt.sent'), "
        "arg_min(ts_ns, (name <> 'server.received', ts_ns, seq)) FILTER (WHERE name IN ('server.received', 'engine.enqueued')), "
        "arg_min(clock, (name <> 'server.received', ts_ns, seq)) FILTER (WHERE name IN ('server.received', 'engine.enqueued')) "
        "FROM events WHERE name IN ('attempt.sent', 'server.received', 'engine.enqueued') AND attempt_id IS NOT NULL "
        "GROUP BY attempt_id ORDER BY attempt_id")
    flow_id = 0
    for aid, s_ns, s_clock, r_ns, r_clock in rows:
        src, dst = lane_tid.get((aid, "client")), lane_tid.get((aid, "server")) or lane_tid.get((aid, "engine"))
        if None in (s_ns, r_ns, src, dst) or not (ax.pid[s_clock] == src[0] == dst[0] == ax.pid[r_clock]):
            continue  # no common axis: a flow would draw an arrow between unaligned clocks
        t0, t1 = ax.us(s_ns, s_clock), ax.us(r_ns, r_clock)
        if t1 < t0:
            continue  # the mapping's error exceeds the uplink: no arrow pointing back in time
        flow_id += 1
        common = {"cat": "flow", "name": "request", "id": flow_id, "pid": src[0]}
        tr.events.append({**common, "ph": "s", "tid": src[1], "ts": t0, "args": {"attempt_id": aid}})
        tr.events.append({**common, "ph": "f", "bp": "e", "tid": dst[1], "ts": t1, "args": {"attempt_id": aid}})


def _instants(rv, ax, tr, lane_tid) -> None:
    names = ", ".join(f"'{n}'" for n in INSTANTS)
    for aid, name, source, ns, clock, value in rv.all(
            f"SELECT attempt_id, name, source, ts_ns, clock, value FROM events WHERE name IN ({names}) "
            "AND attempt_id IS NOT NULL ORDER BY ALL"):
        stream = "client" if source == "client" else "server" if name.startswith("server.") else "engine"
        lane = lane_tid.get((aid, stream))
        if lane is None or lane[0] != ax.pid[clock]:
            continue
        tr.events.append({"ph": "i", "s": "t", "pid": lane[0], "tid": lane[1], "name": name, "ts": ax.us(ns, clock),
                          "args": {"attempt_id": aid, "value": value}})


def _outputs(rv, ax, tr, lane_tid) -> int:
    n = rv.one("SELECT count(*) FROM events WHERE name IN ('attempt.chunk', 'server.write', 'engine.token')")[0]
    if n > MAX_OUTPUT_INSTANTS:
        return 0
    for aid, name, ns, clock, value in rv.all(
            "SELECT attempt_id, name, ts_ns, clock, value FROM events WHERE name IN ('attempt.chunk', 'server.write', "
            "'engine.token') AND attempt_id IS NOT NULL ORDER BY ALL"):
        lane = lane_tid.get((aid, OUTPUT_EVENTS[name]))
        if lane is not None and lane[0] == ax.pid[clock]:
            tr.events.append({"ph": "i", "s": "t", "pid": lane[0], "tid": lane[1], "name": name,
                              "ts": ax.us(ns, clock), "args": {"value": value}})
    return n


def _steps(rv, ax, tr) -> None:
    rows = rv.all(
        "SELECT s.step_id, s.clock, s.ts_ns, e.ts_ns, s.attrs, e.value FROM events s JOIN events e "
        "ON e.name = 'step.end' AND e.step_id = s.step_id AND e.clock = s.clock AND e.source = s.source "
        "WHERE s.name = 'step.start' AND e.ts_ns >= s.ts_ns ORDER BY s.clock, s.ts_ns")
    for step, clock, t0, t1, attrs, tokens in rows:
        pid = ax.pid[clock]
        tid = tr.tid(pid, "engine steps", -1)
        try:
            args = json.loads(attrs) if attrs else {}
        except ValueError:
            args = {"attrs": attrs}
        args.update(step_id=step, tokens=tokens)
        tr.events.append({"ph": "X", "pid": pid, "tid": tid, "name": f"step {step}", "cat": "engine",
                          "ts": ax.us(t0, clock), "dur": (t1 - t0) / 1000.0, "args": args})
    for step, clock, t0, attrs in rv.all("SELECT step_id, clock, ts_ns, attrs FROM events WHERE name = 'device.step' "
                                         "ORDER BY clock, ts_ns"):
        end = (json.loads(attrs or "{}") or {}).get("end_ns")
        if isinstance(end, int) and end >= t0:
            tid = tr.tid(ax.pid[clock], "device", -2)
            tr.events.append({"ph": "X", "pid": ax.pid[clock], "tid": tid, "name": f"device step {step}",
                              "cat": "device", "ts": ax.us(t0, clock), "dur": (end - t0) / 1000.0, "args": {}})


def _counters(rv, ax, tr) -> None:
    """KV blocks as one counter track (used / cached / free series); every other metric its own track."""
    rows = rv.all("SELECT clock, host, metric, unit, ts_ns, value FROM samples WHERE value IS NOT NULL "
                  "AND isfinite(value) ORDER BY clock, host, metric, ts_ns")
    kv: dict[tuple, dict] = defaultdict(dict)
    for clock, host, metric, unit, ns, value in rows:
        if metric.startswith("kv_blocks_"):
            kv[(clock, host, ns)][metric.removeprefix("kv_blocks_")] = float(value)
            continue
        tr.events.append({"ph": "C", "pid": ax.pid[clock], "tid": 0, "name": f"{metric} ({unit or '-'}) · {host}",
                          "ts": ax.us(ns, clock), "args": {"value": float(value)}})
    for (clock, host, ns), series in kv.items():
        tr.events.append({"ph": "C", "pid": ax.pid[clock], "tid": 0, "name": f"KV blocks · {host}",
                          "ts": ax.us(ns, clock), "args": series})


def write_trace(rv, path) -> dict:
    trace = build_trace(rv)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f, separators=(",", ":"), allow_nan=False)
    counts = defaultdict(int)
    for e in trace["traceEvents"]:
        counts[e["ph"]] += 1
    return dict(counts)
