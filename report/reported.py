"""The report's "Engine's own account" panel: what a URL target reported about itself, drawn apart.

Shown only for a run with reported evidence (reported_spans rows or `vllm-metrics` samples): vLLM's
gauges over time (running, waiting, KV cache usage: the engine's view of its queue and memory, like
our KV chart for the reference engine), its counters' run deltas against the spans' sums, and how
many attempts joined a span. Every number here is `reported` (docs/EVENTS.md "Evidence strength").
"""
from __future__ import annotations

from inferledger.report.read import num
from inferledger.report.page import esc, note, section, table

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def _gauge_fig(rv, tb) -> dict | None:
    rows = rv.all("SELECT metric, clock, ts_ns, value FROM samples WHERE source = 'vllm-metrics' AND metric IN "
                  f"({', '.join('?' for _ in GAUGES)}) ORDER BY metric, ts_ns", list(GAUGES))
    if not rows:
        return None
    data = []
    for metric in GAUGES:
        pts = [r for r in rows if r[0] == metric]
        if not pts:
            continue
        clock = pts[0][1]
        base = tb.origin_ns - tb.offset(clock) if tb.aligned(clock) else pts[0][2]
        data.append({"type": "scatter", "mode": "lines", "name": metric.removeprefix("vllm:"),
                     "x": [round((t - base) / 1e6, 3) for _, _, t, _ in pts], "y": [num(v) for *_, v in pts],
                     **({"yaxis": "y2"} if metric.endswith("_perc") else {}), "line": {"shape": "hv", "width": 1.2}})
    return {"data": data, "layout": {"height": 300, "margin": {"l": 60, "r": 60, "t": 10, "b": 40},
                                     "hovermode": "x unified",
                                     "xaxis": {"title": {"text": esc(f"ms (clock {tb.ref})")}},
                                     "yaxis": {"title": {"text": "requests"}, "rangemode": "tozero"},
                                     "yaxis2": {"title": {"text": "KV cache usage (0-1)"}, "overlaying": "y",
                                                "side": "right", "range": [0, 1]}}}


def engine_account(rv, page, p: str, tb) -> str:
    if not rv.has("reported_spans"):
        return ""
    n_spans = rv.one("SELECT count(*) FROM reported_spans")[0]
    n_samples = rv.one("SELECT count(*) FROM samples WHERE source = 'vllm-metrics'")[0]
    if not n_spans and not n_samples:
        return ""
    joined = rv.one("SELECT count(*) FILTER (WHERE server_evidence = 'reported'), count(*) FILTER (WHERE ttft_client_ms "
                    "IS NOT NULL OR e2e_client_ms IS NOT NULL OR client_span_ms IS NOT NULL) FROM request_metrics")
    reporters = [r[0] for r in rv.all("SELECT DISTINCT reporter FROM reported_spans ORDER BY 1")]
    body = note(f"evidence: reported by {', '.join(reporters) or 'the engine'}: {n_spans} span(s); {joined[0]} attempt(s) "
                f"whose server and engine figures rest on the engine's own span (request_metrics.server_evidence)")
    fig = _gauge_fig(rv, tb)
    if fig:
        body += page.figure(f"{p}-engine-gauges", fig)
    cols, rows = rv.dicts("SELECT metric, n_scrapes, run_delta, span_sum, delta_minus_spans FROM reported_counters "
                          "ORDER BY metric")
    if rows:
        body += table(cols, rows, caption="/metrics counters: run delta (last − first scrape) against the spans' sum")
    return section(f"{p}-engine", "Engine's own account (reported)", body,
                   "reported_spans, reported_counters, samples of source vllm-metrics")
