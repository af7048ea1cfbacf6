"""The terminal summary of a ledger, drawn with rich from report/summary.py's sections.

Printed by `reconstruct`, `summary` and `demo`, the verdict first; the numbers are the sections'
(ledger tables only).
An unknown figure prints as "unknown" with what the gap register says it needs, never as a number.
"""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from inferledger.cli.output import show


def _fmt(v) -> str:
    return "—" if v is None else f"{v:,.1f}"


def _latency(rows: list[dict]) -> Table:
    from inferledger.report.tables import counted

    t = Table(title="Latency by observation layer (ms)", title_justify="left")
    for col in ("metric", "layer", "n", "p50", "p90", "p99", "max"):
        t.add_column(col, justify="left" if col in ("metric", "layer") else "right")
    for r in rows:
        t.add_row(r["metric"], r["layer"], counted(r["n"], r["of"]),
                  *(_fmt(r[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")))
    return t


def _accounts(rows: list[dict]) -> Table:
    from inferledger.report.tables import counted

    t = Table(title="The four accounts (attempts; tasks for the outcome)", title_justify="left")
    t.add_column("account")
    t.add_column("status")
    t.add_column("n", justify="right")
    previous = None
    for r in rows:
        t.add_row(r["account"] if r["account"] != previous else "", str(r["status"]), counted(r["n"], r["of"]))
        previous = r["account"]
    return t


def _peer_views(rows: list[dict]) -> Table:
    t = Table(title="The same names in other tools (ms; peer_views)", title_justify="left")
    for col, justify in (("metric", "left"), ("tool", "left"), ("weighting", "left"), ("n", "right"),
                         ("p50", "right"), ("p99", "right")):
        t.add_column(col, justify=justify)
    for r in rows:
        t.add_row(r["metric"], r["tool"], r["weighting"], f"{r['n']:,}", _fmt(r["p50_ms"]), _fmt(r["p99_ms"]))
    return t


def _three(r: dict, side: str) -> str:
    if not r[f"{side}_n"]:
        return "—"
    return " / ".join(_fmt(r[f"{side}_{s}_ms"]) for s in ("mean", "p50", "p99"))


def _peers(rows: list[dict]) -> Table:
    """For a run imported from a load tool: its own numbers, ours on the same requests, the engine's, why."""
    t = Table(title=f"{rows[0]['reporter']}: its own numbers beside ours on the same requests (ms, mean / p50 / p99)",
              title_justify="left")
    for col, justify in (("metric", "left"), ("tool's", "right"), ("ours (client)", "right"),
                         ("engine", "right"), ("why they differ", "left")):
        t.add_column(col, justify=justify, overflow="fold")
    for r in rows:
        t.add_row(r["metric"], _three(r, "tool"), _three(r, "ours"), _three(r, "server"), r["reason"] or "")
    return t


def _where_time_went(rows: list[dict]) -> Table:
    from inferledger.report.tables import VERDICT_COLUMNS

    t = Table(title=f"Verdict: where the time went (ms; the request nearest the {rows[0]['e2e_layer']} E2E p50 / p99)",
              title_justify="left", caption="asleep: of its prefill, decode and stalls, its steps' sleep on a lock "
                                            "(the interpreter: the front end, a full garbage collection)",
              caption_justify="left")
    for col in ("request", "attempt", "E2E", "held", *(name.removesuffix("_ms") for name, _ in VERDICT_COLUMNS)):
        t.add_column(col, justify="left" if col in ("request", "attempt") else "right")
    for r in rows:
        t.add_row(r["request"], r["attempt_id"], _fmt(r["e2e_ms"]), _fmt(r["held_ms"]),
                  *(_fmt(r[name]) for name, _ in VERDICT_COLUMNS))
    return t


def _prediction_lines(rows: list[dict]) -> list[str]:
    from inferledger.report.tables import PREDICTION_BASIS

    lines = []
    for r in rows:
        what = f"prediction {r['class']} ({r['prompt_tokens']} prompt tokens) {r['figure'].upper()}"
        if r["verdict"] == "unknown":
            lines.append(f"{what}: [yellow]unknown[/] (no measured median or no predicted range)")
            continue
        got = (f"median {_fmt(r['measured_p50_ms'])} ms against {_fmt(r['predicted_low_ms'])}–"
               f"{_fmt(r['predicted_high_ms'])} ms")
        off = "" if r["verdict"] == "met" else f" by {abs(r['off_pct']):.0f} %" if r["off_pct"] is not None else ""
        style = "green" if r["verdict"] == "met" else "red"
        lines.append(f"{what}: [{style}]{r['verdict']}{off}[/] ({got})")
    for basis in dict.fromkeys(r["basis"] for r in rows if r["verdict"] != "unknown"):
        lines.append(f"  the prediction's ranges {PREDICTION_BASIS[basis]}; queueing is not in them")
    return lines


def _cause_line(c: dict) -> str:
    if c["diagnosed"] is None:
        return "first cause: [yellow]unknown[/] (this ledger has no run_diagnosis)"
    if c["first_cause"] is None:
        return f"first cause: none measured ({c['evidence']})"
    if c["first_cause_share"] is None:  # 'unknown': a cause that could be the largest is not measured
        return f"first cause: [yellow]{c['first_cause']}[/] — {c['evidence']}"
    then = f", then {c['next_cause']} {c['next_cause_share']:.0%}" if c["next_cause"] else ""
    return f"{c['what']}: [bold]{c['first_cause']}[/] {c['first_cause_share']:.0%}{then} — {c['evidence']}"


def _verdict(sec: dict, console: Console, want) -> None:
    if want("verdict_time") and sec["verdict_time"]:
        show(console, _where_time_went(sec["verdict_time"]))
    if want("verdict_prediction"):
        for line in _prediction_lines(sec["verdict_prediction"]):
            show(console, line)
    if want("verdict_cause"):
        show(console, _cause_line(sec["verdict_cause"]))


def _unknown(what: str, needs: str | None) -> str:
    return f"{what}: [yellow]unknown[/]" + (f" — needs {needs}" if needs else "")


def _run_lines(rm: dict) -> list[str]:
    from inferledger.report.tables import slo_text, tasks_text

    lines = [f"good results (correct and on time): [bold]{rm['good']:,}[/] of {rm['judged']:,} judged attempts "
             f"({rm['attempts']:,} attempts in all, for {tasks_text(list(rm['task_outcomes'].items()))})"]
    if not rm["t_obs_s"]:
        return lines
    if rm["goodput_rps"] is None:
        lines.append(_unknown(f"goodput over a {rm['t_obs_s']:.1f} s window", rm["goodput_rps_needs"]))
    else:
        completed = "" if rm["completed_rps"] is None else f" beside {rm['completed_rps']:.3f} completed/s"
        lines.append(f"goodput [bold]{rm['goodput_rps']:.3f}[/] good/s{completed} over a {rm['t_obs_s']:.1f} s window")
    if rm["vllm_goodput_rps"] is not None:
        lines.append(f"vLLM-style goodput {rm['vllm_goodput_rps']:.3f} req/s "
                     f"({slo_text(rm['slo_ttft_ms'], rm['slo_tpot_ms'], rm['slo_e2e_ms'])}; latency only: answers not checked)")
    if rm["output_tok_s"] is not None:
        lines.append(f"output {rm['output_tok_s']:,.1f} tok/s; with prompt tokens {_fmt(rm['total_tok_s'])} tok/s as the "
                     f"peers count them (cached ones included), {_fmt(rm['computed_tok_s'])} tok/s computed by the engine")
    if rm["energy_per_good_j"] is None:
        lines.append(_unknown("energy per good result", rm["energy_per_good_j_needs"]))
    else:
        lines.append(f"energy per good result: [bold]{rm['energy_per_good_j']:.1f} J[/]")
    return lines


def print_sections(sec: dict, console: Console, only: str | None = None) -> None:
    """Draw the summary's sections (all of them, or the one named `only`)."""
    def want(name: str) -> bool:
        return only is None or only == name

    _verdict(sec, console, want)
    if want("latency"):
        show(console, _latency(sec["latency"]))
    if want("client") and sec["client"]["effect"]:
        from rich.markup import escape

        show(console, f"[yellow]{escape(sec['client']['effect'])}[/]")
    if want("accounts"):
        show(console, _accounts(sec["accounts"]))
    if want("run"):
        for line in _run_lines(sec["run"]):
            show(console, line)
    if want("peer_views") and sec["peer_views"]:
        show(console, _peer_views(sec["peer_views"]))
    imported = [r for r in sec["peers"] if r["imported"]]  # drawn for a run imported from a load tool
    if want("peers") and imported:
        show(console, _peers(imported))
    if want("slo_misses") and sec["slo_misses"]:
        show(console, "late requests by dominant cause: " + ", ".join(
            f"{r['dominant_cause'] or 'none measured'} {r['n']}" for r in sec["slo_misses"]))
    ghost = sec["ghost"]
    if want("ghost") and ghost["ghost_attempts"]:
        ms = "an unknown time" if ghost["ghost_ms"] is None else f"{ghost['ghost_ms']:,.0f} ms"
        tokens = "unknown" if ghost["ghost_tokens"] is None else f"{int(ghost['ghost_tokens'])}"
        show(console, f"ghost load: {ghost['ghost_attempts']} attempt(s) the client gave up on kept the server busy "
                      f"{ms} and {tokens} tokens")
    model = sec.get("model") or {}
    if want("model") and model.get("n_steps"):
        share = model["median_bound_share_pct"]
        source = (f"{model['dominant_source']} ({model['dominant_ms_per_step']:,.1f} ms per step)"
                  if model["dominant_source"] else "unknown (too few steps to tell the sources apart)")
        show(console, f"workload model: median step at {share:.0f} % of its bound (bound_ms / measured_ms over "
                      f"{model['n_steps']} steps, {model['n_beats_bound']} faster than their bound); "
                      f"dominant residual source: {source}")
    if want("stream_checks"):
        show(console, "stream checks: " + ", ".join(f"{r['status']} {r['n']}" for r in sec["stream_checks"]))
    if want("gaps"):
        n = sec["gaps"]["n"]
        show(console, f"gap register: {n} row(s)" + ("  (query: select * from gaps)" if n else ""))


def summary_sections(ledger_path: Path, *, all_tools: bool = False) -> dict:
    from inferledger.report.read import open_run
    from inferledger.report.summary import sections

    rv = open_run(ledger_path)
    try:
        return sections(rv, all_tools=all_tools)
    finally:
        rv.close()


def print_summary(ledger_path: Path, console: Console | None = None) -> None:
    print_sections(summary_sections(ledger_path), console or Console())
