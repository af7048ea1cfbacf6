"""Every archive under samples/e0/ against the ledger values computed by hand beside it."""
from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import pytest

from inferledger.collectors.importer import import_archive
from inferledger.ledger.reconstruct import reconstruct

E0 = Path(__file__).resolve().parent.parent / "samples" / "e0"
CASES = sorted(p.name for p in E0.iterdir() if (p / "expected.json").exists()) if E0.exists() else []


def test_there_are_at_least_eight_cases():
    assert len(CASES) >= 8, CASES


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory):
    out = {}
    for case in CASES:
        run = tmp_path_factory.mktemp("e0") / case
        import_archive(E0 / case / "archive.jsonl", run)
        out[case] = duckdb.connect(str(reconstruct(run).path), read_only=True)
    return out


def _same(actual, expected) -> bool:
    if expected is None or actual is None:
        return actual is None and expected is None
    if isinstance(expected, float) or isinstance(actual, float):
        return math.isclose(float(actual), float(expected), rel_tol=1e-9, abs_tol=1e-9)
    return actual == expected


@pytest.mark.parametrize("case", CASES)
def test_case_matches_hand_computed_ledger(case, ledgers):
    con = ledgers[case]
    spec = json.loads((E0 / case / "expected.json").read_text())
    problems = []
    for table, block in spec.get("rows", {}).items():
        keys = block["key"]
        for want in block["rows"]:
            where = " and ".join(f"{k} = ?" for k in keys) or "true"  # no key: a one-row table
            cols = [c for c in want if c not in keys]
            rows = con.execute(f"select {', '.join(cols) or '1'} from {table} where {where}",
                               [want[k] for k in keys]).fetchall()
            label = f"{table}[{', '.join(str(want[k]) for k in keys)}]"
            if len(rows) != 1:
                problems.append(f"{label}: {len(rows)} rows")
                continue
            for col, got in zip(cols, rows[0]):
                if not _same(got, want[col]):
                    problems.append(f"{label}.{col}: ledger {got!r}, expected {want[col]!r}")
    for table, c in spec.get("counts", {}).items():
        n = con.execute(f"select count(*) from {table} where {c['where']}").fetchone()[0]
        if n != c["n"]:
            problems.append(f"count {table} where {c['where']}: ledger {n}, expected {c['n']}")
    for g in spec.get("gaps_contain", []):
        n = con.execute("select count(*) from gaps where scope = ? and subject_id is not distinct from ? "
                        "and affects like ?", [g["scope"], g.get("subject_id"), f"%{g['affects_contains']}%"]).fetchone()[0]
        if n == 0:
            problems.append(f"no gap {g}")
    assert not problems, "\n".join(problems)
