"""One definition per figure: the latency-percentile table and the observation window live in the
ledger, computed by its one quantile rule (linear interpolation between closest ranks)."""
from __future__ import annotations

import numpy as np
import pytest

from ledger_util import build_run

CONTENT = {"attrs": {"kinds": ["content"]}}
TTFTS_MS = (10, 20, 30, 40, 100)


def _run(tmp_path):
    ev = [{"name": "arrival.planned", "ms": 0, "task_id": "T0", "attempt_id": None, "request_id": None}]
    for i, ttft in enumerate(TTFTS_MS):
        a = {"attempt_id": f"A{i}", "request_id": f"R{i}", "task_id": f"T{i}"}
        ev += [{"name": "attempt.sent", "ms": 1000 * i, **a},
               {"name": "attempt.chunk", "ms": 1000 * i + ttft, **a, **CONTENT},
               {"name": "attempt.chunk", "ms": 1000 * i + ttft + 5, **a, **CONTENT},
               {"name": "attempt.done", "ms": 1000 * i + ttft + 7, **a}]
    return build_run(tmp_path / "r", ev)


def test_ttft_row_is_the_linear_rule_over_attempts(tmp_path):
    con = _run(tmp_path)
    row = con.execute("SELECT metric, layer, label, source_column, sample, n, mean_ms, p50_ms, p90_ms, p95_ms, p99_ms, "
                      "max_ms FROM latency_percentiles WHERE position = 1").fetchone()
    # by hand: ranks at q·(n−1); p90 = 40 + 0.6 × (100 − 40), p95 = 40 + 0.8 × 60, p99 = 40 + 0.96 × 60
    assert row == ("TTFT", "client", "client (first content)", "request_metrics.ttft_client_ms", "attempt", 5,
                   40.0, 30.0, 76.0, 88.0, pytest.approx(97.6), 100.0)
    assert row[8:11] == tuple(pytest.approx(np.percentile(TTFTS_MS, q)) for q in (90, 95, 99))  # NumPy's default


def test_itl_rows_pool_the_gaps_and_empty_rows_are_unknown(tmp_path):
    con = _run(tmp_path)
    rows = dict((r[0], r[1:]) for r in con.execute(
        "SELECT label, sample, n, mean_ms, p50_ms, max_ms FROM latency_percentiles WHERE metric = 'ITL'").fetchall())
    assert rows["client (per output event)"] == ("gap", 5, 5.0, 5.0, 5.0)
    assert rows["engine (per output event)"] == ("gap", 0, None, None, None)  # no engine events: unknown, not 0
    assert [r[0] for r in con.execute("SELECT position FROM latency_percentiles ORDER BY position").fetchall()] \
        == list(range(1, 16))


def test_the_window_goodput_counts_over_is_in_run_metrics(tmp_path):
    con = _run(tmp_path)
    clock, start, end, t_obs = con.execute(
        "SELECT window_clock, window_start_ns, window_end_ns, t_obs_s FROM run_metrics").fetchone()
    # from the planned arrival (0 ms) to the last attempt's done (4000 + 100 + 7 ms)
    assert (clock, start, end) == ("c", 0, 4_107_000_000) and t_obs == pytest.approx(4.107)


def test_the_reporters_of_span_tokens_are_named_in_order(tmp_path):
    """The gap for engine token gaps a reported span cannot give names every reporter once, alphabetically: the
    same run gives the same words (a DISTINCT aggregate without an order listed them as the rows came)."""
    from ledger_util import build_run, dict_rows, event as _e

    events = []
    for i, reporter in enumerate(["zeta", "mu", "alpha", "kappa", "alpha"]):
        said = {"evidence": "reported", "reporter": reporter}
        events += [_e("engine.enqueued", i, f"A{i}", source="engine", attrs=said),
                   _e("engine.token", i + 5, f"A{i}", source="engine", value=3, attrs={**said, "aggregate": True})]
    con = build_run(tmp_path / "r", events)
    assert dict_rows(con, "SELECT detail FROM gaps WHERE gap_id = 'reported:itl'") == [
        {"detail": "5 attempt(s) with tokens reported by alpha, kappa, mu, zeta as a span"}]
