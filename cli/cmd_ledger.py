"""`inferledger reconstruct`: build a run's ledger."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from inferledger.cli.follow import EVERY_HELP, EVERY_MAX_S, EVERY_MIN_S, FOLLOW_HELP
from inferledger.cli.output import FORMAT_HELP, OutputFormat, command_name


def reconstruct_cmd(
    run_dir: str = typer.Argument(..., help="A run directory (events/, clocks.parquet, ...), or its URL "
                                  "(file://, s3://, memory://: any store fsspec reads; needs --out), or a study "
                                  "folder (every finished run, then the comparison)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write the ledger, a file named "
                                       "*.duckdb (default RUN_DIR/ledger.duckdb)."),
    memory_limit: Optional[str] = typer.Option(None, "--memory-limit", "-m", help="Most memory DuckDB may use "
                                               "(4GB, 512MiB, ...; default 1.25 GiB a CPU, at most a quarter of this machine's memory): "
                                               "beyond it joins, sorts and windows spill to disk beside the "
                                               "ledger. The exact percentiles over pooled gaps cannot spill: a "
                                               "build that runs out names its stage; give it more (2.5 GiB held "
                                               "100 M events)."),
    temp_directory: Optional[Path] = typer.Option(None, "--temp-directory", help="Where to spill (default a "
                                                  "folder beside the ledger, removed afterwards)."),
    engine: str = typer.Option("local", "--engine", help="local (one process, DuckDB) or ray: the engine and "
                               "task-bucket stages of a partitioned run (`inferledger repartition`) as Ray tasks, "
                               "the same ledger (needs `pip install 'inferledger[ray]'`; docs/SCALE.md)."),
    address: Optional[str] = typer.Option(None, "--address", help="With --engine ray: a Ray cluster's address "
                                          "(ray://host:10001 or auto); default a local Ray started and stopped here."),
    workers: int = typer.Option(2, "--workers", min=1, help="With --engine ray and no --address: the local Ray's "
                                "CPUs (one shard each); the memory limit is shared between them."),
    follow: bool = typer.Option(False, "--follow", help=FOLLOW_HELP + " One line per rebuild (json / csv: one "
                                "record each)."),
    every: float = typer.Option(2.0, "--every", min=EVERY_MIN_S, max=EVERY_MAX_S, help=EVERY_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the ledger path."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help=FORMAT_HELP + " json and csv hold "
                                     "what was built (section ledger) and the whole summary, as `inferledger "
                                     "summary` gives them."),
) -> None:
    """Rebuild every request of a run into [bold]ledger.duckdb[/] (DuckDB SQL over the Parquet files).

    The ledger holds the tables of the public SQL surface: events, samples, clocks, attempts,
    request_metrics, intervals, stream_checks, itl, accounts, tasks, gaps. Rebuilding is
    deterministic and never touches the raw files; docs/LEDGER.md defines every column.

    With --follow it keeps the ledger of a capture in progress up to date (docs/LEDGER.md "A ledger
    while the run records"): attempts not yet ended are in_flight, never failed.

    Example: [cyan]inferledger reconstruct runs/r1 && inferledger query runs/r1 "select * from accounts"[/];
    while [cyan]inferledger capture ... -o runs/r2[/] runs: [cyan]inferledger reconstruct runs/r2 --follow[/]
    """
    from inferledger.cli.output import check_output

    from inferledger.cli.output import console, echo_sections, fail

    if out is not None:  # before anything is read
        check_output(out, "--out", example="ledger.duckdb")
        if Path(out).suffix != ".duckdb":  # query, report and summary know a ledger file by its suffix
            fail(f"error: --out {out}: a ledger file's name ends in .duckdb (e.g. {Path(out).with_suffix('.duckdb')})")
    from inferledger.cli.progress import progress_bar
    from inferledger.cli.summary import print_sections, summary_sections
    from inferledger.ledger.memory import SizeError
    from inferledger.ledger.reconstruct import BuildOptions, RunDirError, reconstruct

    from inferledger.probes.run_folder import RunFolderError
    from inferledger.probes.study_dir import is_study_dir
    from inferledger.studies.framework import StudyError

    if follow:
        _follow(run_dir, every, out, quiet, fmt, BuildOptions(memory_limit=memory_limit,
                                                             temp_directory=temp_directory, engine=engine))
        return
    try:
        options = BuildOptions(memory_limit=memory_limit, temp_directory=temp_directory, engine=engine,
                               address=address, workers=workers)
        if "://" not in run_dir and is_study_dir(run_dir):
            if out is not None:
                raise typer.BadParameter("a study folder's runs keep their ledgers in their own folders",
                                         param_hint="--out")
            with progress_bar(f"reconstruct {run_dir}") as bar:
                _reconstruct_study(Path(run_dir), options, quiet, fmt, bar)
            return
        from inferledger.collectors.evidence.vllm_rejoin import is_recording

        if "://" not in run_dir and is_recording(run_dir):
            fail(f"{run_dir} is a recorded capture (raw evidence), not a run; join it into one first:\n"
                 f"  {command_name()} import --from vllm-recording {run_dir} -o runs/{Path(run_dir).name}\n"
                 f"  {command_name()} reconstruct runs/{Path(run_dir).name}")
        with progress_bar(f"reconstruct {run_dir}") as bar:
            summary = reconstruct(run_dir, options, out=out, on_stage=stage_ticks(bar, f"reconstruct {run_dir}"))
            bar.finish(f"reconstruct {run_dir}: done")
    except (RunDirError, SizeError, RunFolderError, StudyError) as exc:
        fail(f"error: {exc}")
    except KeyboardInterrupt:  # the ledger is written whole or not at all: the previous one stands
        fail(f"interrupted: the ledger being built was removed; a ledger built before is as it was; run "
             f"the same command again to rebuild {run_dir}", 130)
    if quiet:
        console.print(str(summary.path))
        return
    sections = summary_sections(summary.path)
    if echo_sections(fmt, {"ledger": {**asdict(summary), "path": str(summary.path)}, **sections}):
        return
    console.print(f"[bold]{summary.run_id}[/]: {summary.n_events} events, {summary.n_attempts} attempts, "
                  f"{summary.n_tasks} tasks, {summary.n_gaps} gaps → {summary.path}")
    print_sections(sections, console)


def _follow(run_dir: str, every: float, out, quiet: bool, fmt: OutputFormat, options) -> None:
    """reconstruct --follow: a line per rebuild (json: a record per line; csv: a header, then a row per
    rebuild), the path alone with --quiet, until the run finishes or Ctrl-C."""
    from inferledger.cli.follow import follow_run, refresh_line, refresh_record, refusal
    from inferledger.cli.output import console, csv_text, fail

    why = refusal(run_dir, options.engine)
    if why:
        fail(f"error: {why}")
    header = [True]

    def show(r) -> None:
        record = refresh_record(r)
        if fmt == OutputFormat.json:
            typer.echo(json.dumps(record, allow_nan=False))
        elif fmt == OutputFormat.csv:
            text = csv_text(list(record), [list(record.values())])
            typer.echo(text if header[0] else text.split("\n", 1)[1], nl=False)
            header[0] = False
        elif not quiet:
            typer.echo(refresh_line(r))

    summary = follow_run(run_dir, every, show, options=options, out=out)
    if quiet:
        console.print(str(summary.path))


def stage_ticks(bar, head: str):
    """`reconstruct`'s on_stage for a bar: one tick per ledger stage (a spinner for one of unknown length)."""
    def tick(name: str, i: int, n) -> None:
        bar.update(f"{head}: {name}", completed=i, total=n)
    return tick


def _reconstruct_study(folder: Path, options, quiet: bool, fmt: OutputFormat, bar) -> None:
    """Every run of a study folder rebuilt, then its comparison from the new ledgers (the study that
    wrote it, when this version knows it); `bar` shows the stages of the run being rebuilt."""
    from inferledger.cli.output import console, echo_sections, print_rows
    from inferledger.probes.run_folder import StudyIndex
    from inferledger.probes.study_dir import run_dirs
    from inferledger.studies.framework import kept_runs, rebuild_study
    from inferledger.studies.registry import STUDIES

    doc = StudyIndex.read(folder).doc
    name, kept = doc["name"], kept_runs(folder)
    unfinished = [{"run": run} for run, _ in run_dirs(folder, doc) if run not in kept]  # Ctrl-C stopped them
    built = []

    def one(run: str, summary) -> None:
        built.append({"run": run, **asdict(summary), "path": str(summary.path)})
        if not quiet and fmt == OutputFormat.table:
            bar.say(f"[bold]{run}[/]: {summary.n_events} events, {summary.n_attempts} attempts, "
                    f"{summary.n_tasks} tasks, {summary.n_gaps} gaps → {summary.path}")

    def stage(run: str, module: str, i: int, n) -> None:
        bar.update(f"reconstruct {folder}: {run}: {module}", completed=i, total=n)

    tables = rebuild_study(folder, STUDIES.get(name), options, on_run=one, on_stage=stage)
    bar.stop()
    if quiet:
        console.print("\n".join(b["path"] for b in built))
        return
    comparison = {t.name: [dict(zip(t.columns, row)) for row in t.rows] for t in tables or []}
    if echo_sections(fmt, {"ledgers": built, "not_finished": unfinished, **comparison}):
        return
    if unfinished:
        console.print(f"the comparison was left as it was: the study is {doc['state']}, not finished: "
                      f"{', '.join(u['run'] for u in unfinished)}; continue it with: {command_name()} study "
                      f"{name} --resume {folder}")
    elif tables is None:
        console.print(f"the comparison was left as it was (study {name!r}: "
                      + ("not one this version knows)" if name not in STUDIES else "it did not complete)"))
    for t in tables or []:
        print_rows(t.columns, t.rows, title=t.title, null="—")


def repartition_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory whose events/ to rewrite."),
    buckets: int = typer.Option(16, "--buckets", "-b", help="Task buckets (1-9999): about the number of "
                                "workers times two to four, so each shard fits a worker's memory."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Rewrite a run's events into the [bold]partitioned layout[/]: one folder per task bucket, per
    engine instance, and one for the rest (docs/SCALE.md).

    Safe to interrupt: the new layout is written whole beside the old one, then swapped in; run the
    command again after a kill and it finishes. The ledger is the same either way; `reconstruct
    --engine ray` needs this layout.

    Example: [cyan]inferledger repartition runs/big --buckets 32 && inferledger reconstruct runs/big --engine ray[/]
    """
    from rich.table import Table

    from inferledger.cli.output import console, echo_rows, fail
    from inferledger.collectors.rundir.repartition import RepartitionError, repartition

    if not run_dir.is_dir():
        fail(f"{run_dir}: no such run directory")
    from inferledger.cli.progress import progress_bar

    try:
        with progress_bar(f"repartition {run_dir} into {buckets} buckets"):
            counts = repartition(run_dir, buckets)
    except RepartitionError as exc:
        fail(f"error: {exc}")
    rows = sorted(counts.items())
    if echo_rows(fmt, ["partition", "events"], rows):
        return
    table = Table("partition", "events", title=f"{run_dir}/events: {sum(counts.values())} events")
    for name, n in rows:
        table.add_row(name, str(n))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("reconstruct")(reconstruct_cmd)
    app.command("repartition")(repartition_cmd)
