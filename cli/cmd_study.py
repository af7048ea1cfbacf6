"""`inferledger study NAME`: run a study into a study folder and print its comparison."""
from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from inferledger.cli.output import FORMAT_HELP, OutputFormat


def study_cmd(
    name: str = typer.Argument(..., help="The study: schedule-book, kv-layout (simulated clock), chunked-prefill, "
                                         "prefix-cache, spec-decode, load, fidelity (real engine), routing (two "
                                         "replicas behind vLLM's router); docs/STUDIES.md says what each asks."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="New study folder (default runs/study-<name>-<time>)."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help=FORMAT_HELP + " Every table of the "
                                     "comparison (json: an object of tables; csv: one line per cell, "
                                     "section,row,column,value); the folder keeps the key table as comparison.csv."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help="key=value: one of the study's options "
                                             "(repeatable; docs/STUDIES.md lists each study's)."),
    workload: Optional[Path] = typer.Option(None, "--workload", help="A workload file (capture's TOML format) "
                                            "for a study that takes one (fidelity: the workload replayed on the "
                                            "simulated clock); the same as --set workload=FILE."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the study folder DIR that Ctrl-C (or "
                                          "a failure) stopped: its finished runs are kept, a half-done one is moved "
                                          "to DIR/interrupted/ and run again, with the options it recorded (a --set "
                                          "given again must equal them); a complete one prints its comparison."),
) -> None:
    """Run one of the book's experiments: a set of runs that differ in one knob, then one comparison.

    The study folder keeps every run (each a normal run directory: [bold]query[/], [bold]report[/] and
    [bold]reconstruct[/] open it alone) and the comparison (comparison.csv, comparison.json), computed
    from the runs' ledgers. [bold]inferledger report STUDY_DIR[/] draws it.

    The studies on the real engine load the bundled model once and capture each run through its HTTP
    front end (minutes on a CPU); [bold]--set scale=tiny[/] runs a few short requests instead.

    Ctrl-C keeps the runs finished so far and prints the command that continues the study
    ([bold]--resume[/]).

    Example: [cyan]inferledger study schedule-book -o runs/sched && inferledger report runs/sched[/]
    Example: [cyan]inferledger study load -o runs/load[/] (the knee and its first cause)
    Example: [cyan]inferledger study fidelity --workload samples/workloads/cpu_mixed.toml -o runs/fid[/]
    Example: [cyan]inferledger study load --resume runs/load[/] (after Ctrl-C: the runs not yet finished)
    Example: [cyan]inferledger study routing --set policies=round_robin,cache_aware -o runs/route[/] (the prefix
    cache's hits per router policy; vllm-router from [cyan]bash benchmarks/peers/vllm_router.sh install[/])
    """

    from inferledger.cli.output import check_output, fail
    from inferledger.cli.progress import progress_bar
    from inferledger.studies.framework import StudyError, parse_sets

    if out is not None and resume is not None:
        raise typer.BadParameter("give -o for a new study folder or --resume for one to continue, not both",
                                 param_hint="--resume")
    if out is not None:  # before anything is loaded (the default is a new folder under runs/)
        check_output(out, "--out", folder=True)
    if resume is not None:  # an existing folder, by design
        check_output(resume, "--resume", existing=True)

    try:
        with progress_bar(f"study {name}: reading it"):  # its code imports torch: seconds on a busy host
            from inferledger.studies.registry import get_study

            study = get_study(name)
        if workload is not None and "workload" not in study.options:
            raise StudyError(f"--workload: study {name} takes no workload file (its options: "
                             f"{', '.join(sorted(study.options)) or 'none'})")
        options = parse_sets(study, [*(sets or []), *([f"workload={workload}"] if workload is not None else [])])
    except StudyError as exc:
        fail(f"error: {exc}")
    target = resume or out or Path("runs") / f"study-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    from inferledger.cli.study_progress import run_and_print

    run_and_print(study, target, options, resume is not None, fmt)


def register(app: typer.Typer) -> None:
    app.command("study", no_args_is_help=True)(study_cmd)
