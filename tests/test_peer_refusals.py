"""peer_views reads the run through each tool's definitions with request_metrics' impossible-order rule:
an attempt whose client figure the ledger refuses gives no sample, and peer_comparison says how many
were left out and what a tool that keeps them reports; its reasons state only what holds, or what
this run's events show."""
from __future__ import annotations

import pytest

from ledger_util import build_run

CONTENT = {"attrs": {"kinds": ["content"]}}
ROLE = {"attrs": {"kinds": []}}  # a chunk with choices but no content: the chat role chunk
TTFTS_MS = (100, 200, 300, 400)


def _attempt(i, sent_ms, ttft_ms, role_lead_ms=None, done_ms=None):
    a = {"attempt_id": f"A{i}", "request_id": f"R{i}"}
    ev = [{"name": "attempt.sent", "ms": sent_ms, **a}]
    if role_lead_ms is not None:
        ev.append({"name": "attempt.chunk", "ms": sent_ms + ttft_ms - role_lead_ms, **a, **ROLE})
    ev += [{"name": "attempt.chunk", "ms": sent_ms + ttft_ms, **a, **CONTENT},
           {"name": "attempt.chunk", "ms": sent_ms + 450, **a, **CONTENT},
           {"name": "attempt.done", "ms": done_ms if done_ms is not None else sent_ms + 500, **a,
            "attrs": {"usage": {"completion_tokens": 3}}}]
    return ev


def _views(con, metric):
    return {r[0]: r[1:] for r in con.execute(
        "SELECT tool, n, mean_ms, p50_ms, n_refused, mean_incl_refused_ms, p50_incl_refused_ms FROM peer_views "
        "WHERE metric = ?", [metric]).fetchall()}


def test_a_chunk_30_s_before_its_send_moves_no_tools_ttft(tmp_path):
    ev = [e for i, t in enumerate(TTFTS_MS) for e in _attempt(i, 100_000 * i, t)]
    ev += _attempt(4, 400_000, -30_000)  # its first chunk 30 s before the send: TTFT −30 s, refused
    con = build_run(tmp_path / "r", ev)
    assert con.execute("SELECT ttft_client_ms FROM request_metrics WHERE attempt_id = 'A4'").fetchone()[0] is None
    ttft = _views(con, "TTFT")
    for tool in ("inferledger", "vLLM bench", "AIPerf", "GuideLLM"):
        n, mean, p50, n_refused, mean_in, p50_in = ttft[tool]
        assert (n, mean, n_refused) == (4, 250.0, 1), tool
        assert mean_in == pytest.approx((100 + 200 + 300 + 400 - 30_000) / 5), tool  # what a tool keeping it says
        # the tool's own percentile rule, with and without it: linear 250 / 200, cumulative weight 200 / 200
        assert (p50, p50_in) == ((200.0, 200.0) if tool == "GuideLLM" else (250.0, 200.0)), tool
    # the attempt's E2E is possible (sent → done), but a TPOT needs its TTFT: it is left out of every row
    assert _views(con, "E2E")["inferledger"][:2] == (4, 500.0)
    (reason, n_ref) = con.execute("SELECT reason, tool_n_refused FROM peer_comparison "
                                  "WHERE metric = 'TTFT' AND tool = 'AIPerf'").fetchone()
    assert n_ref == 1 and reason.startswith("1 sample(s) left out, on both sides") and "-5800.0 ms" in reason


def test_a_request_end_before_its_start_enters_no_e2e_mean(tmp_path):
    ev = [e for i, t in enumerate(TTFTS_MS) for e in _attempt(i, 100_000 * i, t)]
    ev += _attempt(4, 400_000, 100, done_ms=399_000)  # done 1 s before the send
    con = build_run(tmp_path / "r", ev)
    e2e = _views(con, "E2E")
    for tool in ("inferledger", "GuideLLM", "AIPerf", "vLLM bench"):
        assert e2e[tool][:2] == ((4, 500.0) if tool in ("inferledger", "GuideLLM") else (4, 450.0)), tool
        assert e2e[tool][3] == 1, tool
    assert e2e["GuideLLM"][4] == pytest.approx((4 * 500 - 1000) / 5)


def test_no_refused_sample_leaves_the_rows_as_they_were(tmp_path):
    con = build_run(tmp_path / "r", [e for i, t in enumerate(TTFTS_MS) for e in _attempt(i, 100_000 * i, t)])
    assert con.execute("SELECT sum(n_refused), count(mean_incl_refused_ms) FROM peer_views").fetchone() == (0, 0)
    assert con.execute("SELECT count(*) FROM peer_comparison WHERE reason LIKE '%left out%'").fetchone()[0] == 0


def test_the_role_chunks_lead_is_read_from_the_run_not_assumed(tmp_path):
    # a server that writes the role chunk on arrival, 80 ms before the first content (as vLLM does)
    ev = [e for i, t in enumerate(TTFTS_MS) for e in _attempt(i, 100_000 * i, t, role_lead_ms=80)]
    con = build_run(tmp_path / "r", ev)
    reasons = dict(((m, t), r) for m, t, r in con.execute(
        "SELECT metric, tool, reason FROM peer_comparison WHERE tool = 'vLLM bench'").fetchall())
    ttft = reasons[("TTFT", "vLLM bench")]
    assert "came 80.0 ms before the first content on average (4 attempts)" in ttft
    assert "nearly agree" not in ttft and "inferledger serve" not in ttft
    assert "on this run those two gaps average 80.0 ms and 0.0 ms" in reasons[("ITL", "vLLM bench")]
    # nothing was imported from vLLM bench: no claim about its own records
    assert "its own records" not in reasons[("TPOT", "vLLM bench")] + reasons[("E2E", "vLLM bench")]
    assert _views(con, "TTFT")["vLLM bench"][:2] == (4, 250.0 - 80.0)
