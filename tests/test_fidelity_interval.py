"""The fidelity study's interval of each figure's error over the attempts: the paired attempts resampled, a
quantile's error on each resample; none where too few attempts lie past the quantile."""
from __future__ import annotations

import pytest

from inferledger.studies.fidelity import BEYOND, error_interval, sampling_sentence


def test_a_simulation_off_by_one_factor_on_every_attempt_has_that_error_on_every_resample():
    real = [10.0 + 3.7 * i for i in range(40)]
    for q in (0.5, 0.2):
        lo, hi = error_interval([(r, 1.1 * r) for r in real], q)
        assert lo == pytest.approx(0.1, abs=1e-12) and hi == pytest.approx(0.1, abs=1e-12)
    assert error_interval([(r, r) for r in real], 0.5) == (0.0, 0.0)


def test_no_interval_where_fewer_than_five_attempts_lie_past_the_quantile():
    pairs = [(float(i + 1), float(i + 2)) for i in range(600)]
    assert BEYOND == 5
    assert error_interval(pairs[:60], 0.99) == (None, None)  # 0.6 attempts past a p99 of 60: the slowest one
    assert error_interval(pairs[:499], 0.99) == (None, None)
    assert None not in error_interval(pairs[:500], 0.99)
    assert error_interval(pairs[:9], 0.5) == (None, None) and None not in error_interval(pairs[:10], 0.5)
    assert error_interval([], 0.5) == (None, None)
    # a value that is not a number gives no interval, never one computed over it
    assert error_interval(pairs[:59] + [(float("nan"), 3.0)], 0.5) == (None, None)
    assert error_interval(pairs[:59] + [(2.0, float("inf"))], 0.5) == (None, None)


def test_a_median_between_two_modes_spans_from_no_error_to_the_whole_gap():
    # 60 attempts: 31 fast (18 ms) and 29 slow (40 ms) in real; the simulation has two of the fast ones slow. Its
    # median jumps from 18 to 40 ms (+122 %) though 58 of 60 attempts agree exactly: a resample with a few more fast
    # attempts puts both medians on 18 (no error), one with fewer puts real's on 18 and the sim's on 40
    real = [18.0] * 31 + [40.0] * 29
    sim = [40.0 if i in (0, 1) else r for i, r in enumerate(real)]
    lo, hi = error_interval(list(zip(real, sim)), 0.5)
    assert lo == 0.0 and hi == pytest.approx(40 / 18 - 1)
    assert error_interval(list(zip(real, sim)), 0.5) == (lo, hi)  # seeded: the same interval every time


def test_the_sentence_says_whether_each_judged_interval_is_within_outside_or_straddling_its_target():
    def row(figure, err, lo, hi, target, n=60):
        return [figure, "c", 1.0, 1.0, err, lo, hi, target, None, n, n, n]

    text = sampling_sentence([row("TPOT p50", -0.114, -0.197, -0.020, 0.05), row("TTFT p50", 0.01, -0.04, 0.05, 0.10),
                              row("E2E p50", 0.3, 0.2, 0.4, 0.10), row("E2E p99", 0.068, None, None, 0.10),
                              row("TTFT p99", 0.5, 0.1, 0.9, None)])
    assert "TPOT p50 -11.4% (-19.7% to -2.0%: straddling its ±5%)" in text
    assert "TTFT p50 +1.0% (-4.0% to +5.0%: within its ±10%)" in text
    assert "E2E p50 +30.0% (+20.0% to +40.0%: outside its ±10%)" in text
    assert "E2E p99 +6.8% (no interval: 60 attempts leave fewer than 5 past its quantile)" in text
    assert "TTFT p99" not in text  # shown, not judged
    assert sampling_sentence([row("TTFT p99", 0.5, 0.1, 0.9, None)]) == ""


def test_the_resamples_drawn_in_batches_give_the_interval_drawn_at_once(monkeypatch):
    # the memory bound draws the resamples a batch at a time: the same draws, so the same interval
    import inferledger.studies.fidelity as fidelity

    pairs = [(10.0 + (7 * i) % 23, 10.5 + (5 * i) % 19) for i in range(60)]
    at_once = error_interval(pairs, 0.5)
    monkeypatch.setattr(fidelity, "RESAMPLE_CELLS", 60 * 7)  # batches of 7 resamples
    assert error_interval(pairs, 0.5) == at_once
