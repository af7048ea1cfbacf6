"""The resource account: KV holding integrals with shared blocks counted once, ghost holding."""
from __future__ import annotations

import pytest

from ledger_util import build_run

GIB_BLOCK = {"model": {"kv_bytes_per_token": 2 ** 26}, "engine_config": {"block_size": 16}}  # 1 GiB a block


def _kv(name, ms, aid, blocks, source="engine"):
    return {"name": name, "ms": ms, "attempt_id": aid, "request_id": "R" + aid, "source": source,
            "attrs": {"blocks": blocks}, "value": len(blocks)}


def _events(a2_client_end="attempt.done"):
    return [
        {"name": "attempt.sent", "ms": 0, "attempt_id": "A1", "request_id": "RA1"},
        {"name": "engine.enqueued", "ms": 0, "attempt_id": "A1", "request_id": "RA1", "source": "engine"},
        _kv("kv.alloc", 0, "A1", [1, 2]),
        {"name": "attempt.sent", "ms": 100, "attempt_id": "A2", "request_id": "RA2"},
        {"name": "engine.enqueued", "ms": 100, "attempt_id": "A2", "request_id": "RA2", "source": "engine"},
        _kv("kv.prefix_hit", 100, "A2", [1]),  # A2 reuses A1's prefix block
        _kv("kv.alloc", 100, "A2", [3]),
        {"name": "engine.finished", "ms": 1000, "attempt_id": "A1", "source": "engine", "attrs": {"reason": "stop"}},
        _kv("kv.release", 1000, "A1", [1, 2]), _kv("kv.free", 1000, "A1", [2]),
        {"name": "attempt.done", "ms": 1001, "attempt_id": "A1"},
        {"name": a2_client_end, "ms": 1200, "attempt_id": "A2"},
        {"name": "engine.finished", "ms": 1500, "attempt_id": "A2", "source": "engine", "attrs": {"reason": "stop"}},
        _kv("kv.release", 1500, "A2", [1, 3]), _kv("kv.free", 1500, "A2", [1, 3]),
    ]


def test_shared_prefix_block_is_paid_once_and_split(tmp_path):
    con = build_run(tmp_path / "r", _events(), manifest=GIB_BLOCK)
    got = dict(con.execute("select attempt_id, kv_gib_s from accounts").fetchall())
    # block 1: A1 alone 0.1 s, shared 0.9 s (0.45 each), A2 alone 0.5 s; block 2: A1 1.0; block 3: A2 1.4
    assert got == {"A1": pytest.approx(1.55), "A2": pytest.approx(2.35)}
    # the attempts' integrals add up to the physical total (1.5 + 1.0 + 1.4), not 4.8 double counted
    assert con.execute("select kv_gib_s from run_metrics").fetchone()[0] == pytest.approx(3.9)


def test_ghost_holding_after_the_client_gave_up(tmp_path):
    con = build_run(tmp_path / "r", _events("attempt.timeout"), manifest=GIB_BLOCK)
    row = con.execute("select ghost_attempts, ghost_ms, ghost_kv_gib_s from reconciliation").fetchone()
    # A2's client gave up at 1200; the server finished at 1500 holding blocks 1 and 3
    assert row == (1, pytest.approx(300.0), pytest.approx(0.6))


def test_unknown_block_size_is_null_with_a_gap(tmp_path):
    con = build_run(tmp_path / "r", _events())
    assert con.execute("select kv_gib_s from run_metrics").fetchone()[0] is None
    assert con.execute("select count(*) from gaps where affects like 'kv_gib_s%'").fetchone()[0] == 1


def test_ghost_energy_follows_step_shares_after_the_client_gave_up(tmp_path):
    ev = _events("attempt.timeout")
    for sid, t0, t1, batch in ((1, 100, 900, [["A1", "decode", 1], ["A2", "decode", 1]]),
                               (2, 1250, 1450, [["A2", "decode", 1]])):
        ev += [{"name": "step.start", "ms": t0, "source": "engine", "step_id": sid, "attempt_id": None,
                "attrs": {"batch": batch}},
               {"name": "step.end", "ms": t1, "source": "engine", "step_id": sid, "attempt_id": None}]
    samples = [(ms, "gpu_energy_mj", ms * 10.0, "mJ", "gpu0") for ms in range(0, 1501, 100)]  # 10 W
    con = build_run(tmp_path / "r", ev, manifest=GIB_BLOCK, samples=samples)
    # window 0..1200 ms (last client terminal): 12 J; step time 800 + 200 ms; the 200 ms step after
    # A2's client gave up is all A2's: 12 J x 200 / 1000
    assert con.execute("select energy_gpu_j from run_metrics").fetchone()[0] == pytest.approx(12.0)
    assert con.execute("select ghost_energy_j from reconciliation").fetchone()[0] == pytest.approx(2.4)
