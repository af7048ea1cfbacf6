"""Reading one run's ledger read-only: the helpers the report, the exports and the summary share.

`open_run` opens a run folder (or its ledger.duckdb) through the query surface (`inferledger.open`)
with its manifest; `num` turns a ledger value into a JSON-safe number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from inferledger.probes.run_folder import Manifest, RunFolderError

if TYPE_CHECKING:  # duckdb loads when a run is opened, not when a command's help is printed
    from inferledger.ledger.query import Ledger


def num(v):
    """A JSON-safe number: None for NULL, NaN and infinities."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


@dataclass
class RunView:
    """One run opened read-only: its ledger, its manifest and the tables it has."""
    name: str
    run_dir: Path
    led: Ledger
    manifest: dict | None
    manifest_error: str | None = None
    tables: set[str] = field(default_factory=set)

    def has(self, table: str) -> bool:
        return table in self.tables

    def all(self, query: str, params=None) -> list[tuple]:
        return self.led.rows(query, params)[1]

    def one(self, query: str, params=None) -> tuple | None:
        rows = self.led.rows(query, params, limit=1)[1]
        return rows[0] if rows else None

    def numpy(self, query: str, params=None) -> dict:
        return self.led.sql(query, params=params).fetchnumpy()

    def dicts(self, query: str, params=None) -> tuple[list[str], list[tuple]]:
        return self.led.rows(query, params)

    def columns(self, table: str) -> list[str]:
        return [r[0] for r in self.all(f"DESCRIBE {table}")] if self.has(table) else []

    def close(self) -> None:
        self.led.close()


def open_run(path) -> RunView:
    """A run folder (or its ledger.duckdb); exactly one run, since a report describes one."""
    from inferledger.ledger.query import Ledger, LedgerError, resolve_runs

    runs = resolve_runs(path)
    if len(runs) != 1:
        raise LedgerError(f"{path} matches {len(runs)} runs; a report takes one run (use --compare for a second)")
    name, ledger_file = runs[0]
    run_dir = Path(ledger_file).resolve().parent
    manifest, error = None, None
    if Manifest.exists(run_dir):
        try:
            manifest = Manifest.read(run_dir).body
        except RunFolderError as exc:
            error = str(exc)
    else:
        error = f"{Manifest.file(run_dir)} is missing"
    led = Ledger(runs)
    if led.stale:  # the figures drawn below are this code's: a ledger other code built is rebuilt first
        led.close()
        raise LedgerError("; ".join(led.stale))
    return RunView(name, run_dir, led, manifest, error, set(led.tables()))
