"""The compiled CPU step: greedy output equal to Hugging Face in fp32, every step compiled (one
compile serves decode batches and mixed steps), the mode on step.end, the fallback to eager, the knob.
The compile runs once per process (inductor's cache makes later processes faster)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from inferledger.engine import LLM, EngineConfig, SamplingParams
from inferledger.engine.cpu_linear import linear, pack
from inferledger.engine.runner import ModelRunner, RunnerOptions, SeqChunk
from engine_checks import RecordingSink, attrs
from test_model import _blocks, _prompts, greedy_paged, oracle_prompts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread for the whole module, the count LLMEngine compiles for on two CPUs: inductor
    builds its kernels for a thread count, so the module then pays one compile, not two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def compiled_runner(bundle):
    runner = ModelRunner(bundle.model, bundle.config, num_blocks=64, block_size=16, options=RunnerOptions(compile=True))
    assert runner.compiled.enabled, runner.compiled.disabled_reason
    return runner


def test_compiled_greedy_matches_hugging_face_and_every_step_is_compiled(bundle, hf_oracle, compiled_runner):
    """8 prompts prefilled in one mixed step, then 31 decode steps of 8: Hugging Face's 32 greedy tokens
    (recorded: tests/conftest.py `hf_oracle`) are ours, and all 32 steps ran compiled (none fell back)."""
    tok, runner = bundle.tokenizer, compiled_runner
    prompts = oracle_prompts(tok, hf_oracle)
    before = runner.compiled.steps
    ours = greedy_paged(runner, prompts, 32, _blocks(runner, len(prompts), 6))
    assert runner.compiled.steps - before == 32 and runner.last_step["mode"] == "compiled"
    for prompt, got, hf in zip(prompts, ours, hf_oracle["greedy"]):
        assert got == hf, tok.decode(prompt)


def test_compiled_logits_equal_eager_at_batch_one(bundle, compiled_runner):
    """A lone decode (one token: the compiled graph does not specialise on it) gives the eager step's logits."""
    eager = ModelRunner(bundle.model, bundle.config, num_blocks=64, block_size=16)
    ids = _prompts(bundle.tokenizer)[5]
    table = list(range(10, 14))
    got = []
    for runner in (eager, compiled_runner):
        runner.forward([SeqChunk(ids[:-1], 0, table, "none")])
        got.append(runner.forward([SeqChunk(ids[-1:], len(ids) - 1, table)])[0])
    assert compiled_runner.last_step["mode"] == "compiled"
    torch.testing.assert_close(got[1], got[0], atol=1e-4, rtol=0)


def test_a_failing_compiled_step_falls_back_to_eager(bundle, compiled_runner, monkeypatch):
    runner = ModelRunner(bundle.model, bundle.config, num_blocks=64, block_size=16, options=RunnerOptions(compile=True))

    def broken(*args):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(runner.compiled, "_forward", broken)
    ids = _prompts(bundle.tokenizer)[4]
    out = runner.forward([SeqChunk(ids, 0, [0, 1])])
    assert runner.last_step["mode"] == "eager" and runner.compiled.steps == 0
    assert "kernel failed" in runner.compiled.disabled_reason
    want = ModelRunner(bundle.model, bundle.config, num_blocks=64, block_size=16).forward([SeqChunk(ids, 0, [0, 1])])
    torch.testing.assert_close(out[0], want[0], atol=1e-4, rtol=0)


