"""docs/BENCHMARKS.md's tables drawn from the results files: between markers, from the newest
qualifying run, under a line naming the file, the CPU and the load; the prose outside untouched."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import render  # noqa: E402

ZEN5 = {"cpu": {"model": "AMD EPYC", "family": 26, "model_number": 2,
                "flags": ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni"]},
        "cores": 2, "cpus_usable": 2, "torch_isa": "AVX512", "dtype_auto": "bfloat16"}
ZEN3 = {"cpu": {"model": "AMD EPYC 7B13", "family": 25, "model_number": 1, "flags": ["avx2", "fma"]},
        "cores": 2, "cpus_usable": 2, "torch_isa": "AVX2", "dtype_auto": "float32"}
PARTS = {"attempts": 1000, "output_tokens": 64, "events": 86000, "repeat": 2,
         "rows": [{"parts": 300, "reconstruct_s": 3.64, "compaction_s": 1.521, "reconstruct_one_part_s": 3.21,
                   "many_over_one_ratio": 1.134, "counts_agree": True},
                  {"parts": 1792, "reconstruct_s": 8.94, "compaction_s": 12.3, "reconstruct_one_part_s": 6.47,
                   "many_over_one_ratio": 1.382, "counts_agree": False}]}


def result(benchmark: str, date: str, figures: dict, *, params=None, host=ZEN5, commit="a51c9bb0123", dirty=False,
           name=None, busy=None) -> dict:
    return {"schema": 1, "benchmark": benchmark, "command": f".venv/bin/python benchmarks/{benchmark}.py",
            "parameters": params or {}, "date_utc": date, "wall_s": 61.4, "load": {"start": [4.95, 5.3, 4.79],
            "end": [5.5, 5.1, 4.8]}, "busy_processes": {"start": busy or [], "end": []},
            "git": {"commit": commit, "dirty": dirty}, "host": host, "figures": figures,
            "_file": name or f"{benchmark}-{date.replace('-', '').replace(':', '')}-{commit[:7]}.json"}


DOC = """# Title

Prose before, with a figure 1.13 typed by hand.

<!-- rendered: parts_compaction -->
stale table
<!-- end rendered: parts_compaction -->

Prose after.
"""


def test_a_marked_table_is_redrawn_from_its_results_and_the_prose_stays():
    r = result("parts_compaction", "2026-12-01T21:00:07Z", PARTS, dirty=True,
               busy=[{"name": "python3", "processes": 3, "cpu_pct": 151.2}, {"name": "chromium", "processes": 1,
                                                                             "cpu_pct": 12.0}])
    assert render.render_doc(DOC, [r]) == """# Title

Prose before, with a figure 1.13 typed by hand.

<!-- rendered: parts_compaction -->
*From `benchmarks/results/parts_compaction-20261201T210007Z-a51c9bb.json`: 2026-12-01 21:00 UTC, commit `a51c9bb` (tree dirty); AMD EPYC family 26 model 2, AVX-512 BF16, no AMX, 2 CPUs, torch ISA AVX512, dtype auto → bfloat16; load (1 min) 4.95 → 5.50; other processes busy at the start: python3 ×3 151 %, chromium ×1 12 %; `.venv/bin/python benchmarks/parts_compaction.py`; 61 s.*

| parts | reconstruct | compaction | reconstruct, 1 part | ratio many / one | ledger rows agree |
| --- | --- | --- | --- | --- | --- |
| 300 | 3.64 s | 1.52 s | 3.21 s | **1.13** | yes |
| 1792 | 8.94 s | 12.30 s | 6.47 s | **1.38** | **no** |

86,000 events (1,000 attempts × 64 tokens); each reconstruct the best of 2.
<!-- end rendered: parts_compaction -->

