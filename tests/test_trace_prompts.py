"""A trace's rows as prompts in the served model's tokens: exact input lengths after token_scale, outputs
bounded by the row's, Mooncake's shared hash ids as identical token blocks and nothing else shared,
and every row that does not fit the context, the template or the output ceiling changed and counted
(or refused by file:line and field under strict = true)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferledger.collectors.workload import Workload

pytestmark = pytest.mark.slow  # the session's model fixture, for its tokenizer

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "samples" / "workloads"
TRACES = REPO / "samples" / "traces"
BLOCK = 16  # 512-token trace blocks at token_scale 1/32
HEAD = 3  # '<|im_start|>', 'system', '\n': the bundled template before the system message
# the sample's lengths at 1/32, to the nearest token (halves up), and its hash ids
MOONCAKE_INPUT = [94, 81, 134, 69, 163, 97, 56, 188, 84, 122, 66, 144]
MOONCAKE_OUTPUT = [4, 2, 6, 3, 5, 1, 9, 3, 2, 6, 2, 4]
MOONCAKE_IDS = [json.loads(line)["hash_ids"] for line in (TRACES / "mooncake_sample.jsonl").read_text().splitlines()]


def _ids(tok, req) -> list[int]:
    text = tok.apply_chat_template([{"role": "system", "content": req.system}, {"role": "user", "content": req.user}],
                                   add_generation_prompt=True)
    return tok.encode(text, add_special=False)


def _tail(tok, question: str) -> int:
    """Tokens after the system message: the template's end around the question."""
    text = tok.apply_chat_template([{"role": "system", "content": ""}, {"role": "user", "content": question}],
                                   add_generation_prompt=True)
    return len(tok.encode(text, add_special=False)) - HEAD


def _trace_workload(name: str, **trace) -> Workload:
    path = WORKLOADS / f"trace_{name}.toml"
    import tomllib
    spec = tomllib.loads(path.read_text())
    spec["trace"] = {**spec["trace"], **trace}
    return Workload.from_dict(spec, base=path.parent, where=path.name)


def test_mooncake_prompts_have_the_rows_exact_lengths_and_bounded_outputs(bundle):
    tok = bundle.tokenizer
    wl = Workload.load(WORKLOADS / "trace_mooncake.toml")
    plans = wl.plan(tok)
    assert [len(_ids(tok, p.requests[0])) for p in plans] == MOONCAKE_INPUT
    assert [p.requests[0].prompt_tokens for p in plans] == MOONCAKE_INPUT
    assert [p.cls.max_tokens for p in plans] == MOONCAKE_OUTPUT and all(p.cls.ignore_eos for p in plans)
    assert [p.task_id for p in plans[:2]] == ["T0000", "T0001"] and {p.cls.name for p in plans} == {"mooncake"}
    assert [p.requests[0].system for p in wl.plan(tok)] == [p.requests[0].system for p in plans]  # seeded


def test_rows_sharing_a_hash_id_share_that_blocks_tokens_and_no_other_block(bundle):
    tok = bundle.tokenizer
    plans = Workload.load(WORKLOADS / "trace_mooncake.toml").plan(tok)
    ids = [_ids(tok, p.requests[0]) for p in plans]
    filler_end = [len(t) - _tail(tok, p.requests[0].user) for t, p in zip(ids, plans)]
    shared = distinct = 0
    for a in range(len(plans)):
        for b in range(a + 1, len(plans)):
            for j in range(min(len(MOONCAKE_IDS[a]), len(MOONCAKE_IDS[b]))):
                if (j + 1) * BLOCK > min(filler_end[a], filler_end[b]):
                    break  # the block holds a row's own tail (its question and the template's end)
                same = ids[a][j * BLOCK:(j + 1) * BLOCK] == ids[b][j * BLOCK:(j + 1) * BLOCK]
                assert same == (MOONCAKE_IDS[a][j] == MOONCAKE_IDS[b][j]), (a, b, j)
                shared, distinct = shared + same, distinct + (not same)
    assert shared >= 30 and distinct >= 100  # the sample has many blocks of each kind
    assert all(t[:HEAD] == ids[0][:HEAD] for t in ids)


def test_rows_without_hash_ids_share_no_block(bundle):
    tok = bundle.tokenizer
    plans = Workload.load(WORKLOADS / "trace_azure.toml").plan(tok)
    blocks = [tuple(t[j:j + BLOCK]) for p in plans for t in [_ids(tok, p.requests[0])]
              for j in range(HEAD, len(t) - _tail(tok, p.requests[0].user) - BLOCK + 1, BLOCK)]
    assert len(blocks) > 40 and len(set(blocks)) == len(blocks)


