"""Build `ledger.duckdb` from a run directory with DuckDB SQL over its Parquet files.

The stages are the ledger's modules (`ledger/modules.py`): SQL files `ledger/<name>.sql` and two Python
stages (the load, the critical paths), each declaring what it reads and creates; they run in the order
derived from those declarations. docs/LEDGER.md explains every table. The ledger is written to a
temporary file and renamed into place, so a failed rebuild never destroys the previous ledger, and
the raw files are only read.
"""
from __future__ import annotations

import json

import os
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import duckdb

from inferledger.ledger.load import RunFiles
from inferledger.ledger.query import LEDGER_FILE
from inferledger.ledger.memory import bound, default_memory_limit, parse_size
from inferledger.ledger.remote import RemoteRunError, is_url, stage
from inferledger.ledger.modules import ledger_modules, public_tables
from inferledger.ledger.stages import (RunDirError, StageError, query_interrupted, run_modules,  # noqa: F401 (API)
                                       set_variables)
from inferledger.probes.events import EVENT_SCHEMA, SAMPLE_SCHEMA
from inferledger.probes.run_dir import PartError, check_layout, list_parts
from inferledger.probes.run_folder import SLO_KEYS, Manifest, RunFolderError

PUBLIC_TABLES = public_tables()
# A run whose event and sample parts take less than this fits one row group per table (122,880 rows; an
# event takes 16 bytes of Parquet at the least): DuckDB has no work to split between threads, and handing
# each statement's one task to a second thread only adds a wake-up and a wait. Such a run builds in one.
SMALL_RUN_BYTES = 2 ** 20


@dataclass
class LedgerSummary:
    path: Path
    run_id: str
    n_events: int
    n_attempts: int
    n_tasks: int
    n_gaps: int


def _manifest(run_dir: Path) -> Manifest:
    try:
        return Manifest.read(run_dir)
    except RunFolderError as exc:
        raise RunDirError(str(exc)) from None


def _run_id(manifest: Manifest, run_dir: Path, url: str | None = None) -> str:
    """The manifest's run_id, else the run folder's name (the URL's last segment for a staged copy)."""
    return manifest.run_id or (url.rsplit("/", 1)[-1] if url else run_dir.name)


@lru_cache(maxsize=1)
def _version() -> str:
    """This inferledger's version, read from its installed metadata once per process (a few ms a read)."""
    from importlib.metadata import version

    return version("inferledger")


def run_variables(manifest: Manifest, run_id: str, live: bool = False) -> dict:
    """The SQL variables every stage reads (`getvariable`): the run id, the KV block size, the SLO, the
    planned arrival rate, how often the client's loop-lag trace kept a wake and whether the run is known
    to be still recording (`run_open`: `live`, a rebuild that watches the run, while its manifest says
    so; an attempt without an end is then in flight, not unterminated)."""
    from inferledger.ledger.modules import modules_sha256

    slo = manifest.slo
    return {"run_id": (run_id, "VARCHAR"), "kv_block_bytes": (manifest.kv_block_bytes, "BIGINT"),
            "inferledger_version": (_version(), "VARCHAR"), "modules_sha256": (modules_sha256(), "VARCHAR"),
            "run_open": (live and manifest.recording, "BOOLEAN"),
            "offered_rps": (manifest.offered_rps, "DOUBLE"),
            "client_lag_every": (manifest.block("client").get("loop_lag_trace_every"), "BIGINT"),
            "replica_kinds": (json.dumps(sorted(manifest.replica_kinds.items())), "VARCHAR"),
            **{f"slo_{k}": (slo.get(k), "DOUBLE") for k in SLO_KEYS}}


@dataclass(frozen=True)
class BuildOptions:
    """How a rebuild runs (`inferledger reconstruct --memory-limit --temp-directory --engine --address
    --workers`): the same ledger whichever way.

    `memory_limit` ("4GB", "512MiB"; default `default_memory_limit()`) bounds DuckDB's memory: beyond
    it, joins, sorts and aggregates spill to `temp_directory` (default a folder beside the output,
    removed afterwards), so the peak depends on the limit, not on the size of the run. `engine="ray"`
    shards a partitioned run over Ray (`ledger/sharded.py`; `address` of a cluster, else a local Ray
    of `workers` CPUs)."""
    memory_limit: str | None = None
    temp_directory: str | os.PathLike | None = None
    engine: str = "local"
    address: str | None = None
    workers: int = 2
    # the caller watches the run as it records (`reconstruct --follow`): while the manifest says starting or
    # running, an attempt without an end is in flight. Without it such a manifest may as well be a capture
    # killed before it could say otherwise (SIGKILL), whose unended attempts never end: unterminated.
    live: bool = False


# a built ledger's counts for its LedgerSummary (n_events, n_attempts, n_tasks, n_gaps)
SUMMARY_COUNTS = ("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM attempts), "
                  "(SELECT count(*) FROM tasks), (SELECT count(*) FROM gaps)")


