"""The recorded samples' runs, each imported and rebuilt once per test session and shared between the
test files (and pytest-xdist's workers) that read them (test helper).

A built run lies in a folder of the session's own (the workers' common temporary folder), keyed on
the sample's content (the archive's bytes) and its run id, so two files asking for the same sample
read one build, and no build of another session or of other code is ever reused. A worker that finds
a sample claimed by another waits for that build rather than doing it again; when it asks for many,
it builds the unclaimed ones first, so two workers asking for the same set split it. The folder
returned is shared: a test only reads it (a read-only ledger, `open_ledger`); one that writes into
a run folder asks for its own copy (`copy_to`)."""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.ledger.reconstruct import reconstruct

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
E0 = SAMPLES / "e0"
WAIT_S = 600  # the longest another worker's build of one sample is waited for before building it here too


def cache_folder(tmp_path_factory) -> Path:
    """This session's folder of built samples: with pytest-xdist, the folder its workers' temporary
    folders share (each worker's is `popen-gwN` inside it); without it, the session's own."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / "built-samples"
    folder.mkdir(exist_ok=True)
    return folder


def _key(archive: Path, run_id: str) -> str:
    return hashlib.sha256(archive.read_bytes() + b"\0" + run_id.encode()).hexdigest()[:20]


def _build(cache: Path, key: str, archive: Path, run_id: str) -> Path:
    """Import and rebuild into a folder of this process, then move it into place whole (a reader never sees
    half a run); when another process put the same build there first, its is kept."""
    work = cache / f".{key}.{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    import_archive(archive, work / run_id, run_id=run_id)
    reconstruct(work / run_id)
    try:
        os.rename(work, cache / key)
    except OSError:  # built beside another worker's wait that gave up: the first one in place stands
        shutil.rmtree(work, ignore_errors=True)
    return cache / key / run_id


def built_samples(tmp_path_factory, wanted: list[tuple[Path, str]]) -> list[Path]:
    """The built run folder of each (archive, run id) in `wanted`, in order (see the module's note)."""
    cache = cache_folder(tmp_path_factory)
    keys = [_key(archive, run_id) for archive, run_id in wanted]
    out: dict[int, Path] = {}
    waiting = []
    for i, ((archive, run_id), key) in enumerate(zip(wanted, keys)):
        if (cache / key).is_dir():
            out[i] = cache / key / run_id
            continue
        try:
            os.close(os.open(cache / f".{key}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            waiting.append(i)  # another worker builds it: the unclaimed ones first
            continue
        out[i] = _build(cache, key, archive, run_id)
    for i in waiting:
        archive, run_id = wanted[i]
        deadline = time.monotonic() + WAIT_S
        while not (cache / keys[i]).is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        out[i] = cache / keys[i] / run_id if (cache / keys[i]).is_dir() else _build(cache, keys[i], archive, run_id)
    return [out[i] for i in range(len(wanted))]


def built_e0(tmp_path_factory, case: str) -> Path:
    """The e0 sample `case` (samples/e0/<case>/archive.jsonl) imported as run `case` and rebuilt: shared."""
    return built_samples(tmp_path_factory, [(E0 / case / "archive.jsonl", case)])[0]


def copy_to(run: Path, dest: Path) -> Path:
    """A copy of a built run folder at `dest` (its own ledger), for a test that writes into its run folder."""
    shutil.copytree(run, dest)
    return dest
