"""`inferledger import` (E0 archive -> run directory) and `inferledger query` (read-only SQL).

Heavy libraries (duckdb, pyarrow) are imported inside the commands so `inferledger --help` stays fast.
"""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from inferledger.cli.output import FORMAT_HELP, OutputFormat, command_name, echo_result, echo_rows, fail

TABLE_ROWS = 100  # rows a terminal table shows when --limit is not given

# The public SQL surface (docs/LEDGER.md defines every table): name -> one row per ...
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
    ("kv_holds", "attempt x KV block it held: how, from, to, back in the pool"),
    ("attempt_causes", "attempt: ms per cause of delay (queue, interference, contention, transport ...)"),
    ("slo_misses", "late attempt (deadline or SLO threshold): its causes, the dominant one"),
    ("run_diagnosis", "run, and its load point: each cause's share of the late requests' delay, the first"),
    ("run_metrics", "run: goodput, vLLM-style goodput, energy per good result"),
    ("energy_shares", "attempt: its share of the window's energy"),
    ("peer_views", "metric x tool: TTFT / ITL / TPOT / E2E as vLLM bench, AIPerf, GuideLLM define them"),
    ("peer_comparison", "metric x tool: the tool's reading beside ours and the engine's, and why"),
    ("gaps", "gap: what is missing, what it affects"),
    ("reported_spans", "engine span (vLLM llm_request): its own figures beside ours"),
    ("reported_counters", "engine /metrics counter: run delta vs the spans' sum"),
    ("reported_timings", "attempt: llama.cpp's own timings (prefill, decode, cached tokens) as reported"),
    ("replicas", "replica behind a router: attempts, unseen tries, busy time, queue, the router's count"),
    ("request_path", "reported attempt x node: client -> link -> queue -> prefill -> decode"),
    ("latency_percentiles", "figure x layer: n, mean, p50 / p90 / p95 / p99, max"),
    ("step_model", "engine step: FLOPs, bytes, lower bound per stage, measured, residual"),
    ("model_residuals", "batch size x context bucket x mode: median residual against the bound"),
    ("residual_sources", "candidate residual source: its ms per step, the dominant one"),
    ("step_fit", "fit parameter or error: alpha, P_eff, B_eff, held-out error, covered range"),
    ("step_fit_points", "engine step the fit saw: split, predicted, error, extrapolated"),
    ("request_model", "attempt: TTFT / TPOT predicted from its steps, bound, residual by source"),
    ("roofline_points", "engine step: intensity, achieved TFLOP/s, share of its bound"),
    ("roofline_roofs", "roof: peak, sustained or effective, with its value and source"),
    ("model_summary", "one row: the median step's share of its bound, the dominant residual source"),
    ("prediction_registration", "the registered prediction: hash, valid, registered before the first event"),
    ("prediction_check", "predicted request shape: TTFT / TPOT bounds and ranges beside the measured"),
    ("ledger_build", "one row: the inferledger and the ledger modules' code that built it"),
    ("ledger_parts", "Parquet part the ledger was built from: size, footer hash (events read there)"),
    ("event_copies_left_out", "second copy of an event id that events leaves out (part, row)"),
]
QUERY_HELP = (
    "Run read-only SQL on the ledger of one run or of many runs at once (a study folder: all its runs).\n\n"
    "Each run needs its ledger.duckdb ([bold]inferledger reconstruct RUN[/] builds it). With a glob, each "
    "table is the union of all runs and [bold]run_id[/] tells their rows apart. Writes, ATTACH, COPY, SET, "
    "INSTALL ... are refused (exit 2), and so is SQL that does not parse or bind, with its position.\n\n"
    "Example:\n  [bold]inferledger query runs/r1 \"select attempt_id, ttft_client_ms from request_metrics "
    "order by 2 desc limit 5\"[/]\n"
    "  [bold]inferledger query 'runs/*' \"select run_id, count(*) from attempts group by run_id\" --format csv[/]\n\n"
    "Tables (the public SQL surface; [bold]show tables[/] lists what a ledger has, [bold]describe T[/] "
    "its columns):\n" + "\n".join(f"  [bold]{name:<16}[/] one row per {what}" for name, what in SQL_SURFACE)
)


