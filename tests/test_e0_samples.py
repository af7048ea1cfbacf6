"""Every archive under samples/e0/ against the ledger values computed by hand beside it."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import duckdb
import pytest

from inferledger.ledger.reconstruct import reconstruct
from sample_runs import built_samples

E0 = Path(__file__).resolve().parent.parent / "samples" / "e0"
CASES = sorted(p.name for p in E0.iterdir() if (p / "expected.json").exists()) if E0.exists() else []


def test_every_sample_folder_is_a_complete_checked_case():
    # a folder missing expected.json would drop out of CASES silently: each must have all three files,
    # and each expected.json must check something
    folders = sorted(p.name for p in E0.iterdir() if p.is_dir())
    incomplete = [f for f in folders if not all((E0 / f / n).is_file() for n in ("README.md", "archive.jsonl",
                                                                               "expected.json"))]
    assert folders and not incomplete, incomplete
    assert CASES == folders
    empty = [c for c in CASES if not any(b["rows"] for b in json.loads((E0 / c / "expected.json").read_text())
                                         .get("rows", {}).values())]
    assert not empty, empty


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Each archive imported and its (default, single-node) ledger built: {case: run folder}, the session's
    shared builds (tests/sample_runs.py), which these tests only read."""
    return dict(zip(CASES, built_samples(tmp_path_factory, [("e0", E0 / case / "archive.jsonl", case) for case in CASES])))


@pytest.fixture(scope="module")
def ledgers(runs):
    return {case: duckdb.connect(str(run / "ledger.duckdb"), read_only=True) for case, run in runs.items()}


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


def test_every_sample_archive_has_the_same_ledger_sharded_and_default(runs, local_ray, tmp_path):
    """The sharded reconstruct on a local Ray of two workers (the run in 3 buckets) gives each archive the
    ledger above, table for table, row for row (the other runs sharded: tests/test_scale_ray.py)."""
    from inferledger.collectors.rundir.repartition import repartition
    from inferledger.ledger.reconstruct import BuildOptions
    from scale_util import ledger_differences

    for case, run in runs.items():
        copy = tmp_path / case
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("ledger.duckdb*"))
        repartition(copy, 3)
        sharded = reconstruct(copy, BuildOptions(engine="ray"), out=tmp_path / f"{case}-ray.duckdb").path
        assert ledger_differences(run / "ledger.duckdb", sharded) == [], case
