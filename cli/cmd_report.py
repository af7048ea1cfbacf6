"""`inferledger report`: the run's HTML report (report/build.py builds it)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def report_cmd(
    run: Path = typer.Argument(..., help="A run folder holding ledger.duckdb (run `inferledger reconstruct` first), "
                               "or a study folder (`inferledger study`)."),
    compare: Optional[Path] = typer.Option(None, "--compare", help="A second run to show side by side, with deltas."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write the HTML (default RUN/report.html)."),
    detail: int = typer.Option(300, help="Attempts drawn as timeline rows; a bigger run shows a sample of them."),
) -> None:
    """Write one self-contained HTML report of a run (or two, compared).

    The file holds the headline (goodput, energy per good result), run identity, latency per observation
    layer, a per-request timeline with drill-down, ITL, TTFT client vs server, KV blocks, the four
    accounts, the critical path, reconciliation and the gap register. plotly.js is inlined, so the file
    opens with no network. docs/REPORT.md says which ledger table each panel is drawn from.

    A study folder gets one page instead: the study's question, every table of its comparison, its
    timelines or curves drawn from each run's ledger, and the runs (each still opens alone).

    Example: [cyan]inferledger report runs/r1 --compare runs/r0[/]
    """
    from inferledger.cli.output import check_output, console, fail
    from inferledger.cli.progress import progress_bar
    from inferledger.report.build import build_report
    from inferledger.ledger.query import LedgerError

    if detail < 1:
        raise typer.BadParameter("needs at least 1 row", param_hint="--detail")
    if out is not None:
        check_output(out, "--out", example="report.html")
    from inferledger.probes.study_dir import is_study_dir

    try:
        if is_study_dir(run):
            if compare is not None:
                raise typer.BadParameter("a study folder compares its own runs; --compare takes run folders",
                                         param_hint="--compare")
            from inferledger.report.study_page import build_study_report

            with progress_bar(f"report {run}: the study's page"):
                result = build_study_report(run, out)
            runs = f"{result.attempts} run" + ("s" if result.attempts != 1 else "")
            console.print(f"report: [bold]{result.path}[/]  ({result.bytes / 2**20:.1f} MiB, {runs}, "
                          f"{result.seconds:.1f} s)")
            return
        with progress_bar(f"report {run}" + (f" compared with {compare}" if compare is not None else "")):
            result = build_report(run, out, compare=compare, detail_limit=detail)
    except LedgerError as exc:
        fail(f"error: {exc}")
    console.print(f"report: [bold]{result.path}[/]  ({result.bytes / 2**20:.1f} MiB, {result.attempts:,} attempts, "
                  f"{result.seconds:.1f} s)")


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
