"""The CPU step's linears: the fp32 gemv kernel and the bf16 panel kernel (engine/csrc/linear.cpp)
against exact products, their fallbacks, and how the engine picks the kind ("onednn", "kernels", "torch")
and says why."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferledger.engine import EngineConfig, cpu_kernels, cpu_linear
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


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13, 16, 17, 64])
@pytest.mark.parametrize(("n", "k"), [(960, 576), (80, 1536), (48, 6), (16, 2)])
def test_the_panel_kernel_equals_the_exact_product_rounded_once(kernels, rows, n, k):
    # n / 16 panels not a multiple of the 4 a tile takes, rows not a multiple of 4, k not a multiple of 32
    x, w, b = (_ints(rows, k, seed=rows).bfloat16(), _ints(n, k, seed=n + k).bfloat16(),
               _ints(n, seed=1).bfloat16())
    exact = x.double() @ w.double().T  # integers below 2**24: exact in the kernel's fp32 lanes
    p = cpu_linear.panel(w)
    if not kernels.panel_kernel():  # a CPU without AVX-512 BF16: no panel copy, and the op says why
        assert p is None
        with pytest.raises(RuntimeError, match="no AVX-512 BF16"):
            torch.ops.inferledger_cpu.panel_linear(x, w.view(n // 16, k // 2, 16, 2), None)
        return
    assert p.shape == (n // 16, k // 2, 16, 2) and torch.equal(p[n // 16 - 1, k // 2 - 1, 3], w[n - 13, k - 2:])
    assert cpu_linear.panel(w) is p  # made once
    # each output rounded to bf16 once, bias included: what rounding the exact value gives
    assert torch.equal(cpu_linear.linear(x, p, b, "kernels"), (exact + b.double()).bfloat16())
    assert torch.equal(cpu_linear.linear(x, p, None, "kernels"), exact.bfloat16())
    assert torch.equal(cpu_linear.linear(x.view(rows, 1, k), p, None, "kernels"), exact.bfloat16().view(rows, 1, n))


def test_the_panel_kernel_refuses_what_it_cannot_take(kernels):
    w = torch.randn(32, 64).bfloat16()
    assert cpu_linear.panel(w.float()) is None and cpu_linear.panel(torch.randn(24, 64).bfloat16()) is None
    if not kernels.panel_kernel():
        assert cpu_linear.panel(w) is None
        return
    p = cpu_linear.panel(w)
    with pytest.raises(RuntimeError, match=r"x \[\.\.\., 32\] does not match the packed weight's K 64"):
        torch.ops.inferledger_cpu.panel_linear(torch.randn(1, 32).bfloat16(), p, None)
    with pytest.raises(RuntimeError, match=r"packed as \[N / 16, K / 2, 16, 2\], not \[32, 64\]"):
        torch.ops.inferledger_cpu.panel_linear(torch.randn(1, 64).bfloat16(), w, None)
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        torch.ops.inferledger_cpu.panel_linear(torch.randn(1, 64), p, None)
    with pytest.raises(RuntimeError, match=r"the bias must be bfloat16 \[32\]"):
        torch.ops.inferledger_cpu.panel_linear(torch.randn(1, 64).bfloat16(), p, torch.zeros(32))


def test_the_engine_picks_its_linears_and_says_why(kernels, monkeypatch):
    ok, why = kernels.load()
    assert EngineConfig().resolve_linear("cpu", torch.float32) == (
        "kernels", f"auto: the gemv kernel for up to 16 token rows: {why}")
    assert EngineConfig(linear="kernels").resolve_linear("cpu", torch.float32) == (
        "kernels", f"kernels (EngineConfig.linear): {why}")
    assert EngineConfig(linear="gemv").linear == "kernels"  # the old name, the same kind
    assert EngineConfig(linear="torch").resolve_linear("cpu", torch.float32) == ("torch", "torch (EngineConfig.linear)")
    assert EngineConfig().resolve_linear("cuda", torch.bfloat16) == ("torch", "cuda: torch's linear")
    kind, reason = EngineConfig().resolve_linear("cpu", torch.bfloat16)
    onednn = "oneDNN over prepacked weights (bf16 on a CPU that multiplies it natively)"
    if native_bf16()[0]:  # this build has the panel kernel wherever the CPU has AVX-512 BF16
        assert kernels.panel_kernel()
        assert (kind, reason) == ("kernels", f"auto: the panel kernel for bf16: {why}")
        assert EngineConfig(linear="onednn").resolve_linear("cpu", torch.bfloat16) == (
            "onednn", f"onednn (EngineConfig.linear): {onednn}")
    else:
        assert (kind, reason) == (
            "torch", "torch: the kernels take float32, or bf16 where the CPU multiplies it natively, not torch.bfloat16")
        assert EngineConfig(linear="onednn").resolve_linear("cpu", torch.bfloat16)[0] == "torch"
    assert EngineConfig(linear="onednn").resolve_linear("cpu", torch.float32) == (
        "torch", "torch: oneDNN's prepacked linear is for bf16 on a CPU that multiplies it natively, not torch.float32")
    with pytest.raises(ValueError, match="linear='blas'"):
        EngineConfig(linear="blas")
    monkeypatch.setenv("INFERLEDGER_LINEAR", "torch")
    assert EngineConfig().resolve_linear("cpu", torch.float32) == ("torch", "torch ($INFERLEDGER_LINEAR)")
    assert EngineConfig(linear="kernels").resolve_linear("cpu", torch.float32)[0] == "kernels"  # a setting beats the variable
    monkeypatch.setenv("INFERLEDGER_LINEAR", "gemv")  # the old name, read as the new one
    assert EngineConfig().resolve_linear("cpu", torch.float32) == ("kernels", f"kernels ($INFERLEDGER_LINEAR): {why}")
    monkeypatch.setenv("INFERLEDGER_LINEAR", "fast")
    with pytest.raises(ValueError, match=r"\$INFERLEDGER_LINEAR='fast': use auto, kernels, onednn or torch"):
        EngineConfig().resolve_linear("cpu", torch.float32)
    monkeypatch.delenv("INFERLEDGER_LINEAR")
    monkeypatch.setenv("CXX", "no-such-compiler-here")  # no kernels: torch's linear, and the reason why
    monkeypatch.setattr(cpu_kernels, "_STATE", {})
    assert EngineConfig().resolve_linear("cpu", torch.float32) == (
        "torch", "torch: no C++ compiler (no-such-compiler-here) to build the CPU kernels")
    if native_bf16()[0]:  # bf16 without the kernels: oneDNN's, and why
        assert EngineConfig().resolve_linear("cpu", torch.bfloat16) == (
            "onednn", f"auto: {onednn}; no panel kernel here: no C++ compiler (no-such-compiler-here) to build the CPU kernels")


@pytest.mark.slow
def test_the_runner_and_the_manifest_say_which_linears_ran(bundle, kernels, monkeypatch):
    from inferledger.engine import LLMEngine
    from inferledger.engine.runner import ModelRunner, RunnerOptions, SeqChunk

    _, why = kernels.load()
    for choice, kind, reason in (("auto", "kernels", f"auto: the gemv kernel for up to 16 token rows: {why}"),
                                 ("torch", "torch", "torch (EngineConfig.linear)")):
        engine = LLMEngine(bundle, EngineConfig(linear=choice, num_blocks=8, probes=False))
        got = engine.manifest()["engine_config"]["resolved"]["linear"]
        assert (got["kernel"], got["resolved_by"], engine.runner.linear) == (kind, reason, kind)
    # two runners on one model keep their own kinds, and give the same logits to within fp32 rounding
    a = ModelRunner(bundle.model, bundle.config, num_blocks=4, options=RunnerOptions(linear="kernels"))
    b = ModelRunner(bundle.model, bundle.config, num_blocks=4, options=RunnerOptions(linear="torch"))
    calls = []
    real = torch.ops.inferledger_cpu.small_linear
    monkeypatch.setattr(torch.ops.inferledger_cpu, "small_linear",
                        lambda *args: calls.append(args[0].shape[0]) or real(*args), raising=False)
    ids = bundle.tokenizer.encode("The history of the printing press")
    la, lb = (r.forward([SeqChunk(ids, 0, [0, 1])])[0] for r in (a, b))
    assert calls and set(calls) == {len(ids), 1}  # the prompt's rows (torch's inside) and lm_head's one row
    assert torch.allclose(la, lb, atol=1e-4, rtol=0) and int(la.argmax()) == int(lb.argmax())
    with pytest.raises(ValueError, match="linear='blas'"):
        ModelRunner(bundle.model, bundle.config, num_blocks=4, options=RunnerOptions(linear="blas"))
    with pytest.raises(ValueError, match="linear='kernels' is the CPU's; this runner is on cuda"):
        ModelRunner(bundle.model, bundle.config, num_blocks=4, device="cuda", options=RunnerOptions(linear="kernels"))
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    monkeypatch.setattr(cpu_kernels, "_STATE", {})
    with pytest.raises(RuntimeError, match="linear='kernels' needs the CPU kernels: no C.. compiler"):
        ModelRunner(bundle.model, bundle.config, num_blocks=4, options=RunnerOptions(linear="kernels"))
