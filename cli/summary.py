"""The terminal summary of a ledger: latency per observation layer, the four accounts, tasks, gaps."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

# (label, table, column, layer); percentiles are taken over attempts (ITL over gaps).
LATENCY_ROWS = (
    ("TTFT", "request_metrics", "ttft_client_ms", "client (first content)"),
    ("TTFT", "request_metrics", "ttft_visible_ms", "client (first answer)"),
    ("TTFT", "request_metrics", "ttft_server_ms", "engine"),
    ("TPOT", "request_metrics", "tpot_ms", "client"),
    ("TPOT", "request_metrics", "tpot_server_ms", "server"),
    ("E2E", "request_metrics", "e2e_client_ms", "client"),
    ("E2E", "request_metrics", "e2e_server_ms", "server"),
    ("queue", "request_metrics", "queue_ms", "engine"),
)
ITL_LAYERS = ("client", "server", "engine")


def print_peer_views(con, console) -> None:
    """TTFT / ITL / TPOT under each tool's definition, p50 and p99 (the ledger's peer_views)."""
    has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'peer_views'").fetchone()[0]
    rows = con.execute("SELECT metric, tool, weighting, n, p50_ms, p99_ms FROM peer_views WHERE n > 0").fetchall() if has else []
    if not rows:
        return
    t = Table(title="The same names in other tools (ms; peer_views)", title_justify="left")
    for col, justify in (("metric", "left"), ("tool", "left"), ("weighting", "left"), ("n", "right"),
                         ("p50", "right"), ("p99", "right")):
        t.add_column(col, justify=justify)
    for metric, tool, weighting, n, p50, p99 in rows:
        t.add_row(metric, tool, weighting, f"{n:,}", _fmt(p50), _fmt(p99))
    console.print(t)


COMPARISON_COLUMNS = ("metric", "tool", "imported", "reporter", "tool_n", "tool_mean_ms", "tool_p50_ms", "tool_p99_ms",
                      "ours_n", "ours_mean_ms", "ours_p50_ms", "ours_p99_ms", "diff_mean_ms", "server_column",
                      "server_n", "server_mean_ms", "server_p50_ms", "server_p99_ms", "reason")


def comparison_rows(con, *, imported_only: bool) -> list[dict]:
    """peer_comparison as dicts; for an imported run only the importing tool's rows unless asked."""
    has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'peer_comparison'").fetchone()[0]
    if not has:
        return []
    rows = [dict(zip(COMPARISON_COLUMNS, r)) for r in
            con.execute(f"SELECT {', '.join(COMPARISON_COLUMNS)} FROM peer_comparison").fetchall()]
    if imported_only and any(r["imported"] for r in rows):
        rows = [r for r in rows if r["imported"]]
    return rows


def print_peer_comparison(con, console) -> None:
    """For a run imported from a load tool: its own numbers, ours on the same requests, the engine's, why."""
    rows = [r for r in comparison_rows(con, imported_only=True) if r["imported"]]
    if not rows:
        return
    t = Table(title=f"{rows[0]['reporter']}: its own numbers beside ours on the same requests (ms, mean / p50 / p99)",
              title_justify="left")
    for col, justify in (("metric", "left"), ("tool's", "right"), ("ours (client)", "right"),
                         ("engine", "right"), ("why they differ", "left")):
        t.add_column(col, justify=justify, overflow="fold")
    for r in rows:
        t.add_row(r["metric"], _three(r, "tool"), _three(r, "ours"), _three(r, "server"), r["reason"] or "")
    console.print(t)


def _three(r: dict, side: str) -> str:
    if not r[f"{side}_n"]:
        return "—"
    return " / ".join(_fmt(r[f"{side}_{s}_ms"]) for s in ("mean", "p50", "p99"))


def slo_text(ttft_ms, tpot_ms, e2e_ms) -> str:
    """The declared thresholds of the vLLM-style goodput, as `TTFT ≤ 300 ms, TPOT ≤ 100 ms`."""
    parts = [f"{name} ≤ {v:g} ms" for name, v in (("TTFT", ttft_ms), ("TPOT", tpot_ms), ("E2E", e2e_ms))
             if v is not None]
    return ", ".join(parts)


def _fmt(v) -> str:
    return "—" if v is None else f"{v:,.1f}"


