"""The terminal summary of a run's ledger as data: named sections of rows, read from ledger tables only.

`inferledger summary` and `reconstruct` print these sections (cli/summary.py draws them with rich;
`--format csv|json` serialises the same sections), the verdict first: where the median and the p99
request's time went (`verdict_time`), the registered prediction met or missed per request class
(`verdict_prediction`) and the first cause of the run's delay (`verdict_cause`, run_diagnosis). A
section is a list of records; `verdict_cause`, `client` (the load client's own delay and, for a client-bound
run, its effect on each latency figure), `run`, `ghost` and `gaps` are one record each. Counts say what they
count (`of`: attempts, tasks, gaps). Unknown figures stay None, with the gap register's `needs` beside
them where a gap names the figure.
"""
from __future__ import annotations

from inferledger.report import tables
from inferledger.report.read import RunView, num

COMPARISON_COLUMNS = ("metric", "tool", "imported", "reporter", "tool_n", "tool_mean_ms", "tool_p50_ms", "tool_p99_ms",
                      "ours_n", "ours_mean_ms", "ours_p50_ms", "ours_p99_ms", "diff_mean_ms", "server_column",
                      "server_n", "server_mean_ms", "server_p50_ms", "server_p99_ms", "reason")
RUN_COLUMNS = ("t_obs_s", "goodput_rps", "completed_rps", "energy_per_good_j", "vllm_goodput_rps", "slo_ttft_ms",
               "slo_tpot_ms", "slo_e2e_ms", "output_tok_s", "total_tok_s", "computed_tok_s")
SECTIONS = ("verdict_time", "verdict_prediction", "verdict_cause", "latency", "client", "accounts", "run", "peer_views",
            "peers", "slo_misses", "ghost", "model", "stream_checks", "gaps")
MODEL_COLUMNS = ("n_steps", "median_bound_share_pct", "n_beats_bound", "dominant_source", "dominant_ms_per_step")


def latency_rows(rv: RunView) -> list[dict]:
    """The latency table (report/tables.py), one record per metric and layer."""
    return [{"metric": r["metric"], "layer": r["layer"], "column": r["column"], "n": r["n"], "of": r["of"],
             **dict(zip(("p50_ms", "p90_ms", "p99_ms", "max_ms"), r["values"]))} for r in tables.latency(rv)]


def account_rows(rv: RunView) -> list[dict]:
    return [{"account": account, "status": status, "n": n, "of": tables.ACCOUNT_COUNTS[account]}
            for account, rows in tables.account_counts(rv).items() for status, n in rows]


def needs(rv: RunView, column: str) -> str | None:
    """What the gap register says a NULL `column` needs (its first gap naming the column)."""
    row = rv.one("SELECT needs FROM gaps WHERE affects LIKE $c ORDER BY gap_id LIMIT 1", {"c": f"%{column}%"})
    return row[0] if row else None


def run_row(rv: RunView) -> dict:
    """Good results, goodput beside completed throughput, token rates and energy per good result."""
    good, judged, attempts = rv.one("SELECT count(*) FILTER (WHERE good), count(good), count(*) FROM request_metrics")
    outcomes = tables.task_outcomes(rv)
    out = {"good": good, "judged": judged, "attempts": attempts, "tasks": sum(n for _, n in outcomes),
           "task_outcomes": dict(outcomes), **{c: None for c in RUN_COLUMNS}}
    if rv.has("run_metrics"):
        have = set(rv.columns("run_metrics"))
        cols = [c for c in RUN_COLUMNS if c in have]
        row = rv.one(f"SELECT {', '.join(cols)} FROM run_metrics LIMIT 1")
        out.update({c: num(v) for c, v in zip(cols, row or ())})
    for column in ("goodput_rps", "energy_per_good_j"):
        out[f"{column}_needs"] = needs(rv, column) if out[column] is None else None
    return out


def peer_view_rows(rv: RunView) -> list[dict]:
    """TTFT / ITL / TPOT under each tool's definition, p50 and p99 (the ledger's peer_views)."""
    if not rv.has("peer_views"):
        return []
    cols, rows = rv.dicts("SELECT metric, tool, weighting, n, p50_ms, p99_ms FROM peer_views WHERE n > 0")
    return [dict(zip(cols, r)) for r in rows]


def comparison_rows(rv: RunView, *, imported_only: bool = True) -> list[dict]:
    """peer_comparison as records; for an imported run only the importing tool's rows unless asked."""
    if not rv.has("peer_comparison"):
        return []
    rows = [dict(zip(COMPARISON_COLUMNS, r)) for r in
            rv.all(f"SELECT {', '.join(COMPARISON_COLUMNS)} FROM peer_comparison")]
    if imported_only and any(r["imported"] for r in rows):
        rows = [r for r in rows if r["imported"]]
    return rows


def sections(rv: RunView, *, all_tools: bool = False) -> dict:
    """Every section of the summary, in print order (SECTIONS)."""
    out = {"verdict_time": tables.verdict_requests(rv), "verdict_prediction": tables.verdict_prediction(rv),
           "verdict_cause": tables.verdict_cause(rv), "latency": latency_rows(rv), "client": tables.client_bound(rv.manifest),
           "accounts": account_rows(rv), "run": run_row(rv),
           "peer_views": peer_view_rows(rv), "peers": comparison_rows(rv, imported_only=not all_tools)}
    if rv.has("slo_misses"):
        cols, rows = rv.dicts("SELECT dominant_cause, count(*) AS n, round(avg(server_queue_ms), 1) AS server_queue_ms, "
                              "round(avg(prefill_interference_ms), 1) AS prefill_interference_ms FROM slo_misses "
                              "GROUP BY 1 ORDER BY 2 DESC, 1")
        out["slo_misses"] = [dict(zip(cols, r)) for r in rows]
    else:
        out["slo_misses"] = []
    ghost = rv.one("SELECT ghost_attempts, ghost_ms, ghost_tokens FROM reconciliation") if rv.has("reconciliation") else None
    out["ghost"] = dict(zip(("ghost_attempts", "ghost_ms", "ghost_tokens"), ghost or (None, None, None)))
    row = rv.one(f"SELECT {', '.join(MODEL_COLUMNS)} FROM model_summary") if rv.has("model_summary") else None
    out["model"] = dict(zip(MODEL_COLUMNS, row or (None,) * len(MODEL_COLUMNS)))
    out["stream_checks"] = [{"status": s, "n": n} for s, n in
                            rv.all("SELECT status, count(*) FROM stream_checks GROUP BY 1 ORDER BY 1")]
    out["gaps"] = {"n": rv.one("SELECT count(*) FROM gaps")[0]}
    return out
