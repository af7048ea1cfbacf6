"""Plotly figures (as plain JSON dicts, drawn by the page) for the report's distribution panels."""
from __future__ import annotations

from inferledger.report.page import esc

LAYER_COLORS = {"client": "#1f77b4", "server": "#ff7f0e", "engine": "#2ca02c"}
KV_COLORS = {"kv_blocks_used": "#d62728", "kv_blocks_cached": "#9467bd", "kv_blocks_free": "#c7e9c0"}
RUN_COLORS = ("#1f77b4", "#ff7f0e")


def _layout(height: int, **kw) -> dict:
    return {"height": height, "margin": {"l": 60, "r": 20, "t": 30, "b": 50}, **kw}


def itl_fig(hists: list[tuple[str, dict]]) -> dict:
    """Share of ITL gaps per log-spaced bin, per layer (and per run when comparing); maxima dashed."""
    data, shapes = [], []
    for i, (run, hist) in enumerate(hists):
        for layer, h in sorted(hist.items()):
            name = f"{run} · {layer}" if len(hists) > 1 else layer
            data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "width": 1.6,
                         "color": LAYER_COLORS.get(layer), "dash": "solid" if i == 0 else "dot"},
                         "name": esc(name), "x": h["edges_ms"], "y": h["share"],
                         "hovertemplate": "≥ %{x:.3f} ms: %{y:.2%}<extra>" + esc(name) + "</extra>"})
            if h.get("max_ms") is not None:
                shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": h["max_ms"], "x1": h["max_ms"],
                               "y0": 0, "y1": 1, "line": {"dash": "dash", "width": 1, "color": LAYER_COLORS.get(layer)}})
    return {"data": data, "layout": _layout(
        340, shapes=shapes, xaxis={"type": "log", "title": {"text": "gap between output events, ms (log; dashed: maximum)"}},
        yaxis={"title": {"text": "share of the layer's gaps"}, "tickformat": ".0%"})}


def ttft_fig(rows: list[tuple], n_total: int) -> dict:
    xs = [r[1] for r in rows]
    ys = [r[2] for r in rows]
    hi = max(xs + ys) if rows else 1.0
    data = [{"type": "scatter", "mode": "markers", "name": "attempts", "x": xs, "y": ys,
             "text": [esc(r[0]) for r in rows], "marker": {"size": 5, "opacity": 0.6, "color": "#1f77b4"},
             "hovertemplate": "%{text}<br>server %{x:.3f} ms<br>client %{y:.3f} ms<extra></extra>"},
            {"type": "scatter", "mode": "lines", "name": "client = server", "x": [0, hi], "y": [0, hi],
             "line": {"dash": "dash", "color": "#888", "width": 1}, "hoverinfo": "skip"}]
    title = f"{len(rows):,} of {n_total:,} attempts" + (" (a fixed random sample)" if len(rows) < n_total else "")
    return {"data": data, "layout": _layout(
        380, title={"text": esc(title), "font": {"size": 12}},
        xaxis={"title": {"text": "ttft_server_ms (first engine.token − engine.enqueued)"}, "rangemode": "tozero"},
        yaxis={"title": {"text": "ttft_client_ms (first content chunk − attempt.sent)"}, "rangemode": "tozero"})}


def kv_fig(kv: dict, ref_clock: str | None) -> dict:
    data = []
    for metric in ("kv_blocks_used", "kv_blocks_cached", "kv_blocks_free"):
        s = kv["series"].get(metric)
        if s:
            data.append({"type": "scatter", "mode": "lines", "stackgroup": "kv", "name": metric.replace("kv_blocks_", ""),
                         "x": s["t_ms"], "y": s["value"], "line": {"width": 0.8, "color": KV_COLORS[metric]},
                         "fillcolor": KV_COLORS[metric]})
    axis = (f"ms since the run's first event (clock {ref_clock})" if kv["aligned"]
            else f"ms since the first KV sample (clock {kv['clock']}: no mapping to {ref_clock})")
    return {"data": data, "layout": _layout(300, hovermode="x unified", xaxis={"title": {"text": esc(axis)}},
                                            yaxis={"title": {"text": "KV blocks (stacked)"}})}


def waterfall_fig(scope: str, nodes: list[tuple]) -> dict:
    """Critical-path nodes (node, start_ms, dur_ms, slack_ms, on_path) as a waterfall, path in red."""
    data = []
    for on_path, name, color in ((True, "on the critical path", "#d62728"), (False, "off the path (slack > 0)", "#9ecae1")):
        sel = [n for n in nodes if bool(n[4]) == on_path]
        if sel:
            data.append({"type": "bar", "orientation": "h", "name": name, "y": [esc(n[0]) for n in sel],
                         "base": [n[1] for n in sel], "x": [n[2] for n in sel], "marker": {"color": color},
                         "text": [f"slack {n[3]:.3f} ms" if n[3] else "" for n in sel], "cliponaxis": False,
                         "textposition": "outside",
                         "hovertemplate": "%{y}: %{x:.3f} ms from %{base:.3f}<br>%{text}<extra></extra>"})
    order = [esc(n[0]) for n in sorted(nodes, key=lambda n: (n[1] if n[1] is not None else 0.0))]
    return {"data": data, "layout": _layout(
        max(180, 26 * len(nodes) + 90), barmode="overlay", title={"text": esc(f"scope {scope}"), "font": {"size": 12}},
        xaxis={"title": {"text": "ms from the scope's start"}},
        yaxis={"type": "category", "categoryorder": "array", "categoryarray": order, "autorange": "reversed",
               "automargin": True})}


def count_bar(labels: list, counts: list, title: str) -> dict:
    return {"data": [{"type": "bar", "x": [esc(x) for x in labels], "y": counts, "marker": {"color": "#d62728"}}],
            "layout": _layout(300, title={"text": esc(title), "font": {"size": 12}})}


def goodput_bars(runs: list[tuple[str, dict]]) -> dict:
    """Completed throughput beside goodput per run (the book's figures 8-33 and 8-34, side by side)."""
    data = []
    for label, key, color in (("completed throughput", "completed_rps", "#9ecae1"), ("goodput (good / T_obs)",
                                                                                   "goodput_rps", "#08519c")):
        data.append({"type": "bar", "name": label, "x": [esc(r) for r, _ in runs],
                     "y": [h.get(key) for _, h in runs], "marker": {"color": color},
                     "hovertemplate": "%{x}: %{y:.3f} req/s<extra>" + label + "</extra>"})
    return {"data": data, "layout": _layout(320, barmode="group", yaxis={"title": {"text": "requests / s"}})}


def kv_vs_makespan(points: list[tuple[str, float | None, float | None]]) -> dict:
    """Each run's peak KV blocks used against its observation window (the book's figure 8-35)."""
    pts = [p for p in points if p[1] is not None and p[2] is not None]
    data = [{"type": "scatter", "mode": "markers+text", "x": [p[1]], "y": [p[2]], "text": [esc(p[0])],
             "textposition": "top center", "name": esc(p[0]), "marker": {"size": 14, "color": RUN_COLORS[i % 2]}}
            for i, p in enumerate(pts)]
    return {"data": data, "layout": _layout(320, xaxis={"title": {"text": "peak kv_blocks_used"}, "rangemode": "tozero"},
                                            yaxis={"title": {"text": "T_obs, s"}, "rangemode": "tozero"})}
