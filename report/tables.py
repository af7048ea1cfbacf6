"""The figure tables a run's report and its terminal summary both show, read here once.

The verdict (where the median and the p99 request's time went, the prediction met or missed per
request class, the first cause of the run's delay), the latency table (the ledger's
`latency_percentiles`: percentiles per metric and observation layer) and the counts of the four
accounts. Every number is a ledger column (docs/LEDGER.md).
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


# the verdict's stretches of a request: the ledger column each is read from (attempt_causes)
WHERE_TIME_WENT = (("queue_ms", "c.client_queue_ms + c.server_queue_ms"), ("prefill_ms", "c.prefill_ms"),
                   ("decode_ms", "c.decode_ms"), ("contention_ms", "c.host_contention_ms"),
                   ("transport_ms", "c.transport_ms"), ("client_ms", "c.client_ms"))


def verdict_requests(rv: RunView) -> list[dict]:
    """Where the time went for the median and the p99 request: the attempt whose E2E (the client's, else
    the server's) is nearest that percentile of latency_percentiles, its stretches from attempt_causes."""
    if not (rv.has("attempt_causes") and rv.has("latency_percentiles")):
        return []
    out = []
    for layer in ("client", "server"):
        pct = rv.one("SELECT p50_ms, p99_ms FROM latency_percentiles WHERE source_column = $c",
                     {"c": f"request_metrics.e2e_{layer}_ms"})
        if pct and pct[0] is not None:
            break
    else:
        return []
    cols = ", ".join(f"{sql} AS {name}" for name, sql in WHERE_TIME_WENT)
    for which, target in zip(("p50", "p99"), pct):
        row = rv.one(f"SELECT c.attempt_id, r.e2e_{layer}_ms, {cols} FROM attempt_causes c "
                     f"JOIN request_metrics r USING (attempt_id) WHERE r.e2e_{layer}_ms IS NOT NULL "
                     f"ORDER BY abs(r.e2e_{layer}_ms - $t), c.attempt_id LIMIT 1", {"t": target})
        if row:
            out.append({"request": which, "attempt_id": row[0], "e2e_layer": layer, "e2e_ms": num(row[1]),
                        **{name: num(v) for (name, _), v in zip(WHERE_TIME_WENT, row[2:])}})
    return out


def against_range(measured, low, high) -> tuple[str, float | None]:
    """met / above / below the predicted range, and by how much (% of the edge it passed)."""
    if measured is None or low is None or high is None:
        return "unknown", None
    if measured > high:
        return "missed: above", 100.0 * (measured - high) / high if high else None
    if measured < low:
        return "missed: below", 100.0 * (measured - low) / low if low else None
    return "met", 0.0


def verdict_prediction(rv: RunView) -> list[dict]:
    """The registered prediction against the run, per request class and shape (prediction_check): each
    figure's median against its sustained range."""
    if not rv.has("prediction_check"):
        return []
    out = []
    rows = rv.all("SELECT class, prompt_tokens, n_attempts, ttft_p50_ms, ttft_sustained_low_ms, ttft_sustained_high_ms, "
                  "tpot_p50_ms, tpot_sustained_low_ms, tpot_sustained_high_ms FROM prediction_check "
                  "ORDER BY class, prompt_tokens")
    for cls, prompt, n, *vals in rows:
        for figure, (measured, low, high) in (("ttft", vals[0:3]), ("tpot", vals[3:6])):
            verdict, off = against_range(num(measured), num(low), num(high))
            out.append({"class": cls, "prompt_tokens": prompt, "n_attempts": n, "figure": figure,
                        "measured_p50_ms": num(measured), "predicted_low_ms": num(low), "predicted_high_ms": num(high),
                        "verdict": verdict, "off_pct": off})
    return out


DIAGNOSIS_COLUMNS = ("diagnosed", "n_attempts", "n_late", "first_cause", "first_cause_share", "evidence")


def verdict_cause(rv: RunView) -> dict:
    """The first cause of the run's delay, its share and evidence: run_diagnosis' run row."""
    row = rv.one(f"SELECT {', '.join(DIAGNOSIS_COLUMNS)} FROM run_diagnosis WHERE scope = 'run'") \
        if rv.has("run_diagnosis") else None
    return {c: num(v) if isinstance(v, float) else v for c, v in zip(DIAGNOSIS_COLUMNS, row or (None,) * 6)}
