"""The model at the dtype a run resolves ($INFERLEDGER_DTYPE, else "auto" for this CPU), as `serve`,
`capture` and `LLM()` load it: weights, KV cache and manifest take that dtype, and what it computes is
held to that dtype's tolerance: exact against the fp32 oracle in fp32, equal up to a near tie in
bf16. `make test` reruns these with the dtype forced each way, so both paths run on every CPU."""
from __future__ import annotations

import os

import pytest
import torch
from engine_checks import reference_greedy

from inferledger.engine import LLM, EngineConfig, LLMEngine, SamplingParams
from inferledger.engine.cpu_host import resolve_dtype
from inferledger.engine.loader import load_model
from inferledger.engine.model import full_sequence_logits

from test_loader import _tiny_hf_model
from test_model import _prompts
from test_model_bf16 import NEAR_TIE

pytestmark = [pytest.mark.slow, pytest.mark.dtype]

NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BYTES = {torch.float32: 4, torch.bfloat16: 2}
TINY_BF16_REL_L2 = 0.03  # the tiny random models' logits in bf16 against HF's fp32; measured 0.006-0.009


def _forced() -> str | None:
    return os.environ.get("INFERLEDGER_DTYPE") or None


def _expected() -> torch.dtype:
    """The dtype this run must load at: the forced one, else what "auto" gives this CPU (the rule
    itself is held by tests/test_cpu_host.py)."""
    forced = _forced()
    return NAMES[forced] if forced in NAMES else resolve_dtype(torch.device("cpu"), "auto")[0]


def test_weights_kv_and_manifest_take_the_resolved_dtype(resolved_bundle):
    want = _expected()
    name = str(want).removeprefix("torch.")
    d = resolved_bundle.identity["dtype"]
    assert (d["weights"], d["activations"], d["kv"]) == (name, name, name)
    if _forced():
        assert d["resolved_by"] == "asked for ($INFERLEDGER_DTYPE)"
    else:
        assert d["resolved_by"].startswith("auto: ")
    assert next(resolved_bundle.model.parameters()).dtype == want
    assert resolved_bundle.identity["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * BYTES[want]
    engine = LLMEngine(resolved_bundle, EngineConfig(kv_cache_bytes=16 * 2**20, probes=False))
    assert engine.runner.k_cache.dtype == want
    # 16 MiB over blocks of 16 tokens x 46080 bytes (fp32) or 23040 (bf16)
    assert engine.runner.num_blocks == {torch.float32: 22, torch.bfloat16: 45}[want]
    assert engine.manifest()["engine_config"]["resolved"]["dtype"] == name


def test_greedy_at_the_resolved_dtype_is_fp32_s_up_to_a_near_tie(bundle, resolved_bundle):
    """The whole engine (continuous batching, 8 prompts at once) at the resolved dtype against the
    fp32 runner alone: identical in fp32; in bf16 identical up to a first divergence where fp32's own
    token beat the other by less than NEAR_TIE logits."""
    prompts = _prompts(bundle.tokenizer)
    with LLM(bundle=resolved_bundle, config=EngineConfig(num_blocks=64, probes=False)) as llm:
        outs = llm.generate(prompts, SamplingParams(max_tokens=16))
    for prompt, out in zip(prompts, outs):
        ref, got = reference_greedy(bundle, prompt, 16), out.token_ids
        if _expected() == torch.float32:
            assert got == ref, bundle.tokenizer.decode(prompt)
            continue
        j = next((j for j, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        if j is None:
            assert got == ref  # both stopped at the same EOS or at max_tokens
            continue
        logits = full_sequence_logits(bundle.model, prompt + ref[:j])[-1]
        margin = (logits[ref[j]] - logits[got[j]]).item()
        assert 0 <= margin < NEAR_TIE, (bundle.tokenizer.decode(prompt), j, margin)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_hf_folder_at_the_resolved_dtype_matches_transformers_to_its_rounding(tmp_path, bundle, kind):
    hf = _tiny_hf_model(kind)
    hf.save_pretrained(tmp_path)
    bundle.tokenizer.save_hf(tmp_path)
    ours = load_model(tmp_path)
    want = _expected()
    assert next(ours.model.parameters()).dtype == want
    assert ours.identity["dtype"]["weights"] == str(want).removeprefix("torch.")
    ids = [5, 900, 17, 3000, 42, 7, 49151, 12, 8, 1000]
    with torch.inference_mode():
        ref = hf(input_ids=torch.tensor([ids])).logits[0]
    got = full_sequence_logits(ours.model, ids)
    if want == torch.float32:
        assert torch.allclose(got, ref, atol=1e-4, rtol=0)
    else:
        assert ((got - ref).norm() / ref.norm()).item() < TINY_BF16_REL_L2


def test_a_capture_at_the_resolved_dtype_completes_every_task_and_its_manifest_says_the_dtype(resolved_bundle, tmp_path):
    """`capture` on the model `load_model()` gives at the resolved dtype (the load itself is held above):
    every task completes, the manifest's model and engine name that dtype."""
    import json

    import duckdb

    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.collectors.capture.run import capture
    from inferledger.collectors.workload import Workload
    from inferledger.ledger.reconstruct import reconstruct
    from inferledger.probes.run_folder import Manifest

    name = str(_expected()).removeprefix("torch.")
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"kind": "lookup", "prompt": "Capital of France?",
                                                      "answer": "paris"}) + "\n")
    (tmp_path / "arrivals.txt").write_text("0\n10\n20\n")
    (tmp_path / "w.toml").write_text('name = "dtype"\nseed = 1\n[taskset]\nfile = "tasks.jsonl"\n[arrivals]\n'
                                     'process = "replay"\nfile = "arrivals.txt"\n[contract]\ndeadline_ms = 120000\n'
                                     '[client]\ntimeout_ms = 60000\n[generation]\nmax_tokens = 4\ntemperature = 0.0\n')
    capture(Workload.load(tmp_path / "w.toml"), tmp_path / "run", CaptureOptions(max_num_seqs=2), bundle=resolved_bundle)
    manifest = Manifest.read(tmp_path / "run")
    assert manifest.get("state") == "complete"
    assert manifest.weights_dtype == name and manifest.block("model")["dtype"]["kv"] == name
    assert manifest.block("engine_config")["resolved"]["dtype"] == name
    with duckdb.connect(str(reconstruct(tmp_path / "run").path), read_only=True) as con:
        assert con.execute("SELECT count(*) FILTER (WHERE client_status = 'completed'), count(*) FROM attempts"
                           ).fetchone() == (3, 3)
