"""`inferledger study NAME`: run a study into a study folder and print its comparison."""
from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from inferledger.cli.output import FORMAT_HELP, OutputFormat


def study_cmd(
    name: str = typer.Argument(..., help="The study: schedule-book, kv-layout (simulated clock), chunked-prefill, "
                                         "prefix-cache, spec-decode, load, fidelity (real engine); docs/STUDIES.md "
                                         "says what each asks."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="New study folder (default runs/study-<name>-<time>)."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help=FORMAT_HELP + " Every table of the "
                                     "comparison (json: an object of tables; csv: one line per cell, "
                                     "section,row,column,value); the folder keeps the key table as comparison.csv."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help="key=value: one of the study's options "
                                             "(repeatable; docs/STUDIES.md lists each study's)."),
    workload: Optional[Path] = typer.Option(None, "--workload", help="A workload file (capture's TOML format) "
                                            "for a study that takes one (fidelity: the workload replayed on the "
                                            "simulated clock); the same as --set workload=FILE."),
) -> None:
    """Run one of the book's experiments: a set of runs that differ in one knob, then one comparison.

    The study folder keeps every run (each a normal run directory: [bold]query[/], [bold]report[/] and
    [bold]reconstruct[/] open it alone) and the comparison (comparison.csv, comparison.json), computed
    from the runs' ledgers. [bold]inferledger report STUDY_DIR[/] draws it.

    The studies on the real engine load the bundled model once and capture each run through its HTTP
    front end (minutes on a CPU); [bold]--set scale=tiny[/] runs a few short requests instead.

    Example: [cyan]inferledger study schedule-book -o runs/book && inferledger report runs/book[/]
    Example: [cyan]inferledger study load -o runs/load[/] (the knee and its first cause)
    Example: [cyan]inferledger study fidelity --workload samples/workloads/cpu_mixed.toml -o runs/fid[/]
    """

    from inferledger.cli.output import console, echo_sections, fail, print_rows
    from inferledger.studies.framework import StudyError, parse_sets, run_study
    from inferledger.studies.registry import get_study
    from inferledger.cli.output import check_output

    if out is not None:  # before anything is loaded (the default is a new folder under runs/)
        check_output(out, "--out", folder=True)

    try:
        study = get_study(name)
        if workload is not None and "workload" not in study.options:
            raise StudyError(f"--workload: study {name} takes no workload file (its options: "
                             f"{', '.join(sorted(study.options)) or 'none'})")
        options = parse_sets(study, [*(sets or []), *([f"workload={workload}"] if workload is not None else [])])
        target = out or Path("runs") / f"study-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        def done(run: str, i: int, n: int, seconds: float, summary) -> None:
            if fmt == OutputFormat.table:
                console.print(f"run {i}/{n} [bold]{run}[/]: {summary.n_attempts} attempts, {seconds:.1f} s",
                              highlight=False)

        with console.status(f"study {name}: {target} ...", spinner="dots"):
            result = run_study(study, target, options, on_run=done)
    except StudyError as exc:
        fail(f"error: {exc}")
    if echo_sections(fmt, {t.name: [dict(zip(t.columns, row)) for row in t.rows] for t in result.tables}):
        return
    console.print(f"[bold]{study.name}[/]: {study.question}")
    for t in result.tables:
        print_rows(t.columns, t.rows, title=t.title, null="—")
        if t.note:
            console.print(f"[dim]{t.note}[/]")
    console.print(f"study folder: [bold]{result.path}[/] ({len(result.study['runs'])} runs, {result.seconds:.1f} s); "
                  f"draw it with: inferledger report {result.path}")


def register(app: typer.Typer) -> None:
    app.command("study", no_args_is_help=True)(study_cmd)
