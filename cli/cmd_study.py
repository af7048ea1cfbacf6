"""`inferledger study NAME`: run a study into a study folder and print its comparison."""
from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from inferledger.cli.output import FORMAT_HELP, OutputFormat, command_name


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
    run_and_print(study, target, options, resume is not None, fmt)


def run_and_print(study, target: Path, options: dict, resume: bool, fmt: OutputFormat) -> None:
    """The study run (its progress, Ctrl-C as `_run` says), then its comparison printed in `fmt` and
    where its folder is (shared by `study` and `capture --sweep`)."""
    from inferledger.cli.output import console, echo_sections, print_rows

    result = _run(study, target, options, resume, fmt)
    if echo_sections(fmt, {t.name: [dict(zip(t.columns, row)) for row in t.rows] for t in result.tables}):
        return
    console.print(f"[bold]{study.name}[/]: {study.question}")
    for t in result.tables:
        print_rows(t.columns, t.rows, title=t.title, null="—")
        if t.note:
            console.print(f"[dim]{t.note}[/]")
    console.print(f"study folder: [bold]{result.path}[/] ({len(result.study['runs'])} runs, {result.seconds:.1f} s); "
                  f"draw it with: {command_name()} report {result.path}")


def _run(study, target: Path, options: dict, resume: bool, fmt: OutputFormat):
    """The study run with its progress bar (stderr, a terminal only); Ctrl-C or SIGTERM: one line saying
    what was kept and how to continue, exit 130 (143), no traceback."""
    import shlex
    import signal

    from inferledger.cli.output import fail
    from inferledger.cli.progress import progress_bar
    from inferledger.collectors.capture.interrupt import sigterm_like_sigint
    from inferledger.probes.run_folder import StudyIndex
    from inferledger.studies.framework import StudyError, StudyWatch, kept_runs, run_study

    current = {"head": f"study {study.name}"}  # the run being worked on, as the bar names it

    with sigterm_like_sigint() as got, progress_bar(f"study {study.name}: {target}", None) as bar:
        def start(run: str, i: int, n: int, what: str) -> None:
            if not i:  # before the runs: the model's load
                bar.update(f"study {study.name}: {what} {run}", completed=0, total=n)
                return
            current["head"] = f"study {study.name}: run {i}/{n} {run}"
            bar.update(f"{current['head']}: {what}", completed=i - 1, total=n)
            if what.startswith("set aside") and fmt == OutputFormat.table:
                bar.say(f"run {i}/{n} [bold]{run}[/]: half-done, {what}")

        def task(k: int, m: int) -> None:
            bar.update(f"{current['head']}: producing, task {k}/{m}")

        def stage(module: str, k: int, m) -> None:
            bar.update(f"{current['head']}: ledger {module}" + (f" ({k + 1}/{m})" if m else ""))

        def done(run: str, i: int, n: int, seconds: float, summary) -> None:
            bar.update(completed=i, total=n)
            if fmt != OutputFormat.table:
                return
            if summary is None:
                bar.say(f"run {i}/{n} [bold]{run}[/]: kept (finished before the resume)")
            else:
                bar.say(f"run {i}/{n} [bold]{run}[/]: {summary.n_attempts} attempts, {seconds:.1f} s; "
                        + point_figures(summary.path))

        try:
            return run_study(study, target, options, resume=resume,
                             watch=StudyWatch(on_start=start, on_stage=stage, on_run=done, on_task=task,
                                              signal=lambda: "SIGTERM" if got["signum"] == signal.SIGTERM else None))
        except StudyError as exc:
            bar.stop()
            fail(f"error: {exc}")
        except KeyboardInterrupt as exc:
            bar.stop()
            signum = getattr(exc, "signum", None) or got["signum"] or 2
            if not StudyIndex.exists(target):
                fail(f"interrupted: study {study.name} stopped before it wrote anything", 128 + signum)
            kept = kept_runs(target)
            fail(f"interrupted: study {study.name} kept {len(kept)} finished run{'s' if len(kept) != 1 else ''}"
                 f"{' (' + ', '.join(kept) + ')' if kept else ''} in {target}; continue it with: "
                 f"{command_name()} study {study.name} --resume {shlex.quote(str(target))}", 128 + signum)


POINT_SQL = """
SELECT (SELECT goodput_rps FROM run_metrics) AS goodput_rps,
       (SELECT p50_ms FROM latency_percentiles WHERE metric = 'TTFT' AND n > 0 ORDER BY position LIMIT 1) AS ttft,
       (SELECT layer FROM latency_percentiles WHERE metric = 'TTFT' AND n > 0 ORDER BY position LIMIT 1) AS ttft_at,
       (SELECT p50_ms FROM latency_percentiles WHERE metric = 'ITL' AND n > 0 ORDER BY position LIMIT 1) AS itl,
       (SELECT layer FROM latency_percentiles WHERE metric = 'ITL' AND n > 0 ORDER BY position LIMIT 1) AS itl_at
"""


def point_figures(ledger: Path) -> str:
    """A finished run's goodput and median TTFT and ITL (the first layer that has them), from its ledger,
    for the line the study prints as it goes; unknown where the ledger has none."""
    from inferledger.ledger.query import open_ledger

    with open_ledger(ledger) as led:
        goodput, ttft, ttft_at, itl, itl_at = led.rows(POINT_SQL)[1][0]

    def ms(v, at) -> str:
        return "unknown" if v is None else f"{float(v):.1f} ms ({at})"
    return (f"goodput {'unknown' if goodput is None else f'{float(goodput):.3g} req/s'}, "
            f"TTFT p50 {ms(ttft, ttft_at)}, ITL p50 {ms(itl, itl_at)}")


def register(app: typer.Typer) -> None:
    app.command("study", no_args_is_help=True)(study_cmd)
