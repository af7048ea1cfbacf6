"""Two ledgers compared table by table, row for row (test helper for the scale paths)."""
from __future__ import annotations

import math

import duckdb

from inferledger.ledger.reconstruct import PUBLIC_TABLES

REL = 1e-9
# A difference of two equal figures (a mean against a mean) comes out as ±1e-14 from the order DuckDB's
# threads summed in, so near zero the relative bound means nothing: 1e-9 (a picosecond in ms) absolute.
ABS = 1e-9


def _rows(con, table: str) -> list[tuple]:
    cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    # rows in a total order of their text, so two ledgers built in different orders compare
    order = ", ".join(f'CAST("{c}" AS VARCHAR) NULLS FIRST' for c in cols)
    return con.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= max(REL * max(abs(a), abs(b)), ABS)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


# where the rows were read from (a part's path, size and footer; a left-out copy's part and row), which a
# repartition of the same events changes: the rows themselves are compared in every other table
CONTENT_TABLES = tuple(t for t in PUBLIC_TABLES if t not in ("ledger_parts", "event_copies_left_out"))


def ledger_differences(path_a, path_b, tables=CONTENT_TABLES) -> list[str]:
    """What differs between two ledger files, one line per table (empty when they agree)."""
    a, b = duckdb.connect(str(path_a), read_only=True), duckdb.connect(str(path_b), read_only=True)
    out = []
    try:
        for t in tables:
            ra, rb = _rows(a, t), _rows(b, t)
            if len(ra) != len(rb):
                out.append(f"{t}: {len(ra)} rows against {len(rb)}")
                continue
            bad = [i for i, (x, y) in enumerate(zip(ra, rb)) if not _same(x, y)]
            if bad:
                out.append(f"{t}: row {bad[0]} differs: {ra[bad[0]]} against {rb[bad[0]]} ({len(bad)} rows)")
    finally:
        a.close()
        b.close()
    return out
