"""What the report reads from one run's ledger: identity, headline figures, distributions, accounts.

Every figure is a column the ledger already defines (docs/LEDGER.md); this module only selects and
counts those columns. Goodput and its observation window are `run_metrics`'s alone: a ledger built
without that table shows them as unknown, with the rebuild that would give them.
"""
from __future__ import annotations

from inferledger.report.read import RunView, num


def counts(rv: RunView) -> dict:
    q = ("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM attempts), (SELECT count(*) FROM tasks), "
         "(SELECT count(*) FROM gaps), (SELECT count(*) FROM attempts WHERE client_status = 'completed'), "
         "(SELECT count(*) FILTER (WHERE good) FROM request_metrics), (SELECT count(good) FROM request_metrics)")
    keys = ("events", "attempts", "tasks", "gaps", "completed", "good", "judged")
    return dict(zip(keys, rv.one(q)))


def energy_reason(rv: RunView) -> str:
    """Why energy per good result is unknown, from the gap register (else what the ledger lacks)."""
    rows = rv.all("SELECT needs, detail FROM gaps WHERE affects ILIKE '%energy%' OR needs ILIKE '%energy%' "
                  "OR detail ILIKE '%energy%' ORDER BY gap_id LIMIT 3")
    if rows:
        return "; ".join(f"{d or 'gap'} (needs: {n})" for n, d in rows)
    n_energy = rv.one("SELECT count(*) FROM samples WHERE metric ILIKE '%energy%'")[0]
    if not rv.has("run_metrics"):
        return ("this ledger has no run_metrics table (energy per good result is defined there)"
                + ("; energy samples exist, rebuild the ledger with `inferledger reconstruct`" if n_energy
                   else "; the run recorded no energy samples (no NVML or RAPL counter)"))
    return "run_metrics.energy_per_good_j is NULL and the gap register says nothing more"


def headline(rv: RunView) -> dict:
    """Goodput beside completed throughput, and energy per good result, with where each came from."""
    c = counts(rv)
    out = {"counts": c, "source": None, "goodput_rps": None, "completed_rps": None,
           "t_obs_s": None, "n_good": c["good"], "energy_per_good_j": None, "gpu_s_per_good": None,
           "energy_reason": None, "run_metrics": None}
    if rv.has("run_metrics"):
        cols, rows = rv.dicts("SELECT * FROM run_metrics LIMIT 1")
        rm = dict(zip(cols, rows[0])) if rows else {}
        out.update(source="run_metrics", run_metrics=rm, goodput_rps=num(rm.get("goodput_rps")),
                   completed_rps=num(rm.get("completed_rps")), t_obs_s=num(rm.get("t_obs_s")),
                   n_good=rm.get("n_good", c["good"]), energy_per_good_j=num(rm.get("energy_per_good_j")),
                   gpu_s_per_good=num(rm.get("gpu_s_per_good")))
    if out["energy_per_good_j"] is None:
        out["energy_reason"] = energy_reason(rv)
    return out


def itl_histogram(rv: RunView, per_decade: int = 20) -> dict[str, dict]:
    """ITL gaps per layer in log-spaced bins (share of the layer's gaps), and the layer's maximum."""
    rows = rv.all(f"SELECT layer, floor(log10(greatest(gap_ms, 1e-3)) * {per_decade})::INTEGER AS b, count(*) "
                  "FROM itl WHERE gap_ms IS NOT NULL GROUP BY ALL ORDER BY layer, b")
    maxes = dict(rv.all("SELECT layer, max(gap_ms) FROM itl GROUP BY layer"))
    out: dict[str, dict] = {}
    for layer, b, n in rows:
        d = out.setdefault(layer, {"edges_ms": [], "counts": [], "max_ms": num(maxes.get(layer))})
        d["edges_ms"].append(10 ** (b / per_decade))
        d["counts"].append(n)
    for d in out.values():
        total = sum(d["counts"]) or 1
        d["share"] = [n / total for n in d["counts"]]
    return out


