"""bf16 against the fp32 parity path (which equals Hugging Face, tests/test_model.py), on the same
8 parity prompts. bf16 keeps 8 bits of mantissa, so its logits carry an error of ~1-4 % (relative L2)
and a greedy continuation may leave fp32's where fp32's two best tokens are nearly tied; the test
pins both: the logit error, and that every divergence happens at such a near tie."""
from __future__ import annotations

import pytest
import torch

from inferledger.engine.loader import load_model
from inferledger.engine.model import full_sequence_logits
from inferledger.engine.runner import ModelRunner

from test_model import _blocks, _prompts, greedy_paged

pytestmark = pytest.mark.slow

REL_L2_TOL = 0.05   # measured 0.011-0.037 on these prompts (2026-12-01)
NEAR_TIE = 0.5      # fp32 logit gap at a divergence; measured 0.02-0.24, bf16 logit error is up to ~1.8


@pytest.fixture(scope="module")
def bf16_bundle():
    return load_model(dtype="bfloat16")


def test_bf16_bundle_records_its_dtype(bf16_bundle):
    d = bf16_bundle.identity["dtype"]
    assert (d["weights"], d["activations"], d["kv"]) == ("bfloat16", "bfloat16", "bfloat16")
    assert d["resolved_by"] == "asked for (argument)"
    assert next(bf16_bundle.model.parameters()).dtype == torch.bfloat16
    assert bf16_bundle.identity["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 2  # layers * KV heads * head dim, 2 bytes


def test_bf16_logits_within_tolerance_of_fp32(bundle, bf16_bundle):
    for ids in _prompts(bundle.tokenizer):
        ref = full_sequence_logits(bundle.model, ids)
        got = full_sequence_logits(bf16_bundle.model, ids)
        assert got.dtype == torch.float32  # logits leave the model in fp32 whatever it computes in
        rel = ((got - ref).norm() / ref.norm()).item()
        assert rel < REL_L2_TOL, bundle.tokenizer.decode(ids)
        assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95


def test_bf16_greedy_equals_fp32_up_to_a_near_tie(bundle, bf16_bundle):
    """32 greedy tokens per prompt through the paged runner in each dtype: identical, or identical up
    to a first divergence where fp32's own token beat bf16's by less than NEAR_TIE logits."""
    prompts = _prompts(bundle.tokenizer)
    outs = {}
    for name, b in (("fp32", bundle), ("bf16", bf16_bundle)):
        runner = ModelRunner(b.model, b.config, num_blocks=64, block_size=16)
        assert runner.k_cache.dtype == b.dtype
        outs[name] = greedy_paged(runner, prompts, 32, _blocks(runner, len(prompts), 6))
    identical = 0
    for prompt, ref, got in zip(prompts, outs["fp32"], outs["bf16"]):
        j = next((j for j, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        if j is None:
            identical += 1
            continue
        logits = full_sequence_logits(bundle.model, prompt + ref[:j])[-1]
        gap = (logits[ref[j]] - logits[got[j]]).item()
        assert 0 <= gap < NEAR_TIE, (bundle.tokenizer.decode(prompt), j, gap)
    assert identical >= 4  # measured: 4 of 8 identical over 32 tokens, the others part at tokens 9-23
