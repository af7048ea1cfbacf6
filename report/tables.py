"""The figure tables a run's report and its terminal summary both show, defined once here.

The latency table (percentiles per metric and observation layer: `request_metrics` columns over
attempts, `itl.gap_ms` over output events) and the counts of the four accounts. Every number is a
ledger column (docs/LEDGER.md); percentiles are DuckDB's `quantile_cont`.
"""
from __future__ import annotations

from inferledger.report.read import RunView, num

# (label, request_metrics column, layer): the latency table's rows over attempts, in print order.
LATENCY = (
    ("TTFT", "ttft_client_ms", "client (first content)"),
    ("TTFT", "ttft_visible_ms", "client (first answer)"),
    ("TTFT", "ttft_first_byte_ms", "client (first byte)"),
    ("TTFT", "ttft_server_ms", "engine"),
    ("TPOT", "tpot_ms", "client"),
    ("TPOT", "tpot_server_ms", "server"),
    ("E2E", "e2e_client_ms", "client"),
    ("E2E", "e2e_server_ms", "server"),
    ("queue", "queue_ms", "engine"),
)
ITL_LAYERS = ("client", "server", "engine")
ITL_MAX = (("client", "itl_client_max_ms"), ("server", "itl_server_max_ms"), ("engine", "itl_engine_max_ms"))
QUANTILES = (0.5, 0.9, 0.99)
LATENCY_COLUMNS = ("metric", "layer", "column", "n", "p50_ms", "p90_ms", "p99_ms", "max_ms")


def latency(rv: RunView) -> list[dict]:
    """Percentiles per observation layer: request_metrics columns over attempts, itl gaps per layer;
    `values` is (p50, p90, p99, max) in ms."""
    qs = ", ".join(f"quantile_cont({{c}}, {q})" for q in QUANTILES)
    rows = []
    for label, column, layer in LATENCY:
        n, *vals = rv.one(f"SELECT count({column}), {qs.format(c=column)}, max({column}) FROM request_metrics")
        rows.append({"metric": label, "layer": layer, "column": f"request_metrics.{column}", "n": n,
                     "values": [num(v) for v in vals]})
    itl = {r[0]: r[1:] for r in rv.all(
        f"SELECT layer, count(*), {qs.format(c='gap_ms')}, max(gap_ms) FROM itl GROUP BY layer")}
    for layer in ITL_LAYERS:
        if layer in itl:
            n, *vals = itl[layer]
            rows.append({"metric": "ITL", "layer": f"{layer} (per output event)", "column": f"itl.gap_ms ({layer})",
                         "n": n, "values": [num(v) for v in vals]})
    for layer, column in ITL_MAX:
        n, *vals = rv.one(f"SELECT count({column}), {qs.format(c=column)}, max({column}) FROM request_metrics")
        if n:
            rows.append({"metric": "max ITL", "layer": f"{layer} (per attempt)", "column": f"request_metrics.{column}",
                         "n": n, "values": [num(v) for v in vals]})
    return rows


def account_counts(rv: RunView) -> dict[str, list[tuple]]:
    """(status, n) per account: client and server statuses and resources per attempt, outcome per task."""
    return {
        "client": rv.all("SELECT coalesce(client_status, '(no client events)'), count(*) FROM accounts GROUP BY 1 ORDER BY 1"),
        "server": rv.all("SELECT server_status, count(*) FROM accounts GROUP BY 1 ORDER BY 1"),
        "task": rv.all("SELECT outcome, count(*) FROM tasks GROUP BY 1 ORDER BY 1"),
        "resource": rv.all("SELECT resource_status, count(*) FROM accounts GROUP BY 1 ORDER BY 1"),
    }


def slo_text(ttft_ms, tpot_ms, e2e_ms) -> str:
    """The declared thresholds of the vLLM-style goodput, as `TTFT ≤ 300 ms, TPOT ≤ 100 ms`."""
    parts = [f"{name} ≤ {v:g} ms" for name, v in (("TTFT", ttft_ms), ("TPOT", tpot_ms), ("E2E", e2e_ms))
             if v is not None]
    return ", ".join(parts)