def ttft_pairs(rv: RunView, limit: int = 4000) -> tuple[list[tuple], int]:
    """(attempt_id, ttft_server_ms, ttft_client_ms) for attempts with both; a fixed sample if many."""
    n = rv.one("SELECT count(*) FROM request_metrics WHERE ttft_client_ms IS NOT NULL AND ttft_server_ms IS NOT NULL")[0]
    sample = f" USING SAMPLE {limit} ROWS (reservoir, 7)" if n > limit else ""
    rows = rv.all("SELECT attempt_id, ttft_server_ms, ttft_client_ms FROM (SELECT * FROM request_metrics "
                  f"WHERE ttft_client_ms IS NOT NULL AND ttft_server_ms IS NOT NULL){sample} ORDER BY attempt_id")
    return rows, n


def kv_series(rv: RunView, tb, max_points: int = 1500) -> dict | None:
    """kv_blocks_used / cached / free samples, averaged into at most `max_points` buckets per metric,
    on the report's axis when their clock maps onto it, else on their own clock from its first sample."""
    rows = rv.all("SELECT clock, count(*) AS n FROM samples WHERE metric IN ('kv_blocks_used', 'kv_blocks_cached', "
                  "'kv_blocks_free') GROUP BY clock ORDER BY n DESC, clock")
    if not rows:
        return None
    clock = rows[0][0]
    t_min, t_max = rv.one("SELECT min(ts_ns), max(ts_ns) FROM samples WHERE clock = ? AND metric LIKE 'kv_blocks_%'",
                          [clock])
    width = max(1, -(-(t_max - t_min) // max_points))
    data = rv.all("SELECT metric, (ts_ns - $t0) // $w AS b, avg(ts_ns)::DOUBLE, avg(value), max(value) FROM samples "
                  "WHERE clock = $c AND metric IN ('kv_blocks_used', 'kv_blocks_cached', 'kv_blocks_free') "
                  "GROUP BY ALL ORDER BY metric, b", {"t0": t_min, "w": width, "c": clock})
    aligned = tb.aligned(clock)
    base = tb.origin_ns - tb.offset(clock) if aligned else t_min
    series: dict[str, dict] = {}
    for metric, _b, ts, avg, mx in data:
        s = series.setdefault(metric, {"t_ms": [], "value": [], "max": []})
        s["t_ms"].append(round((ts - base) / 1e6, 3))
        s["value"].append(num(avg))
        s["max"].append(num(mx))
    return {"clock": clock, "aligned": aligned, "other_clocks": [r[0] for r in rows[1:]], "series": series,
            "bucket_ms": width / 1e6}


ACCOUNT_COLUMNS = ("attempt_id", "task_id", "request_id", "attempt_index", "client_status", "server_status",
                   "task_outcome", "resource_status", "finish_reason", "n_output_tokens", "ttft_client_ms",
                   "e2e_client_ms", "e2e_server_ms", "good")


def account_rows(rv: RunView) -> tuple[list[str], list[list]]:
    """One row per attempt: the four accounts beside the attempt's headline metrics."""
    rows = rv.all("SELECT c.attempt_id, c.task_id, c.request_id, c.attempt_index, c.client_status, c.server_status, "
                  "c.task_outcome, c.resource_status, a.finish_reason, a.n_output_tokens, "
                  "round(r.ttft_client_ms, 3), round(r.e2e_client_ms, 3), round(r.e2e_server_ms, 3), r.good "
                  "FROM accounts c JOIN attempts a USING (attempt_id) JOIN request_metrics r USING (attempt_id) "
                  "ORDER BY c.attempt_id")
    return list(ACCOUNT_COLUMNS), [[num(v) if isinstance(v, float) else v for v in r] for r in rows]


def table_rows(rv: RunView, table: str, order: str | None = None, limit: int = 2000) -> tuple[list[str], list, int]:
    """Every column of a ledger table (run_id left out), at most `limit` rows, and the full count."""
    total = rv.one(f"SELECT count(*) FROM {table}")[0]
    order_by = f" ORDER BY {order}" if order else ""
    cols, rows = rv.dicts(f"SELECT * EXCLUDE (run_id) FROM {table}{order_by} LIMIT {int(limit)}")
    return cols, [[num(v) if isinstance(v, float) else v for v in r] for r in rows], total
