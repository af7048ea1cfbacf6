"""The per-request timeline: one row per attempt (client stream behind, engine stream in front), arrival
markers, prefill chunks, preemptions and cancellations, drawn from `intervals` and `events` on one
clock axis (report/clocks.py), grouped by replica (a deployment's run), task class and outcome with the
slowest first in each group (`arrange`). A big run is drawn as attempts-per-stage over time for every attempt plus the rows of a sample
(the slowest, the abnormal, and an even spread by arrival); docs/REPORT.md.
"""
from __future__ import annotations

import numpy as np

from inferledger.report.page import esc

# Colours follow the book's timelines: prefill blue, decode green, queue grey.
STATE_COLORS = {
    "queue": "#9e9e9e", "prefill": "#1f77b4", "recompute": "#6baed6", "decode": "#2ca02c", "preempted": "#ff7f0e",
    "cancelling": "#d62728", "releasing": "#e377c2", "sample": "#17becf", "await_first_write": "#bcbd22",
    "stream": "#74c476", "finalize": "#8c564b", "front_end": "#dadaeb", "client_queue": "#c7c7c7",
    "await_first_byte": "#bcbddc", "await_first_content": "#9e9ac8", "await_first_visible": "#807dba",
    "uplink": "#f7b6d2", "downlink_first": "#c5b0d5", "unattributed": "#ffffff",
}
MARKERS = {  # event name -> (label, plotly symbol, colour)
    "arrival": ("arrival", "triangle-right", "#000000"),
    "engine.prefill": ("prefill chunk", "line-ns-open", "#08306b"),
    "engine.preempted": ("preempted", "diamond", "#ff7f0e"),
    "attempt.cancel": ("client cancel", "x", "#d62728"),
    "engine.cancel_received": ("engine cancel received", "x-thin-open", "#d62728"),
    "attempt.timeout": ("client timeout", "x", "#7f0000"),
    "attempt.error": ("client error", "x", "#7f0000"),
}
DENSE_ROWS = 60  # above this many rows: no row labels, no bar outlines, smaller markers
OVERVIEW_STREAMS = {"client": (0.8, 0.45), "engine": (0.42, 1.0)}  # stream -> (bar width, opacity)


# an attempt's outcome in the timeline's groups: its client status, else (no client events) its server status
OUTCOME_ORDER = ("completed", "timeout", "cancelled", "error", "unterminated", "in_flight")


def attempt_index(rv, tb) -> list[dict]:
    """Every attempt with where it starts on the axis, its group (replica, task class, outcome) and what makes it
    interesting; `e2e` is how long it took: the client's E2E, else the client's span to its terminal event,
    else the server's E2E."""
    rows = rv.all("WITH cls AS (SELECT task_id, arg_min(json_extract_string(attrs, '$.task_class'), (ts_ns, seq)) AS cls "
                  "FROM events WHERE name = 'task.start' AND task_id IS NOT NULL GROUP BY task_id) "
                  "SELECT a.attempt_id, a.sent_ns, a.client_clock, a.enqueued_ns, a.server_clock, a.client_status, "
                  "a.server_status, coalesce(r.e2e_client_ms, r.client_span_ms, r.e2e_server_ms), r.ttft_client_ms, "
                  "cls.cls, a.replica_id FROM attempts a JOIN request_metrics r USING (attempt_id) LEFT JOIN cls ON cls.task_id = a.task_id")
    out = []
    for aid, sent, cc, enq, sc, cs, ss, e2e, ttft, cls, replica in rows:
        t = tb.ms(sent, cc)
        t = tb.ms(enq, sc) if t is None else t
        abnormal = cs not in (None, "completed") or ss not in ("completed", "unknown")
        out.append({"id": aid, "t": t, "e2e": e2e, "ttft": ttft, "abnormal": abnormal, "cls": cls, "replica": replica,
                    "outcome": cs if cs is not None else f"server {ss}"})
    out.sort(key=lambda a: (a["t"] is None, a["t"] or 0.0, a["id"]))
    return out


def _group_key(key: tuple) -> tuple:
    replica, cls, outcome = key
    rank = OUTCOME_ORDER.index(outcome) if outcome in OUTCOME_ORDER else len(OUTCOME_ORDER)
    return replica is None, replica or "", cls is None, cls or "", rank, outcome


def group_label(replica: str | None, cls: str | None, outcome: str, replicas: bool) -> str:
    """`replicas`: the run has them (a deployment's capture), so every label names one ('(no replica)'
    for an attempt none served); a run of one server names none."""
    where = f"{replica or '(no replica)'} · " if replicas else ""
    return f"{where}{cls or '(no class)'} · {outcome}"


