"""The read-only query surface: `inferledger.open(...)` and `inferledger query`.

One in-memory DuckDB connection ATTACHes each run's ledger.duckdb READ_ONLY and exposes one view per
table name, the UNION ALL BY NAME of that table over every run (each row keeps its `run_id`). A ledger
whose `events` and `samples` are views over its run's Parquet parts (ledger/load.py, read in place) is
first held to the parts it was built from (`ledger_parts`: each there, of its size and footer), and
its run's `events/` and `samples/` folders are the only ones DuckDB may read (`allowed_directories`).
Then external access and the configuration are locked, and every statement is checked before it runs:
only reads (SELECT, WITH ... SELECT, EXPLAIN, SHOW, DESCRIBE, SUMMARIZE) get through.
"""
from __future__ import annotations

import glob as globlib
import re
from pathlib import Path

import duckdb

from inferledger.ledger.tables import sql_string
from inferledger.probes.run_folder import RunFolderError
from inferledger.probes.study_dir import is_study_dir, run_dirs

LEDGER_FILE = "ledger.duckdb"
READ_TYPES = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
_LEADING = re.compile(r"^(\s+|--[^\n]*\n|/\*.*?\*/)*", re.DOTALL)  # blanks and comments
# EXPLAIN [ANALYZE] [(options)]: what follows is the statement it runs.
_EXPLAIN = re.compile(_LEADING.pattern + r"explain(\s+analy[sz]e)?(\s*\([^)]*\))?", re.IGNORECASE | re.DOTALL)
_SPOKEN = {"INSTALL": "INSTALL", "FORCE": "INSTALL", "USE": "USE", "RESET": "RESET", "CHECKPOINT": "CHECKPOINT"}


class LedgerError(Exception):
    """A ledger could not be opened (missing run, missing ledger.duckdb)."""


class ReadOnlyError(LedgerError):
    """A statement that would write, attach, configure or export was refused."""


class QueryError(LedgerError):
    """DuckDB could not parse or bind the query; the message carries its position (LINE n: ...)."""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def resolve_runs(path_or_glob: str | Path, skipped: list[Path] | None = None) -> list[tuple[str, Path]]:
    """(run name, ledger file) for a run folder, a study folder (its runs), a glob of those, or ledger.duckdb
    paths. A glob passes over a folder without a ledger yet (appended to `skipped`); a folder named
    alone must have one."""
    text = str(path_or_glob)
    paths = sorted(Path(p) for p in globlib.glob(text)) if globlib.has_magic(text) else [Path(text)]
    if not paths:
        raise LedgerError(f"no run matches {text!r}")
    runs = []
    for p in paths:
        if p.is_file() and p.suffix == ".duckdb":
            runs.append((p.resolve().parent.name, p))
        elif p.is_dir() and is_study_dir(p):  # a study folder: every run it keeps
            try:
                study_runs = run_dirs(p)
            except RunFolderError as exc:
                raise LedgerError(str(exc)) from None
            for _, run in study_runs:
                runs += resolve_runs(run)
        elif p.is_dir():
            if not (p / LEDGER_FILE).is_file() and globlib.has_magic(text) and skipped is not None:
                skipped.append(p)
                continue
            if not (p / LEDGER_FILE).is_file():
                raise LedgerError(f"run {p} has no {LEDGER_FILE}: run `inferledger reconstruct {p}` first")
            runs.append((p.resolve().name, p / LEDGER_FILE))
        elif not globlib.has_magic(text):
            what = "no such run" if not p.exists() else "not a run folder or a .duckdb file"
            raise LedgerError(f"{p}: {what} (expected a run folder holding {LEDGER_FILE}, "
                              f"a glob like 'runs/*', or a {LEDGER_FILE} file)")
    if not runs:
        built = f" with a {LEDGER_FILE} (run `inferledger reconstruct` on them first)" if skipped else ""
        raise LedgerError(f"no run folder{built} matches {text!r}")
    return runs


