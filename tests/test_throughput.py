"""run_metrics token throughput: output tokens/s beside the peers' total tokens/s (cached prompt tokens
counted) and what the engine really computed."""
from __future__ import annotations

import pytest

from ledger_util import build_run


def _attempt(aid, t0, *, prompt, prefills, tokens, end="attempt.done"):
    """prefills: [(ms after t0, tokens computed, cached tokens or None)]; tokens: output tokens."""
    eng = {"source": "engine", "attempt_id": aid, "request_id": "R" + aid}
    cli = {"attempt_id": aid, "request_id": "R" + aid}
    evs = [{"name": "attempt.created", "ms": t0, **cli}, {"name": "attempt.sent", "ms": t0, **cli},
           {"name": "engine.enqueued", "ms": t0 + 1, "value": prompt, **eng},
           {"name": "engine.scheduled", "ms": t0 + 2, **eng}]
    for ms, computed, cached in prefills:
        evs.append({"name": "engine.prefill", "ms": t0 + ms, "value": computed,
                    "attrs": {"cached_tokens": cached} if cached is not None else {}, **eng})
    for k in range(tokens):
        evs.append({"name": "engine.token", "ms": t0 + 50 + 10 * k, "value": 1, **eng})
        evs.append({"name": "attempt.chunk", "ms": t0 + 51 + 10 * k, "attrs": {"kinds": ["content"]}, **cli})
    evs.append({"name": "engine.finished", "ms": t0 + 50 + 10 * tokens, "value": tokens,
                "attrs": {"reason": "stop"}, **eng})
    evs.append({"name": end, "ms": t0 + 52 + 10 * tokens, **cli})
    return evs


def test_token_throughput_separates_cached_prompt_tokens(tmp_path):
    events = (
        # A1: 48-token prompt of which 32 came from the prefix cache; 16 computed; 4 output tokens
        _attempt("A1", 0, prompt=48, prefills=[(10, 16, 32)], tokens=4)
        # A2: 20-token prompt computed in two chunks, then 10 of them again after a preemption; 6 tokens
        + _attempt("A2", 100, prompt=20, prefills=[(10, 12, 0), (20, 8, None), (40, 10, None)], tokens=6)
        # A3: the client timed out: in no throughput figure
        + _attempt("A3", 200, prompt=64, prefills=[(10, 64, 0)], tokens=3, end="attempt.timeout")
    )
    con = build_run(tmp_path / "r", events)
    cols = ("t_obs_s", "output_tokens", "output_tok_s", "prompt_tokens", "prompt_tokens_cached",
            "prefill_tokens_computed", "total_tok_s", "computed_tok_s")
    m = dict(zip(cols, con.execute(f"SELECT {', '.join(cols)} FROM run_metrics").fetchone()))
    # window: first client event 0 ms -> last client terminal (A3's timeout at 200 + 52 + 30) = 0.282 s
    assert m["t_obs_s"] == pytest.approx(0.282)
    assert (m["output_tokens"], m["prompt_tokens"], m["prompt_tokens_cached"], m["prefill_tokens_computed"]) == \
        (10, 68, 32, 46)
    assert m["output_tok_s"] == pytest.approx(10 / 0.282)
    assert m["total_tok_s"] == pytest.approx((68 + 10) / 0.282)  # the peers' figure: cached tokens in
    assert m["computed_tok_s"] == pytest.approx((46 + 10) / 0.282)  # the engine's work: recompute in, cache out


def test_token_counts_unknown_without_server_evidence(tmp_path):
    cli = {"attempt_id": "A1", "request_id": "R1"}
    events = [{"name": "attempt.created", "ms": 0, **cli}, {"name": "attempt.sent", "ms": 0, **cli},
              {"name": "attempt.chunk", "ms": 50, "attrs": {"kinds": ["content"]}, **cli},
              {"name": "attempt.done", "ms": 100, **cli}]  # no usage, no engine: token counts unknown
    con = build_run(tmp_path / "r", events)
    row = con.execute("SELECT output_tokens, output_tok_s, prompt_tokens, total_tok_s, computed_tok_s "
                      "FROM run_metrics").fetchone()
    assert row == (None, None, None, None, None)  # a chunk is not a token: unknown, not 1
    affects = [r[0] for r in con.execute("SELECT affects FROM gaps WHERE scope = 'run'").fetchall()]
    assert any(a.startswith("output_tokens, output_tok_s") for a in affects)  # each NULL has its gap row
    assert any(a.startswith("prompt_tokens, prompt_tokens_cached") for a in affects)
