"""Energy per good result from raw counters: window energy, RAPL wrap, driver reset, idle term, shares."""
from __future__ import annotations


import pytest

from ledger_util import build_run


def _attempt(aid, sent, done, correct=True):
    return [
        {"name": "task.start", "ms": sent, "task_id": "T" + aid, "attempt_id": aid, "request_id": "R" + aid,
         "attrs": {"deadline_ms": 5000}},
        {"name": "attempt.sent", "ms": sent, "task_id": "T" + aid, "attempt_id": aid, "request_id": "R" + aid},
        {"name": "attempt.chunk", "ms": done - 1, "attempt_id": aid, "attrs": {"kinds": ["content"]}},
        {"name": "attempt.done", "ms": done, "attempt_id": aid, "attrs": {"usage": {"completion_tokens": 4}}},
        {"name": "verdict", "ms": done, "attempt_id": aid, "source": "checker", "attrs": {"correct": correct}},
    ]


def _steps():
    # two steps: A1 prefills 30 tokens beside A2's 10; then both decode one token each
    ev = []
    for sid, t0, t1, batch in ((1, 100, 400, [["A1", "prefill", 30], ["A2", "prefill", 10]]),
                               (2, 400, 600, [["A1", "decode", 1], ["A2", "decode", 1]])):
        ev.append({"name": "step.start", "ms": t0, "source": "engine", "step_id": sid, "attempt_id": None,
                   "attrs": {"batch": batch}})
        ev.append({"name": "step.end", "ms": t1, "source": "engine", "step_id": sid, "attempt_id": None})
    return ev


def _gpu_samples(values_at):
    return [(ms, "gpu_energy_mj", v, "mJ", "gpu0") for ms, v in values_at]


def test_gpu_window_energy_idle_term_and_per_good(tmp_path):
    # 50 W before the window (5 J per 100 ms), 200 W inside it (20 J per 100 ms); window 0..1000 ms
    values, v = [], 0.0
    for ms in range(-500, 1001, 100):
        values.append((ms, v))
        v += 5000.0 if ms < 0 else 20000.0
    con = build_run(tmp_path / "r", _attempt("A1", 0, 1000) + _steps(), samples=_gpu_samples(values))
    row = con.execute("select energy_gpu_j, idle_gpu_j, energy_cpu_j, energy_scope, energy_per_good_j, "
                      "energy_gpu_per_good_j, gpu_window_short from run_metrics").fetchone()
    assert row == (pytest.approx(200.0), pytest.approx(50.0), None, "gpu", pytest.approx(200.0),
                   pytest.approx(200.0), False)
    assert con.execute("select count(*) from gaps where affects like '%energy_gpu_j%'").fetchone()[0] == 0


def test_rapl_wrap_is_unwrapped_with_the_zone_range(tmp_path):
    zone = "/sys/class/powercap/intel-rapl:0"
    samples = [(-600, "rapl_max_energy_range_uj", 1_000_000, "uJ", zone),
               (-500, "cpu_package_energy_uj", 900_000, "uJ", zone), (0, "cpu_package_energy_uj", 950_000, "uJ", zone),
               (500, "cpu_package_energy_uj", 20_000, "uJ", zone), (1000, "cpu_package_energy_uj", 120_000, "uJ", zone)]
    con = build_run(tmp_path / "r", _attempt("A1", 0, 1000), samples=samples)
    energy, idle, scope = con.execute("select energy_cpu_j, idle_cpu_j, energy_scope from run_metrics").fetchone()
    assert energy == pytest.approx((1_000_000 - 950_000 + 20_000 + 100_000) / 1e6)  # 0.17 J across the wrap
    assert idle == pytest.approx(0.05 / 0.5 * 1.0)  # 50 000 uJ in the 0.5 s before, times the 1 s window
    assert scope == "cpu_package"


def test_driver_reset_invalidates_the_window(tmp_path):
    values = [(0, 10_000.0), (500, 30_000.0), (600, 100.0), (1000, 5_000.0)]  # the counter restarts at 600
    con = build_run(tmp_path / "r", _attempt("A1", 0, 1000), samples=_gpu_samples(values))
    assert con.execute("select energy_gpu_j, energy_per_good_j from run_metrics").fetchone() == (None, None)
    assert con.execute("select count(*) from gaps where scope = 'energy' and subject_id = 'gpu_energy_mj'").fetchone()[0] == 1


def test_no_source_is_unknown_not_zero(tmp_path):
    con = build_run(tmp_path / "r", _attempt("A1", 0, 1000))
    assert con.execute("select energy_gpu_j, energy_cpu_j, energy_per_good_j, energy_scope from run_metrics").fetchone() \
        == (None, None, None, None)
    needs = con.execute("select needs from gaps where scope = 'energy'").fetchone()[0]
    assert "NVML" in needs and "RAPL" in needs


def test_shares_follow_tokens_per_step_and_add_up(tmp_path):
    values = [(ms, ms * 100.0) for ms in range(0, 1001, 100)]  # 100 J over the window
    con = build_run(tmp_path / "r", _attempt("A1", 0, 1000) + _attempt("A2", 0, 1000, correct=False) + _steps(),
                    samples=_gpu_samples(values))
    total = con.execute("select energy_gpu_j from run_metrics").fetchone()[0]
    assert total == pytest.approx(100.0)
    shares = dict(con.execute("select attempt_id, gpu_j from energy_shares").fetchall())
    # step 1 (300 ms) splits 30:10, step 2 (200 ms) 1:1 -> A1 325 ms, A2 175 ms of 500 ms
    assert shares == {"A1": pytest.approx(65.0), "A2": pytest.approx(35.0)}
    assert sum(shares.values()) == pytest.approx(total)
    # one good result (A2 was wrong): all window energy is charged to it
    assert con.execute("select n_good, energy_per_good_j from run_metrics").fetchone() == (1, pytest.approx(100.0))
    attributed, steps_total = con.execute("select attributed_step_ms, attributed_steps_total_ms from run_metrics").fetchone()
    assert attributed == pytest.approx(steps_total) == pytest.approx(500.0)


