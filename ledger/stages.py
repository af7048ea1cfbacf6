"""Running the ledger's stages on a DuckDB connection: the SQL variables, each module in turn, and the
errors a rebuild reports (shared by the single-node build and the sharded one)."""
from __future__ import annotations

import time

import duckdb

from inferledger.ledger.load import LoadError, RunFiles
from inferledger.ledger.modules import Module


class RunDirError(Exception):
    """The run directory is missing or unreadable; the message names the file."""


class StageError(RunDirError):
    """A ledger stage failed on this run's data; the message names the stage and the run."""


def query_interrupted(exc: BaseException) -> bool:
    """A Ctrl-C that landed inside a DuckDB statement: DuckDB's Python client takes the KeyboardInterrupt
    and raises RuntimeError('Query interrupted') in its place; callers give the interrupt back."""
    return type(exc) is RuntimeError and str(exc) == "Query interrupted"


_PARSED: dict[str, tuple] = {}  # a SQL module's text -> its parsed statements, for the life of the process


def statements(con, sql: str) -> tuple:
    """The statements of a SQL module, parsed once per process: DuckDB's parser takes about a tenth of a
    small run's rebuild, and a module's text is the same at every rebuild. A parsed statement runs on
    any connection (`con.execute(statement)` binds it there)."""
    parsed = _PARSED.get(sql)
    if parsed is None:
        parsed = _PARSED[sql] = tuple(con.extract_statements(sql))
    return parsed


def _run_module(con, module: Module, run: RunFiles, profile: list | None) -> None:
    """One stage; with `profile`, (module, statement, seconds) for each SQL statement or Python stage."""
    t0 = time.perf_counter()
    if module.build is not None:
        module.build(con, run)
        if profile is not None:
            profile.append((module.source, ", ".join(module.public or module.creates), time.perf_counter() - t0))
        return
    for statement in statements(con, module.sql):
        t0 = time.perf_counter()
        con.execute(statement)
        if profile is not None:  # timed one by one
            text = " ".join(ln for ln in statement.query.splitlines() if not ln.strip().startswith("--"))
            label = " ".join(text.split()).split(" AS ")[0].replace("CREATE OR REPLACE ", "")[:48]
            profile.append((module.source, label, time.perf_counter() - t0))


def set_variables(con, variables: dict) -> None:
    for name, (value, kind) in variables.items():
        con.execute(f"SET VARIABLE {name} = ?::{kind}", [value])


def run_modules(con, modules, run: RunFiles, profile: list | None = None, on_stage=None) -> None:
    """The stages in order, each error as a RunDirError naming the stage; `on_stage(name, i, n)` as the
    i-th of n starts (0-based: i stages are done)."""
    modules = list(modules)
    for i, module in enumerate(modules):
        if on_stage is not None:
            on_stage(module.name, i, len(modules))
        try:
            _run_module(con, module, run, profile)
        except LoadError as exc:
            raise RunDirError(str(exc)) from None
        except duckdb.Error as exc:
            raise StageError(f"ledger stage {module.source} failed on {run.run_dir}: {exc}") from exc
