"""`inferledger summary`: a built ledger's summary again, or its peer comparison for scripts."""
from __future__ import annotations

from pathlib import Path

import typer

from inferledger.cli.cmd_data import OutputFormat


def summary_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory with its ledger.duckdb (inferledger reconstruct RUN)."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f",
                                     help="table: the whole summary; csv or json: the peer comparison only, one row "
                                          "per metric × tool (the tool's reading, ours, the engine's, the reason)."),
    all_tools: bool = typer.Option(False, "--all", help="csv/json of an imported run: every tool's row, not only "
                                   "the importing tool's."),
) -> None:
    """Print the summary of a run's ledger without rebuilding it.

    For a run imported from a load tool ([bold]inferledger import --from aiperf|vllm-bench|guidellm[/]),
    the last table puts the tool's own TTFT / ITL / TPOT / E2E (the numbers it printed, reproduced from
    its records) beside ours on the same requests and the engine's, with the reason they differ.

    Example: [cyan]inferledger summary runs/a1 --format csv[/]
    """
    import duckdb

    from inferledger.cli.app import console
    from inferledger.cli.cmd_data import _fail
    from inferledger.cli.summary import COMPARISON_COLUMNS, comparison_rows, print_summary

    ledger = run_dir / "ledger.duckdb"
    if not ledger.exists():
        _fail(f"{ledger}: no ledger; build it with: inferledger reconstruct {run_dir}")
    if fmt == OutputFormat.table:
        print_summary(ledger, console)
        return
    import csv
    import io
    import json

    from inferledger.cli.cmd_data import _csv_cell, _plain

    con = duckdb.connect(str(ledger), read_only=True)
    try:
        rows = comparison_rows(con, imported_only=not all_tools)
    finally:
        con.close()
    if fmt == OutputFormat.json:
        typer.echo(json.dumps([{k: _plain(v) for k, v in r.items()} for r in rows], allow_nan=False))
        return
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COMPARISON_COLUMNS)
    w.writerows([_csv_cell(r[c]) for c in COMPARISON_COLUMNS] for r in rows)
    typer.echo(buf.getvalue(), nl=False)


def register(app: typer.Typer) -> None:
    app.command("summary", no_args_is_help=True)(summary_cmd)