def test_vllm_style_goodput_uses_declared_thresholds(tmp_path):
    ev = _attempt("A1", 0, 1000) + _attempt("A2", 0, 400)
    con = build_run(tmp_path / "r", ev, manifest={"slo": {"e2e_ms": 500}})
    # only A2 finished within 500 ms; the window is 1 s
    assert con.execute("select vllm_goodput_rps, slo_e2e_ms, slo_ttft_ms from run_metrics").fetchone() \
        == (pytest.approx(1.0), 500.0, None)
    con2 = build_run(tmp_path / "r2", ev)
    assert con2.execute("select vllm_goodput_rps from run_metrics").fetchone()[0] is None


# -- samples that do not line up with the window ---------------------------------------------------

def _counter(points):
    """(ms, joules in the interval ending at ms) -> raw gpu_energy_mj samples, counter from 1000 J."""
    out, v = [], 1_000_000.0
    for ms, joules in points:
        v += joules * 1000.0
        out.append((ms, v))
    return _gpu_samples(out)


def test_counter_deltas_straddling_the_window_edges_are_apportioned(tmp_path):
    # window 0 .. 1000 ms; samples every 300 ms from -550: -550, -250, 50, 350, 650, 950, 1250
    # J per interval: (-550,-250) 30 = 100 W; (-250,50) 45 = 150 W; then 60, 60, 60 (200 W); (950,1250) 30
    samples = _counter([(-550, 0), (-250, 30), (50, 45), (350, 60), (650, 60), (950, 60), (1250, 30)])
    con = build_run(tmp_path / "r", _attempt("A1", 0, 1000) + _steps(), samples=samples)
    energy, idle, short = con.execute("SELECT energy_gpu_j, idle_gpu_j, gpu_window_short FROM run_metrics").fetchone()
    # inside: 45 x 50/300 = 7.5 (the part of (-250, 50) after 0) + 180 + 30 x 50/300 = 5  -> 192.5 J
    assert energy == pytest.approx(192.5)
    # idle power before the window: 30 J + 45 x 250/300 = 37.5 J over 0.3 + 0.25 s; times the 1 s covered
    assert idle == pytest.approx(67.5 / 0.55 * 1.0)
    assert short is False


def test_idle_and_window_terms_share_the_covered_time(tmp_path):
    # the sampler stopped at 950 ms: the counter covers 0 .. 950 of the 0 .. 1000 window
    samples = _counter([(-550, 0), (-250, 30), (50, 45), (350, 60), (650, 60), (950, 60)])
    con = build_run(tmp_path / "r", _attempt("A1", 0, 1000), samples=samples)
    energy, idle = con.execute("SELECT energy_gpu_j, idle_gpu_j FROM run_metrics").fetchone()
    assert energy == pytest.approx(7.5 + 180.0)
    assert idle == pytest.approx(67.5 / 0.55 * 0.95)  # the same 0.95 s the window energy covers


def test_instant_power_is_integrated_up_to_the_window_edges(tmp_path):
    # 1 W at -500 ms rising linearly to 3 W at 500 ms, then 3 W until 1500 ms; window 0 .. 1000
    samples = [(ms, "gpu_power_instant_mw", mw, "mW", "gpu0") for ms, mw in ((-500, 1000.0), (500, 3000.0), (1500, 3000.0))]
    con = build_run(tmp_path / "r", _attempt("A1", 0, 1000), samples=samples)
    # 0 .. 500: 2 W -> 3 W, 1.25 J; 500 .. 1000: 3 W, 1.5 J
    assert con.execute("SELECT gpu_power_integrated_j FROM run_metrics").fetchone()[0] == pytest.approx(2.75)


def test_psys_is_never_added_to_the_cpu_package(tmp_path):
    zone = "/sys/class/powercap/intel-rapl:0"
    s = [(-600, "rapl_max_energy_range_uj", 10_000_000_000, "uJ", zone)]
    for ms, pkg, psys in ((0, 1_000_000, 5_000_000), (1000, 3_000_000, 9_000_000)):
        s += [(ms, "cpu_package_energy_uj", pkg, "uJ", zone), (ms, "cpu_psys_energy_uj", psys, "uJ", zone + ":psys")]
    con = build_run(tmp_path / "r", _attempt("A1", 0, 1000), samples=s)
    assert con.execute("SELECT energy_cpu_j, energy_scope FROM run_metrics").fetchone() == (pytest.approx(2.0), "cpu_package")


def test_a_window_shorter_than_the_nvml_update_period_is_flagged(tmp_path):
    # 60 ms window: the counter did not move (NVML updates about every 100 ms): 0 J, flagged, not dropped
    samples = _gpu_samples([(0, 10_000.0), (60, 10_000.0)])
    con = build_run(tmp_path / "r", _attempt("A1", 0, 60), samples=samples)
    assert con.execute("SELECT energy_gpu_j, gpu_window_short FROM run_metrics").fetchone() == (0.0, True)
