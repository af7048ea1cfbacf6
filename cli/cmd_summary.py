"""`inferledger summary`: a built ledger's summary again, whole or one section, for people or scripts."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from inferledger.cli.output import FORMAT_HELP, OutputFormat
from inferledger.report.summary import SECTIONS


def summary_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory with its ledger.duckdb (inferledger reconstruct RUN)."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help=FORMAT_HELP + " Without --table: "
                                     "the whole summary (json: an object of sections; csv: one line per cell, "
                                     "section,row,column,value)."),
    table: Optional[str] = typer.Option(None, "--table", "-t", help="Only this section: " + ", ".join(SECTIONS)
                                        + " (peers: the load tool's own numbers beside ours and the engine's)."),
    all_tools: bool = typer.Option(False, "--all", help="--table peers of an imported run: every tool's rows, not "
                                   "only the importing tool's."),
) -> None:
    """Print the summary of a run's ledger without rebuilding it.

    Sections, the verdict first: where the median and the p99 request's time went (queue, prefill,
    decode, contention, transport, client), the registered prediction met or missed per request class,
    the first cause of the run's delay with its share and evidence (run_diagnosis); then latency per
    observation layer, the four accounts, the run's figures (good results,
    goodput, token rates, energy per good result), other tools' definitions of the same names
    (peer_views), for a run imported from a load tool ([bold]inferledger import --from
    aiperf|vllm-bench|guidellm[/]) the tool's own TTFT / ITL / TPOT / E2E beside ours on the same
    requests and the engine's with the reason they differ (peers), deadline misses by cause, ghost
    load, stream checks and the gap register's size. Unknown figures are null, never 0.

    Examples: [cyan]inferledger summary runs/r1 --table verdict_cause[/];
    [cyan]inferledger summary runs/a1 --table peers --format csv[/];
    [cyan]inferledger summary runs/r1 --format json | jq .run.goodput_rps[/]
    """
    from inferledger.cli.output import console, echo_rows, echo_sections, fail, section_rows
    from inferledger.cli.summary import print_sections, summary_sections

    if table is not None and table not in SECTIONS:
        raise typer.BadParameter(f"{table!r}: choose one of {', '.join(SECTIONS)}", param_hint="--table")
    ledger = run_dir / "ledger.duckdb"
    if not ledger.exists():
        fail(f"{ledger}: no ledger; build it with: inferledger reconstruct {run_dir}")
    sections = summary_sections(ledger, all_tools=all_tools)
    if table is None:
        if not echo_sections(fmt, sections):
            print_sections(sections, console)
    elif not echo_rows(fmt, *section_rows(sections[table])):
        print_sections(sections, console, only=table)


def register(app: typer.Typer) -> None:
    app.command("summary", no_args_is_help=True)(summary_cmd)