def test_step_end_states_compiled_and_the_manifest_says_why(bundle, compiled_runner):
    sink = RecordingSink()
    llm = LLM(bundle=bundle, config=EngineConfig(compile="on", num_blocks=32), sink=sink)
    out = llm.generate([_prompts(bundle.tokenizer)[0]], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    ends = [r for r in sink.rows if r["name"] == "step.end"]
    assert [attrs(r)["mode"] for r in ends] == ["compiled"] * 4
    got = llm.engine.manifest()["engine_config"]["resolved"]["compile"]
    assert got["on"] and got["resolved_by"] == "on (EngineConfig.compile)" and got["steps_compiled"] == 4
    assert got["disabled_reason"] is None and got["warm_up_s"] > 0


def test_compile_knob_resolution(monkeypatch):
    import inferledger.engine.cpu_host as cpu_host

    monkeypatch.delenv("INFERLEDGER_COMPILE", raising=False)
    for native in (True, False):  # auto compiles bf16 where the CPU multiplies it natively, nothing else
        monkeypatch.setattr(cpu_host, "native_bf16", lambda native=native: (native, "stated by the test"))
        for dtype in (torch.float32, torch.bfloat16):
            on, why = EngineConfig(compile="auto").resolve_compile("cpu", dtype)
            want = native and dtype == torch.bfloat16
            assert on is want and why.startswith("auto: compiled" if want else "auto: eager"), (native, dtype, why)
    assert EngineConfig(compile="on").resolve_compile("cuda", torch.bfloat16)[0] is False  # CUDA graphs instead
    assert EngineConfig(compile="off").resolve_compile("cpu", torch.bfloat16) == (False, "off (EngineConfig.compile)")
    monkeypatch.setenv("INFERLEDGER_COMPILE", "on")
    assert EngineConfig().resolve_compile("cpu", torch.float32) == (True, "on ($INFERLEDGER_COMPILE)")
    assert EngineConfig(compile="off").resolve_compile("cpu", torch.float32)[0] is False  # the argument wins
    monkeypatch.setenv("INFERLEDGER_COMPILE", "yes")
    with pytest.raises(ValueError, match=r"\$INFERLEDGER_COMPILE='yes': use auto, on or off"):
        EngineConfig().resolve_compile("cpu", torch.float32)
    with pytest.raises(ValueError, match="compile"):
        EngineConfig(compile="maybe")


def test_packed_linear_equals_f_linear_eager_and_compiled():
    """The prepacked bf16 linear (oneDNN, where bf16 is native; F.linear elsewhere) against fp32."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=gen).to(torch.bfloat16)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    packed = pack(w)
    want = F.linear(x.float(), w.float())
    with torch.inference_mode():
        eager = linear(x, w, None, packed)
        compiled = torch.compile(lambda a, b: linear(a, b, None, packed) * 2, fullgraph=True)(x, w) / 2
    for got in (eager, compiled):
        assert got.dtype == torch.bfloat16 and got.shape == (5, 96)
        torch.testing.assert_close(got.float(), want, atol=0.05 * want.abs().max().item(), rtol=0)


def test_compiled_stack_at_the_resolved_dtype_gives_the_eager_logits(resolved_bundle, bundle):
    """At the dtype `serve` runs (bf16 where the CPU multiplies it natively, as `auto` compiles it): a
    prefill, a lone decode and a mixed step of a decode with a new prompt through the compiled stack.
    fp32: the eager step's logits within 1e-4. bf16: the fused norms round differently from the eager
    operators, so the rows are held to the fp32 model's instead: each with a cosine of at least 0.995,
    and the worst logit error no more than 1.5x the eager bf16 step's own (measured: 0.40 against
    0.93 at the prefill, 0.81 against 1.67 in the mixed step)."""
    b = resolved_bundle
    bf16 = b.model.embed_tokens.weight.dtype == torch.bfloat16
    runners = [ModelRunner(b.model, b.config, num_blocks=32, block_size=16, options=RunnerOptions(compile=on))
               for on in (False, True)]
    if os.environ.get("ATEN_CPU_CAPABILITY"):  # ATen held below the CPU's ISA: the compiled stack refuses
        assert not runners[1].compiled.enabled and "ATEN_CPU_CAPABILITY" in runners[1].compiled.disabled_reason
        out = [r.forward([SeqChunk(_prompts(b.tokenizer)[0], 0, [0, 1, 2, 3])])[0] for r in runners]
        assert runners[1].last_step["mode"] == "eager" and torch.equal(out[0], out[1])
        return
    runners[1].compiled.warm_up()  # compiled for this dtype now, so no step below is the one that compiles
    if bf16:
        runners.append(ModelRunner(bundle.model, bundle.config, num_blocks=32, block_size=16))  # the fp32 reference
    ids = _prompts(b.tokenizer)
    a, c = [0, 1, 2, 3], [8, 9, 10, 11]  # 64 positions each
    steps = [[SeqChunk(ids[0], 0, a)],
             [SeqChunk([ids[0][-1]], len(ids[0]), a)],
             [SeqChunk([ids[0][-2]], len(ids[0]) + 1, a), SeqChunk(ids[1], 0, c, "all")]]
    for chunks in steps:
        eager, compiled, *ref = (torch.cat([x.reshape(-1, x.shape[-1]) for x in r.forward(chunks)]) for r in runners)
        assert runners[1].last_step["mode"] == "compiled" and runners[0].last_step["mode"] == "eager"
        if not bf16:
            torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=0)
            continue
        ref = ref[0]
        cos = F.cosine_similarity(compiled, ref, dim=-1).min().item()
        worst = lambda x: (x - ref).abs().max().item()
        assert cos >= 0.995 and worst(compiled) <= 1.5 * worst(eager), (cos, worst(compiled), worst(eager))
    assert runners[1].compiled.steps == len(steps)


def test_a_step_that_compiles_its_graph_says_compiling(bundle, compiled_runner):
    """Inductor builds its kernels for an intra-op thread count, so a step at another count than the
    compile's recompiles: that step is labelled `compiling` (its time holds the compile), the next
    one at the same count `compiled`, and both ran compiled."""
    ids = _prompts(bundle.tokenizer)[2]
    table = list(range(20, 24))
    compiled_runner.forward([SeqChunk(ids[:-2], 0, table, "none")])  # the module's thread count: compiled by now
    torch.set_num_threads(2)
    try:
        before = compiled_runner.compiled.steps
        modes = []
        for i in (2, 1):
            compiled_runner.forward([SeqChunk([ids[-i]], len(ids) - i, table)])
            modes.append(compiled_runner.last_step["mode"])
    finally:
        torch.set_num_threads(1)
    assert modes == ["compiling", "compiled"] and compiled_runner.compiled.steps - before == 2