def arrange(atts: list[dict], sample: list[tuple[str, str]]) -> dict:
    """The timeline's rows: the drawn attempts grouped by replica where the run has replicas, then task
    class, then outcome (OUTCOME_ORDER), and in
    each group the slowest first (`orders["slowest"]`, by `e2e`, unknown last) or in arrival order
    (`orders["arrival"]`); `groups`: each group's label, first row and size (the same in both orders);
    `sent`: each one's send on the run's axis (ms; its enqueue without a send; None where neither is on it)."""
    drawn = {aid for aid, _ in sample}
    groups: dict[tuple, list[dict]] = {}
    for a in atts:  # arrival order
        if a["id"] in drawn:
            groups.setdefault((a.get("replica"), a["cls"], a["outcome"]), []).append(a)
    out = {"groups": [], "orders": {"slowest": [], "arrival": []},
           "sent": {a["id"]: a["t"] for a in atts if a["id"] in drawn}}
    replicas = any(a.get("replica") is not None for a in atts)
    for key in sorted(groups, key=_group_key):
        members = groups[key]
        out["groups"].append({"label": group_label(*key, replicas), "first": len(out["orders"]["slowest"]), "n": len(members)})
        out["orders"]["slowest"] += [a["id"] for a in sorted(
            members, key=lambda a: (a["e2e"] is None, -(a["e2e"] or 0.0), a["id"]))]
        out["orders"]["arrival"] += [a["id"] for a in members]
    return out


