"""The study report's figures (plotly JSON dicts), each drawn from ledger tables or the comparison.

- `timeline`: per run, one row per request; a bar per engine step it was in (step_attribution: blue
  prefill, green decode), a triangle at its arrival (attempts.enqueued_ns); every run on one time
  scale, in ms from the run's first arrival.
- `kv_blocks`: per run, one row per physical KV block; a bar per request's hold of it (kv_holds), so
  a block two requests share shows two bars on one row.
- `curve`: columns of a comparison table against one of its columns.
"""
from __future__ import annotations

from inferledger.report.page import esc

KIND_COLORS = {"prefill": "#1f77b4", "decode": "#2ca02c", "verify": "#ff7f0e"}
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")

STEPS_SQL = """
WITH t0 AS (SELECT min(enqueued_ns) AS ns, any_value(server_clock) AS clock FROM attempts)
SELECT s.attempt_id, s.kind, s.tokens, (s.start_ns - t0.ns) / 1e6 AS start_ms, (s.end_ns - t0.ns) / 1e6 AS end_ms
FROM step_attribution s, t0 WHERE s.clock = t0.clock ORDER BY s.attempt_id, s.start_ns"""
ARRIVALS_SQL = """
WITH t0 AS (SELECT min(enqueued_ns) AS ns FROM attempts)
SELECT attempt_id, (enqueued_ns - t0.ns) / 1e6 FROM attempts, t0 WHERE enqueued_ns IS NOT NULL ORDER BY attempt_id"""
HOLDS_SQL = """
WITH t0 AS (SELECT min(enqueued_ns) AS ns, max(server_end_ns) AS last_ns FROM attempts)
SELECT h.block, h.attempt_id, h.how, (h.start_ns - t0.ns) / 1e6, (coalesce(h.end_ns, t0.last_ns) - t0.ns) / 1e6
FROM kv_holds h, t0 ORDER BY h.block, h.start_ns"""


def _layout(height: int, **kw) -> dict:
    # the legend above the plot, not beside it: a legend at the side narrows that figure's axis, and the
    # runs' figures must share one time scale to the pixel
    return {"height": height, "margin": {"l": 70, "r": 20, "t": 40, "b": 50}, "barmode": "overlay",
            "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.0, "yanchor": "bottom"}, **kw}


def _bar(name: str, ys, starts, ends, color: str, hover: list[str], legend: bool) -> dict:
    return {"type": "bar", "orientation": "h", "name": esc(name), "y": ys, "base": starts,
            "x": [e - s for s, e in zip(starts, ends)], "marker": {"color": color, "line": {"width": 0.5, "color": "#fff"}},
            "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>", "showlegend": legend, "legendgroup": esc(name)}


def timeline_fig(title: str, steps: list[tuple], arrivals: list[tuple], x_max: float, legend: bool) -> dict:
    data = []
    for kind, color in KIND_COLORS.items():
        rows = [r for r in steps if r[1] == kind]
        if rows:
            hover = [esc(f"{r[0]} {kind} of {r[2]:g} tokens: {r[3]:.2f} → {r[4]:.2f} ms") for r in rows]
            data.append(_bar(kind, [esc(r[0]) for r in rows], [r[3] for r in rows], [r[4] for r in rows], color,
                             hover, legend))
    if arrivals:
        data.append({"type": "scatter", "mode": "markers", "name": "arrival", "y": [esc(a) for a, _ in arrivals],
                     "x": [t for _, t in arrivals], "marker": {"symbol": "triangle-right", "size": 11, "color": "#000"},
                     "hovertemplate": "%{y} arrives at %{x:.2f} ms<extra></extra>", "showlegend": legend})
    return {"data": data, "layout": _layout(
        max(200, 70 + 34 * len({r[0] for r in steps} | {a for a, _ in arrivals})), title={"text": esc(title), "font": {"size": 13}},
        xaxis={"range": [0, x_max], "title": {"text": "ms since the run's first arrival (same scale for every run)"}},
        yaxis={"autorange": "reversed", "type": "category"})}


def kv_blocks_fig(title: str, holds: list[tuple], x_max: float, legend_seen: set) -> dict:
    data, owners = [], sorted({h[1] for h in holds})
    for i, owner in enumerate(owners):
        rows = [h for h in holds if h[1] == owner]
        hover = [esc(f"block {h[0]}: held by {owner} ({h[2]}) {h[3]:.2f} → {h[4]:.2f} ms") for h in rows]
        data.append({**_bar(owner, [f"block {h[0]}" for h in rows], [h[3] for h in rows], [h[4] for h in rows],
                            PALETTE[i % len(PALETTE)], hover, owner not in legend_seen), "opacity": 0.75})
        legend_seen.add(owner)
    return {"data": data, "layout": _layout(
        max(200, 70 + 22 * len({h[0] for h in holds})), title={"text": esc(title), "font": {"size": 13}},
        xaxis={"range": [0, x_max], "title": {"text": "ms since the run's first arrival (same scale for every run)"}},
        yaxis={"autorange": "reversed", "type": "category"})}


def curve_fig(title: str, table: dict, x: str, ys: list[str]) -> dict:
    cols = table["columns"]
    xi = cols.index(x)
    data = [{"type": "scatter", "mode": "lines+markers", "name": esc(y), "x": [r[xi] for r in table["rows"]],
             "y": [r[cols.index(y)] for r in table["rows"]]} for y in ys if y in cols]
    return {"data": data, "layout": _layout(360, title={"text": esc(title), "font": {"size": 13}},
                                            xaxis={"title": {"text": esc(x)}})}
