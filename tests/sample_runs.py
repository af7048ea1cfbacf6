"""The recorded samples' runs, each imported and rebuilt once per test session and shared between the
test files (and pytest-xdist's workers) that read them (test helper).

A built run lies in a folder of the session's own (the workers' common temporary folder), keyed on
the sample's content (an archive's bytes, a recorded run folder's files) and the folder's name (an
archive's run id), so two files asking for the same sample
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


def _content(source: Path) -> bytes:
    """A sample's bytes: an archive file's, or every file of a run folder by its path inside it."""
    if source.is_file():
        return source.read_bytes()
    out = b""
    for f in sorted(p for p in source.rglob("*") if p.is_file()):
        out += f.relative_to(source).as_posix().encode() + b"\0" + f.read_bytes() + b"\0"
    return out


def _key(kind: str, source: Path, name: str) -> str:
    return hashlib.sha256(kind.encode() + b"\0" + name.encode() + b"\0" + _content(source)).hexdigest()[:20]


def _make(kind: str, source: Path, run: Path) -> None:
    """The run folder `run` made from the sample, not yet rebuilt: an e0 archive imported (as run `run.name`),
    a recorded run folder copied, a vLLM recording rejoined."""
    if kind == "e0":
        import_archive(source, run, run_id=run.name)
    elif kind == "copy":
        shutil.copytree(source, run)
    elif kind == "rejoin":
        from inferledger.collectors.evidence.vllm_rejoin import rejoin

        rejoin(source, run)
    else:
        raise ValueError(f"kind {kind!r}: expected e0, copy or rejoin")


def _build(folder: Path, kind: str, source: Path, name: str) -> Path:
    """Make and rebuild the run `folder/name` where it stays (its ledger reads its events in place, by path)."""
    shutil.rmtree(folder, ignore_errors=True)
    _make(kind, source, folder / name)
    reconstruct(folder / name)
    return folder / name


def built_samples(tmp_path_factory, wanted: list[tuple[str, Path, str]]) -> list[Path]:
    """The built run folder of each (kind, source, folder name) in `wanted`, in order: kind "e0" an archive
    (imported as run `name`), "copy" a recorded run folder, "rejoin" a vLLM recording (see the module's note).
    A build is claimed by one worker (a file made only if absent) and marked done once whole."""
    cache = cache_folder(tmp_path_factory)
    keys = [_key(*w) for w in wanted]
    out: dict[int, Path] = {}
    waiting = []
    for i, ((kind, source, name), key) in enumerate(zip(wanted, keys)):
        if (cache / f"{key}.done").is_file():
            out[i] = cache / key / name
            continue
        try:
            os.close(os.open(cache / f"{key}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            waiting.append(i)  # another worker builds it: the unclaimed ones first
            continue
        try:
            out[i] = _build(cache / key, kind, source, name)
        except BaseException:
            (cache / f"{key}.failed").touch()  # the workers waiting for it build it themselves (and fail alike)
            raise
        (cache / f"{key}.done").touch()
    for i in waiting:
        kind, source, name = wanted[i]
        deadline = time.monotonic() + WAIT_S
        while not any((cache / f"{keys[i]}.{end}").is_file() for end in ("done", "failed")) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        done = (cache / f"{keys[i]}.done").is_file()  # else the claimant failed or died: a build of this worker's own
        out[i] = cache / keys[i] / name if done else _build(cache / f"{keys[i]}.{os.getpid()}", kind, source, name)
    return [out[i] for i in range(len(wanted))]


def built_e0(tmp_path_factory, case: str) -> Path:
    """The e0 sample `case` (samples/e0/<case>/archive.jsonl) imported as run `case` and rebuilt: shared."""
    return built_samples(tmp_path_factory, [("e0", E0 / case / "archive.jsonl", case)])[0]


def copy_to(run: Path, dest: Path) -> Path:
    """A copy of a built run folder at `dest` (its own ledger, which reads the events where the shared
    build's lie), for a test that writes into its run folder."""
    shutil.copytree(run, dest)
    return dest
