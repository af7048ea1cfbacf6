"""`inferledger import` (E0 archive -> run directory) and `inferledger query` (read-only SQL).

Heavy libraries (duckdb, pyarrow) are imported inside the commands so `inferledger --help` stays fast.
"""
from __future__ import annotations

import csv
import io
import json
import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

TABLE_ROWS = 100  # rows a terminal table shows when --limit is not given

# The public SQL surface (DESIGN "Public SQL surface"): name -> one row per ...
SQL_SURFACE = [
    ("events", "raw event"), ("samples", "raw sample (energy, power, KV blocks)"),
    ("clocks", "clock domain or mapping"), ("attempts", "attempt: ids and the four statuses"),
    ("request_metrics", "attempt: TTFT, E2E, TPOT, ITL max, queue/prefill/decode, good"),
    ("intervals", "interval of a stream"), ("stream_checks", "attempt x stream: path sum vs span"),
    ("choice_metrics", "attempt x choice (n > 1): tokens, TTFT, TPOT, ITL max"),
    ("itl", "output event: inter-token gap per layer and choice"), ("accounts", "attempt: client/server/task/resource"),
    ("tasks", "task: outcome against its contract"), ("critical_path", "node: duration, slack, on path"),
    ("critical_path_edges", "edge of a critical-path graph"),
    ("reconciliation", "run: created ... unterminated, ghost load"),
    ("step_attribution", "engine step x attempt: its share of the step"),
    ("slo_misses", "attempt past its deadline: the dominant cause"),
    ("run_metrics", "run: goodput, vLLM-style goodput, energy per good result"),
    ("energy_shares", "attempt: its share of the window's energy"),
    ("peer_views", "metric x tool: TTFT / ITL / TPOT / E2E as vLLM bench, AIPerf, GuideLLM define them"),
    ("peer_comparison", "metric x tool: the tool's reading beside ours and the engine's, and why"),
    ("gaps", "gap: what is missing, what it affects"),
    ("reported_spans", "engine span (vLLM llm_request): its own figures beside ours"),
    ("reported_counters", "engine /metrics counter: run delta vs the spans' sum"),
    ("request_path", "reported attempt x node: client -> link -> queue -> prefill -> decode"),
    ("latency_percentiles", "figure x layer: n, mean, p50 / p90 / p95 / p99, max"),
]
QUERY_HELP = (
    "Run read-only SQL on the ledger of one run or of many runs at once.\n\n"
    "Each run needs its ledger.duckdb ([bold]inferledger reconstruct RUN[/] builds it). With a glob, each "
    "table is the union of all runs and [bold]run_id[/] tells their rows apart. Writes, ATTACH, COPY, SET, "
    "INSTALL ... are refused (exit 2), and so is SQL that does not parse or bind, with its position.\n\n"
    "Example:\n  [bold]inferledger query runs/r1 \"select attempt_id, ttft_client_ms from request_metrics "
    "order by 2 desc limit 5\"[/]\n"
    "  [bold]inferledger query 'runs/*' \"select run_id, count(*) from attempts group by run_id\" --format csv[/]\n\n"
    "Tables (the public SQL surface; [bold]show tables[/] lists what a ledger has, [bold]describe T[/] "
    "its columns):\n" + "\n".join(f"  [bold]{name:<16}[/] one row per {what}" for name, what in SQL_SURFACE)
)


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _fail(message: str) -> None:
    # Plain echo, not rich: DuckDB's caret under "LINE 1:" must stay aligned and unwrapped.
    typer.echo(message, err=True)
    raise typer.Exit(2)


class ImportSource(str, Enum):
    e0 = "e0"
    otlp = "otlp"
    aiperf = "aiperf"
    vllm_bench = "vllm-bench"
    guidellm = "guidellm"


