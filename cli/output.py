"""What every command shares for its output: the consoles, the exit-2 refusal, and `--format`.

`--format table|csv|json` means one thing in every command that prints rows: the same rows, for
people (a rich table), as CSV (a header line, then one line per row) or as JSON (one array of
objects). NULL, NaN and infinities are empty in CSV and null in JSON.
"""
from __future__ import annotations

import csv
import io
import json
import math
from enum import Enum

import typer
from rich.console import Console

console = Console()


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


FORMAT_HELP = "table for people; csv (a header, then one line per row) or json (an array of objects) for scripts."


def fail(message: str, code: int = 2) -> None:
    """Print `message` on stderr and exit `code` (2: bad input). Plain echo, not rich: a message is
    never wrapped (a path or DuckDB's caret under "LINE 1:" stays whole and aligned) and never read
    as markup (a path may hold brackets)."""
    typer.echo(message, err=True)
    raise typer.Exit(code)


def check_output(path, flag: str, *, folder: bool = False) -> None:
    """Exit 2 naming `flag` and the reason unless `path` can be written (a file, or with `folder` a new
    or empty folder): every command that writes checks this before it loads anything."""
    from inferledger.collectors.rundir.out_dir import OutDirError, check_new_folder, check_out_file

    try:
        (check_new_folder if folder else check_out_file)(path, flag)
    except OutDirError as exc:
        fail(f"error: {exc}")


def plain(v):
    """A JSON-ready Python value (NaN and infinities have no JSON spelling: null)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def csv_cell(v) -> str:
    v = plain(v)
    return "" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def csv_text(columns, rows) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    w.writerows([csv_cell(v) for v in row] for row in rows)
    return buf.getvalue()


def json_text(columns, rows) -> str:
    return json.dumps([dict(zip(columns, map(plain, row))) for row in rows], allow_nan=False)


def echo_rows(fmt: OutputFormat, columns, rows) -> bool:
    """Print the rows as csv or json and return True; False for `table` (the caller draws it)."""
    if fmt == OutputFormat.csv:
        typer.echo(csv_text(columns, rows), nl=False)
        return True
    if fmt == OutputFormat.json:
        typer.echo(json_text(columns, rows))
        return True
    return False


def echo_result(fmt: OutputFormat, result) -> bool:
    """A command's result (a dataclass) as one csv / json row, its `refusals` left out (they went to
    stderr); False for `table`."""
    from dataclasses import asdict

    row = {k: (str(v) if k == "out" else v) for k, v in asdict(result).items() if k != "refusals"}
    return echo_rows(fmt, list(row), [list(row.values())])


def section_rows(value) -> tuple[list[str], list[list]]:
    """(columns, rows) of one section: a list of records, or one record."""
    records = value if isinstance(value, list) else [value]
    columns = list(dict.fromkeys(k for r in records for k in r))
    return columns, [[r.get(c) for c in columns] for r in records]


LONG_COLUMNS = ("section", "row", "column", "value")


def echo_sections(fmt: OutputFormat, sections: dict) -> bool:
    """Print named sections (each a list of records or one record) as json (an object of sections) or
    csv (one line per cell: section, row index, column, value); False for `table`."""
    if fmt == OutputFormat.json:
        typer.echo(json.dumps(plain(sections), allow_nan=False))
        return True
    if fmt == OutputFormat.csv:
        cells = []
        for name, value in sections.items():
            columns, rows = section_rows(value)
            cells += [(name, i, c, v) for i, row in enumerate(rows) for c, v in zip(columns, row)]
        typer.echo(csv_text(LONG_COLUMNS, cells), nl=False)
        return True
    return False
