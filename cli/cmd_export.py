"""`inferledger export`: a run as a Perfetto trace or OpenTelemetry spans (report/export.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def export_cmd(
    run: Path = typer.Argument(..., help="A run folder holding ledger.duckdb (run `inferledger reconstruct` first)."),
    kind: str = typer.Option(..., "--as", help="The file type to write: perfetto (Chrome trace-event JSON) or otlp "
                             "(OpenTelemetry spans)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Output file (default RUN/trace.perfetto.json or RUN/spans.otlp.jsonl)."),
    endpoint: Optional[str] = typer.Option(None, help="OTLP/HTTP collector URL, e.g. http://localhost:4318 "
                                                      "(--as otlp only; /v1/traces is added to a bare host)."),
) -> None:
    """Export the ledger for other tools.

    [bold]perfetto[/]: a trace for ui.perfetto.dev: a lane per attempt and stream with its stages as
    slices, engine steps, KV and power counters, a flow from the client's send to the server's receipt;
    each clock without a mapping in its own process.

    [bold]otlp[/]: one span per attempt with gen_ai.* attributes and a child span per stage, to a
    JSON-lines file (OTLP/JSON) or to an OTLP/HTTP endpoint.

    Example: [cyan]inferledger export runs/r1 --as perfetto[/]  (then open the file at ui.perfetto.dev)
    """
    from inferledger.cli.output import check_output, console, fail
    from inferledger.cli.progress import progress_bar
    from inferledger.report.export import FORMATS, export_run
    from inferledger.ledger.query import LedgerError

    fmt = kind.lower()
    if fmt not in FORMATS:
        raise typer.BadParameter(f"{kind!r}: choose one of {', '.join(FORMATS)}", param_hint="--as")
    if endpoint and fmt != "otlp":
        raise typer.BadParameter("--endpoint goes with --as otlp", param_hint="--endpoint")
    if out is not None:
        check_output(out, "--out")
    try:
        with progress_bar(f"export {run} as {fmt}"):
            result = export_run(run, fmt, out, endpoint=endpoint)
    except LedgerError as exc:
        fail(f"error: {exc}")
    except (ValueError, RuntimeError) as exc:
        fail(f"error: {exc}", code=1)
    what = ", ".join(f"{k} {v:,}" for k, v in result.counts.items())
    console.print(f"{fmt}: [bold]{result.destination}[/]  ({what}; {result.seconds:.1f} s)")


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)
