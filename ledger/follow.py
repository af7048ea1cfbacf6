"""Following a run while it is recorded: its ledger rebuilt from the parts flushed so far, again and again.

`follow` is `reconstruct RUN --follow`: every `every_s` seconds it looks at the run folder's files (each
one's path, size and mtime, the ledger and what is drawn from it aside) and, when one changed, rebuilds
the whole ledger with `reconstruct`, which writes a new file beside `ledger.duckdb` and renames it over
it: a reader (`inferledger query RUN` in another terminal) opens the last complete ledger, never a half
built one and never a lock. A capture writes every part under a dot name and renames it whole
(collectors/rundir/writer.py), and the manifest the same way, so a refresh never reads a part being
written; a part that vanishes under a build (the capture's compaction at its end merges them) only
skips that refresh, and one renamed in between a look and its build is read by that build and
rebuilt once more at the next look (the same ledger).

While the manifest's state is starting or running (`Manifest.recording`), an attempt without an end is
in flight (attempts.client_status `in_flight`, with a gap), not unterminated: it is counted in no
figure of ended attempts. Once the manifest says the run finished (complete or interrupted, or has no
state: a run of another writer), one more rebuild from the files as they are then, and `follow` returns
its summary: the ledger a fresh `reconstruct` gives. A folder without a manifest yet (a capture just
started) is waited for, at most `wait_s`; a file named as the run folder is refused at once.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb

from inferledger.ledger.incremental import refresh, state_path
from inferledger.ledger.query import LEDGER_FILE
from inferledger.ledger.reconstruct import BuildOptions, LedgerSummary, RunDirError
from inferledger.probes.run_folder import Manifest, RunFolderError

# what is drawn from a run rather than recorded in it: a change to these is no reason to rebuild
DERIVED_SUFFIXES = (".duckdb", ".duckdb.wal", ".html", ".perfetto.json", ".otlp.jsonl")


@dataclass(frozen=True)
class FollowOptions:
    """How often to look (`every_s`, `reconstruct --every`) and how long to wait for a folder that holds
    no manifest yet (`wait_s`)."""
    every_s: float = 2.0
    wait_s: float = 60.0
    # a capture rewrites its manifest at every flush (2 s by default): this long with no file of the run
    # changed while its manifest still says recording, it may have been killed (SIGKILL writes no last state)
    silent_s: float = 60.0


@dataclass(frozen=True)
class Refresh:
    """One rebuild: its number (1 for the first), the ledger's summary, how long it took, whether the run
    was still recording and how many attempts were in flight; `final` for the last one; how it was built
    (`incremental: ...` or `whole: why`, ledger/incremental.py) and the seconds of its steps."""
    n: int
    summary: LedgerSummary
    seconds: float
    recording: bool
    in_flight: int
    final: bool
    how: str = ""
    steps: dict | None = None


def fingerprint(run_dir: Path) -> tuple:
    """(path, size, mtime) of every file a rebuild may read: dot-named files (being written) and what
    is drawn from the run (ledgers, pages, exports) aside."""
    out = []
    for root, dirs, files in os.walk(run_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or name.endswith(DERIVED_SUFFIXES):
                continue
            path = Path(root) / name
            try:
                st = path.stat()
            except FileNotFoundError:  # removed while listed (a compaction): the next look sees it gone
                continue
            out.append((str(path.relative_to(run_dir)), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _in_flight(ledger: Path) -> int:
    con = duckdb.connect(str(ledger), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM attempts WHERE client_status = 'in_flight' "
                           "OR server_status = 'in_flight'").fetchone()[0]
    finally:
        con.close()


def _wait_for_manifest(run_dir: Path, wait_s: float, every_s: float, say, sleep) -> None:
    if run_dir.exists() and not run_dir.is_dir():  # a file never becomes a run folder: no wait for it
        raise RunDirError(f"{run_dir}: a file, not a run folder; name the folder the capture writes (its --out)")
    deadline = time.monotonic() + wait_s
    said = False
    while not Manifest.exists(run_dir):
        left = deadline - time.monotonic()
        if left <= 0:
            raise RunDirError(f"{run_dir}: no manifest after {wait_s:g} s: not a run being captured (start the "
                              "capture first, or name its output folder)")
        if not said:
            say(f"{run_dir}: no manifest yet; waiting up to {wait_s:g} s for the capture to start")
            said = True
        sleep(min(every_s, left))


def _has_parts(run_dir: Path) -> bool:
    return any((run_dir / "events").rglob("part-*.parquet"))


def follow(run_dir: str | os.PathLike, options: BuildOptions = BuildOptions(),
           following: FollowOptions = FollowOptions(), *, out: str | os.PathLike | None = None,
           on_refresh=None, say=None, sleep=time.sleep) -> LedgerSummary:
    """Rebuild the ledger of `run_dir` whenever its files change, until its manifest says the run
    finished; return the last build's summary. `on_refresh(Refresh)` after each build, `say(line)` for
    what is waited for or skipped. KeyboardInterrupt (Ctrl-C) goes to the caller between or during
    builds: the last complete ledger stays where it is."""
    run_dir = Path(run_dir)
    say = say or (lambda line: None)
    _wait_for_manifest(run_dir, following.wait_s, following.every_s, say, sleep)
    built, summary, n, waiting, state = None, None, 0, False, None
    changed, told = time.monotonic(), False  # when the run's files last changed; the silence said once
    try:
        while True:
            try:
                recording = Manifest.read(run_dir).recording
            except RunFolderError as exc:
                raise RunDirError(str(exc)) from None
            seen = fingerprint(run_dir)
            if seen != built:
                changed, told = time.monotonic(), False
                if recording and not _has_parts(run_dir):
                    if not waiting:
                        say(f"{run_dir}: recording, no events flushed yet; waiting for the first part")
                        waiting = True
                    built = seen  # looked at: a capture killed before its first flush is then told silent too
                else:
                    t0 = time.perf_counter()
                    try:
                        done = refresh(run_dir, replace(options, live=recording), state, out=out)
                        summary, state = done.summary, done.state
                    except (RunDirError, OSError) as exc:
                        state = None  # the next refresh is whole
                        if not recording and fingerprint(run_dir) == seen:
                            raise  # the files are still: a real fault, not a part moved under the build
                        say(f"refresh skipped, the last ledger kept; tried again when the run's files change: {exc}")
                        built = seen
                        sleep(following.every_s)
                        continue
                    n, built = n + 1, seen
                    final = not recording and fingerprint(run_dir) == seen
                    if on_refresh is not None:
                        on_refresh(Refresh(n, summary, time.perf_counter() - t0, recording, _in_flight(summary.path), final,
                                           done.how, done.steps))
                    if final:
                        return summary
                    continue  # files that moved during the build are read again at once, without a wait
            elif not recording and summary is not None:
                return summary
            elif recording and not told and time.monotonic() - changed >= following.silent_s:
                told = True
                say(f"{run_dir}: no file of the run changed for {time.monotonic() - changed:.0f} s while its manifest "
                    "says it is recording: its capture may have been killed (SIGKILL leaves no last state). Still "
                    "following; Ctrl-C keeps the last ledger, and a plain `inferledger reconstruct` then counts the "
                    "attempts without an end unterminated")
            sleep(following.every_s)
    finally:  # the state an incremental refresh reads goes with the loop (a final refresh removed it)
        state_path(run_dir / LEDGER_FILE if out is None else Path(out)).unlink(missing_ok=True)
