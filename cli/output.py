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


def check_output(path, flag: str, *, folder: bool = False, existing: bool = False, example: str = "out.json") -> None:
    """Exit 2 naming `flag` and the reason unless `path` can be written (a file, with `folder` a new or
    empty folder, with `existing` a folder that exists, to continue): every command that writes checks
    this before it loads anything. `example`: a file name the command takes, offered when `path` is a
    folder."""
    from inferledger.collectors.rundir.out_dir import (OutDirError, check_existing_folder, check_new_folder,
                                                        check_out_file)

    try:
        if existing or folder:
            (check_existing_folder if existing else check_new_folder)(path, flag)
        else:
            check_out_file(path, flag, example)
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


def command_name() -> str:
    """How to call this very `inferledger` from the current folder, as pasted: `inferledger` when the
    shell finds this one on PATH, else its path (`.venv/bin/inferledger` from the repository root)."""
    import shutil
    import sys
    from pathlib import Path

    me = Path(sys.argv[0]).absolute() if sys.argv and sys.argv[0] else Path()
    if me.name != "inferledger":  # not the console script (python -m, a test runner): the venv's, beside python
        me = Path(sys.executable).absolute().parent / "inferledger"
    found = shutil.which("inferledger")
    if (found and Path(found).absolute() == me) or not me.exists():
        return "inferledger"
    try:
        return str(me.relative_to(Path.cwd()))
    except ValueError:
        return str(me)


# ---- tables for people ---------------------------------------------------------------------------
# A float shows at most 4 digits after the point; below 1, 4 significant digits; below 1e-3, in
# scientific notation. CSV and JSON keep the full value (echo_rows); only the table rounds.
NULL_TEXT = "NULL"


def number_text(v) -> str:
    """A number as a table shows it: 273.301666999999 -> 273.3017, 0.0123456 -> 0.01235,
    0.000123456 -> 1.235e-04, 2.50 -> 2.5, 3 -> 3; NaN and infinities spelled out."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"not a number: {v!r}")
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if v == 0:
        return "0"
    a = abs(v)
    if a < 1e-3:
        return f"{v:.3e}"
    text = f"{v:.4f}" if a >= 1 else f"{v:.{3 - math.floor(math.log10(a))}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def cell_text(v, null: str = NULL_TEXT) -> str:
    if v is None:
        return null
    return number_text(v) if is_number(v) else str(plain(v))


def table_width(con: Console | None = None) -> int | None:
    """The width tables must fit: the terminal's (or $COLUMNS); None when stdout is a pipe or a file
    (the whole width then: nothing cut at 80 columns)."""
    import os

    con = con or console
    if con.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return con.width
    return None


def show(con: Console, renderable) -> None:
    """Print one table or line for people: in a terminal as rich draws it; piped or to a file, a table at
    its own full width and a line unwrapped (rich would cut both to 80 columns)."""
    from rich.measure import Measurement
    from rich.table import Table

    if table_width(con) is not None:
        con.print(renderable)
    elif isinstance(renderable, Table):
        _print_at(con, renderable, Measurement.get(con, con.options.update(width=100_000), renderable).maximum)
    else:
        con.print(renderable, soft_wrap=True)


def _print_at(con: Console, renderable, width: int) -> None:
    """Print on the same console (its file, its record), at least `width` columns wide, nothing cropped."""
    before = con.width
    con.width = max(width, before)
    try:
        con.print(renderable, crop=False)
    finally:
        con.width = before


def _groups(widths: list[int], limit: int | None, keep_first: bool) -> list[list[int]]:
    """Column indexes split into tables of at most `limit` characters (3 per column for its border
    and padding, 1 for the last border); the first column repeated in each when it names the row."""
    if limit is None:
        return [list(range(len(widths)))]
    groups, current, used = [], [], 1
    for i, w in enumerate(widths):
        if current and used + w + 3 > limit and current != [0]:
            groups.append(current)
            current, used = ([0], 1 + widths[0] + 3) if keep_first else ([], 1)
        current.append(i)
        used += w + 3
    groups.append(current)
    return groups


def print_rows(columns, rows, *, title: str | None = None, null: str = NULL_TEXT, con: Console | None = None) -> None:
    """Rows as tables for people: numbers rounded (number_text) and right-aligned, every header whole
    on one line; a table wider than the terminal is split by columns into several (the first column,
    naming the row, repeated), a piped one printed at its full width."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    con = con or console
    cells = [[cell_text(v, null) for v in row] for row in rows]
    numeric = [any(is_number(row[j]) for row in rows) and all(row[j] is None or is_number(row[j]) for row in rows)
               for j in range(len(columns))]
    widths = [max([len(str(c))] + [max(map(len, row[j].split("\n"))) for row in cells]) for j, c in enumerate(columns)]
    limit = table_width(con)
    if limit is not None and 0 < len(rows) <= 3 and sum(w + 3 for w in widths) + 1 > limit:
        _print_transposed(columns, rows, cells, title, con)
        return
    keep_first = bool(columns) and not numeric[0]
    groups = _groups(widths, limit, keep_first)
    for n, group in enumerate(groups):
        shown = [j for j in group if not (n and keep_first and j == 0)]
        head = title if len(groups) == 1 else \
            f"{title + ' ' if title else ''}(columns {shown[0] + 1}–{shown[-1] + 1} of {len(columns)})"
        table = Table(title=escape(head) if head else None, title_justify="left", header_style="bold")
        for j in group:
            table.add_column(escape(str(columns[j])), justify="right" if numeric[j] else "left",
                             min_width=len(str(columns[j])), overflow="fold", no_wrap=numeric[j])
        for row_cells, row in zip(cells, rows):
            table.add_row(*(Text(row_cells[j], style="dim" if row[j] is None else "") for j in group))
        if limit is None:  # piped: the table's own width, whatever the 80 columns rich assumes
            _print_at(con, table, max(sum(widths[j] + 3 for j in group) + 1, len(head or "")))
        else:
            con.print(table)


def _print_transposed(columns, rows, cells, title, con) -> None:
    """A few wide rows (run_metrics, reconciliation ...): one line per column, one column per row."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    table = Table(title=escape(title) if title else None, title_justify="left", header_style="bold")
    table.add_column("column", min_width=len("column"))
    for i in range(len(rows)):
        table.add_column(f"row {i + 1}", overflow="fold", justify="left")
    for j, col in enumerate(columns):
        table.add_row(escape(str(col)), *(Text(row_cells[j], justify="right" if is_number(row[j]) else "left",
                                               style="dim" if row[j] is None else "")
                                          for row_cells, row in zip(cells, rows)))
    con.print(table)
