"""`inferledger summary`: a built ledger's summary again, whole or one section, for people or scripts."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from inferledger.cli.follow import EVERY_HELP, EVERY_MAX_S, EVERY_MIN_S, FOLLOW_HELP
from inferledger.cli.output import FORMAT_HELP, OutputFormat, command_name
from inferledger.report.summary import SECTIONS


def summary_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory with its ledger.duckdb (inferledger reconstruct RUN), "
                                   "or a study folder (each run's summary, then the comparison)."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help=FORMAT_HELP + " Without --table: "
                                     "the whole summary (json: an object of sections; csv: one line per cell, "
                                     "section,row,column,value)."),
    table: Optional[str] = typer.Option(None, "--table", "-t", help="Only this section: " + ", ".join(SECTIONS)
                                        + " (peers: the load tool's own numbers beside ours and the engine's)."),
    all_tools: bool = typer.Option(False, "--all", help="--table peers of an imported run: every tool's rows, not "
                                   "only the importing tool's."),
    follow: bool = typer.Option(False, "--follow", help=FOLLOW_HELP + " The summary after each rebuild: redrawn "
                                "in place on a terminal, else one block each (json: one object per line)."),
    every: float = typer.Option(2.0, "--every", min=EVERY_MIN_S, max=EVERY_MAX_S, help=EVERY_HELP),
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

    With --follow it builds the ledger of a capture in progress and shows its summary after each
    rebuild, until the capture finishes (or Ctrl-C); attempts not yet ended are in flight, not failed.

    Examples: [cyan]inferledger summary runs/r1 --table verdict_cause[/];
    [cyan]inferledger summary runs/r2 --follow --every 5[/] (while a capture writes runs/r2);
    [cyan]inferledger summary runs/a1 --table peers --format csv[/];
    [cyan]inferledger summary runs/r1 --format json | jq .run.goodput_rps[/]
    """
    from inferledger.cli.output import console, echo_rows, echo_sections, fail, section_rows
    from inferledger.cli.summary import print_sections, summary_sections
    from inferledger.ledger.query import LedgerError

    if table is not None and table not in SECTIONS:
        raise typer.BadParameter(f"{table!r}: choose one of {', '.join(SECTIONS)}", param_hint="--table")
    from inferledger.probes.study_dir import is_study_dir

    if follow:
        _follow_summary(run_dir, every, table, all_tools, fmt)
        return
    if is_study_dir(run_dir):
        _study_summary(run_dir, table, all_tools, fmt)
        return
    ledger = run_dir / "ledger.duckdb"
    if not ledger.exists():
        fail(f"{ledger}: no ledger; build it with: {command_name()} reconstruct {run_dir}")
    try:
        sections = summary_sections(ledger, all_tools=all_tools)
    except LedgerError as exc:  # a ledger other code built (rebuild it), or one that cannot be opened
        fail(str(exc))
    if table is None:
        if not echo_sections(fmt, sections):
            print_sections(sections, console)
    elif not echo_rows(fmt, *section_rows(sections[table])):
        print_sections(sections, console, only=table)


def _follow_summary(run_dir: Path, every: float, table: str | None, all_tools: bool, fmt: OutputFormat) -> None:
    """summary --follow: the ledger rebuilt as the capture flushes, its summary (or one section) after
    each rebuild with a `follow` section saying which rebuild it is: redrawn in place (rich Live) on a
    terminal, else one block (json: one line) per rebuild."""
    import io
    from contextlib import nullcontext

    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from inferledger.cli.follow import follow_run, refresh_line, refresh_record, refusal
    from inferledger.cli.output import console, echo_sections, fail
    from inferledger.cli.summary import print_sections, summary_sections

    why = refusal(str(run_dir))
    if why:
        fail(f"error: {why}")
    live = Live(console=console, auto_refresh=False) if fmt == OutputFormat.table and console.is_terminal else None

    def show(r) -> None:
        sections = summary_sections(r.summary.path, all_tools=all_tools)
        shown = sections if table is None else {table: sections[table]}
        if echo_sections(fmt, {"follow": refresh_record(r), **shown}):
            return
        if live is None:
            console.rule(style="dim")
            console.print(refresh_line(r), markup=False, highlight=False, soft_wrap=True)
            print_sections(sections, console, only=table)
            return
        drawn = Console(file=io.StringIO(), width=console.width, force_terminal=True,
                        color_system=console.color_system)
        drawn.print(refresh_line(r), markup=False, highlight=False)
        print_sections(sections, drawn, only=table)
        live.update(Text.from_ansi(drawn.file.getvalue()), refresh=True)

    with live if live is not None else nullcontext():
        follow_run(run_dir, every, show)


def _study_summary(folder: Path, table: str | None, all_tools: bool, fmt: OutputFormat) -> None:
    """A study folder: each run's summary (or its one section), then the study's comparison."""
    from inferledger.cli.output import console, echo_sections, fail, print_rows
    from inferledger.cli.summary import print_sections, summary_sections
    from inferledger.ledger.query import LEDGER_FILE, LedgerError
    from inferledger.probes.run_folder import RunFolderError, StudyIndex
    from inferledger.probes.study_dir import COMPARISON_JSON, read_comparison, run_dirs
    from inferledger.studies.framework import finished

    try:
        doc = StudyIndex.read(folder).doc
        runs = run_dirs(folder, doc)
        comparison = read_comparison(folder) if (folder / COMPARISON_JSON).exists() else {}
    except RunFolderError as exc:
        fail(f"error: {exc}")
    # a study Ctrl-C stopped: the runs it finished, and the ones it did not named with how to continue
    unfinished = [name for name, run in runs if not finished(run)]
    runs = [(name, run) for name, run in runs if name not in unfinished]
    resume = f"continue it with: {command_name()} study {doc['name']} --resume {folder}"
    if not runs:
        fail(f"{folder}: the study is {doc['state']} and none of its runs has finished; {resume}")
    missing = [str(run) for _, run in runs if not (run / LEDGER_FILE).exists()]
    if missing:
        fail(f"{', '.join(missing)}: no ledger; build them with: {command_name()} reconstruct {folder}")
    try:
        per_run = {name: summary_sections(run / LEDGER_FILE, all_tools=all_tools) for name, run in runs}
    except LedgerError as exc:
        fail(str(exc))
    sections = {f"{name}.{sec}": value for name, secs in per_run.items() for sec, value in secs.items()
                if table is None or sec == table}
    sections |= {f"comparison.{name}": [dict(zip(t["columns"], row)) for row in t["rows"]]
                 for name, t in comparison.items()}
    if echo_sections(fmt, sections):
        return
    for name, secs in per_run.items():
        console.rule(f"[bold]{name}[/]", align="left")
        print_sections(secs, console, only=table)
    console.rule("[bold]comparison[/]", align="left")
    if not comparison:
        console.print(f"no comparison yet: the study is {doc['state']}"
                      + (f", not finished: {', '.join(unfinished)}; {resume}" if unfinished else ""))
    for t in comparison.values():
        print_rows(t["columns"], t["rows"], title=t.get("title"), null="—")


def register(app: typer.Typer) -> None:
    app.command("summary", no_args_is_help=True)(summary_cmd)