class ImportSource(str, Enum):
    e0 = "e0"
    otlp = "otlp"
    aiperf = "aiperf"
    vllm_bench = "vllm-bench"
    guidellm = "guidellm"
    vllm_recording = "vllm-recording"


def import_cmd(
    archive: Annotated[Path, typer.Argument(metavar="PATH", help="The E0 archive (JSON Lines), or the tool's output "
                                            "file or folder with --from.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The run folder to create (must not hold a run).")],
    source: Annotated[ImportSource, typer.Option("--from", help="What PATH is: e0 (our archive), otlp (an "
                                                 "OpenTelemetry Collector file-exporter file: OTLP/JSON trace "
                                                 "requests, one a line), aiperf (an "
                                                 "--artifact-dir or profile_export.jsonl), vllm-bench (the "
                                                 "--save-detailed result JSON), guidellm (the --output kind=json file), "
                                                 "vllm-recording (a recorded capture against vLLM or llama.cpp, "
                                                 "samples/peers/vllm-0.32-cpu or samples/peers/llamacpp: joined "
                                                 "again into a run).")] = ImportSource.e0,
    server: Annotated[Optional[Path], typer.Option("--server", help="A server-side run directory (serve --out, "
                                                   "capture, imported vLLM evidence) to merge and join per request.")] = None,
    tool_version: Annotated[Optional[str], typer.Option("--tool-version", help="The tool's version when its output does "
                                                        "not record it (vLLM bench's result JSON does not).")] = None,
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Run id for every row (default: the out folder's name).")] = None,
    lenient: Annotated[bool, typer.Option("--lenient", help="Import the good lines; register each refused line in gaps.parquet.")] = False,
    engine_host: Annotated[Optional[str], typer.Option("--engine-host", help="--from otlp: the engine's host, whose "
                                                       "wall clock the spans are on (default: the resource's "
                                                       "host.name).")] = None,
    reporter: Annotated[Optional[str], typer.Option("--reporter", help="--from otlp: who reported the spans, e.g. "
                                                    "vllm-0.32.0 (default: the resource's service.name).")] = None,
    model_config: Annotated[Optional[Path], typer.Option("--model-config", help="The served model's Hugging Face "
                                                         "config.json (or its folder): recorded in the run's manifest "
                                                         "as model_shape, declared, so the workload model can hold the "
                                                         "run against its bounds (docs/MODEL.md).")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help=FORMAT_HELP + " One row: what was imported "
                                              "(refusals and warnings go to stderr in every format).")] = OutputFormat.table,
) -> None:
    """Import an E0 archive, or a load tool's own output, into a new run directory.

    [bold]--from e0[/] (default): each line is one event with the columns of docs/EVENTS.md; run_id,
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

    Examples: [bold]inferledger import samples/e0/r2_timeout_retry/archive.jsonl --out runs/retry[/];
    [bold]inferledger import --from aiperf artifacts/ --server runs/s1 --out runs/a1[/], then
    [bold]inferledger reconstruct runs/a1[/] and [bold]inferledger report runs/a1[/].

    [bold]--from otlp[/]: spans from an OpenTelemetry Collector file (vLLM's llm_request spans become
    reported server and engine events): [bold]inferledger import --from otlp traces.jsonl --out runs/vllm-server
    --reporter vllm-0.32.0[/]; such a run can be the --server of a load tool's import. A span whose
    fields cannot be held is refused as FILE:LINE: span ID: field ... (exit 2), or kept as a gap with --lenient.
    Add [bold]--model-config config.json[/] to declare the model the peer served.
    """
    shape = None
    if model_config is not None:  # checked before anything is written
        from inferledger.collectors.rundir.declared_shape import read_model_config
        from inferledger.probes.model_shape import ShapeError

        try:
            shape = read_model_config(model_config)
        except ShapeError as exc:
            fail(f"inferledger import --model-config: {exc}; nothing was written")
    if source == ImportSource.otlp:
        _import_otlp(archive, out, run_id, engine_host, reporter, lenient, fmt)
    elif source == ImportSource.vllm_recording:
        _import_recording(archive, out, fmt)
    elif source != ImportSource.e0:
        from inferledger.cli.import_peer import import_peer_cmd

        import_peer_cmd(source.value, archive, out, server=server, run_id=run_id, lenient=lenient,
                        tool_version=tool_version, fail=fail, fmt=fmt)
    else:
        _import_e0(archive, out, server, run_id, lenient, fmt)
    if shape is not None:
        from inferledger.collectors.rundir.declared_shape import declare_model_shape

        declare_model_shape(out, shape)


