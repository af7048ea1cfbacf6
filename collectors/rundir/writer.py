"""Writing a run directory: buffered Parquet parts, renamed into place whole.

Layout (docs/ARCHITECTURE.md "The run directory"): the manifest (probes/run_folder.py), events/part-*.parquet, samples/part-*.parquet, clocks.parquet,
tasks.parquet. Every file is written under a temporary name in the same folder and renamed, so a
killed process leaves only complete files; a flush never rewrites a part already on disk.

Durability: with `autoflush_s` a background thread flushes every buffer, clocks, tasks and the
manifest (with a `flushed` section: rows on disk, when) at that period, so SIGKILL, the OOM killer or
a CI timeout lose at most the last period. `close(compact=True)` merges the many small parts of a
clean run into one per folder (probes/run_dir.py), so they cost `reconstruct` nothing; with
`buckets` it then writes the partitioned layout (collectors/rundir/repartition.py, docs/SCALE.md) instead.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from inferledger.probes.run_dir import compact, next_part_number
from inferledger.probes.run_folder import Manifest
from inferledger.probes.events import CLOCK_SCHEMA, EVENT_SCHEMA, SAMPLE_SCHEMA, TASK_SCHEMA

AUTOFLUSH_S = 2.0  # capture and serve --out: the most recorded time a kill can lose


def write_table_atomic(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


class _PartBuffer:
    def __init__(self, folder: Path, schema: pa.Schema, flush_rows: int) -> None:
        self.folder = folder
        self.schema = schema
        self.flush_rows = flush_rows
        self.rows: list[dict] = []
        self.part = self._next_part_index()

    def _next_part_index(self) -> int:
        if not self.folder.exists():
            return 0
        for stale in self.folder.glob(".part-*.tmp-*"):  # left by a killed writer; never a part
            stale.unlink(missing_ok=True)
        return next_part_number(self.folder)

    def add(self, row: dict) -> bool:
        self.rows.append(row)
        return len(self.rows) >= self.flush_rows

    def take(self) -> tuple[list[dict], int]:
        """The buffered rows and the part number they will have (under the writer's lock)."""
        rows, part = self.rows, self.part
        self.rows = []
        if rows:
            self.part += 1
        return rows, part

    def write(self, rows: list[dict], part: int) -> None:
        """Write `rows` as part `part` (outside the lock: emitters never wait for the disk)."""
        if not rows:
            return
        try:
            table = pa.Table.from_pylist(rows, schema=self.schema)
            write_table_atomic(table, self.folder / f"part-{part:05d}.parquet")
        except Exception as exc:
            raise ValueError(f"{self.folder}: could not write part {part}: {exc}") from exc

    def restore(self, rows: list[dict]) -> None:
        self.rows = rows + self.rows  # nothing already emitted is lost to a failed write

    def flush(self) -> None:
        rows, part = self.take()
        try:
            self.write(rows, part)
        except Exception:
            self.restore(rows)
            raise


class RunWriter:
    """The sink probes and collectors write through. Thread-safe; call close() (or use `with`)."""

    def __init__(self, run_dir: str | os.PathLike, run_id: str | None = None, *, flush_rows: int = 50_000,
                 autoflush_s: float | None = None, buckets: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.buckets = buckets
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id or self.run_dir.name
        self._lock = threading.Lock()
        self._events = _PartBuffer(self.run_dir / "events", EVENT_SCHEMA, flush_rows)
        self._samples = _PartBuffer(self.run_dir / "samples", SAMPLE_SCHEMA, flush_rows)
        self._clocks: list[dict] = []
        self._tasks: list[dict] = []
        self.n_events = 0
        self.n_samples = 0
        self._manifest: dict | None = None
        self._io = threading.Lock()  # one flush or manifest write at a time; `_lock` guards the buffers
        self._on_disk = (0, 0)  # events, samples known to be in parts
        self._flushes = 0
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if autoflush_s:
            self._flusher = threading.Thread(target=self._autoflush, args=(autoflush_s,), name="run-writer-flush",
                                             daemon=True)
            self._flusher.start()

    # -- rows ---------------------------------------------------------------------------------
    def emit(self, row: dict) -> None:
        with self._lock:
            self.n_events += 1
            if self._events.add(row):
                self._events.flush()

    def sample(self, *, ts_ns: int, clock: str, source: str, host: str, metric: str,
               value: float | None, unit: str, device: str | None = None) -> None:
        row = {"run_id": self.run_id, "ts_ns": int(ts_ns), "clock": clock, "source": source,
               "host": host, "device": device, "metric": metric, "value": value, "unit": unit}
        with self._lock:
            self.n_samples += 1
            if self._samples.add(row):
                self._samples.flush()

    def clock_domain(self, clock: str, *, host: str | None = None, kind: str | None = None) -> None:
        with self._lock:
            self._clocks.append({"run_id": self.run_id, "clock": clock, "host": host, "kind": kind})

    def clock_map(self, from_clock: str, to_clock: str, offset_ns: int, epsilon_ns: int, method: str) -> None:
        with self._lock:
            self._clocks.append({"run_id": self.run_id, "from_clock": from_clock, "to_clock": to_clock,
                                 "offset_ns": int(offset_ns), "epsilon_ns": int(epsilon_ns), "method": method})

    def task(self, task_id: str, *, deadline_ms: float | None = None, required: list[str] | None = None,
             on_missing: str | None = None, max_attempts: int | None = None, expected: str | None = None,
             contract: dict | None = None) -> None:
        with self._lock:
            self._tasks.append({
                "run_id": self.run_id, "task_id": task_id, "deadline_ms": deadline_ms,
                "required": None if required is None else json.dumps(required),
                "on_missing": on_missing, "max_attempts": max_attempts, "expected": expected,
                "contract": json.dumps(contract or {}, sort_keys=True)})

    # -- files --------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write everything buffered. The rows are swapped out under the lock and written outside it, so
        the server's event loop, which emits, never waits for Parquet or the disk."""
        with self._io:
            with self._lock:
                (ev, ev_part), (sa, sa_part) = self._events.take(), self._samples.take()
                clocks, tasks = list(self._clocks), list(self._tasks)
                counts = (self.n_events - len(self._events.rows), self.n_samples - len(self._samples.rows))
            for buf, rows, part in ((self._events, ev, ev_part), (self._samples, sa, sa_part)):
                try:
                    buf.write(rows, part)
                except Exception:
                    with self._lock:
                        buf.restore(rows)
                        if buf is self._events:
                            self._samples.restore(sa)
                    raise
            write_table_atomic(pa.Table.from_pylist(clocks, schema=CLOCK_SCHEMA), self.run_dir / "clocks.parquet")
            write_table_atomic(pa.Table.from_pylist(tasks, schema=TASK_SCHEMA), self.run_dir / "tasks.parquet")
            self._flushes += 1
            self._on_disk = counts
            if self._manifest is not None and self._flusher is not None:
                self._write_manifest_io()

    def _write_manifest_io(self) -> None:
        body = {"run_id": self.run_id, **(self._manifest or {})}
        if self._flusher is not None:  # what a reader of a killed run can count on
            body["flushed"] = {"events": self._on_disk[0], "samples": self._on_disk[1],
                               "flushes": self._flushes, "at_unix_s": round(time.time(), 3)}
        Manifest(body).write(self.run_dir)

    def write_manifest(self, manifest: dict) -> None:
        """Write the manifest now; with autoflush it is rewritten at every flush (with `flushed`)."""
        with self._io:
            # a key the schema does not hold fails here, not in the flusher
            Manifest({"run_id": self.run_id, **manifest}).check_declared(Manifest.file(self.run_dir))
            self._manifest = dict(manifest)
            self._write_manifest_io()

    def _autoflush(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            try:
                self.flush()
            except Exception as exc:  # a full disk: say so, keep the rows, try again next period
                print(f"inferledger: flush of {self.run_dir} failed, will retry: {exc}", file=sys.stderr)

    def close(self, *, compact_parts: bool = False) -> None:
        """Stop the flush thread and write what is buffered; `compact_parts` merges the parts (a clean end)."""
        self._stop.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join()
        self.flush()
        if compact_parts:
            with self._io:
                compact(self._events.folder, EVENT_SCHEMA)
                compact(self._samples.folder, SAMPLE_SCHEMA)
                if self.buckets and self._events.folder.is_dir():
                    from inferledger.collectors.rundir.repartition import repartition

                    repartition(self.run_dir, self.buckets)

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
