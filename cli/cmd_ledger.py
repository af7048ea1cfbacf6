"""`inferledger reconstruct`: build a run's ledger."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def reconstruct_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory (events/, clocks.parquet, ...)."),
    out: Optional[Path] = typer.Option(None, help="Where to write the ledger (default RUN_DIR/ledger.duckdb)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the ledger path."),
) -> None:
    """Rebuild every request of a run into [bold]ledger.duckdb[/] (DuckDB SQL over the Parquet files).

    The ledger holds the tables of the public SQL surface: events, samples, clocks, attempts,
    request_metrics, intervals, stream_checks, itl, accounts, tasks, gaps. Rebuilding is
    deterministic and never touches the raw files; docs/LEDGER.md defines every column.

    Example: [cyan]inferledger reconstruct runs/r1 && inferledger query runs/r1 "select * from accounts"[/]
    """
    from inferledger.cli.app import console, err
    from inferledger.cli.summary import print_summary
    from inferledger.ledger.reconstruct import RunDirError, reconstruct

    try:
        summary = reconstruct(run_dir, out=out)
    except RunDirError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2)
    if quiet:
        console.print(str(summary.path))
        return
    console.print(f"[bold]{summary.run_id}[/]: {summary.n_events} events, {summary.n_attempts} attempts, "
                  f"{summary.n_tasks} tasks, {summary.n_gaps} gaps → {summary.path}")
    print_summary(summary.path, console)


def register(app: typer.Typer) -> None:
    app.command("reconstruct")(reconstruct_cmd)