def _import_recording(sample: Path, out: Path, fmt: OutputFormat) -> None:
    """A recorded capture against a peer engine (samples/peers/vllm-0.32-cpu/, samples/peers/llamacpp/: the
    client's events, the engine's spans and scrapes, as each side produced them) joined again into a run,
    as the capture joined them."""
    from inferledger.cli.output import console
    from inferledger.collectors.evidence.vllm_rejoin import RecordingError, check_recording, is_recording, rejoin
    from inferledger.collectors.rundir.out_dir import OutDirError, check_new_run_dir

    if not is_recording(sample):
        fail(f"inferledger import --from vllm-recording: {sample} is not a recorded capture (client/events.parquet "
             "and otlp/ or scrapes/ beside its manifest)")
    try:
        check_recording(sample)
        check_new_run_dir(out)
    except RecordingError as exc:
        fail(f"inferledger import --from vllm-recording: {exc}")
    except OutDirError as exc:
        fail(f"inferledger import: {exc}")
    from inferledger.cli.progress import progress_bar

    with progress_bar(f"import {sample}: joining the engine's evidence"):
        try:
            join = rejoin(sample, out)
        except RecordingError as exc:  # found before the run folder is written
            fail(f"inferledger import --from vllm-recording: {exc}")
    if not echo_rows(fmt, list(join), [list(join.values())]):
        console.print(f"rejoined {sample} -> {out}: {', '.join(f'{k} {v}' for k, v in join.items())}\n"
                      f"next: {command_name()} reconstruct {out}", highlight=False, soft_wrap=True)


def _import_e0(archive: Path, out: Path, server, run_id, lenient: bool, fmt: OutputFormat) -> None:
    if server is not None:
        fail("inferledger import: --server goes with --from aiperf|vllm-bench|guidellm (an E0 archive carries its own server events)")
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from inferledger.collectors.rundir.e0_import import ArchiveError, OutDirError, import_archive

    from inferledger.cli.progress import progress_bar

    try:
        with progress_bar(f"import {archive}"):
            res = import_archive(archive, out, run_id=run_id, lenient=lenient)
    except ArchiveError as exc:
        for n, reason in exc.refusals:
            typer.echo(f"{archive}:{n}: {reason}", err=True)
        fail(f"{len(exc.refusals)} line(s) of {archive} refused; nothing was written. "
              "Fix them, or rerun with --lenient to import the rest and register these as gaps.")
    except (OutDirError, FileNotFoundError, IsADirectoryError) as exc:
        fail(f"inferledger import: {exc}")
    for n, reason in res.refusals:
        typer.echo(f"warning: {archive}:{n}: {reason}", err=True)
    if res.refusals:
        typer.echo(f"warning: {res.refused} refused line(s) went to the gap register ({out / 'gaps.parquet'})", err=True)
    if echo_result(fmt, res):
        return
    console = Console()
    console.print(f"imported {escape(str(archive))} -> {escape(str(out))} (run [bold]{escape(res.run_id)}[/])",
                  highlight=False)
    table = Table(show_header=True)
    for col in ("lines", "events", "clocks", "tasks", "refused"):
        table.add_column(col, justify="right")
    table.add_row(*(str(getattr(res, c)) for c in ("lines", "events", "clocks", "tasks", "refused")))
    console.print(table)


