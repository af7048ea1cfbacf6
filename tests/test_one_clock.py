"""One clock rule, no fallbacks: no figure compares raw timestamps of two clocks.
Each run puts the client's clock far from the server's, so a raw comparison gives a wildly wrong value."""
from __future__ import annotations

import pytest

from ledger_util import build_run

FAR = 1_000_000.0  # ms: the client clock reads 1000 s more than the engine clock at the same instant
ENG = {"source": "engine", "clock": "e"}
MANIFEST = {"model": {"kv_bytes_per_token": 2 ** 20}, "engine_config": {"block_size": 1024}}  # 1 GiB blocks


def test_an_unreleased_kv_hold_ends_at_the_last_event_of_its_own_clock(tmp_path):
    ev = [{"name": "attempt.sent", "ms": FAR, "clock": "c"},
          {"name": "engine.enqueued", "ms": 0, **ENG},
          {"name": "kv.alloc", "ms": 100, "attrs": {"blocks": [7]}, **ENG},
          {"name": "engine.token", "ms": 150, "value": 1, **ENG},
          {"name": "step.end", "ms": 600, "attempt_id": None, "step_id": 1, **ENG},  # the engine's last event
          {"name": "attempt.timeout", "ms": FAR + 2000, "clock": "c"}]  # never released: the run closed
    con = build_run(tmp_path / "r", ev, domains=("c", "e"), manifest=MANIFEST)
    # held from 100 ms to 600 ms on the engine clock: 0.5 s x 1 GiB (not 1000 s from the client's clock)
    assert con.execute("SELECT kv_gib_s FROM accounts").fetchone()[0] == pytest.approx(0.5)


def test_the_window_end_is_never_a_raw_server_time(tmp_path):
    ev = [{"name": "attempt.sent", "ms": FAR, "clock": "c"},
          {"name": "engine.enqueued", "ms": 10, **ENG},
          {"name": "engine.finished", "ms": 500, "attrs": {"reason": "stop"}, **ENG}]  # no client terminal
    con = build_run(tmp_path / "r", ev, domains=("c", "e"))
    assert con.execute("SELECT t_obs_s, goodput_rps FROM run_metrics").fetchone() == (None, None)
    (detail,) = con.execute("SELECT detail FROM gaps WHERE scope = 'clock' AND affects LIKE 't_obs_s%'").fetchone()
    assert "e cannot be compared" in detail
    # with a mapping (client = engine + FAR ms, ± 1 ms) the end converts: 500 + FAR − FAR = 0.5 s... − 0
    con2 = build_run(tmp_path / "r2", ev, domains=("c", "e"),
                     maps=[("e", "c", int(FAR * 1e6), 1_000_000, "round-trip")])
    assert con2.execute("SELECT t_obs_s FROM run_metrics").fetchone()[0] == pytest.approx(0.5)


def test_attempt_order_converts_clocks_before_comparing(tmp_path):
    # A1 sent at 1000 ms on c1; the retry A2 sent at 10 ms on c2, which reads 2000 ms less: 2010 on c1
    ev = [{"name": "attempt.sent", "ms": 1000, "clock": "c1", "attempt_id": "A1"},
          {"name": "attempt.error", "ms": 1005, "clock": "c1", "attempt_id": "A1"},
          {"name": "attempt.sent", "ms": 10, "clock": "c2", "attempt_id": "A2"},
          {"name": "attempt.done", "ms": 50, "clock": "c2", "attempt_id": "A2"}]
    con = build_run(tmp_path / "r", ev, domains=("c1", "c2"), maps=[("c2", "c1", 2_000_000_000, 1_000_000, "ntp")])
    assert dict(con.execute("SELECT attempt_id, attempt_index FROM attempts").fetchall()) == {"A1": 1, "A2": 2}
    # without the mapping the order is unknown: NULL for the attempt that cannot be placed, with a gap
    con2 = build_run(tmp_path / "r2", ev, domains=("c1", "c2"))
    idx = dict(con2.execute("SELECT attempt_id, attempt_index FROM attempts").fetchall())
    assert sorted(idx.values(), key=str) == [1, None]
    assert con2.execute("SELECT count(*) FROM gaps WHERE affects LIKE '%attempt_index%'").fetchone()[0] == 1


def test_energy_samples_on_an_unmapped_clock_are_a_named_gap(tmp_path):
    from ledger_util import build_run as _build  # samples go on the first domain: make it the sampler's

    ev = [{"name": "attempt.sent", "ms": 0, "clock": "c"}, {"name": "attempt.done", "ms": 1000, "clock": "c"}]
    samples = [(ms, "gpu_energy_mj", ms * 10.0, "mJ", "gpu0") for ms in (0, 500, 1000)]
    con = _build(tmp_path / "r", ev, domains=("probe", "c"), samples=samples)
    assert con.execute("SELECT energy_gpu_j FROM run_metrics").fetchone() == (None,)
    (detail,) = con.execute("SELECT detail FROM gaps WHERE scope = 'clock' AND affects LIKE 'energy_gpu_j%'").fetchone()
    assert "3 energy samples on probe" in detail
