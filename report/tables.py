"""The figure tables a run's report and its terminal summary both show, read here once.

The latency table (the ledger's `latency_percentiles`: percentiles per metric and observation layer)
and the counts of the four accounts. Every number is a ledger column (docs/LEDGER.md).
"""
from __future__ import annotations

from inferledger.report.read import RunView, num


def latency(rv: RunView) -> list[dict]:
    """The ledger's latency_percentiles rows in its order (`values`: p50, p90, p99, max in ms); ITL and
    max-ITL rows of a layer with no values are left out."""
    from inferledger.ledger.query import LedgerError

    if not rv.has("latency_percentiles"):
        raise LedgerError(f"{rv.run_dir}: this ledger has no latency_percentiles table (built by an older "
                          f"version): rebuild it with `inferledger reconstruct {rv.run_dir}`")
    rows = rv.all("SELECT metric, label, source_column, n, p50_ms, p90_ms, p99_ms, max_ms FROM latency_percentiles "
                  "WHERE n > 0 OR metric NOT IN ('ITL', 'max ITL') ORDER BY position")
    return [{"metric": m, "layer": label, "column": col, "n": n, "values": [num(v) for v in vals]}
            for m, label, col, n, *vals in rows]


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