def _import_otlp(path: Path, out: Path, run_id, host, reporter, lenient: bool, fmt: OutputFormat) -> None:
    from rich.console import Console
    from rich.markup import escape

    from inferledger.collectors.evidence.otlp_file import OtlpFileError
    from inferledger.collectors.evidence.otlp_import import import_otlp
    from inferledger.collectors.rundir.out_dir import OutDirError

    from inferledger.cli.progress import progress_bar

    try:
        with progress_bar(f"import {path}"):
            res = import_otlp(path, out, run_id=run_id, host=host, reporter=reporter, lenient=lenient)
    except OtlpFileError as exc:
        typer.echo(str(exc), err=True)
        fail(f"inferledger import --from otlp: {len(exc.refusals)} span(s) or line(s) of {path} refused; nothing "
             "was written. Fix them, or rerun with --lenient to import the rest and register these as gaps.")
    except (OutDirError, FileNotFoundError, IsADirectoryError) as exc:
        fail(f"inferledger import: {exc}")
    except OSError as exc:  # a full disk part-way: the run was being built aside, nothing is left at --out
        fail(f"inferledger import --from otlp: {exc}; nothing was written to {out}")
    if res.refused:
        typer.echo(f"warning: {res.refused} refused span(s) or line(s) went to the gap register and "
                   f"{out / 'otlp' / 'refused.jsonl'}", err=True)
    if echo_result(fmt, res):
        return
    Console().print(f"imported {escape(str(path))} -> {escape(str(out))} (run [bold]{escape(res.run_id)}[/]): "
                    f"{res.spans} spans ({res.request_spans} llm_request) -> {res.events} events on wall:"
                    f"{escape(res.host)}, reported by {escape(res.reporter)}", highlight=False)


def query_cmd(
    target: Annotated[str, typer.Argument(metavar="RUN_DIR|GLOB", help="A run folder, a quoted glob like 'runs/*', or a ledger.duckdb file.")],
    sql: Annotated[str, typer.Argument(metavar="SQL", help="One read-only query (SELECT, WITH, EXPLAIN, SHOW, DESCRIBE, SUMMARIZE).")],
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help=FORMAT_HELP)] = OutputFormat.table,
    limit: Annotated[Optional[int], typer.Option("--limit", "-n", min=1, help=f"At most N rows (a table shows {TABLE_ROWS} by default).")] = None,
) -> None:
    """Run read-only SQL on the ledger of one run or of many runs at once."""
    from inferledger.ledger.query import LedgerError, open_ledger

    n = limit or (TABLE_ROWS if fmt == OutputFormat.table else None)
    try:
        with open_ledger(target) as led:
            columns, rows = led.rows(sql, limit=None if n is None else n + 1)
    except LedgerError as exc:
        fail(str(exc))
    for line in led.stale:  # the user's SQL may still read it; its columns may be another version's
        typer.echo(f"warning: {line}", err=True)
    if led.skipped:
        typer.echo(f"warning: {len(led.skipped)} run(s) without a ledger left out (build with `inferledger "
                   f"reconstruct RUN`): {', '.join(map(str, led.skipped))}", err=True)
    more = n is not None and len(rows) > n
    rows = rows[:n] if n is not None else rows
    if not echo_rows(fmt, columns, rows):
        _print_table(columns, rows, more)


def _print_table(columns: list[str], rows: list[tuple], more: bool) -> None:
    from inferledger.cli.output import console, print_rows

    print_rows(columns, rows)
    tail = f"{len(rows)} row(s)" + (" shown; more exist: raise --limit, or use --format csv" if more else "")
    console.print(tail, style="dim")


def register(app: typer.Typer) -> None:
    app.command("import", no_args_is_help=True)(import_cmd)
    app.command("query", no_args_is_help=True, help=QUERY_HELP)(query_cmd)
