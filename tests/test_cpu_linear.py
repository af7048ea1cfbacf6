"""The CPU step's linears: the fp32 gemv kernel (engine/csrc/linear.cpp) against exact products, its
fallbacks, and how the engine picks the kind ("onednn", "gemv", "torch") and says why."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferledger.engine import EngineConfig, cpu_kernels
from inferledger.engine.cpu_host import native_bf16


@pytest.fixture(scope="module")
def kernels():
    ok, why = cpu_kernels.load()
    assert ok, why  # this machine has a compiler: the kernels build or load
    return cpu_kernels


def _ints(*shape, seed):
    """Small integers as fp32: every product and sum below is exact, so any order of summation gives
    the same value and the kernel must match the float64 product exactly."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).float()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize(("n", "k"), [(960, 576), (13, 1536), (7, 64), (49, 8)])
def test_the_gemv_kernel_equals_the_exact_product(kernels, rows, n, k):
    # n not a multiple of the 8 (or 4, 2) weight rows a pass takes: the last rows go one at a time; more
    # than 4 rows go in groups of 4 and a last group of fewer
    x, w, b = _ints(rows, k, seed=rows), _ints(n, k, seed=n + k), _ints(n, seed=1)
    exact = (x.double() @ w.double().T + b.double()).float()
    assert torch.equal(kernels.small_linear(x, w, b), exact)
    assert torch.equal(kernels.small_linear(x, w, None), (x.double() @ w.double().T).float())
    # leading dimensions and a strided x are kept and read as they are
    assert torch.equal(kernels.small_linear(x.view(rows, 1, k), w, b), exact.view(rows, 1, n))
    wide = _ints(rows, 2 * k, seed=7)
    assert torch.equal(kernels.small_linear(wide[:, ::2], w, b),
                       (wide[:, ::2].double() @ w.double().T + b.double()).float())


def test_the_gemv_kernel_leaves_what_it_does_not_take_to_torch(kernels):
    w = torch.randn(24, 64)
    # more than 16 rows, a width that is not a multiple of 8, bf16, a strided weight: torch's own linear, bit for bit
    assert cpu_kernels.GEMV_MAX_ROWS == 16
    for x, weight in ((torch.randn(17, 64), w), (torch.randn(3, 6, 64), w), (torch.randn(2, 60), torch.randn(24, 60)),
                      (torch.randn(2, 64, dtype=torch.bfloat16), w.bfloat16()), (torch.randn(1, 32), w[:, ::2])):
        assert torch.equal(kernels.small_linear(x, weight, None), F.linear(x, weight))
    with pytest.raises(RuntimeError, match=r"does not match the weight \[24, 64\]"):
        kernels.small_linear(torch.randn(1, 32), w, None)


def test_the_engine_picks_its_linears_and_says_why(kernels, monkeypatch):
    ok, why = kernels.load()
    assert EngineConfig().resolve_linear("cpu", torch.float32) == ("gemv", f"auto: gemv for up to 16 token rows: {why}")
    assert EngineConfig(linear="gemv").resolve_linear("cpu", torch.float32) == (
        "gemv", f"gemv (EngineConfig.linear): {why}")
    assert EngineConfig(linear="torch").resolve_linear("cpu", torch.float32) == ("torch", "torch (EngineConfig.linear)")
    assert EngineConfig().resolve_linear("cuda", torch.bfloat16) == ("torch", "cuda: torch's linear")
    kind, reason = EngineConfig().resolve_linear("cpu", torch.bfloat16)
    if native_bf16()[0]:
        assert (kind, reason) == ("onednn", "auto: oneDNN over prepacked weights (bf16 on a CPU that multiplies it natively)")
    else:
        assert (kind, reason) == ("torch", "torch: the gemv kernel takes float32, not torch.bfloat16")
    with pytest.raises(ValueError, match="linear='blas'"):
        EngineConfig(linear="blas")
    monkeypatch.setenv("INFERLEDGER_LINEAR", "torch")
    assert EngineConfig().resolve_linear("cpu", torch.float32) == ("torch", "torch ($INFERLEDGER_LINEAR)")
    assert EngineConfig(linear="gemv").resolve_linear("cpu", torch.float32)[0] == "gemv"  # a setting beats the variable
    monkeypatch.setenv("INFERLEDGER_LINEAR", "fast")
    with pytest.raises(ValueError, match=r"\$INFERLEDGER_LINEAR='fast': use auto, gemv or torch"):
        EngineConfig().resolve_linear("cpu", torch.float32)
    monkeypatch.delenv("INFERLEDGER_LINEAR")
    monkeypatch.setenv("CXX", "no-such-compiler-here")  # no kernels: torch's linear, and the reason why
    monkeypatch.setattr(cpu_kernels, "_STATE", {})
    assert EngineConfig().resolve_linear("cpu", torch.float32) == (
        "torch", "torch: no C++ compiler (no-such-compiler-here) to build the CPU kernels")


@pytest.mark.slow
def test_the_runner_and_the_manifest_say_which_linears_ran(bundle, kernels, monkeypatch):
    from inferledger.engine import LLMEngine
    from inferledger.engine.runner import ModelRunner, SeqChunk

    _, why = kernels.load()
    for choice, kind, reason in (("auto", "gemv", f"auto: gemv for up to 16 token rows: {why}"),
                                 ("torch", "torch", "torch (EngineConfig.linear)")):
        engine = LLMEngine(bundle, EngineConfig(linear=choice, num_blocks=8, probes=False))
        got = engine.manifest()["engine_config"]["resolved"]["linear"]
        assert (got["kernel"], got["resolved_by"], engine.runner.linear) == (kind, reason, kind)
    # two runners on one model keep their own kinds, and give the same logits to within fp32 rounding
    a = ModelRunner(bundle.model, bundle.config, num_blocks=4, linear="gemv")
    b = ModelRunner(bundle.model, bundle.config, num_blocks=4, linear="torch")
    calls = []
    real = torch.ops.inferledger_cpu.small_linear
    monkeypatch.setattr(torch.ops.inferledger_cpu, "small_linear",
                        lambda *args: calls.append(args[0].shape[0]) or real(*args), raising=False)
    ids = bundle.tokenizer.encode("The history of the printing press")
    la, lb = (r.forward([SeqChunk(ids, 0, [0, 1])])[0] for r in (a, b))
    assert calls and set(calls) == {len(ids), 1}  # the prompt's rows (torch's inside) and lm_head's one row
    assert torch.allclose(la, lb, atol=1e-4, rtol=0) and int(la.argmax()) == int(lb.argmax())
    with pytest.raises(ValueError, match="linear='blas'"):
        ModelRunner(bundle.model, bundle.config, num_blocks=4, linear="blas")
    with pytest.raises(ValueError, match="linear='gemv' is a CPU kernel; this runner is on cuda"):
        ModelRunner(bundle.model, bundle.config, num_blocks=4, device="cuda", linear="gemv")
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    monkeypatch.setattr(cpu_kernels, "_STATE", {})
    with pytest.raises(RuntimeError, match="linear='gemv' needs the CPU kernels: no C.. compiler"):
        ModelRunner(bundle.model, bundle.config, num_blocks=4, linear="gemv")
