"""`inferledger whatif`: shorten one stage and recompute end-to-end on the stored critical-path DAGs."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from inferledger.cli.output import FORMAT_HELP, OutputFormat, command_name


def _parse_shrink(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*(%?)\s*", text)
    if not m:
        raise typer.BadParameter(f"{text!r}: give a fraction like 30% or 0.3", param_hint="--shrink")
    value = float(m.group(1)) / (100 if m.group(2) else 1)
    if not 0 <= value <= 1:
        raise typer.BadParameter(f"{text!r}: a shrink must lie between 0% and 100%", param_hint="--shrink")
    return value


def _parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s)?\s*", text)
    if not m:
        raise typer.BadParameter(f"{text!r}: give a duration like 0ms, 250ms or 1.5s", param_hint="--to")
    return float(m.group(1)) * (1000 if m.group(2) == "s" else 1)


COLUMNS = ("scope", "scope_id", "e2e_before_ms", "e2e_after_ms", "delta_ms", "path_after")


def whatif_cmd(
    run: Path = typer.Argument(..., help="A reconstructed run directory (or its ledger.duckdb)."),
    node: str = typer.Option(..., "--node", help="Stage to change: a span, tool, attempt or stage name."),
    shrink: Optional[str] = typer.Option(None, help="Shorten the node by a fraction: 30% or 0.3."),
    to: Optional[str] = typer.Option(None, "--to", help="Set the node's duration: 0ms, 250ms, 1.5s."),
    scope: Optional[str] = typer.Option(None, help="One task (or attempt) id; default every DAG holding the node."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help=FORMAT_HELP + " One row per "
                                     "graph: " + ", ".join(COLUMNS) + " (the critical path after, as a list)."),
) -> None:
    """Recompute end to end after shortening one stage of a task's critical path.

    Works on the ledger's dependency graphs (earliest finish E(v) = d(v) + max over predecessors). The longest path may switch: the answer is often less
    than the stage's own saving.

    Example (the book's chapter-1 case): [cyan]inferledger whatif runs/r1 --node S6_decode --shrink 30%[/]
    """

    from inferledger.cli.output import echo_rows, fail, print_rows
    from inferledger.ledger.critical_path import ledger_dags, what_if

    if (shrink is None) == (to is None):
        raise typer.BadParameter("give exactly one of --shrink and --to")
    path = run / "ledger.duckdb" if run.is_dir() else run
    if not path.exists():
        fail(f"error: {path} not found: run `{command_name()} reconstruct {run}` first")
    dags = ledger_dags(path, scope_id=scope)
    frac, to_ms = (_parse_shrink(shrink), None) if shrink is not None else (None, _parse_duration(to))
    rows = []
    for dag in dags:
        res = what_if(dag, node, shrink=frac, to_ms=to_ms)
        if res is not None:
            before, after = res
            rows.append([dag.scope, dag.scope_id, before.e2e_ms, after.e2e_ms, after.e2e_ms - before.e2e_ms,
                         list(after.path)])
    if not rows:
        fail(f"error: no critical-path node named {node!r}" + (f" in {scope}" if scope else "")
             + f" (list them: inferledger query {run} \"select distinct node from critical_path\")")
    if echo_rows(fmt, COLUMNS, rows):
        return
    change = f"shrinks by {frac:.0%}" if frac is not None else f"takes {to_ms:g} ms"
    print_rows(["scope", "id", "e2e before (ms)", "e2e after (ms)", "Δ (ms)", "critical path after"],
               [[*row[:5], " → ".join(row[5])] for row in rows], title=f"what if {node} {change}")


def register(app: typer.Typer) -> None:
    app.command("whatif")(whatif_cmd)
