"""A study on the terminal: a progress bar per run and point, Ctrl-C's one line, then the comparison
(shared by `study` and `capture --sweep`)."""
from __future__ import annotations

from pathlib import Path

from inferledger.cli.output import OutputFormat, command_name


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
