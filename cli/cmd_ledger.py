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
    memory_limit: Optional[str] = typer.Option(None, "--memory-limit", "-m", help="Most memory DuckDB may use "
                                               "(4GB, 512MiB, ...; default a quarter of this machine's memory): "
                                               "beyond it the build spills to disk beside the ledger, so a run of "
                                               "any size fits."),
    temp_directory: Optional[Path] = typer.Option(None, "--temp-directory", help="Where to spill (default a "
                                                  "folder beside the ledger, removed afterwards)."),
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
    from inferledger.cli.output import console, echo_sections, err
    from inferledger.cli.summary import print_sections, summary_sections
    from inferledger.ledger.memory import SizeError
    from inferledger.ledger.reconstruct import RunDirError, reconstruct

    try:
        summary = reconstruct(run_dir, out=out, memory_limit=memory_limit, temp_directory=temp_directory)
    except (RunDirError, SizeError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2)
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