Prose after.
"""


def _ledger(ratio: float) -> dict:
    phase = {"wall_s": 1.0, "cpu_s": 1.0, "peak_gib": 0.5, "events_per_s": 1000.0}
    return {"events": 1000, "attempts": 10, "output_tokens": 256, "loop_over_ledger_ratio": ratio, "agree": True,
            "max_abs_diff_ms": {"ttft_client_ms": 0.0}, "phases": {"import": phase, "ledger": phase, "peer": phase},
            "targets": [{"target": ">= 5x faster than the loop", "measured": f"{ratio:.2f}x", "met": ratio >= 5}]}


def test_the_newest_qualifying_run_is_drawn_and_a_history_table_draws_every_qualifying_run():
    full = {"attempts": 10_000, "tokens": 256}
    rs = [result("ledger_scale", "2026-11-29T10:00:00Z", _ledger(4.51), params=full, host=ZEN3, commit="1111111aaa"),
          result("ledger_scale", "2026-12-01T21:00:00Z", _ledger(6.02), params=full, commit="2222222bbb"),
          result("ledger_scale", "2026-12-01T22:00:00Z", _ledger(9.99), params={"attempts": 100, "tokens": 256})]
    latest = render.render_table("ledger_scale", rs)
    assert "ledger_scale-20261201T210000Z-2222222.json" in latest.splitlines()[0]
    assert "**ratio loop / ledger 6.02×**" in latest and "| >= 5x faster than the loop | 6.02x | met |" in latest
    history = render.render_table("ledger_scale.history", rs).splitlines()
    assert history[0].startswith("*From 2 results files of `ledger_scale`, the newest "
                                 "`benchmarks/results/ledger_scale-20261201T210000Z-2222222.json`: ")
    assert history[2:] == [
        "| date | commit | CPU | load | reconstruct s | loop s | loop / ledger |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        "| 2026-11-29 | `1111111` | AMD EPYC 7B13 family 25 model 1, AVX2 only | 4.95 → 5.50 | 1.00 | 1.00 | 4.51 |",
        "| 2026-12-01 | `2222222` | AMD EPYC family 26 model 2, AVX-512 BF16, no AMX | 4.95 → 5.50 | 1.00 | 1.00 | 6.02 |"]


def test_an_unknown_figure_renders_as_a_dash_never_zero():
    figures = json.loads(json.dumps(PARTS))
    figures["rows"][0]["compaction_s"] = None
    out = render.render_table("parts_compaction", [result("parts_compaction", "2026-12-01T21:00:00Z", figures)])
    assert "| 300 | 3.64 s | — | 3.21 s | **1.13** | yes |" in out


@pytest.mark.parametrize("doc, message", [
    ("a\n<!-- rendered: parts_compaction -->\nx\n", "doc.md:2: marker '<!-- rendered: parts_compaction -->' has no partner"),
    ("a\n\n<!-- end rendered: parts_compaction -->\n", "doc.md:3: marker '<!-- end rendered: parts_compaction -->' has no partner"),
    ("<!-- rendered: parts_compaction -->\n<!-- rendered: linear_dtypes -->\n<!-- end rendered: parts_compaction -->\n",
     "doc.md:2: marker '<!-- rendered: linear_dtypes -->' has no partner"),
    ("<!-- rendered: nosuch -->\n<!-- end rendered: nosuch -->\n", "no table 'nosuch' in benchmarks/render_tables.py"),
    ("<!-- rendered: loop_lag -->\n<!-- end rendered: loop_lag -->\n",
     "table 'loop_lag': no results file of loop_lag qualifies"),
])
def test_a_marker_without_its_partner_an_unknown_table_or_missing_results_are_refused(doc, message):
    r = result("parts_compaction", "2026-12-01T21:00:00Z", PARTS)
    with pytest.raises(render.RenderError) as err:
        render.render_doc(doc, [r], doc_name="doc.md")
    assert str(err.value).startswith(message)


def test_a_results_file_lacking_a_figure_is_named(tmp_path):
    r = result("parts_compaction", "2026-12-01T21:00:00Z", {"rows": []}, name="p.json")
    with pytest.raises(render.RenderError, match=r"benchmarks/results/p.json lacks a figure \(KeyError\('events'\)\)"):
        render.render_table("parts_compaction", [r])
    (tmp_path / "bad.json").write_text('{"benchmark": "x"}')
    with pytest.raises(render.RenderError, match="bad.json: not a results file"):
        render.load_results(tmp_path)


def test_the_check_mode_exits_1_on_a_stale_doc_and_changes_nothing(tmp_path):
    (tmp_path / "results").mkdir()
    r = result("parts_compaction", "2026-12-01T21:00:00Z", PARTS)
    (tmp_path / "results" / r.pop("_file")).write_text(json.dumps(r))
    doc = tmp_path / "B.md"
    doc.write_text(DOC)
    assert render.main(["--check", "--doc", str(doc), "--results", str(tmp_path / "results")]) == 1
    assert doc.read_text() == DOC
    assert render.main(["--doc", str(doc), "--results", str(tmp_path / "results")]) == 0
    assert "| 300 | 3.64 s |" in doc.read_text()
    assert render.main(["--check", "--doc", str(doc), "--results", str(tmp_path / "results")]) == 0


def test_the_benchmarks_doc_is_current_with_the_committed_results():
    doc = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    assert render.BLOCK.search(doc), "docs/BENCHMARKS.md has no rendered table"
    assert render.render_doc(doc, render.load_results()) == doc, "run: .venv/bin/python benchmarks/render.py"


def test_a_second_table_of_the_same_run_in_a_section_only_names_its_file_and_a_new_section_names_it_in_full():
    r = result("parts_compaction", "2026-12-01T21:00:07Z", PARTS)
    doc = ("## A\n\n<!-- rendered: parts_compaction -->\n<!-- end rendered: parts_compaction -->\n\nprose\n\n"
           "<!-- rendered: parts_compaction -->\n<!-- end rendered: parts_compaction -->\n\n## B\n\n"
           "<!-- rendered: parts_compaction -->\n<!-- end rendered: parts_compaction -->\n")
    heads = [line for line in render.render_doc(doc, [r]).splitlines() if line.startswith("*")]
    assert [h[:20] for h in heads] == ["*From `benchmarks/re", "*Same run: `benchmar", "*From `benchmarks/re"]
    assert heads[1] == "*Same run: `benchmarks/results/parts_compaction-20261201T210007Z-a51c9bb.json`.*"


def test_the_engine_against_vllm_run_keeps_its_rows_with_units_and_renders_its_ratios_per_round():
    import argparse
    import importlib.util

    import results

    spec = importlib.util.spec_from_file_location("engine_vs_vllm", ROOT / "benchmarks" / "engine_vs_vllm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def row(rnd, server, client, c, tok_s, tpot_p50, load="2.88 3.01 3.2"):
        return {"round": rnd, "server": server, "client": client, "concurrency": c, "prompts": 4, "load_before": load,
                "tok_s": tok_s, "ttft_p50": 277.4, "ttft_p99": 303.0, "tpot_p50": tpot_p50, "tpot_p99": 68.0,
                "completed": 4, "input_tokens_client": 256, "prompt_tokens_server": 320.0,
                "prompt_tokens_per_request_server": 64.0}
    bench = "vllm bench serve"
    rows = [row(1, "ours", bench, 1, 3.0, 322.0), row(1, "vllm", bench, 1, 7.5, 74.0),
            row(2, "ours", bench, 1, 14.7, 65.0), row(2, "vllm", bench, 1, 12.8, 53.0)]

    class Server:
        def __init__(self, name):
            self.name = name

        def manifest(self):
            return {"dtype": "bf16"}
    args = argparse.Namespace(concurrency=[1], capture_concurrency=[], rounds=2)
    figures = mod.figures(rows, [Server("ours"), Server("vllm")], args)
    results.check_figures(figures)
    assert figures["rows"][0] == {"round": 1, "server": "ours", "client": bench, "concurrency": 1, "prompts": 4,
                                  "tok_s": 3.0, "ttft_p50_ms": 277.4, "ttft_p99_ms": 303.0, "tpot_p50_ms": 322.0,
                                  "tpot_p99_ms": 68.0, "completed": 4, "input_tokens_client": 256, "load_1m_before": 2.88,
                                  "prompt_tokens_server": 320, "prompt_per_request_server_tokens": 64.0}
    assert figures["ratios"] == [{"client": bench, "concurrency": 1, "ours_over_vllm_tok_s_ratio": [0.4, 1.1484],
                                  "vllm_over_ours_tpot_p50_ratio": [0.2298, 0.8154]}]
    out = render.render_table("engine_vs_vllm", [result("engine_vs_vllm", "2026-12-01T21:00:00Z", figures)])
    assert out.splitlines()[2:] == [
        "| round | server | client | c | tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | load (1 min) before |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        "| 1 | ours | vllm bench serve | 1 | 3.0 | 277 / 303 | 322 / 68 | 2.88 |",
        "| 1 | vllm | vllm bench serve | 1 | 7.5 | 277 / 303 | 74 / 68 | 2.88 |",
        "| 2 | ours | vllm bench serve | 1 | 14.7 | 277 / 303 | 65 / 68 | 2.88 |",
        "| 2 | vllm | vllm bench serve | 1 | 12.8 | 277 / 303 | 53 / 68 | 2.88 |",
        "",
        "| client | c | ours / vLLM tok/s, per round | vLLM / ours TPOT p50, per round |",
        "| --- | --- | --- | --- |",
        "| vllm bench serve | 1 | 0.40, 1.15 | 0.23, 0.82 |"]


def test_our_served_steps_are_read_from_the_run_ledger_within_each_bench_window(tmp_path, monkeypatch):
    import importlib.util
    import types

    import duckdb
    import results

    from inferledger.ledger import reconstruct as rebuild

    spec = importlib.util.spec_from_file_location("engine_vs_vllm", ROOT / "benchmarks" / "engine_vs_vllm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    db = tmp_path / "ledger.duckdb"
    con = duckdb.connect(str(db))  # the two tables the query reads, as the ledger has them
    con.execute("CREATE TABLE events (name VARCHAR, step_id BIGINT, clock VARCHAR, ts_ns BIGINT, attrs JSON)")
    con.execute("CREATE TABLE step_model (step_id BIGINT, num_seqs INT, prefill_tokens INT, measured_ms DOUBLE, "
                "contention_ms DOUBLE, gap_after_ms DOUBLE)")
    ms = 1_000_000
    # steps 1-3: 16 decodes (50, 60, 70 ms; on a CPU 40, 44, 48; waiting 8, 14, 20); 4: a prefill beside them;
    # 5: 16 decodes after the window
    for sid, start, dur, cpu, wait, seqs, pf in [(1, 100, 50, 40, 8, 16, 0), (2, 200, 60, 44, 14, 16, 0),
                                                 (3, 300, 70, 48, 20, 16, 0), (4, 400, 300, 250, 40, 16, 64),
                                                 (5, 900, 50, 40, 8, 16, 0)]:
        con.execute("INSERT INTO events VALUES ('step.start', ?, 'mono:h', ?, '{}'), ('step.end', ?, 'mono:h', ?, ?)",
                    [sid, start * ms, sid, (start + dur) * ms, f'{{"cpu_ns": {cpu * ms}, "wait_ns": {wait * ms}}}'])
        con.execute("INSERT INTO step_model VALUES (?, ?, ?, ?, ?, 1.5)", [sid, seqs, pf, float(dur), float(wait)])
    con.close()
    monkeypatch.setattr(rebuild, "reconstruct", lambda run: types.SimpleNamespace(path=db))
    ours = mod.Ours("auto", "auto", ledger=True)
    ours.runs = [tmp_path / "ours-run-1"]
    rows = [{"concurrency": 16, "served_window": {"run": 1, "from_ns": 50 * ms, "to_ns": 800 * ms,
                                                  "step_thread_cpu_s": 9.5, "other_threads_cpu_s": 0.44}},
            {"concurrency": 1, "server": "vllm"}]
    mod.served_steps(rows, ours)
    assert rows[0] == {"concurrency": 16, "served_step": {
        "run_dir": "ours-run-1", "decode_steps": 3, "decode_step_ms": 60.0, "decode_on_cpu_ms": 44.0,
        "decode_cpu_wait_ms": 14.0, "decode_off_cpu_ms": 2.0, "decode_gap_after_ms": 1.5, "steps": 4,
        "steps_s": 0.48, "prefill_steps_s": 0.3, "step_thread_cpu_s": 9.5, "other_threads_cpu_s": 0.44}}
    assert rows[1] == {"concurrency": 1, "server": "vllm"}  # no window: untouched
    results.check_figures({"rows": rows})


def test_vllm_gets_its_documented_preload_by_default_and_the_table_says_which_environment_it_had(tmp_path, monkeypatch):
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("engine_vs_vllm", ROOT / "benchmarks" / "engine_vs_vllm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    script = ROOT / "benchmarks" / "peers" / "vllm_cpu.sh"
    tcmalloc = tmp_path / "libtcmalloc_minimal.so.4"
    tcmalloc.write_bytes(b"")
    monkeypatch.setenv("VLLM_TCMALLOC", str(tcmalloc))
    documented, plain = mod.VLLM(script, "bfloat16", "nobind"), mod.VLLM(script, "bfloat16", "nobind", plain=True)
    if (ROOT / ".peers" / "vllm" / "lib" / "libiomp5.so").exists():  # where vLLM is installed
        preload = documented.resolve_preload().split(":")
        assert preload[0] == str(tcmalloc) and preload[1].endswith("/vllm/lib/libiomp5.so") and len(preload) == 2
    assert plain.resolve_preload() == ""
    monkeypatch.setenv("VLLM_TCMALLOC", str(tmp_path / "absent.so"))
    with pytest.raises(SystemExit) as exit_:
        mod.VLLM(script, "bfloat16", "nobind").resolve_preload()
    assert exit_.value.code == 2
    documented.ld_preload = "/lib/libtcmalloc_minimal.so.4:/v/lib/libiomp5.so"
    assert documented.manifest()["ld_preload"] == documented.ld_preload
    assert plain.manifest()["ld_preload"] is None and "plain (--vllm-plain)" in plain.manifest()["environment"]
    args = argparse.Namespace(concurrency=[1], capture_concurrency=[], rounds=1)
    for server, said in ((documented, "vLLM's environment: documented: LD_PRELOAD=/lib/libtcmalloc_minimal.so.4:"
                          "/v/lib/libiomp5.so (tcmalloc"), (plain, "vLLM's environment: plain (--vllm-plain)")):
        out = render.render_table("engine_vs_vllm", [result("engine_vs_vllm", "2026-12-01T21:00:00Z",
                                                            mod.figures([], [server], args))])
        assert said in out
    older = render.render_table("engine_vs_vllm", [result("engine_vs_vllm", "2026-12-01T21:00:00Z",
                                                          {"rows": [], "ratios": [], "servers": {"vllm": {}}})])
    assert "environment" not in older  # a run before the record names none


def test_llamacpp_as_a_third_server_gets_its_own_ratios_and_names_its_weights():
    import argparse
    import importlib.util

    import results

    spec = importlib.util.spec_from_file_location("engine_vs_vllm", ROOT / "benchmarks" / "engine_vs_vllm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cap = "inferledger capture (closed loop)"

    def row(server, tok_s, tpot_p50):
        return {"round": 1, "server": server, "client": cap, "concurrency": 2, "prompts": 4, "load_before": "9.4 6.1 4.5",
                "tok_s": tok_s, "ttft_p50": 430.0, "ttft_p99": 450.0, "tpot_p50": tpot_p50, "tpot_p99": 72.1,
                "completed": 4, "prompt_tokens_server": 256.0}
    rows = [row("ours", 25.8, 71.9), row("llamacpp", 34.1, 41.5)]
    servers = [mod.Ours("auto", "off"), mod.LlamaCpp(ROOT / "benchmarks" / "peers" / "llamacpp.sh", 1)]
    figures = mod.figures(rows, servers, argparse.Namespace(concurrency=[], capture_concurrency=[2], rounds=1))
    results.check_figures(figures)
    assert figures["ratios"] == []  # ours / vLLM: no vLLM in this run
    assert figures["llamacpp_ratios"] == [{"client": cap, "concurrency": 2, "ours_over_llamacpp_tok_s_ratio": [0.7566],
                                           "llamacpp_over_ours_tpot_p50_ratio": [0.5772]}]
    assert "as stored" in figures["servers"]["llamacpp"]["weights"] and \
        "dequantised" in figures["servers"]["ours"]["weights"]


def test_a_run_with_onednn_held_to_avx2_is_drawn_only_by_the_held_table_and_says_so():
    rows = {"threads": 1, "repeats": 5, "torch_isa": "AVX512", "onednn_bf16": True,
            "rows": [{"rows": 1, "fp32_ms": 100.0, "bf16_ms": 60.0, "fp16_ms": 70.0, "bf16_over_fp32_ratio": 0.6,
                      "fp16_over_fp32_ratio": 0.7}]}
    held = json.loads(json.dumps(rows)) | {"torch_isa": "AVX2", "onednn_bf16": False}
    native = result("linear_dtypes", "2026-12-01T21:00:00Z", rows)
    avx2 = result("linear_dtypes", "2026-12-01T22:00:00Z", held)
    avx2["environment"] = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    plain = render.render_table("linear_dtypes", [native, avx2])
    assert native["_file"] in plain and "torch ISA AVX512, oneDNN bf16 path available" in plain
    limited = render.render_table("linear_dtypes.held_to_avx2", [native, avx2])
    assert avx2["_file"] in limited and "ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 `" in limited
    assert "torch ISA AVX2, oneDNN bf16 path unavailable" in limited


def test_the_engine_against_vllm_table_of_each_cpu_kind_draws_only_runs_on_that_kind():
    """The target is judged on a CPU that multiplies bf16 natively; an AVX2-only run (bf16 emulated,
    ours in fp32) is a figure of its own kind and never becomes the newest run of the other table."""
    figures = {"rows": [], "ratios": [{"client": "vllm bench serve", "concurrency": 1,
                                       "ours_over_vllm_tok_s_ratio": [0.9, 0.8], "vllm_over_ours_tpot_p50_ratio": [0.9, 0.8]}]}
    avx2_figures = json.loads(json.dumps(figures))
    avx2_figures["ratios"][0]["ours_over_vllm_tok_s_ratio"] = [1.15, 0.93]
    native = result("engine_vs_vllm", "2026-12-01T21:00:00Z", figures, host=ZEN5)
    avx2 = result("engine_vs_vllm", "2026-12-02T21:00:00Z", avx2_figures, host=ZEN3)  # the newer one
    native_table = render.render_table("engine_vs_vllm", [native, avx2])
    avx2_table = render.render_table("engine_vs_vllm.avx2", [native, avx2])
    assert native["_file"] in native_table and avx2["_file"] not in native_table
    assert "| vllm bench serve | 1 | 0.90, 0.80 |" in native_table and "AVX-512 BF16" in native_table
    assert avx2["_file"] in avx2_table and native["_file"] not in avx2_table
    assert "| vllm bench serve | 1 | 1.15, 0.93 |" in avx2_table and "AVX2 only" in avx2_table
    with pytest.raises(render.RenderError, match="no results file of engine_vs_vllm qualifies"):
        render.render_table("engine_vs_vllm.avx2", [native])


def test_a_large_run_shows_its_query_time_and_peak_and_an_older_file_without_them_a_dash():
    big = {"attempts": 331_200, "tokens": 256, "no_peer": True, "memory_limit": "4GB"}
    older = _ledger(1.0) | {"memory_limit": "4GB", "loop_over_ledger_ratio": None}
    older["phases"] = {"import": older["phases"]["import"], "ledger": older["phases"]["ledger"]}
    newer = json.loads(json.dumps(older)) | {"query": {"wall_s": 12.345, "peak_gib": 0.456,
                                                       "queries_s": {"itl p99 by layer": 11.0}}}
    rows = render.render_table("ledger_scale.large", [
        result("ledger_scale", "2026-12-01T21:00:00Z", older, params=big),
        result("ledger_scale", "2026-12-02T21:00:00Z", newer, params=big)]).splitlines()
    assert rows[2].split(" | ")[12] == "query s (peak GiB)" and rows[2].split(" | ")[6] == "repartition s"
    assert [r.split(" | ")[12] for r in rows[4:]] == ["—", "12.3 (0.46)"]
    assert [r.split(" | ")[6] for r in rows[4:]] == ["—", "—"]  # neither repartitioned


def test_the_fidelity_bench_table_shows_each_repeats_judged_figures_contention_and_the_spreads():
    def fig(name, real, sim, target):
        err = (sim - real) / real
        return {"figure": name, "real_ms": real, "sim_ms": sim, "error_ratio": err, "target_ratio": target,
                "met": None if target is None else abs(err) <= target, "n": 20}

    def run(tpot_sim, contention, decode_ratio=None, by_second=(None, None)):
        return {"real_decode_p10_ratio": by_second[0], "real_decode_p90_ratio": by_second[1], "study_wall_s": 80.4, "folder": "/tmp/x", "replayed_whole": 27, "replayed_until_cancel": 2,
                "not_replayed": 0, "real_contention_share": contention, "fit_contention_share": 0.125,
                "fit_held_out_median_abs_pct": 6.54, "fit_n_train": 189, "real_decode_time_ratio": decode_ratio,
                "figures": [fig("TPOT p50", 40.0, tpot_sim, 0.05), fig("TTFT p50", 200.0, 210.0, 0.10),
                            fig("E2E p99", 1000.0, 1120.0, 0.10), fig("TTFT p99", 500.0, 400.0, None)]}

    figures = {"workloads": [{"workload": "cpu_demo", "file": "w.toml", "runs": [run(41.0, 0.3351, 1.0963, (0.914, 1.2371)),
                                                                                     run(44.0, None)],
                              "spreads": [{"figure": "TPOT p50", "by_repeat_error_ratio": [0.025, 0.1],
                                           "by_repeat_met": [True, False], "spread_pct": 7.5, "spread_within": False}]}],
               "spread_target_pct": 3.0, "all_met": False, "all_spreads_within": False}
    out = render.render_table("fidelity_bench", [result("fidelity_bench", "2026-12-05T22:34:49Z", figures)])
    assert "| cpu_demo | 1 | 40.0 / 41.0: +2.5% | 200.0 / 210.0: +5.0% | 1000.0 / 1120.0: +12.0% **not met** | " \
           "33.5% | 12.5% | 6.5 % | 1.096 (0.91–1.24 by the second) | 27 + 2 | 80 s |" in out
    assert "| cpu_demo | 2 | 40.0 / 44.0: +10.0% **not met** | 200.0 / 210.0: +5.0% | 1000.0 / 1120.0: +12.0% " \
           "**not met** | — | 12.5% | 6.5 % | — |" in out  # contention and the time ratio unknown: a dash, never 0
    assert "| cpu_demo | TPOT p50 | 7.5 points | **not met** |" in out
    assert "| every judged figure within its target, every repeat | 3 of 6 | **not met** |" in out
    assert "| two repeats within 3 points | 0 of 1 | **not met** |" in out
    assert "TTFT p99" not in out  # shown by the study, not judged
    # recorded with each error's interval over the attempts: beside the error, and whether the repeats' overlap
    w = figures["workloads"][0]
    for r, lo in zip(w["runs"], (-0.02, 0.04)):
        for f in r["figures"]:
            f["error_lo_ratio"], f["error_hi_ratio"] = (lo, lo + 0.1) if f["figure"] == "TPOT p50" else (None, None)
    w["spreads"][0] |= {"by_repeat_interval_ratio": [[-0.02, 0.08], [0.04, 0.14]], "intervals_overlap": True}
    out = render.render_table("fidelity_bench", [result("fidelity_bench", "2026-12-05T22:34:49Z", figures)])
    assert "| cpu_demo | 1 | 40.0 / 41.0: +2.5% (-2.0% to +8.0%) | 200.0 / 210.0: +5.0% |" in out
    assert "| cpu_demo | 2 | 40.0 / 44.0: +10.0% (+4.0% to +14.0%) **not met** |" in out
    assert "| cpu_demo | TPOT p50 | 7.5 points | **not met** | yes |" in out
    assert "intervals overlap | 1 of 1 with intervals | met |" in out


def test_the_diagnosis_bench_names_the_cause_beside_the_hosts_wait():
    import render_tables
    busy = {"expected": "prefill_interference", "named": "host_contention",
            "shares": {"host_contention_share": 0.534, "prefill_interference_share": 0.281, "server_queue_share": 0.185,
                       "client_share": None, "transport_share": 0.0}}
    assert render_tables._first_beside_host(busy) == "prefill_interference"
    # only the host's wait (or nothing) shared the delay: no other cause to name
    assert render_tables._first_beside_host({"shares": {"host_contention_share": 1.0, "client_share": 0.0}}) is None
    assert render_tables._first_beside_host({"shares": {"host_contention_share": None}}) is None


def test_a_large_run_without_a_limit_names_the_default_it_was_held_to():
    big = {"attempts": 331_200, "tokens": 256, "no_peer": True}
    older = _ledger(1.0) | {"memory_limit": None, "loop_over_ledger_ratio": None}  # before the default was recorded
    newer = _ledger(1.0) | {"memory_limit": None, "memory_limit_default": "2.50GiB", "loop_over_ledger_ratio": None}
    given = _ledger(1.0) | {"memory_limit": "4GB", "memory_limit_default": None, "loop_over_ledger_ratio": None}
    rows = render.render_table("ledger_scale.large", [
        result("ledger_scale", f"2026-12-0{i}T21:00:00Z", f, params=big)
        for i, f in enumerate((older, newer, given), 1)]).splitlines()
    assert [r.split(" | ")[5] for r in rows[4:]] == ["single node", "single node, default limit 2.50GiB",
                                                      "single node, limit 4GB"]


def test_the_fidelity_bench_says_whether_the_repeats_intervals_share_a_value():
    import fidelity_bench

    assert fidelity_bench.overlap([[-0.2, -0.02], [-0.05, 0.1]]) is True  # both hold -0.05 to -0.02
    assert fidelity_bench.overlap([[-0.2, -0.06], [-0.05, 0.1]]) is False
    assert fidelity_bench.overlap([[0.0, 0.1], [0.1, 0.2]]) is True  # touching ends share 0.1
    assert fidelity_bench.overlap([[0.0, 0.1], [None, None]]) is None  # a repeat without an interval: unknown
    assert fidelity_bench.overlap([[0.0, 0.1]]) is None  # one repeat: nothing to compare

    def run(err, lo, hi):
        return {"figures": [{"figure": "TPOT p50", "error_ratio": err, "error_lo_ratio": lo, "error_hi_ratio": hi,
                             "target_ratio": 0.05, "met": abs(err) <= 0.05},
                            {"figure": "TTFT p99", "error_ratio": 0.3, "error_lo_ratio": None, "error_hi_ratio": None,
                             "target_ratio": None, "met": None}]}

    [s] = fidelity_bench.spreads([run(-0.114, -0.197, -0.02), run(0.016, -0.032, 0.117)])
    assert s["spread_pct"] == 13.0 and s["spread_within"] is False  # 13 points apart ...
    assert s["intervals_overlap"] is True  # ... and yet within what their 60 attempts each can tell
    assert s["by_repeat_interval_ratio"] == [[-0.197, -0.02], [-0.032, 0.117]]
