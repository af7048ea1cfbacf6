"""The figures of a benchmarks/cuda_check.py run for its results file: the few numbers worth keeping
from its report (cuda_check.json keeps everything, tracebacks included, and is not committed).

A phase that failed or was skipped gives None for its figures and says why under "phases".
"""
from __future__ import annotations


def _result(data: dict, phase: str):
    entry = data["phases"].get(phase) or {}
    return entry.get("result") if entry.get("ok") else None


def cuda_figures(data: dict) -> dict:
    env = _result(data, "env") or {}
    bw = _result(data, "bandwidth") or {}
    correctness = _result(data, "correctness")
    capture = _result(data, "capture")
    energy = (capture or {}).get("gpu_energy") or {}
    return {
        "device": data.get("device"), "gpu": env.get("gpu"), "capability": env.get("capability"),
        "cuda_runtime": env.get("cuda_runtime"), "cudnn_version": env.get("cudnn_version"),
        "memcpy_best_gb_s": bw.get("best_gb_s"), "memcpy_median_gb_s": bw.get("median_gb_s"),
        "correctness_pass": {k: v.get("pass") for k, v in correctness.items()} if correctness else None,
        "mbu": [{"batch": m["batch"], "mode": m["mode"], "context_tokens": m["context_tokens"],
                 "median_step_ms": m["median_step_ms"], "achieved_gb_s": m["achieved_gb_s"], "mbu_ratio": m["mbu"]}
                for m in _result(data, "mbu") or []],
        "throughput": [{"concurrency": t["concurrency"], "eager_tok_s": t["eager_tok_s"],
                        "graphs_tok_s": t["graphs_tok_s"], "graphs_over_eager_ratio": t["graphs_over_eager"]}
                       for t in _result(data, "throughput") or []],
        "capture": None if capture is None else {
            "steps": capture["steps"], "device_steps": capture["device_steps"],
            "device_over_host_ratio": capture["device_ms_over_host_ms"],
            "gpu_energy_j": energy.get("joules"), "energy_window_s": energy.get("window_s"),
            "gpu_energy_why_none": energy.get("why_none"),
            "provisional_per_good_j": capture["provisional_j_per_good"],
            "loop_lag_p99_ms": capture["loop_lag_p99_ms"]},
        "phases": {name: ("ok" if p.get("ok") else p.get("skipped") or (p.get("error") or "failed")[:200])
                   for name, p in data["phases"].items()},
        "check_s": data.get("seconds"),
    }