def import_cmd(
    archive: Annotated[Path, typer.Argument(metavar="PATH", help="The E0 archive (JSON Lines), or the tool's output "
                                            "file or folder with --from.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The run folder to create (must not hold a run).")],
    source: Annotated[ImportSource, typer.Option("--from", help="What PATH is: e0 (our archive), otlp (an "
                                                 "OpenTelemetry Collector file-exporter file: OTLP/JSON trace "
                                                 "requests, one a line), aiperf (an "
                                                 "--artifact-dir or profile_export.jsonl), vllm-bench (the "
                                                 "--save-detailed result JSON), guidellm (the --output kind=json file).")] = ImportSource.e0,
    server: Annotated[Optional[Path], typer.Option("--server", help="A server-side run directory (serve --out, "
                                                   "capture, imported vLLM evidence) to merge and join per request.")] = None,
    tool_version: Annotated[Optional[str], typer.Option("--tool-version", help="The tool's version when its output does "
                                                        "not record it (vLLM bench's result JSON does not).")] = None,
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Run id for every row (default: the out folder's name).")] = None,
    lenient: Annotated[bool, typer.Option("--lenient", help="Import the good lines; register each refused line in gaps.parquet.")] = False,
    host: Annotated[Optional[str], typer.Option("--host", help="--from otlp: the host whose wall clock the spans are on "
                                                "(default: the resource's host.name).")] = None,
    reporter: Annotated[Optional[str], typer.Option("--reporter", help="--from otlp: who reported the spans, e.g. "
                                                    "vllm-0.32.0 (default: the resource's service.name).")] = None,
) -> None:
    """Import an E0 archive, or a load tool's own output, into a new run directory.

    [bold]--from e0[/] (default): each line is one event with the columns of DESIGN §4; run_id,
    event_id, seq and host are filled in when missing. clock.domain and clock.map lines go to
    clocks.parquet, task.start contracts to tasks.parquet. Any bad line (unknown name, missing id,
    non-integer ts_ns, undeclared clock, duplicate event_id, contradicting clock.map ...) is reported as
    ARCHIVE:LINE: reason; by default nothing is written then (exit 2), with --lenient the rest is
    imported and the refusals become gaps.

    [bold]--from aiperf|vllm-bench|guidellm[/]: the tool's per-request records become attempt.* client
    events on the tool's own clock (attrs.evidence = reported); with [bold]--server[/] the server run is
    merged, each request joined to its server attempt (x-request-id, prefix+index, response id; see
    docs/PEERS.md "Load tools") and the clock mapping estimated from the join. A malformed record is
    refused as FILE:LINE: field ... (exit 2), or kept as a gap with --lenient.

    Examples: [bold]inferledger import samples/e0/retry.jsonl --out runs/retry[/];
    [bold]inferledger import --from aiperf artifacts/ --server runs/s1 --out runs/a1[/], then
    [bold]inferledger reconstruct runs/a1[/] and [bold]inferledger report runs/a1[/].

    [bold]--from otlp[/]: spans from an OpenTelemetry Collector file (vLLM's llm_request spans become
    reported server and engine events): [bold]inferledger import --from otlp traces.jsonl --out runs/vllm-server
    --reporter vllm-0.32.0[/]; such a run can be the --server of a load tool's import. A span whose
    fields cannot be held is refused as FILE:LINE: span ID: field ... (exit 2), or kept as a gap with --lenient.
    """
    if source == ImportSource.otlp:
        return _import_otlp(archive, out, run_id, host, reporter, lenient)
    if source != ImportSource.e0:
        from inferledger.cli.import_peer import import_peer_cmd

        return import_peer_cmd(source.value, archive, out, server=server, run_id=run_id, lenient=lenient,
                               tool_version=tool_version, fail=_fail)
    if server is not None:
        _fail("inferledger import: --server goes with --from aiperf|vllm-bench|guidellm (an E0 archive carries its own server events)")
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from inferledger.collectors.importer import ArchiveError, OutDirError, import_archive

    try:
        res = import_archive(archive, out, run_id=run_id, lenient=lenient)
    except ArchiveError as exc:
        for n, reason in exc.refusals:
            typer.echo(f"{archive}:{n}: {reason}", err=True)
        _fail(f"{len(exc.refusals)} line(s) of {archive} refused; nothing was written. "
              "Fix them, or rerun with --lenient to import the rest and register these as gaps.")
    except (OutDirError, FileNotFoundError, IsADirectoryError) as exc:
        _fail(f"inferledger import: {exc}")
    for n, reason in res.refusals:
        typer.echo(f"warning: {archive}:{n}: {reason}", err=True)
    if res.refusals:
        typer.echo(f"warning: {res.refused} refused line(s) went to the gap register ({out / 'gaps.parquet'})", err=True)
    console = Console()
    console.print(f"imported {escape(str(archive))} -> {escape(str(out))} (run [bold]{escape(res.run_id)}[/])",
                  highlight=False)
    table = Table(show_header=True)
    for col in ("lines", "events", "clocks", "tasks", "refused"):
        table.add_column(col, justify="right")
    table.add_row(*(str(getattr(res, c)) for c in ("lines", "events", "clocks", "tasks", "refused")))
    console.print(table)


def _import_otlp(path: Path, out: Path, run_id, host, reporter, lenient: bool) -> None:
    from rich.console import Console
    from rich.markup import escape

    from inferledger.collectors.otlp_file import OtlpFileError
    from inferledger.collectors.otlp_import import import_otlp
    from inferledger.collectors.out_dir import OutDirError

    try:
        res = import_otlp(path, out, run_id=run_id, host=host, reporter=reporter, lenient=lenient)
    except OtlpFileError as exc:
        typer.echo(str(exc), err=True)
        _fail(f"inferledger import --from otlp: {len(exc.refusals)} span(s) or line(s) of {path} refused; nothing "
              "was written. Fix them, or rerun with --lenient to import the rest and register these as gaps.")
    except (OutDirError, FileNotFoundError, IsADirectoryError) as exc:
        _fail(f"inferledger import: {exc}")
    except OSError as exc:  # a full disk part-way: the run was being built aside, nothing is left at --out
        _fail(f"inferledger import --from otlp: {exc}; nothing was written to {out}")
    if res.refused:
        typer.echo(f"warning: {res.refused} refused span(s) or line(s) went to the gap register and "
                   f"{out / 'otlp' / 'refused.jsonl'}", err=True)
    Console().print(f"imported {escape(str(path))} -> {escape(str(out))} (run [bold]{escape(res.run_id)}[/]): "
                    f"{res.spans} spans ({res.request_spans} llm_request) -> {res.events} events on wall:"
                    f"{escape(res.host)}, reported by {escape(res.reporter)}", highlight=False)


def _plain(v):
    """A JSON-ready Python value (NaN and infinities have no JSON spelling: null)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _csv_cell(v) -> str:
    v = _plain(v)
    return "" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def query_cmd(
    target: Annotated[str, typer.Argument(metavar="RUN_DIR|GLOB", help="A run folder, a quoted glob like 'runs/*', or a ledger.duckdb file.")],
    sql: Annotated[str, typer.Argument(metavar="SQL", help="One read-only query (SELECT, WITH, EXPLAIN, SHOW, DESCRIBE, SUMMARIZE).")],
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help="table for people; csv or json (one array of records) for scripts.")] = OutputFormat.table,
    limit: Annotated[Optional[int], typer.Option("--limit", "-n", min=1, help=f"At most N rows (a table shows {TABLE_ROWS} by default).")] = None,
) -> None:
    """Run read-only SQL on the ledger of one run or of many runs at once."""
    from inferledger.ledger.query import LedgerError, open_ledger

    n = limit or (TABLE_ROWS if fmt == OutputFormat.table else None)
    try:
        with open_ledger(target) as led:
            columns, rows = led.rows(sql, limit=None if n is None else n + 1)
    except LedgerError as exc:
        _fail(str(exc))
    more = n is not None and len(rows) > n
    rows = rows[:n] if n is not None else rows
    if fmt == OutputFormat.csv:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_csv_cell(v) for v in row] for row in rows)
        typer.echo(buf.getvalue(), nl=False)
    elif fmt == OutputFormat.json:
        typer.echo(json.dumps([dict(zip(columns, map(_plain, row))) for row in rows], allow_nan=False))
    else:
        _print_table(columns, rows, more)


def _print_table(columns: list[str], rows: list[tuple], more: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    def cell(v) -> str:
        return "[dim]NULL[/]" if v is None else escape(str(_plain(v)))

    console = Console()
    if len(rows) <= 3 and len(columns) * 12 > console.width:
        # a few wide rows (run_metrics, reconciliation ...): one column per row, one line per field
        table = Table(show_header=True, header_style="bold")
        table.add_column("column")
        for i in range(len(rows)):
            table.add_column(f"row {i + 1}", overflow="fold")
        for j, col in enumerate(columns):
            table.add_row(escape(col), *(cell(row[j]) for row in rows))
    else:
        table = Table(show_header=True, header_style="bold")
        for col in columns:
            table.add_column(escape(col), overflow="fold")
        for row in rows:
            table.add_row(*(cell(v) for v in row))
    console.print(table)
    tail = f"{len(rows)} row(s)" + (" shown; more exist: raise --limit, or use --format csv" if more else "")
    console.print(tail, style="dim")


def register(app: typer.Typer) -> None:
    app.command("import", no_args_is_help=True)(import_cmd)
    app.command("query", no_args_is_help=True, help=QUERY_HELP)(query_cmd)
