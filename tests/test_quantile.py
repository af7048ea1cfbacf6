"""The one quantile rule for figures computed in Python: linear interpolation between the closest
ranks, the same as DuckDB's quantile_cont (the ledger's rule), checked against DuckDB itself."""
from __future__ import annotations

import random
import re
from pathlib import Path

import duckdb
import pytest

from inferledger.collectors.load.loadgen import LoadResult
from inferledger.probes.quantile import quantile

REPO = Path(__file__).resolve().parent.parent


def test_hand_computed_values():
    assert quantile([10.0, 20.0, 30.0, 40.0], 0.5) == 25.0  # between ranks 1 and 2
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0  # order of the input does not matter
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.25) == 2.0
    assert quantile(range(10), 0.99) == pytest.approx(8.91)  # h = 9 * 0.99 = 8.91
    assert quantile([7.0], 0.99) == 7.0
    assert quantile([1.0, 5.0], 0.0) == 1.0 and quantile([1.0, 5.0], 1.0) == 5.0


def test_no_values_is_unknown_and_bad_input_is_refused():
    assert quantile([], 0.5) is None
    for q in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="q must be within 0..1"):
            quantile([1.0], q)
    with pytest.raises(ValueError, match="NaN"):
        quantile([1.0, float("nan")], 0.5)


def test_agrees_with_duckdb_quantile_cont():
    rng = random.Random(7)
    con = duckdb.connect()
    for n in [*range(1, 30), 101, 1000]:
        values = [rng.lognormvariate(0.0, 2.0) for _ in range(n)]
        for q in (0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0, rng.random()):
            oracle, = con.execute("SELECT quantile_cont(v, ?) FROM unnest(?::DOUBLE[]) t(v)", [q, values]).fetchone()
            # the same rule; the last bits differ only by the order of the floating-point operations
            assert quantile(values, q) == pytest.approx(oracle, rel=1e-12, abs=1e-15), (n, q)


def test_pacing_summary_interpolates_between_ranks():
    result = LoadResult(pacing={"arrival": [float(v) for v in range(10)], "retry": [4.0, 2.0], "turn": []})
    assert result.pacing_summary() == {
        "arrival": {"n": 10, "mean": 4.5, "p50": 4.5, "p99": 8.91, "max": 9.0},  # nearest rank said 5 and 9
        "retry": {"n": 2, "mean": 3.0, "p50": 3.0, "p99": 3.98, "max": 4.0},
        "turn": {"n": 0},
    }


def test_no_other_quantile_rule_in_the_code():
    """Python-side percentiles go through probes.quantile: no exclusive-method `statistics.quantiles`,
    no nearest-rank index into a sorted list."""
    banned = re.compile(r"statistics\.quantiles\(|sorted\([^)]*\)\[\s*int\(|int\(\s*\w+\s*\*\s*len\(")
    found = []
    for folder in ("engine", "probes", "collectors", "ledger", "cli", "inferledger", "serve", "report", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if banned.search(line):
                    found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert found == []
