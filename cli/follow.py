"""`--follow` of `reconstruct` and `summary`: the follow loop (ledger/follow.py) run for a command, its
refusals, its waits on stderr and Ctrl-C as every command ends on it."""
from __future__ import annotations

import signal
from pathlib import Path

import typer

EVERY_HELP = "With --follow: seconds between looks at the run's files (a rebuild only when one changed)."
EVERY_MIN_S, EVERY_MAX_S = 0.05, 3600.0  # --every's range: a look at most every hour
FOLLOW_HELP = ("Refresh the ledger of a capture in progress whenever a part is flushed, until its manifest says "
               "it finished (then a whole rebuild: the ledger a fresh reconstruct gives) or Ctrl-C; a refresh "
               "rebuilds only the tasks the new parts touch (whole where it cannot be sure; each line says which "
               "and why) and is renamed over ledger.duckdb, so `inferledger query` in another terminal reads the "
               "last one.")


def refusal(run_dir: str, engine: str = "local") -> str | None:
    """Why --follow cannot follow this, or None."""
    from inferledger.probes.study_dir import is_study_dir

    if "://" in run_dir:
        return f"--follow: {run_dir} is a URL; follow a run folder on this machine"
    if is_study_dir(run_dir):
        return f"--follow: {run_dir} is a study folder; follow one of its runs"
    if engine != "local":
        return "--follow: the Ray engine needs a partitioned run, which a capture writes only at its end; " \
               "follow with --engine local"
    return None


def follow_run(run_dir: str | Path, every_s: float, on_refresh, *, options=None, out=None):
    """Run the follow loop; exit 2 naming what is wrong, 130 on Ctrl-C (the last ledger left whole)."""
    from inferledger.cli.output import fail
    from inferledger.ledger.follow import FollowOptions, follow
    from inferledger.ledger.memory import SizeError
    from inferledger.ledger.reconstruct import BuildOptions, RunDirError
    from inferledger.probes.run_dir import PartError
    from inferledger.probes.run_folder import RunFolderError

    from inferledger.collectors.capture.interrupt import sigterm_like_sigint

    got = {"signum": None}
    try:
        # SIGINT taken whatever the process inherited (a background job starts with it ignored) and SIGTERM
        # stopping it the same way: the rebuild under way removed, the last ledger whole
        with sigterm_like_sigint() as got:
            return follow(run_dir, options or BuildOptions(), FollowOptions(every_s=every_s), out=out,
                          on_refresh=on_refresh, say=lambda line: typer.echo(line, err=True))
    except (RunDirError, SizeError, RunFolderError, PartError) as exc:
        fail(f"error: {exc}")
    except KeyboardInterrupt:
        term = got["signum"] == signal.SIGTERM
        fail(f"{'terminated (SIGTERM)' if term else 'interrupted'}: stopped following {run_dir}; the last "
             f"ledger built is whole and in place (a rebuild under way was removed)", 143 if term else 130)


def refresh_record(r) -> dict:
    """One refresh as a flat record (reconstruct --follow's json and csv lines, summary's `follow` section)."""
    return {"refresh": r.n, "final": r.final, "recording": r.recording, "seconds": round(r.seconds, 3),
            "run_id": r.summary.run_id, "n_events": r.summary.n_events, "n_attempts": r.summary.n_attempts,
            "in_flight": r.in_flight, "n_tasks": r.summary.n_tasks, "n_gaps": r.summary.n_gaps,
            "path": str(r.summary.path), "how": r.how}


def refresh_line(r) -> str:
    state = "final" if r.final else ("recording" if r.recording else "finished, files still moving")
    return (f"refresh {r.n} ({state}, {r.seconds:.2f} s): {r.summary.n_events} events, {r.summary.n_attempts} "
            f"attempts ({r.in_flight} in flight), {r.summary.n_tasks} tasks, {r.summary.n_gaps} gaps → {r.summary.path}; "
            f"{r.how}")
