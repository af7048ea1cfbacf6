"""peer_base's per-attempt gap lists hold the attempt's itl gaps in itl's own order (choice, then idx: each
choice's gaps as they followed each other), whatever order the itl rows were produced in (an aggregate
without an order gives its rows' order: here the choice that streamed first would come first)."""
from __future__ import annotations

from ledger_util import build_run

# an n = 3 request: each choice's client chunks and server writes (ms), interleaved in time across choices;
# choice 2 streams first, then 1, then 0
CLIENT_MS = {0: (102, 110, 130), 1: (101, 104, 112), 2: (100, 107, 108.5)}
SERVER_MS = {0: (101.5, 108, 127), 1: (100.5, 103, 111), 2: (99, 106, 107)}


def _events():
    a = {"attempt_id": "A1", "request_id": "R1"}
    ev = [{"name": "attempt.sent", "ms": 0, **a}]
    for source, name, times in (("client", "attempt.chunk", CLIENT_MS), ("server", "server.write", SERVER_MS)):
        ev += [{"name": name, "ms": ms, "source": source, "value": 1, **a,
                "attrs": {"kinds": ["content"], "choice": c}} for c, t in times.items() for ms in t]
    ev.append({"name": "attempt.done", "ms": 140, **a, "attrs": {"usage": {"completion_tokens": 9}}})
    return sorted(ev, key=lambda e: e["ms"])  # recorded in time order, as a capture writes them


def test_an_attempts_gap_lists_follow_its_choices_then_their_order(tmp_path):
    got = {}

    def grab(con, run):  # peer_base is a temporary table of the build: read before the ledger is written
        got.update({r[0]: r[1:] for r in con.execute(
            "SELECT attempt_id, content_gaps_ms, server_gaps_ms FROM peer_base").fetchall()})

    con = build_run(tmp_path / "r", _events(), on_built=grab)
    # choice 0's gaps, then choice 1's, then choice 2's, each in its own order
    assert got == {"A1": ([8.0, 20.0, 3.0, 8.0, 7.0, 1.5], [6.5, 19.0, 2.5, 8.0, 7.0, 1.0])}
    # the same gaps, in the same order, as a reader of itl browses them
    for layer, expected in (("client", got["A1"][0]), ("server", got["A1"][1])):
        assert [r[0] for r in con.execute("SELECT gap_ms FROM itl WHERE attempt_id = 'A1' AND layer = ? "
                                          "ORDER BY choice, idx", [layer]).fetchall()] == expected
