"""A real AIPerf 0.13.0 run with client cancellations (samples/peers/aiperf-0.13.0-cancel: 60 requests,
8 cancelled 0.3 s after they were sent) imported and joined: every request joins, the clock mapping is
estimated from all 60, AIPerf's own TTFT and ITL are reproduced, and each cancelled request's send and
cancel sit where the server saw them (the send before the server received it, the cancel before the
server saw the disconnect)."""
from __future__ import annotations

import json

import pytest

from peer_util import SAMPLES, import_sample, mapping_eps_ms, peer_row

SAMPLE = SAMPLES / "aiperf-0.13.0-cancel"
SUMMARY = json.loads((SAMPLE / "tool" / "profile_export_aiperf.json").read_text())
RECORDS = [json.loads(line) for line in (SAMPLE / "tool" / "profile_export.jsonl").read_text().splitlines()]
CANCELLED = sorted(r["metadata"]["x_request_id"] for r in RECORDS if r["metadata"]["was_cancelled"])


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    run, con = import_sample("aiperf", "aiperf-0.13.0-cancel", tmp_path_factory.mktemp("aiperf-cancel"))
    yield run, con
    con.close()


def test_the_sample_has_cancelled_requests():
    assert len(RECORDS) == 60 and len(CANCELLED) == 8
    assert SUMMARY["error_request_count"]["avg"] == 8


def test_every_request_joins_and_the_mapping_holds_all_of_them(imported):
    run, con = imported
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["join"]["key_rules"] == {"x-request-id, exact": 60}
    mapping = manifest["clock"]["mapping"]
    assert mapping["offset_ns"] is not None and mapping["n"] == 60, mapping
    assert mapping_eps_ms(run) < 5
    assert con.execute("SELECT count(*) FROM gaps WHERE gap_id = 'peer-clock' OR gap_id LIKE 'peer-join:%'").fetchone()[0] == 0
    statuses = dict(con.execute("SELECT client_status, count(*) FROM attempts GROUP BY 1").fetchall())
    assert statuses == {"completed": 52, "cancelled": 8}
    cancelled = [r[0] for r in con.execute("SELECT attempt_id FROM attempts WHERE client_status = 'cancelled' ORDER BY 1").fetchall()]
    assert cancelled == CANCELLED
    # the cross-clock figures exist for every request, cancelled ones included
    assert con.execute("SELECT count(uplink_ms) FROM request_metrics").fetchone()[0] == 60


@pytest.mark.parametrize("metric, key", [("TTFT", "time_to_first_token"), ("ITL", "inter_token_latency")])
def test_aiperfs_own_ttft_and_itl_are_reproduced(imported, metric, key):
    _, con = imported
    ours, theirs = peer_row(con, metric, "AIPerf"), SUMMARY[key]
    assert ours["n"] == theirs["count"] == 52
    for stat, their_stat in (("mean", "avg"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99")):
        assert ours[stat] == pytest.approx(theirs[their_stat], abs=1e-6), stat


def test_a_cancelled_request_is_sent_and_cancelled_where_the_server_saw_it(imported):
    run, con = imported
    m = json.loads((run / "manifest.json").read_text())["clock"]["mapping"]
    eps_ns = m["epsilon_ns"]
    rows = con.execute("""
        SELECT attempt_id,
               min(ts_ns) FILTER (WHERE name = 'attempt.sent'), min(ts_ns) FILTER (WHERE name = 'attempt.cancel'),
               min(ts_ns) FILTER (WHERE name = 'server.received'), min(ts_ns) FILTER (WHERE name = 'server.disconnect')
        FROM events WHERE attempt_id IN (SELECT attempt_id FROM attempts WHERE client_status = 'cancelled')
        GROUP BY 1 ORDER BY 1""").fetchall()
    assert [r[0] for r in rows] == CANCELLED
    for aid, sent, cancel, received, disconnect in rows:
        assert sent + m["offset_ns"] <= received + eps_ns, aid  # sent before the server received it
        assert cancel + m["offset_ns"] <= disconnect + eps_ns, aid  # cancelled before the server saw it go
        # AIPerf's own delay: cancelled 0.3 s (and what its event loop adds) after the send
        assert 300_000_000 <= cancel - sent < 400_000_000, aid
