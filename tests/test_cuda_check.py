"""benchmarks/cuda_check.py, the script a GPU session runs, as a dry run on the CPU: the same code
paths (padded decode buckets instead of graphs), so it cannot rot between GPU sessions; and its
report survives a failing phase."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_script():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("cuda_check", ROOT / "benchmarks" / "cuda_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _workload(tmp_path: Path) -> Path:
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"kind": "lookup", "prompt": "Say hi.", "answer": "hi"}) + "\n")
    (tmp_path / "w.toml").write_text(
        'name = "dry"\nseed = 1\n[taskset]\nfile = "tasks.jsonl"\n'
        '[arrivals]\nprocess = "poisson"\nrate_rps = 50.0\nn_tasks = 3\n'
        '[contract]\ndeadline_ms = 60000\n[client]\ntimeout_ms = 60000\n'
        '[generation]\nmax_tokens = 4\ntemperature = 0.0\n')
    return tmp_path / "w.toml"


@pytest.mark.slow
def test_cuda_check_dry_run_on_the_cpu(bundle, tmp_path):
    mod = _load_script()
    plan = mod.CheckPlan(n_prompts=3, tokens=5, concurrency=(3,), mbu_batches=(1, 2), mbu_context=20, mbu_steps=5,
                         capture_seqs=3,
                         workload=_workload(tmp_path), bandwidth_mib=8, budget_s=1e9)
    report = mod.run_checks("cpu", tmp_path / "out", plan, cpu_bundle=bundle, device_bundles={"float32": bundle})
    assert json.loads((tmp_path / "out" / "cuda_check.json").read_text()) == json.loads(json.dumps(report))
    phases = report["phases"]
    assert [n for n, p in phases.items() if not p["ok"]] == [], {n: p.get("error") for n, p in phases.items()}
    assert list(phases) == ["env", "bandwidth", "numerics", "attention", "load", "reference", "correctness",
                            "mbu", "throughput", "capture"]
    env = phases["env"]["result"]
    assert "cudnn_version" in env and env["flags"]["float32_matmul_precision"] in ("highest", "high", "medium")
    assert phases["bandwidth"]["result"]["best_gb_s"] > 0
    # the CPU's bf16 matmul accumulates in fp32 (oneDNN): the probe must say so
    assert phases["numerics"]["result"]["bf16_accumulation"] == "fp32 (rounded once)"
    attn = phases["attention"]["result"]
    assert set(attn) == {"decode_b1_ctx256", "decode_b64_ctx256", "prefill_128", "chunk_16_ctx256"}
    assert attn["decode_b1_ctx256"]["math"]["ok"] and sum(attn["decode_b1_ctx256"]["default"].values()) == 1
    ref = phases["reference"]["result"]
    assert ref["forced_argmax_equals_greedy"] and [len(t) for t in ref["tokens"]] == [5, 5, 5]
    (cfg,) = phases["correctness"]["result"].values()
    # the CPU against itself: every logit identical, every token identical, graphs (padded) = eager
    assert cfg["forced_eager_vs_cpu"]["top1_agree"] == cfg["forced_eager_vs_cpu"]["positions"] == 15
    assert cfg["forced_eager_vs_cpu"]["max_abs_logit_diff"] == 0.0 and cfg["pass"]
    for key in ("greedy_eager_vs_cpu", "greedy_graphs_vs_cpu", "greedy_graphs_vs_eager"):
        assert cfg[key]["identical"] == 3 and cfg[key]["matched_prefix_tokens"] == [5, 5, 5]
    assert [(m["batch"], m["mode"]) for m in phases["mbu"]["result"]] == [(1, "eager"), (2, "eager")]
    assert all(m["mbu"] > 0 and m["weight_mb"] > 0 for m in phases["mbu"]["result"])
    (tp,) = phases["throughput"]["result"]
    assert tp["concurrency"] == 3 and tp["eager_tok_s"] > 0 and tp["graphs_tok_s"] > 0
    cap = phases["capture"]["result"]
    assert cap["steps"] > 0 and cap["output_tokens"] > 0
    # on the CPU: no device clock and no NVML; the run says so instead of writing zeros
    assert cap["device_steps"] == 0 and cap["cuda_mapping"] == [] and cap["gpu_energy"]["joules"] is None
    assert cap["provisional_j_per_good"] is None
    assert set(cap["step_modes"]) <= {"eager", "padded"}
    assert (tmp_path / "out" / "run" / "manifest.json").exists()


def test_each_phase_is_on_disk_as_it_ends_and_a_failure_keeps_its_traceback(tmp_path):
    mod = _load_script()
    rep = mod.Report(tmp_path / "r.json", budget_s=100.0, header={"device": "cpu"})
    seen = []

    def first():
        return {"value": 1}

    def broken():
        seen.append(json.loads((tmp_path / "r.json").read_text())["phases"])  # what is on disk meanwhile
        raise ValueError("kernel refused")
    assert rep.phase("first", first) == {"value": 1}
    assert rep.phase("broken", broken) is None
    rep.phase("after", first, needs=("broken",))
    rep.phase("independent", first)
    disk = json.loads((tmp_path / "r.json").read_text())["phases"]
    (meanwhile,) = seen  # the first phase's result, and the second marked as running
    assert meanwhile["first"] == {"ok": True, "result": {"value": 1}, "seconds": meanwhile["first"]["seconds"]}
    assert list(meanwhile) == ["first", "broken"] and meanwhile["broken"]["ok"] is None
    assert "running_since_s" in meanwhile["broken"]
    assert disk["broken"]["ok"] is False and "ValueError('kernel refused')" == disk["broken"]["error"]
    assert "raise ValueError" in disk["broken"]["traceback"]
    assert disk["after"] == {"ok": False, "skipped": "needs broken"}
    assert disk["independent"]["ok"] is True
    over = mod.Report(tmp_path / "o.json", budget_s=-1.0, header={})
    over.phase("late", first)
    assert json.loads((tmp_path / "o.json").read_text())["phases"]["late"]["skipped"].startswith("budget:")


def test_agreement_counts_the_prefix_before_the_first_divergence():
    _load_script()
    import cuda_model_checks as mc

    got = mc.agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]])
    assert got == {"identical": 1, "sequences": 2, "matched_prefix_tokens": [3, 1], "tokens_each": 3}


def test_logit_comparison_calls_a_disagreement_a_near_tie_by_the_cpu_margin():
    _load_script()
    import torch

    import cuda_model_checks as mc

    ref = torch.tensor([[[5.0, 4.8, 0.0], [1.0, 3.0, 0.0]]])  # [T=1, B=2, V=3]
    got = torch.tensor([[[4.7, 4.9, 0.0], [1.0, 3.0, 0.5]]])  # row 0 flips to token 1 (CPU margin 0.2)
    bf16 = mc.compare_logits(ref, got, "bfloat16")
    assert bf16["top1_agree"] == 1 and bf16["disagreement_cpu_margins"] == [0.2]
    assert bf16["max_abs_logit_diff"] == 0.5
    assert not bf16["pass"]  # 1 of 2 positions is over the 5 % a bf16 run may differ at
    assert not mc.compare_logits(ref, got, "float32")["pass"]  # 0.2 is no near-tie in fp32


def test_gpu_energy_is_read_only_from_the_nvml_device_with_the_cuda_uuid():
    _load_script()
    from cuda_capture_check import gpu_energy

    def s(dev, ts, mj):
        return {"metric": "gpu_energy_mj", "device": dev, "ts_ns": ts, "value": mj}
    samples = [s("gpu0/GPU-aaaa", 0, 1000), s("gpu0/GPU-aaaa", 2_000_000_000, 9000),
               s("gpu1/GPU-bbbb", 0, 500), s("gpu1/GPU-bbbb", 2_000_000_000, 2500)]
    fig, matched = gpu_energy(samples, "GPU-BBBB")  # CUDA's device 0 is NVML's device 1 here
    assert matched == "gpu1/GPU-bbbb" and fig["joules"] == 2.0 and fig["window_s"] == 2.0
    none, nobody = gpu_energy(samples, "GPU-cccc")
    assert nobody is None and none["joules"] is None and "UUID GPU-cccc" in none["why_none"]
    assert "no NVML energy samples" in gpu_energy([], "GPU-aaaa")[0]["why_none"]


def test_cudnn_pinned_first_really_comes_first():
    """PyTorch's default order puts math before cuDNN: a pin of [cudnn, math] must reorder, or the
    cuDNN configuration would silently run math."""
    _load_script()
    import cuda_probes

    before = cuda_probes.sdpa_priority()
    assert before.index("math") < before.index("cudnn")
    with cuda_probes.pinned(["cudnn", "math"]):
        assert cuda_probes.sdpa_priority()[:2] == ["cudnn", "math"]
    assert cuda_probes.sdpa_priority() == before


def _run_sh(tmp_path: Path, *args: str, stage: Path) -> tuple[int, str, list[str]]:
    """benchmarks/cuda_run.sh with `python3` replaced by a stub that logs its arguments."""
    import os
    import subprocess

    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    (stub / "python3").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (stub / "python3").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "OUT": str(out),
           "INFERLEDGER_GPU_STAGE": str(stage), "INFERLEDGER_GPU_CARRY": str(tmp_path / "carry"),
           "INFERLEDGER_GPU_RESULTS": str(tmp_path / "results"), "INFERLEDGER_GPU_SITE": str(tmp_path / "site"),
           "INFERLEDGER_GPU_PKG": str(tmp_path / "pkg")}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "cuda_run.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr, calls.read_text().splitlines() if calls.exists() else []


def _carry(tmp_path: Path, first: bytes, second: bytes) -> None:
    import hashlib

    for half, name, data in (("a", "model.part00", first), ("b", "model.part01", second)):
        d = tmp_path / "carry" / half
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
        (d / f"{name}.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    (tmp_path / "carry" / "b" / "model.sha256").write_text(hashlib.sha256(first + second).hexdigest() + "\n")
    (tmp_path / "carry" / "b" / "gguf-0-py3-none-any.whl").write_bytes(b"")


def test_the_second_call_says_when_the_first_half_is_gone_and_runs_only_the_model_free_phases(tmp_path):
    _carry(tmp_path, b"first half", b"second half")
    rc, text, calls = _run_sh(tmp_path, stage=tmp_path / "cold-machine")  # call 1 never reached this machine
    assert rc == 3 and "FIRST HALF MISSING" in text
    assert "FIRST HALF MISSING" in (tmp_path / "out" / "cuda_check.log").read_text()
    assert calls[-1] == f"benchmarks/cuda_check.py --out {tmp_path / 'results'} --model-free"


def test_the_two_calls_reassemble_the_model_and_run_the_whole_check(tmp_path):
    _carry(tmp_path, b"first half", b"second half")
    stage = tmp_path / "stage"
    rc, text, _ = _run_sh(tmp_path, "stage", stage=stage)
    assert rc == 0 and (stage / "model.part00").read_bytes() == b"first half"
    rc, text, calls = _run_sh(tmp_path, "--budget-s", "300", stage=stage)
    assert rc == 0, text
    assert (stage / "model.gguf").read_bytes() == b"first halfsecond half"
    assert calls[-1] == f"benchmarks/cuda_check.py --out {tmp_path / 'results'} --budget-s 300"
    assert (tmp_path / "pkg" / "inferledger" / "engine" / "runner.py").exists()  # the tree, importable
    # a half damaged in transit stops the call before anything runs
    (tmp_path / "carry" / "a" / "model.part00").write_bytes(b"first hal!")
    rc, text, _ = _run_sh(tmp_path, "stage", stage=tmp_path / "stage2")
    assert rc == 2 and "corrupt" in text
