"""The rules for what a command writes, checked before it loads anything: a new run directory
(`capture --out`, `serve --out`, `import --out`), a new folder (`study -o`), a folder to continue
(`study --resume`: it must exist, by design) and an output file (`predict -o`, `report -o`, `export -o`,
`reconstruct -o`).

A new run goes into a folder that does not exist yet or is empty, and that this process can create
and write: a file, a folder holding another run or other files, or a place we cannot write is refused
before anything is loaded or recorded, with the reason and what to do. An output file may replace a
file, never a folder, and its folder must be one this process can create and write. Checking writes a
probe file and removes it again (with any folder it had to create), so a refusal leaves the disk as
it was.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from inferledger.probes.run_folder import MANIFEST_FILE, Manifest


class OutDirError(ValueError):
    """`--out` cannot hold a new run; the message names the folder and the reason."""


class RunExistsError(OutDirError, FileExistsError):
    """The out folder already holds a run; writing there would mix two runs."""


def check_new_run_dir(out: Path) -> None:
    """Raise OutDirError unless `out` can become a new run directory; leaves nothing behind."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutDirError(f"{out} is a file, not a folder; choose a new folder for --out")
    if out.is_dir():
        entries = sorted(p.name for p in out.iterdir())
        if Manifest.file(out).exists() or (out / "events").exists():
            raise RunExistsError(f"{out} already holds a run ({MANIFEST_FILE} or events/ present); write into a "
                                 "new folder, the existing run was left untouched")
        if entries:
            shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
            raise OutDirError(f"{out} already holds files that are not a run ({shown}); choose a new or empty "
                              "folder for --out")
    _check_writable(out, "--out")


def check_new_folder(out: Path, flag: str) -> None:
    """Raise OutDirError unless `out` can become a new folder (absent or empty, creatable, writable)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutDirError(f"{flag} {out}: is a file, not a folder; choose a new folder")
    if out.is_dir() and any(out.iterdir()):
        raise OutDirError(f"{flag} {out}: a folder that is not empty; choose a new or empty folder, nothing was changed")
    _check_writable(out, flag)


def check_existing_folder(out: Path, flag: str) -> None:
    """Raise OutDirError unless `out` is a folder this process can write into (one a command continues)."""
    out = Path(out)
    if not out.exists():
        raise OutDirError(f"{flag} {out}: no such folder; {flag} continues a folder an earlier command wrote")
    if not out.is_dir():
        raise OutDirError(f"{flag} {out}: is a file, not a folder")
    _check_writable(out, flag)


def check_out_file(path: Path, flag: str, example: str = "out.json") -> None:
    """Raise OutDirError unless `path` can be written as a file: not a folder, its folder creatable
    and writable (an existing file is replaced); a folder is answered with `example`, a name the command
    takes, inside it."""
    path = Path(path)
    if path.is_dir():
        raise OutDirError(f"{flag} {path}: is a folder; give a file name (e.g. {path / example})")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutDirError(f"{flag} {path}: a file this process cannot write; choose another path")
    _check_writable(path.parent, flag)


def _check_writable(out: Path, flag: str) -> None:
    """`out` can be created (with its parents) and written: tried with a probe file, then undone."""
    created = [p for p in (out, *out.parents) if not p.exists()]
    probe = out / f".inferledger-write-check-{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
    except OSError as exc:
        blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file, not a folder" if blocker is not None else exc.strerror or exc
        raise OutDirError(f"{flag} {out}: cannot create or write this folder ({why}); choose a {flag} "
                          "in a folder you can write") from None
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:  # its folder could not be made: there is nothing to remove
            pass
        for p in created:  # innermost first
            try:
                p.rmdir()
            except OSError:
                break


@contextlib.contextmanager
def building_run_dir(out: Path) -> Iterator[Path]:
    """Write a new run into a hidden sibling folder and rename it to `out` only when the block succeeds.

    An import that fails part-way (a refusal found late, a full disk) then leaves nothing at `out`, so
    the same command can be run again once its input is fixed. `out` is checked as a new run directory
    before and again just before the rename (another process may have written there meanwhile)."""
    out = Path(out)
    check_new_run_dir(out)
    created = [p for p in out.parents if not p.exists()]  # outermost last
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        yield staging
        check_new_run_dir(out)
        if out.is_dir():  # an empty folder the user made for the run
            out.rmdir()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for p in created:  # innermost first: the folders made for this run, if still empty
            try:
                p.rmdir()
            except OSError:
                break
        raise