def test_a_row_past_the_context_is_clipped_from_its_end_and_counted(bundle):
    tok = bundle.tokenizer
    wl = Workload.load(WORKLOADS / "trace_mooncake.toml")
    plans = wl.plan(tok, context_tokens=120)
    # rows 3, 5, 8, 10 and 12 need 134+6, 163+5, 188+3, 122+6, 144+4 positions: their prompts give way
    expected = [94, 81, 114, 69, 115, 97, 56, 117, 84, 114, 66, 116]
    assert [len(_ids(tok, p.requests[0])) for p in plans] == expected
    assert [p.cls.max_tokens for p in plans] == MOONCAKE_OUTPUT
    s = wl.trace.summary
    assert s["clipped"] == {"rows": 5, "lines": [3, 5, 8, 10, 12]}
    assert (s["context_tokens"], s["context_source"], s["sent"], s["block_tokens"]) == (120, "engine", 12, 16)
    full = Workload.load(WORKLOADS / "trace_mooncake.toml")
    start = _ids(tok, full.plan(tok)[7].requests[0])[:5 * BLOCK]
    assert _ids(tok, plans[7].requests[0])[:5 * BLOCK] == start  # the clipped row keeps its start: its shared prefix


def test_strict_refuses_every_row_past_the_context_by_line_and_field(bundle):
    wl = _trace_workload("mooncake", strict=True)
    with pytest.raises(ValueError) as info:
        wl.plan(bundle.tokenizer, context_tokens=120)
    path = TRACES / "mooncake_sample.jsonl"
    assert str(info.value).splitlines() == [
        f"{path}:{line}: input_length: {n} input + {o} output tokens exceed the model's context of 120 "
        "(strict = true: not clipped)" for line, n, o in [(3, 134, 6), (5, 163, 5), (8, 188, 3), (10, 122, 6),
                                                          (12, 144, 4)]]


def test_the_declared_context_clips_below_the_engines(bundle):
    tok = bundle.tokenizer
    wl = Workload.load(WORKLOADS / "trace_azure.toml")  # context_tokens = 512; line 8: 9100 -> 1138 tokens
    plans = wl.plan(tok, context_tokens=8192)
    assert [p.requests[0].prompt_tokens for p in plans] == [128, 49, 276, 77, 435, 118, 507, 38, 219, 63, 415, 103]
    assert len(_ids(tok, plans[6].requests[0])) == 507 and plans[6].cls.max_tokens == 5
    s = wl.trace.summary
    assert (s["clipped"], s["context_tokens"], s["context_source"]) == ({"rows": 1, "lines": [8]}, 512, "[trace]")


def test_burstgpt_failures_are_counted_short_rows_lengthened_and_outputs_capped(bundle):
    tok = bundle.tokenizer
    wl = Workload.load(WORKLOADS / "trace_burstgpt.toml")  # token_scale 1/8, max_tokens 16
    plans = wl.plan(tok)
    assert [p.cls.name for p in plans] == ["ChatGPT", "ChatGPT", "ChatGPT", "GPT-4", "ChatGPT", "GPT-4", "ChatGPT",
                                           "ChatGPT", "GPT-4", "ChatGPT"]
    assert [p.cls.max_tokens for p in plans] == [16, 16, 12, 16, 8, 16, 16, 6, 16, 16]
    short = plans[7].requests[0]  # line 11: 190 request tokens -> 24, shorter than the template and question
    assert short.prompt_tokens == len(_ids(tok, short)) == HEAD + 1 + _tail(tok, short.user) > 24
    assert len(short.system.split()) == 1  # the one filler word that keeps the system message from being empty
    s = wl.trace.summary
    assert s["zero_output"] == {"rows": 2, "lines": [4, 8]} and s["sent"] == 10 and s["window_rows"] == 12
    assert s["output_capped"] == {"rows": 6, "lines": [2, 3, 6, 9, 10, 12]}
    assert s["lengthened"] == {"rows": 1, "lines": [11]} and s["context_tokens"] is None
    with pytest.raises(ValueError, match=rf"burstgpt_sample\.csv:11: Request tokens: 24 tokens is shorter than the "
                                         rf"chat template and question \({short.prompt_tokens}\) \(strict = true"):
        _trace_workload("burstgpt", strict=True).plan(tok)
