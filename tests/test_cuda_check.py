"""benchmarks/cuda_check.py, the script a GPU session runs, as a dry run on the CPU: the same code
paths (padded decode buckets instead of graphs), so it cannot rot between GPU sessions."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _load_script():
    spec = importlib.util.spec_from_file_location("cuda_check", ROOT / "benchmarks" / "cuda_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cuda_check_dry_run_on_the_cpu(bundle, tmp_path):
    mod = _load_script()
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"kind": "lookup", "prompt": "Say hi.", "answer": "hi"}) + "\n")
    (tmp_path / "w.toml").write_text(
        'name = "dry"\nseed = 1\n[taskset]\nfile = "tasks.jsonl"\n'
        '[arrivals]\nprocess = "poisson"\nrate_rps = 50.0\nn_tasks = 3\n'
        '[contract]\ndeadline_ms = 60000\n[client]\ntimeout_ms = 60000\n'
        '[generation]\nmax_tokens = 4\ntemperature = 0.0\n')
    report = mod.run_checks("cpu", tmp_path / "out", n_prompts=3, tokens=6, concurrency=(3,), capture_seqs=3,
                            workload=tmp_path / "w.toml", cpu_bundle=bundle, device_bundles={"float32": bundle})
    assert json.loads((tmp_path / "out" / "cuda_check.json").read_text()) == report
    eq = report["greedy"]["float32"]
    for key in ("eager_vs_cpu_fp32", "graphs_vs_cpu_fp32", "graphs_vs_eager"):
        assert eq[key]["identical"] == eq[key]["sequences"] == 3, (key, eq[key])
        assert eq[key]["matched_prefix_tokens"] == [6, 6, 6]
    (tp,) = report["throughput"]
    assert tp["concurrency"] == 3 and tp["eager_tok_s"] > 0 and tp["graphs_tok_s"] > 0
    cap = report["capture"]
    assert cap["steps"] > 0 and cap["output_tokens"] > 0
    # on the CPU: no device clock and no NVML; the run says so instead of writing zeros
    assert cap["device_steps"] == 0 and cap["cuda_mapping"] == [] and cap["gpu_energy_j"] is None
    assert set(cap["step_modes"]) <= {"eager", "padded"}
    assert (tmp_path / "out" / "run" / "manifest.json").exists()


def test_agreement_counts_the_prefix_before_the_first_divergence():
    mod = _load_script()
    got = mod.agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]])
    assert got == {"identical": 1, "sequences": 2, "matched_prefix_tokens": [3, 1], "tokens_each": 3}
