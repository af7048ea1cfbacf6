"""A benchmark's results file: what ran, on what machine, how loaded, and figures named with their units."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_results", ROOT / "benchmarks" / "results.py")
results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results)

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma bmi2

processor\t: 1
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx avx2 fma bmi2 avx512f
"""
HOST = {"cpu": {"model": "test"}, "cores": 2}


def fake_proc(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(CPUINFO)
    (proc / "meminfo").write_text("MemTotal:       24683584 kB\nMemFree:         6461836 kB\n")
    return proc


def test_the_cpu_flags_the_figures_depend_on_are_read_present_and_absent_from_the_first_processor(tmp_path):
    cpu = results.cpu_info(fake_proc(tmp_path))
    assert cpu == {"model": "AMD EPYC 7B13", "vendor": "AuthenticAMD", "family": 25, "model_number": 1,
                   "flags": ["avx2", "fma"],
                   "flags_absent": ["avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
                                    "amx_tile", "amx_bf16", "amx_int8"]}


def test_a_results_file_holds_command_commit_dates_load_versions_and_the_figures(tmp_path, monkeypatch):
    monkeypatch.delenv("INFERLEDGER_BENCH_RESULTS", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    rec = results.start("demo_bench", {"attempts": 3, "out": Path("/x")}, sample_s=0.01,
                        argv=[str(ROOT / "benchmarks" / "demo_bench.py"), "--attempts", "3", "two words"])
    path = rec.write({"reconstruct_s": 1.5, "events": 12, "rows": [{"parts": 3, "ratio_many_over_one_ratio": 1.1}]},
                     host=HOST, out_dir=tmp_path)
    doc = json.loads(path.read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert re.fullmatch(rf"demo_bench-\d{{8}}T\d{{6}}Z-{head[:7]}\.json", path.name)
    python = os.path.relpath(sys.executable, ROOT) if Path(sys.executable).is_relative_to(ROOT) else sys.executable
    assert doc["command"] == f"{python} benchmarks/demo_bench.py --attempts 3 'two words'"
    assert doc["parameters"] == {"attempts": 3, "out": "/x"}
    assert doc["git"]["commit"] == head and isinstance(doc["git"]["dirty"], bool)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["date_utc"])
    assert len(doc["load"]["start"]) == 3 and len(doc["load"]["end"]) == 3
    assert isinstance(doc["busy_processes"]["start"], list) and isinstance(doc["busy_processes"]["end"], list)
    assert set(doc["versions"]) == {"python", "torch", "duckdb", "numpy", "pyarrow", "pandas", "transformers"}
    assert doc["versions"]["duckdb"] and doc["versions"]["torch"]
    assert doc["environment"]["OMP_WAIT_POLICY"] == "PASSIVE"
    assert doc["host"] == HOST
    assert doc["figures"] == {"reconstruct_s": 1.5, "events": 12, "rows": [{"parts": 3, "ratio_many_over_one_ratio": 1.1}]}
    assert path.stat().st_size < 8192
    assert list(tmp_path.iterdir()) == [path]  # written whole: no temporary left beside it


@pytest.mark.parametrize("figures, where", [
    ({"reconstruct": 1.5}, "figures.reconstruct: name a float with its unit"),
    ({"rows": [{"parts": 3, "tok_s": 2.0}, {"parts": 4, "tok": 2.0}]}, "figures.rows[1].tok: name a float"),
    ({"wall_s": float("nan")}, "figures.wall_s: nan is no figure (an unknown is None)"),
    ({"nested": {"peak_gib": float("inf")}}, "figures.nested.peak_gib: inf is no figure"),
    ({"when": object()}, "figures.when: object is not JSON"),
    ({3: 1}, "figures: key 3 is not a string"),
])
def test_a_figure_without_its_unit_or_a_number_that_is_no_figure_is_refused_by_its_place(tmp_path, figures, where):
    rec = results.start("demo_bench", sample_s=0.0, argv=["x.py"])
    with pytest.raises(results.FigureError) as err:
        rec.write(figures, host=HOST, out_dir=tmp_path)
    assert str(err.value).startswith(where)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_figures_the_check_refuses_are_printed_whole_so_a_long_run_loses_nothing(tmp_path, capsys):
    rec = results.start("demo_bench", sample_s=0.0, argv=["x.py"])
    figures = {"ledger_s": 693.34, "query": {"queries_s": {"request_metrics p50/p99": 0.07}}}
    with pytest.raises(results.FigureError, match="figures.query.queries_s.request_metrics p50/p99"):
        rec.write(figures, host=HOST, out_dir=tmp_path)
    err = capsys.readouterr().err
    assert err.startswith("demo_bench: the figures, not written")
    assert json.loads(err.splitlines()[1]) == figures


def test_counts_unknowns_strings_and_load_averages_need_no_unit():
    results.check_figures({"events": 3, "ttft_ms": None, "mode": "eager", "agree": True, "load_1m_before": 4.2,
                           "runs": [{"run": 1, "tok_s": 2.5}], "steps_ms": [1.0, 2.0]})


def test_the_busy_processes_are_named_grouped_and_ours_left_out(monkeypatch):
    hz = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    before = {me: ("python", 1, 0), 900: ("child", me, 0), 901: ("grandchild", 900, 0),
              10: ("python3", 1, 0), 11: ("python3", 1, 0), 12: ("chromium", 1, 0), 13: ("idle", 1, 0)}
    after = {me: ("python", 1, hz), 900: ("child", me, hz), 901: ("grandchild", 900, hz),
             10: ("python3", 1, hz), 11: ("python3", 1, hz // 2), 12: ("chromium", 1, hz // 4),
             13: ("idle", 1, 0), 14: ("new", 1, hz)}
    snaps = iter([before, after])
    monkeypatch.setattr(results, "_cpu_ticks", lambda proc: next(snaps))
    monkeypatch.setattr(results.time, "sleep", lambda s: None)
    got = results.busy_processes(1.0)
    assert got == [{"name": "python3", "processes": 2, "cpu_pct": round(100 + 100 * (hz // 2) / hz, 1)},
                   {"name": "chromium", "processes": 1, "cpu_pct": round(100 * (hz // 4) / hz, 1)}]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_the_tree_is_dirty_when_a_tracked_or_new_file_changed_but_not_for_results_files(tmp_path):
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "a.py")
    _git(repo, "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (repo / "benchmarks" / "results" / "x-1-abc.json").write_text("{}")
    assert results.git_state(repo) == {"commit": head, "dirty": False, "changed": []}
    (repo / "a.py").write_text("x = 2\n")
    (repo / "b.py").write_text("new\n")
    assert results.git_state(repo) == {"commit": head, "dirty": True, "changed": ["a.py", "b.py"]}


def test_outside_a_checkout_the_commit_comes_from_the_recorded_file_or_is_unknown(tmp_path, monkeypatch):
    monkeypatch.delenv("INFERLEDGER_BENCH_GIT", raising=False)
    bare = tmp_path / "not-a-repo"
    bare.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    got = results.git_state(bare)
    assert got["commit"] is None and got["dirty"] is None and "INFERLEDGER_BENCH_GIT" in got["why_none"]
    recorded = tmp_path / "git.json"
    recorded.write_text(json.dumps({"commit": "0123456789abcdef", "dirty": False}))
    monkeypatch.setenv("INFERLEDGER_BENCH_GIT", str(recorded))
    assert results.git_state(bare) == {"commit": "0123456789abcdef", "dirty": False, "recorded_by": str(recorded)}


def test_host_facts_say_what_dtype_auto_resolves_to_here(tmp_path):
    from inferledger.engine.cpu_host import native_bf16

    facts = results.host_facts(fake_proc(tmp_path))
    assert facts["memory_gib"] == 23.5 and facts["cores"] == os.cpu_count()
    assert facts["cpu"]["flags"] == ["avx2", "fma"]
    assert facts["dtype_auto"] == ("bfloat16" if native_bf16()[0] else "float32")
    assert facts["torch_isa"]


def test_every_benchmark_script_records_its_run():
    scripts = [p for p in sorted((ROOT / "benchmarks").glob("*.py"))
               if '__name__ == "__main__"' in p.read_text() and p.name != "render.py"]
    assert len(scripts) >= 8
    missing = [p.name for p in scripts if "results.start(" not in p.read_text()]
    assert missing == []


def test_a_gpu_check_keeps_its_few_figures_and_says_why_a_phase_gave_none():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from cuda_results import cuda_figures

    data = {"device": "cuda", "seconds": 301.2, "phases": {
        "env": {"ok": True, "result": {"gpu": "NVIDIA H200", "capability": "sm90", "cuda_runtime": "12.8",
                                       "cudnn_version": 91000}},
        "bandwidth": {"ok": True, "result": {"best_gb_s": 3900.5, "median_gb_s": 3800.0}},
        "correctness": {"ok": True, "result": {"bfloat16/default": {"pass": True}, "float32/math": {"pass": False}}},
        "mbu": {"ok": True, "result": [{"batch": 1, "mode": "graph", "context_tokens": 256, "steps": 20,
                                        "median_step_ms": 0.81, "weight_mb": 270.0, "kv_mb": 1.2,
                                        "achieved_gb_s": 335.0, "mbu": 0.086, "mbu_against": "memcpy"}]},
        "throughput": {"ok": False, "error": "RuntimeError('CUDA out of memory')", "traceback": "..."},
        "capture": {"ok": False, "skipped": "budget: 401 s of 400 s spent"}}}
    figures = cuda_figures(data)
    results.check_figures(figures)
    assert figures == {
        "device": "cuda", "gpu": "NVIDIA H200", "capability": "sm90", "cuda_runtime": "12.8", "cudnn_version": 91000,
        "memcpy_best_gb_s": 3900.5, "memcpy_median_gb_s": 3800.0,
        "correctness_pass": {"bfloat16/default": True, "float32/math": False},
        "mbu": [{"batch": 1, "mode": "graph", "context_tokens": 256, "median_step_ms": 0.81, "achieved_gb_s": 335.0,
                 "mbu_ratio": 0.086}],
        "throughput": [], "capture": None,
        "phases": {"env": "ok", "bandwidth": "ok", "correctness": "ok", "mbu": "ok",
                   "throughput": "RuntimeError('CUDA out of memory')", "capture": "budget: 401 s of 400 s spent"},
        "check_s": 301.2}