def latency_table(con) -> Table:
    t = Table(title="Latency by observation layer (ms)", title_justify="left")
    for col in ("metric", "layer", "n", "p50", "p90", "p99", "max"):
        t.add_column(col, justify="right" if col not in ("metric", "layer") else "left")
    q = ("SELECT count({c}), quantile_cont({c}, 0.5), quantile_cont({c}, 0.9), quantile_cont({c}, 0.99), max({c}) "
         "FROM {t}{w}")
    for label, table, column, layer in LATENCY_ROWS:
        n, *vals = con.execute(q.format(c=column, t=table, w="")).fetchone()
        t.add_row(label, layer, str(n), *map(_fmt, vals))
    for layer in ITL_LAYERS:
        n, *vals = con.execute(q.format(c="gap_ms", t="itl", w=" WHERE layer = ?"), [layer]).fetchone()
        if n:
            t.add_row("ITL", layer + " (per output event)", str(n), *map(_fmt, vals))
    return t


def accounts_table(con) -> Table:
    t = Table(title="The four accounts (attempts; tasks for the outcome)", title_justify="left")
    t.add_column("account")
    t.add_column("status")
    t.add_column("n", justify="right")
    for account, sql in (
        ("client", "SELECT coalesce(client_status, 'no client events'), count(*) FROM accounts GROUP BY 1 ORDER BY 1"),
        ("server", "SELECT server_status, count(*) FROM accounts GROUP BY 1 ORDER BY 1"),
        ("task", "SELECT outcome, count(*) FROM tasks GROUP BY 1 ORDER BY 1"),
        ("resource", "SELECT resource_status, count(*) FROM accounts GROUP BY 1 ORDER BY 1"),
    ):
        for i, (status, n) in enumerate(con.execute(sql).fetchall()):
            t.add_row(account if i == 0 else "", status, str(n))
    return t


def print_summary(ledger_path: Path, console: Console | None = None) -> None:
    import duckdb

    console = console or Console()
    con = duckdb.connect(str(ledger_path), read_only=True)
    try:
        console.print(latency_table(con))
        console.print(accounts_table(con))
        good, judged, att = con.execute(
            "SELECT count(*) FILTER (WHERE good), count(good), count(*) FROM request_metrics").fetchone()
        checks = con.execute("SELECT status, count(*) FROM stream_checks GROUP BY 1 ORDER BY 1").fetchall()
        n_gaps = con.execute("SELECT count(*) FROM gaps").fetchone()[0]
        console.print(f"good results (correct and on time): [bold]{good}[/] of {judged} judged, {att} attempts")
        rm = con.execute("SELECT t_obs_s, goodput_rps, completed_rps, energy_per_good_j, vllm_goodput_rps, "
                         "slo_ttft_ms, slo_tpot_ms, slo_e2e_ms, output_tok_s, total_tok_s, computed_tok_s "
                         "FROM run_metrics").fetchone()
        if rm and rm[0]:
            console.print(f"goodput [bold]{rm[1]:.3f}[/] good/s beside {rm[2]:.3f} completed/s over a {rm[0]:.1f} s window")
            if rm[4] is not None:
                console.print(f"vLLM-style goodput {rm[4]:.3f} req/s ({slo_text(rm[5], rm[6], rm[7])}; "
                              "latency only: answers not checked)")
            if rm[8] is not None:
                console.print(f"output {rm[8]:,.1f} tok/s; with prompt tokens {_fmt(rm[9])} tok/s as the peers count "
                              f"them (cached ones included), {_fmt(rm[10])} tok/s computed by the engine")
            if rm[3] is None:
                why = con.execute("SELECT needs FROM gaps WHERE affects LIKE '%energy_per_good_j%' LIMIT 1").fetchone()
                console.print("energy per good result: [yellow]unknown[/]" + (f" — needs {why[0]}" if why else ""))
            else:
                console.print(f"energy per good result: [bold]{rm[3]:.1f} J[/]")
        print_peer_views(con, console)
        print_peer_comparison(con, console)
        causes = con.execute("SELECT dominant_cause, count(*), round(avg(server_queue_ms)), round(avg(prefill_interference_ms)) "
                             "FROM slo_misses GROUP BY 1 ORDER BY 2 DESC").fetchall()
        if causes:
            console.print("deadline misses by dominant cause: " + ", ".join(f"{c or 'none measured'} {n}" for c, n, *_ in causes))
        ghost = con.execute("SELECT ghost_attempts, ghost_ms, ghost_tokens FROM reconciliation").fetchone()
        if ghost and ghost[0]:
            console.print(f"ghost load: {ghost[0]} attempt(s) the client gave up on kept the server busy "
                          f"{ghost[1]:,.0f} ms and {int(ghost[2] or 0)} tokens")
        console.print("stream checks: " + ", ".join(f"{s} {n}" for s, n in checks))
        console.print(f"gap register: {n_gaps} row(s)" + ("  (query: select * from gaps)" if n_gaps else ""))
    finally:
        con.close()