def run_parts(run_dir: Path) -> tuple[list[Path], list[Path], list[str]]:
    """The run's event parts and sample parts, every part checked whole and of our schema (merged ranges over
    their leftovers), and the run as a whole against its layout record: the lines of parts newer than it."""
    try:
        parts = list_parts(run_dir / "events", EVENT_SCHEMA)
        sample_parts = list_parts(run_dir / "samples", SAMPLE_SCHEMA)
        newer = check_layout(run_dir / "events")
    except (PartError, RunFolderError) as exc:
        raise RunDirError(str(exc)) from None
    if not parts:
        raise RunDirError(f"{run_dir}/events: no event parts (part-*.parquet); capture or import a run first")
    return parts, sample_parts, newer


def reconstruct(run_dir: str | os.PathLike, options: BuildOptions = BuildOptions(), *,
                out: str | os.PathLike | None = None, profile: list | None = None,
                run_id: str | None = None, on_stage=None, on_built=None) -> LedgerSummary:
    """Build the ledger, the `options` way; with `profile` (a list), append (stage, statement,
    seconds) for every step (with engine="ray": a dict per shard, `ledger/sharded.py`). `run_dir` may
    be a URL fsspec can read (s3://, memory://, file://, ...): then `out` is needed. `on_stage(name, i,
    n)` as each stage starts, i of n done (n None: one step of unknown length, as the Ray shards), for a
    progress bar. `on_built(con, run)` once the local engine's stages ran, before the ledger is written out
    (`--follow` keeps what its next refresh reuses, ledger/incremental.py)."""
    memory_limit, temp_directory = options.memory_limit, options.temp_directory
    engine, address, workers = options.engine, options.address, options.workers
    if is_url(run_dir):  # an object store: copied beside the ledger, read locally, the copy removed
        if out is None:
            raise RunDirError(f"{run_dir}: a run at a URL needs --out, a local path for its ledger")
        staging = Path(out).with_name(f".{Path(out).name}.run-{os.getpid()}")
        try:
            if on_stage is not None:
                on_stage(f"copying {run_dir}", 0, None)
            stage(str(run_dir), staging)
            return reconstruct(staging, options, out=out, profile=profile,
                               run_id=_run_id(_manifest(staging), staging, str(run_dir).rstrip("/")),
                               on_stage=on_stage)
        except RemoteRunError as exc:
            raise RunDirError(str(exc)) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if engine not in ("local", "ray"):
        raise RunDirError(f"--engine {engine!r}: expected local or ray")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    parts, sample_parts, newer = run_parts(run_dir)
    manifest = _manifest(run_dir)  # read once: every stage takes it from `run`
    run_id = run_id or _run_id(manifest, run_dir)
    target = Path(out) if out else run_dir / "ledger.duckdb"
    target.parent.mkdir(parents=True, exist_ok=True)  # --out in a folder not made yet (its check found it creatable)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    for stale in (tmp, Path(f"{tmp}.wal")):
        stale.unlink(missing_ok=True)

    limit = parse_size(memory_limit) if memory_limit is not None else default_memory_limit()
    spill = Path(temp_directory) if temp_directory else target.with_name(f".{target.name}.spill-{os.getpid()}")
    con = duckdb.connect(str(tmp))
    try:
        bound(con, limit, spill)
        if sum(p.stat().st_size for p in parts + sample_parts) < SMALL_RUN_BYTES:
            con.execute("SET threads = 1")
        # the file is renamed into place only when whole and removed if the build fails: syncing its
        # write-ahead log at each statement's commit protects nothing; the CHECKPOINT below syncs the file
        con.execute("SET fsync_mode = 'NONE'")
        variables = run_variables(manifest, run_id, options.live)
        set_variables(con, variables)
        # a ledger inside its run folder reads events and samples where they lie; one written elsewhere (or
        # from a run staged from a URL, removed after) keeps its own copy
        in_place = target.resolve() == (run_dir / LEDGER_FILE).resolve()
        run = RunFiles(run_dir, parts, sample_parts, manifest, newer, in_place)
        if engine == "ray":
            from inferledger.ledger.sharded import build_sharded

            if on_stage is not None:
                on_stage("Ray shards (engines, task buckets), then the merge", 0, None)
            build_sharded(con, run, variables, work=target.with_name(f".{target.name}.shards-{os.getpid()}"),
                          limit_bytes=limit, address=address, workers=workers, stats=profile)
        else:
            run_modules(con, ledger_modules(), run, profile, on_stage)
            if on_built is not None:
                on_built(con, run)
        counts = con.execute(SUMMARY_COUNTS).fetchone()
        con.execute("SET fsync_mode = 'STANDARD'")
        con.execute("CHECKPOINT")
    except BaseException as exc:
        con.close()
        tmp.unlink(missing_ok=True)
        if query_interrupted(exc):  # Ctrl-C inside a statement: the interrupt it was, not an error
            raise KeyboardInterrupt("SIGINT") from None
        raise
    finally:
        con.close()
        if not temp_directory:
            shutil.rmtree(spill, ignore_errors=True)
    os.replace(tmp, target)
    return LedgerSummary(target, run_id, *counts)
