"""The CPU's dtype resolution and the step thread's placement (engine/cpu_host.py)."""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from inferledger.engine import AsyncEngine, EngineConfig, LLMEngine, SamplingParams
from inferledger.engine.cpu_host import native_bf16, plan_placement, resolve_dtype
from inferledger.engine.loader import ModelLoadError, load_model

CPU = torch.device("cpu")
pytestmark = pytest.mark.isa


def test_auto_is_fp32_without_native_bf16_and_says_why():
    assert native_bf16({"avx2", "fma", "avx512f"})[0] is False
    assert "no native bf16" in native_bf16({"avx2"})[1]
    assert native_bf16(set())[0] is False


def test_native_bf16_needs_the_flag_and_onednn():
    ok, why = native_bf16({"avx512f", "amx_bf16", "amx_tile"})
    assert ok == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert "amx_bf16" in why


def test_resolve_dtype_names_env_and_cuda(monkeypatch):
    monkeypatch.delenv("INFERLEDGER_DTYPE", raising=False)
    assert resolve_dtype(CPU, "float32") == (torch.float32, "asked for (argument)")
    assert resolve_dtype(CPU, torch.bfloat16)[0] == torch.bfloat16
    assert resolve_dtype(torch.device("cuda"), "auto") == (torch.bfloat16, "auto: bf16 on CUDA")
    assert resolve_dtype(CPU, None)[1].startswith("auto: ")
    monkeypatch.setenv("INFERLEDGER_DTYPE", "bf16")
    assert resolve_dtype(CPU, None) == (torch.bfloat16, "asked for ($INFERLEDGER_DTYPE)")
    with pytest.raises(ValueError, match="float16"):
        resolve_dtype(CPU, "float16")


def test_a_bad_dtype_variable_is_a_load_error_naming_it(monkeypatch):
    monkeypatch.setenv("INFERLEDGER_DTYPE", "fp8")
    with pytest.raises(ModelLoadError, match=r"'fp8' \(\$INFERLEDGER_DTYPE\)"):
        load_model()


def test_plan_leaves_a_core_to_the_front_end():
    assert plan_placement("auto", [0, 1]) == {"threads": 1, "pinned_cpus": None, "cpus_left": 1}
    assert plan_placement("pinned", [3, 1, 2, 0]) == {"threads": 3, "pinned_cpus": [1, 2, 3], "cpus_left": 1}
    assert plan_placement("auto", [5]) is None  # one CPU: nothing to leave
    assert plan_placement("pinned", [5]) is None
    assert plan_placement(2, [0, 1, 2, 3]) == {"threads": 2, "pinned_cpus": None, "cpus_left": 2}
    assert plan_placement(4, [0, 1]) == {"threads": 4, "pinned_cpus": None, "cpus_left": 0}
    assert plan_placement(None, [0, 1]) is None
    with pytest.raises(ValueError, match="cpu_threads"):
        EngineConfig(cpu_threads=0)
    with pytest.raises(ValueError, match="cpu_threads"):
        EngineConfig(cpu_threads="all")


def _allowed_cpus(native_id: int) -> str:
    with open(f"/proc/self/task/{native_id}/status") as f:
        return next(line.split(":")[1].strip() for line in f if line.startswith("Cpus_allowed_list"))


def _run_placed(bundle, cpu_threads):
    """One request through an AsyncEngine; (deltas, the step thread's allowed CPUs, manifest placement)."""
    engine = LLMEngine(bundle, EngineConfig(max_num_seqs=2, cpu_threads=cpu_threads, probes=False))
    assert engine.manifest()["engine_config"]["resolved"]["cpu_placement"]["threads_read_back"] is None

    async def run():
        async with AsyncEngine(engine) as ae:
            ids = bundle.tokenizer.encode("Hello")
            got = [d async for d in ae.generate(ids, SamplingParams(max_tokens=2), request_id="p1")]
            return got, _allowed_cpus(ae._thread.native_id)

    deltas, step_cpus = asyncio.run(run())
    assert deltas[-1].request_finished
    return step_cpus, engine.manifest()["engine_config"]["resolved"]["cpu_placement"]


@pytest.mark.slow
def test_the_async_step_thread_takes_its_threads_and_pins_only_when_asked(bundle):
    import os

    cpus = sorted(os.sched_getaffinity(0))
    before = _allowed_cpus(threading.get_native_id())
    step_cpus, placement = _run_placed(bundle, 1)  # 1 thread, the OS places it
    assert placement["threads_read_back"] == 1 and placement["pinned_cpus"] is None
    assert step_cpus == before
    if len(cpus) >= 2:  # "pinned": all CPUs but the first (the step thread only; the caller is not)
        step_cpus, placement = _run_placed(bundle, "pinned")
        last = cpus[1:]
        assert placement["pinned_cpus"] == last and placement["threads_read_back"] == len(last)
        assert step_cpus == (str(last[0]) if len(last) == 1 else f"{last[0]}-{last[-1]}")
    assert _allowed_cpus(threading.get_native_id()) == before


def test_a_onednn_isa_limit_is_named_as_the_reason_for_fp32():
    # oneDNN reads its ISA limit once, at start: so a fresh interpreter, with flags that would allow bf16
    import os
    import subprocess
    import sys

    code = ("from inferledger.engine.cpu_host import native_bf16; "
            "ok, why = native_bf16({'avx512f', 'avx512_bf16'}); print(ok); print(why)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}).stdout
    ok, why = out.splitlines()
    assert ok == "False"
    assert "ONEDNN_MAX_CPU_ISA=AVX2 limits oneDNN" in why and why.endswith(": fp32")