def choose_sample(atts: list[dict], limit: int) -> list[tuple[str, str]]:
    """(attempt id, why chosen), in arrival order: all of them when they fit, else a sample."""
    if len(atts) <= limit:
        return [(a["id"], "all attempts drawn") for a in atts]
    why: dict[str, str] = {}

    def take(items, n, reason):
        for a in items:
            if n <= 0:
                break
            if a["id"] not in why:
                why[a["id"]] = reason
                n -= 1

    take(sorted((a for a in atts if a["e2e"] is not None), key=lambda a: -a["e2e"]), max(1, limit // 5),
         "slowest end to end")
    take(sorted((a for a in atts if a["ttft"] is not None), key=lambda a: -a["ttft"]),
         min(max(1, limit // 8), limit - len(why)), "slowest TTFT")
    take((a for a in atts if a["abnormal"]), min(max(1, limit // 8), limit - len(why)), "not completed on every layer")
    rest = [a for a in atts if a["id"] not in why]
    room = limit - len(why)
    if room > 0 and rest:
        step = len(rest) / room
        take((rest[int(i * step)] for i in range(room)), room, "even spread by arrival")
    return [(a["id"], why[a["id"]]) for a in atts if a["id"] in why]


def _arrivals(rv, ids: list[str]) -> list[tuple]:
    return rv.all(
        "WITH s AS (SELECT unnest($ids::VARCHAR[]) AS attempt_id), "
        "ap AS (SELECT task_id, arg_min(ts_ns, (ts_ns, seq)) AS ns, arg_min(clock, (ts_ns, seq)) AS clock "
        "       FROM events WHERE name = 'arrival.planned' AND task_id IS NOT NULL GROUP BY task_id), "
        "cr AS (SELECT attempt_id, arg_min(ts_ns, (ts_ns, seq)) AS ns, arg_min(clock, (ts_ns, seq)) AS clock FROM events "
        "       WHERE name IN ('attempt.created', 'attempt.sent') AND attempt_id IN (SELECT attempt_id FROM s) "
        "       GROUP BY attempt_id) "
        "SELECT s.attempt_id, coalesce(ap.ns, cr.ns), CASE WHEN ap.ns IS NOT NULL THEN ap.clock ELSE cr.clock END "
        "FROM s JOIN attempts a USING (attempt_id) LEFT JOIN ap ON ap.task_id = a.task_id LEFT JOIN cr USING (attempt_id)",
        {"ids": ids})


def gantt(rv, tb, sample: list[tuple[str, str]], rows: dict) -> tuple[dict, dict]:
    """The row-per-attempt figure, its rows as `arrange` orders them (the slowest first in each group), and
    what it left out (intervals on a clock that does not map)."""
    ids = rows["orders"]["slowest"]
    row_of = {aid: i for i, aid in enumerate(ids)}
    reason = dict(sample)
    group_of = {aid: g["label"] for g in rows["groups"] for aid in ids[g["first"]:g["first"] + g["n"]]}
    ivs = rv.all("SELECT attempt_id, stream, name, clock, start_ns, end_ns, label, eps_ms FROM intervals "
                 "WHERE start_ns IS NOT NULL AND kind <> 'link' AND stream IN ('client', 'engine') "
                 "AND attempt_id IN (SELECT unnest($ids::VARCHAR[])) ORDER BY attempt_id, stream, start_ns",
                 {"ids": ids})
    traces: dict[tuple[str, str], dict] = {}
    left_out = {"intervals": 0, "clocks": set(), "unanchored": 0}
    placed = []
    for aid, stream, name, clock, s, e, label, eps in ivs:
        x0, x1 = tb.ms(s, clock), tb.ms(e, clock)
        if x0 is None:
            left_out["intervals"] += 1
            left_out["clocks"].add(clock)
            continue
        placed.append((aid, stream, name, x0, x1, label, eps))
    # each row from its attempt's send (its first drawn interval where no send is on the axis)
    off = dict(rows["sent"])
    for aid, _stream, _name, x0, *_rest in placed:
        if off.get(aid) is None or (rows["sent"].get(aid) is None and x0 < off[aid]):
            off[aid] = x0
    rows["offset"] = off
    rows["titles"] = {"sent": f"ms since each attempt was sent (enqueued, without a send; clock {tb.ref})",
                      "run": f"ms since the run's first event (clock {tb.ref})"}
    for aid, stream, name, x0, x1, label, eps in placed:
        width, opacity = OVERVIEW_STREAMS[stream]
        t = traces.setdefault((stream, name), {
            "type": "bar", "orientation": "h", "name": f"{stream}: {name}", "legendgroup": stream,
            "x": [], "base": [], "y": [], "width": width, "opacity": opacity, "customdata": [],
            "hovertext": [], "hoverinfo": "text",
            "marker": {"color": STATE_COLORS.get(name, "#aaaaaa"),
                       "line": {"width": 0.5 if len(ids) <= DENSE_ROWS else 0, "color": "#444444"}}})
        t["x"].append(round(x1 - x0, 6))
        t["base"].append(round(x0 - off[aid], 6))
        t["y"].append(row_of[aid])
        t["customdata"].append(aid)
        plus = f" ± {eps:.3f}" if eps else ""
        t["hovertext"].append(f"{esc(aid)}<br>{esc(stream)} · {esc(name)}: {x1 - x0:.3f} ms{plus} ({esc(label)})"
                              f"<br>{x0 - off[aid]:.3f} → {x1 - off[aid]:.3f} ms after its send; {x0:.3f} → {x1:.3f} "
                              f"ms on the run's axis<br>{esc(group_of[aid])}; drawn because: {esc(reason[aid])}")
    order = ["engine", "client"]
    data = [traces[k] for k in sorted(traces, key=lambda k: (order.index(k[0]), k[1]))]
    if not any(k[0] == "engine" for k in traces):  # black box: the client's view is all there is
        for t in data:
            t["opacity"] = 0.9
    data += _marker_traces(rv, tb, ids, row_of, left_out, off)
    n = len(ids)
    fig = {"data": data, "layout": {
        "barmode": "overlay", "height": max(260, min(1200, 16 * n + 160)), "hovermode": "closest",
        "margin": {"l": 120, "r": 20, "t": 30, "b": 40}, "dragmode": "zoom",
        "xaxis": {"title": {"text": esc(rows["titles"]["sent"])}, "rangeslider": {"visible": True, "thickness": 0.05}},
        # a range slider fixes the y axis unless told otherwise: rows zoom too
        "yaxis": {"autorange": "reversed", "automargin": True, "fixedrange": False, "tickmode": "array",
                  "tickvals": list(range(n)), "ticktext": [esc(a[:28]) for a in ids],
                  "tickfont": {"size": 9 if n > 40 else 11}, "showticklabels": n <= DENSE_ROWS,
                  "title": {"text": "" if n <= DENSE_ROWS else f"{n} attempts (hover for ids)"}},
        **_group_marks(rows["groups"]),
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "font": {"size": 10}}}}
    left_out["clocks"] = sorted(left_out["clocks"])
    return fig, left_out


def _group_marks(groups: list[dict]) -> dict:
    """A line above each group but the first and its label at its top left."""
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": g["first"] - 0.5,
               "y1": g["first"] - 0.5, "line": {"color": "#555555", "width": 1}} for g in groups[1:]]
    notes = [{"xref": "paper", "x": 0, "xanchor": "left", "yref": "y", "y": g["first"] - 0.5, "yanchor": "top",
              "text": esc(f"{g['label']} ({g['n']:,})"), "showarrow": False, "font": {"size": 10},
              "bgcolor": "rgba(255,255,255,0.85)"} for g in groups]
    return {"shapes": shapes, "annotations": notes}


def _marker_traces(rv, tb, ids, row_of, left_out, off) -> list[dict]:
    pts: dict[str, dict] = {}

    def add(kind, aid, ns, clock, extra=""):
        x = tb.ms(ns, clock)
        if x is not None and off.get(aid) is None:  # neither its send nor an interval of it is on the axis
            left_out["unanchored"] += 1
            return
        if x is None:
            left_out["intervals"] += 1
            left_out["clocks"].add(clock)
            return
        label, symbol, color = MARKERS[kind]
        t = pts.setdefault(kind, {"type": "scatter", "mode": "markers", "name": label, "x": [], "y": [],
                                  "customdata": [], "hovertext": [], "hoverinfo": "text",
                                  "marker": {"symbol": symbol, "size": 9 if len(ids) <= DENSE_ROWS else 5,
                                             "color": color,
                                             "line": {"width": 1.5, "color": color}}})
        t["x"].append(round(x - off[aid], 6))
        t["y"].append(row_of[aid])
        t["customdata"].append(aid)
        t["hovertext"].append(f"{esc(aid)}<br>{esc(label)} {x - off[aid]:.3f} ms after its send, at {x:.3f} ms on the "
                              f"run's axis{extra}")

    for aid, ns, clock in _arrivals(rv, ids):
        if ns is not None:
            add("arrival", aid, ns, clock)
    for aid, name, ns, clock, value in rv.all(
            "SELECT attempt_id, name, ts_ns, clock, value FROM events WHERE name IN ('engine.prefill', "
            "'engine.preempted', 'attempt.cancel', 'engine.cancel_received', 'attempt.timeout', 'attempt.error') "
            "AND attempt_id IN (SELECT unnest($ids::VARCHAR[])) ORDER BY attempt_id, ts_ns, seq", {"ids": ids}):
        add(name, aid, ns, clock, "" if value is None else f"<br>value {value:g}")
    return list(pts.values())


def aggregate(rv, tb, bins: int = 300) -> tuple[dict | None, str | None]:
    """Mean number of attempts in each state per time bin (time in state / bin width), every attempt."""
    streams = [s for (s,) in rv.all("SELECT DISTINCT stream FROM intervals WHERE stream IN ('engine', 'client')")]
    if not streams:
        return None, None
    stream = "engine" if "engine" in streams else "client"
    cols = rv.numpy("SELECT name, clock, start_ns, end_ns FROM intervals WHERE stream = ? AND kind = 'state' "
                    "AND start_ns IS NOT NULL", [stream])
    names = np.asarray(cols["name"], dtype=object)
    clocks = np.asarray(cols["clock"], dtype=object)
    s = np.asarray(cols["start_ns"], dtype=np.int64)
    e = np.asarray(cols["end_ns"], dtype=np.int64)
    off = np.array([tb.offset(c) if tb.aligned(c) else 0 for c in clocks], dtype=np.int64)
    ok = np.array([tb.aligned(c) for c in clocks], dtype=bool)
    if not ok.any():
        return None, stream
    s = (s[ok] + off[ok] - tb.origin_ns).astype(np.float64)
    e = (e[ok] + off[ok] - tb.origin_ns).astype(np.float64)
    names = names[ok]
    edges = np.linspace(s.min(), max(e.max(), s.min() + 1.0), bins + 1)
    width = edges[1] - edges[0]
    data = []
    for name in sorted(set(names), key=lambda n: list(STATE_COLORS).index(n) if n in STATE_COLORS else 99):
        m = names == name
        data.append({"type": "scatter", "mode": "lines", "stackgroup": "states", "name": name, "line": {"width": 0.5, "shape": "hv"},
                     "fillcolor": STATE_COLORS.get(name), "marker": {"color": STATE_COLORS.get(name)},
                     "x": [round(x / 1e6, 3) for x in edges[:-1]],
                     "y": [round(float(v), 4) for v in np.diff(_covered(s[m], e[m], edges)) / width]})
    fig = {"data": data, "layout": {
        "height": 320, "margin": {"l": 60, "r": 20, "t": 30, "b": 40}, "hovermode": "x unified",
        "xaxis": {"title": {"text": f"ms since the run's first event (clock {esc(tb.ref)})"},
                  "rangeslider": {"visible": True, "thickness": 0.06}},
        "yaxis": {"title": {"text": f"attempts in state ({stream} stream)"}}}}
    return fig, stream


def _covered(s: np.ndarray, e: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """I(E) = total time the intervals [s, e) cover before each edge E (exact, via sorted prefix sums)."""
    s, e = np.sort(s), np.sort(e)
    ps = np.concatenate([[0.0], np.cumsum(s)])
    pe = np.concatenate([[0.0], np.cumsum(e)])
    ks, ke = np.searchsorted(s, edges), np.searchsorted(e, edges)
    return (ks * edges - ps[ks]) - (ke * edges - pe[ke])
