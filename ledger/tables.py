"""The tables a Python stage creates from rows it computed, declared once beside the stage, and the one
shape of the gap tables every module declares.

A Python stage declares each table it builds from Python rows as a `StageTable` (name, columns with their
Arrow types, TEMP or public, the order its rows are kept in) and calls `table.store(con, rows)`: the
rows become an Arrow table, registered, copied into DuckDB with the run's id in front (public
tables) and unregistered, in one place. `ledger/modules.py` reads the stage's `StageTable`s: each is among
its CREATES, a public one among its PUBLIC, a TEMP one not.

A module that can leave a figure NULL declares why in a TEMP table named `<module>_gaps` with exactly
the columns of `GAP_COLUMNS` (`gap_table(module)` in a Python stage; `CREATE OR REPLACE TEMP TABLE
<module>_gaps AS SELECT ...` with those columns, all VARCHAR, in a SQL module). The gap register
(`ledger/gaps.sql`) is the union of these tables, numbered (docs/LEDGER.md "gaps").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import pyarrow as pa


def sql_string(text: str) -> str:
    """`text` as a SQL string literal (where a statement cannot take a parameter: a view keeps its text, ATTACH
    takes no parameter)."""
    return "'" + text.replace("'", "''") + "'"


GAP_COLUMNS = (("scope", pa.string()), ("subject_id", pa.string()), ("affects", pa.string()),
               ("needs", pa.string()), ("detail", pa.string()))
GAP_SUFFIX = "_gaps"


@dataclass(frozen=True)
class StageTable:
    name: str
    columns: tuple[tuple[str, pa.DataType], ...]
    temp: bool = False          # TEMP: stays inside the rebuild; else part of the ledger, with run_id first
    order: str = ""             # ORDER BY of the stored rows ("" keeps the rows' order)
    hidden: tuple[str, ...] = ()  # columns the rows carry for the order only, not kept

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)

    def arrow(self, rows: Iterable) -> pa.Table:
        """Rows as dicts (a missing key is NULL) or as tuples in column order."""
        rows = list(rows)
        if rows and not isinstance(rows[0], dict):
            rows = [dict(zip(self.names, r)) for r in rows]
        return pa.table({c: pa.array([r.get(c) for r in rows], t) for c, t in self.columns})

    def store(self, con, rows: Iterable, sql_rows: str = "") -> None:
        """CREATE OR REPLACE the table from `rows` (see `arrow`), and the rows of `sql_rows` (a query
        with the same columns, computed in SQL) after them."""
        view = f"_rows_{self.name}"
        con.register(view, self.arrow(rows))
        try:
            kind = "TEMP TABLE" if self.temp else "TABLE"
            run_id = "" if self.temp else "getvariable('run_id') AS run_id, "
            keep = f"* EXCLUDE ({', '.join(self.hidden)})" if self.hidden else "*"
            source = f"(SELECT * FROM {view} UNION ALL BY NAME SELECT * FROM ({sql_rows}))" if sql_rows else view
            order = f" ORDER BY {self.order}" if self.order else ""
            con.execute(f"CREATE OR REPLACE {kind} {self.name} AS SELECT {run_id}{keep} FROM {source}{order}")
        finally:
            con.unregister(view)


def gap_table(module: str) -> StageTable:
    """The gap table a module declares: `<module>_gaps`, TEMP, in the one gap shape."""
    return StageTable(f"{module}{GAP_SUFFIX}", GAP_COLUMNS, temp=True)