def _statement_types(query: str) -> list[str]:
    """The type name of every statement in `query`, looking inside EXPLAIN [ANALYZE] (which runs it)."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from None
    types = []
    for st in statements:
        if st.type == duckdb.StatementType.EXPLAIN:
            inner = _EXPLAIN.sub("", st.query, count=1)
            types += _statement_types(inner) if inner.strip() else ["EXPLAIN"]
        elif st.type in READ_TYPES:
            types.append("SELECT")
        else:
            # Name what the user typed where DuckDB files it under another type (INSTALL is a LOAD).
            words = _LEADING.sub("", st.query, count=1).split(None, 1)
            first = words[0].upper().rstrip(";") if words else ""
            types.append(_SPOKEN.get(first, st.type.name))
    return types


def check_read_only(query: str) -> None:
    """Raise ReadOnlyError unless every statement in `query` only reads (QueryError if none)."""
    kinds = _statement_types(query)
    if not kinds:
        raise QueryError("empty query: write a SELECT, e.g. select * from attempts limit 5")
    for kind in kinds:
        if kind != "SELECT":
            # A PIVOT without an IN list parses as several statements (it creates a type first).
            hint = " (for PIVOT, list the values: PIVOT ... ON col IN (...))" if kind == "MULTI" else ""
            raise ReadOnlyError(f"inferledger query is read-only: {kind} statements are refused{hint}")


class Ledger:
    """Read-only SQL over one or more runs' ledgers. `sql(...)` returns a DuckDB relation."""

    def __init__(self, runs: list[tuple[str, Path]]) -> None:
        self.runs = [name for name, _ in runs]
        self.skipped: list[Path] = []
        self.stale: list[str] = []  # a line per ledger other code built (`ledger_build`): rebuild it
        self._con = duckdb.connect(":memory:")
        try:
            self._build(runs)
        except BaseException:
            self._con.close()
            raise

    def _build(self, runs: list[tuple[str, Path]]) -> None:
        con = self._con
        by_table: dict[str, list[tuple[str, str, bool]]] = {}
        allowed: list[str] = []  # the folders of the parts ledgers read in place
        for i, (name, path) in enumerate(runs):
            alias = f"run_{i}"
            try:
                con.execute(f"ATTACH {sql_string(str(path))} AS {alias} (READ_ONLY)")
            except duckdb.Error as exc:
                raise LedgerError(f"cannot open {path} (run {name}): {exc}") from None
            rows = con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main' "
                "UNION SELECT view_name FROM duckdb_views() WHERE database_name = ? AND schema_name = 'main' "
                "AND NOT internal", [alias, alias]).fetchall()
            self._check_build(alias, path, {t for (t,) in rows})
            allowed += self._check_parts(alias, path)
            for (table,) in rows:
                cols = {c for (c,) in con.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE database_name = ? AND schema_name = 'main' "
                    "AND table_name = ?", [alias, table]).fetchall()}
                by_table.setdefault(table, []).append((name, alias, "run_id" in cols))
        self._refuse_shared_run_ids(runs, by_table)
        for table, parts in sorted(by_table.items()):
            selects = [f"SELECT * FROM {alias}.main.{_quote(table)}" if has_run_id else
                       f"SELECT {sql_string(name)} AS run_id, * FROM {alias}.main.{_quote(table)}"
                       for name, alias, has_run_id in parts]
            try:
                con.execute(f"CREATE VIEW {_quote(table)} AS " + " UNION ALL BY NAME ".join(selects))
            except duckdb.Error as exc:
                raise LedgerError(f"table {table!r} cannot be combined across runs {self.runs}: {exc}") from None
        self._tables = sorted(by_table)
        # From here on the connection can read the attached files, the parts in `allowed`, and nothing else.
        con.execute("SET allowed_directories = ?", [sorted(set(allowed))])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")

    def _check_build(self, alias: str, path: Path, tables: set[str]) -> None:
        """A ledger records the ledger modules' code that built it (`ledger_build.modules_sha256`); one
        built by other code (an older inferledger: other columns, or the same ones computed another way)
        is noted in `stale`, which the summary, the report and the exports refuse."""
        from inferledger.ledger.modules import modules_sha256

        rebuild = f"rebuild it: inferledger reconstruct {path.parent}"
        if "ledger_build" not in tables:
            self.stale.append(f"{path}: built by an older inferledger (it records no ledger_build); {rebuild}")
            return
        row = self._con.execute(f"SELECT inferledger_version, modules_sha256 FROM {alias}.main.ledger_build").fetchone()
        if row is None or row[1] != modules_sha256():
            version = row[0] if row else "?"
            self.stale.append(f"{path}: built by other ledger code (inferledger {version}, modules "
                              f"{(row[1] or '?')[:12] if row else '?'} against these {modules_sha256()[:12]}); {rebuild}")

    def _check_parts(self, alias: str, path: Path) -> list[str]:
        """The folders a ledger reads in place (its views of `ledger_parts` tables), each part held to what it
        was built from: LedgerError naming the part that is missing, resized or rewritten."""
        from inferledger.probes.run_dir import PartError, part_record

        views = [v for (v,) in self._con.execute(
            "SELECT view_name FROM duckdb_views() WHERE database_name = ? AND schema_name = 'main' AND NOT internal "
            "AND view_name IN ('events', 'samples')", [alias]).fetchall()]
        if not views:
            return []
        rows = self._con.execute(f"SELECT run_dir, part, table_name, bytes, footer_sha256 FROM {alias}.main.ledger_parts "
                                 "WHERE table_name IN (SELECT unnest(?)) ORDER BY part", [views]).fetchall()
        for run_dir, part, table, size, footer in rows:
            f = Path(run_dir) / part
            rebuild = (f"the ledger {path} reads its {table} in place from the run folder {run_dir}; rebuild it "
                       f"from the run folder as it is now: inferledger reconstruct {path.parent}")
            if not Path(run_dir).is_dir():
                raise LedgerError(f"{run_dir}: no such run folder (moved or removed?): {rebuild}")
            try:
                got = part_record(f) if f.is_file() else None
            except PartError as exc:
                raise LedgerError(f"{exc}; {rebuild}") from None
            if got is None:
                raise LedgerError(f"{f}: missing, though the ledger was built from it: {rebuild}")
            if (got.bytes, got.footer_sha256) != (size, footer):
                raise LedgerError(f"{f}: rewritten since the ledger was built from it ({got.bytes} bytes against "
                                  f"{size}, or another Parquet footer): {rebuild}")
        return sorted({f"{Path(run_dir) / table}/" for run_dir, _part, table, _s, _f in rows})

    def _refuse_shared_run_ids(self, runs: list[tuple[str, Path]], by_table: dict) -> None:
        """Two ledgers with one run_id would merge into one run in every GROUP BY run_id: refuse them."""
        if len(runs) < 2:
            return
        seen: dict[str, Path] = {}
        for i, (name, path) in enumerate(runs):
            alias = f"run_{i}"
            carriers = [t for t in ("run_metrics", "attempts", "gaps", "events")
                        if (name, alias, True) in by_table.get(t, [])]
            ids = {name}  # a ledger whose tables carry no run_id is labelled with its run folder's name
            if carriers:
                ids = {r for (r,) in self._con.execute(
                    f"SELECT DISTINCT run_id FROM {alias}.main.{_quote(carriers[0])} LIMIT 10").fetchall()}
            for run_id in ids:
                if run_id in seen:
                    raise LedgerError(f"run_id {run_id!r} is in two ledgers, {seen[run_id]} and {path}: their rows "
                                      "would mix in every query by run_id; re-import one with a distinct "
                                      "--run-id (or query them one at a time)")
                seen[run_id] = path

    def tables(self) -> list[str]:
        """The views this ledger exposes (one per table name found in any run)."""
        return list(self._tables)

    def sql(self, query: str, params=None) -> duckdb.DuckDBPyRelation:
        """Run a read-only query; returns a relation (`.pl()`, `.df()`, `.arrow()`, `.fetchall()`)."""
        check_read_only(query)
        try:
            return self._con.sql(query, params=params)
        except duckdb.Error as exc:
            raise QueryError(self._with_position(query, params, exc)) from None

    def rows(self, query: str, params=None, limit: int | None = None) -> tuple[list[str], list[tuple]]:
        """(column names, at most `limit` rows) of a read-only query; errors keep their SQL position."""
        check_read_only(query)
        try:
            cur = self._con.execute(query, params)
            columns = [d[0] for d in cur.description or []]
            return columns, (cur.fetchall() if limit is None else cur.fetchmany(limit))
        except duckdb.Error as exc:
            raise QueryError(str(exc)) from None

    def _with_position(self, query: str, params, exc: duckdb.Error) -> str:
        # The relation API drops DuckDB's "LINE n: ..." context; execute() keeps it. The statement
        # is read-only and has already failed to bind, so running it again reads nothing.
        message = str(exc)
        if "LINE " in message:
            return message
        try:
            self._con.execute(query, params)
        except duckdb.Error as again:
            if "LINE " in str(again):
                return str(again)
        return message

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger(runs={self.runs}, tables={self._tables})"


def open_ledger(path_or_glob: str | Path) -> Ledger:
    """`inferledger.open`: a read-only ledger over a run folder, a glob of runs, or a ledger.duckdb."""
    skipped: list[Path] = []
    led = Ledger(resolve_runs(path_or_glob, skipped))
    led.skipped = skipped  # a glob's folders without a ledger yet, passed over
    return led


def ledger_current(run_dir: str | Path) -> bool:
    """Whether a run folder holds a ledger this code reads as built: False without one, for one other
    ledger code built (`stale`), and for one it cannot open (a part it reads in place moved or changed):
    each needs `reconstruct` before a figure is drawn from it."""
    if not (Path(run_dir) / LEDGER_FILE).is_file():
        return False
    try:
        with open_ledger(run_dir) as led:
            return not led.stale
    except LedgerError:
        return False
