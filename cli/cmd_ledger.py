"""`inferledger reconstruct`: build a run's ledger."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from inferledger.cli.output import FORMAT_HELP, OutputFormat


def reconstruct_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory (events/, clocks.parquet, ...)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write the ledger (default "
                                       "RUN_DIR/ledger.duckdb)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the ledger path."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help=FORMAT_HELP + " json and csv hold "
                                     "what was built (section ledger) and the whole summary, as `inferledger "
                                     "summary` gives them."),
) -> None:
    """Rebuild every request of a run into [bold]ledger.duckdb[/] (DuckDB SQL over the Parquet files).

    The ledger holds the tables of the public SQL surface: events, samples, clocks, attempts,
    request_metrics, intervals, stream_checks, itl, accounts, tasks, gaps. Rebuilding is
    deterministic and never touches the raw files; docs/LEDGER.md defines every column.

    Example: [cyan]inferledger reconstruct runs/r1 && inferledger query runs/r1 "select * from accounts"[/]
    """
    from inferledger.cli.output import console, echo_sections, fail
    from inferledger.cli.summary import print_sections, summary_sections
    from inferledger.ledger.reconstruct import RunDirError, reconstruct

    try:
        summary = reconstruct(run_dir, out=out)
    except RunDirError as exc:
        fail(f"error: {exc}")
    if quiet:
        console.print(str(summary.path))
        return
    sections = summary_sections(summary.path)
    if echo_sections(fmt, {"ledger": {**asdict(summary), "path": str(summary.path)}, **sections}):
        return
    console.print(f"[bold]{summary.run_id}[/]: {summary.n_events} events, {summary.n_attempts} attempts, "
                  f"{summary.n_tasks} tasks, {summary.n_gaps} gaps → {summary.path}")
    print_sections(sections, console)


def register(app: typer.Typer) -> None:
    app.command("reconstruct")(reconstruct_cmd)
