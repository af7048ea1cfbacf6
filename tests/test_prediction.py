"""Device parameters measured at capture start, `inferledger predict`, and the prediction a capture
registers before its load: bounds by hand, the registration before the first event, a changed or
malformed prediction refused by name (capture) or registered as a gap (ledger)."""
from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.capture import microbench
from inferledger.collectors.capture.run import capture
from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.workload import Workload
from inferledger.costmodel import Roofs
from inferledger.probes.model_shape import ModelShape
from inferledger.costmodel.prediction import SCHEMA, PredictionError, check, predict
from inferledger.ledger.reconstruct import reconstruct

SMOL = SimpleNamespace(shape=ModelShape(30, 576, 9, 3, 64, 1536, 49152, True, 4, 4, 4))  # the engine config holds it


def fake_timer(step_s: float = 1e-3):
    """A clock that moves step_s at every reading: each timed call lasts exactly step_s."""
    ticks = itertools.count()
    return lambda: next(ticks) * step_s


def test_the_engine_shapes_are_its_fused_matmuls_at_batch_one_the_limit_and_the_token_budget():
    shapes = microbench.linear_shapes(SMOL, 8, 512)
    got = {(s["name"], s["m"]): (s["k"], s["n"]) for s in shapes}
    # q, k, v fused: (9 + 2*3) heads of 64 = 960 columns; gate and up fused: 2 * 1536
    assert got[("qkv", 1)] == got[("qkv", 8)] == got[("qkv", 512)] == (576, 960)
    assert got[("gate_up", 512)] == (576, 3072) and got[("down", 8)] == (1536, 576)
    assert got[("lm_head", 8)] == (576, 49152) and ("lm_head", 512) not in got  # one logit row per sequence
    assert len(shapes) == 11


def test_microbenchmarks_keep_peak_and_median_apart_with_their_source(monkeypatch):
    import torch

    shapes = [{"name": "qkv", "m": 1, "k": 576, "n": 960}, {"name": "qkv", "m": 8, "k": 576, "n": 960}]
    got = microbench.measure("cpu", torch.float32, shapes, timer=fake_timer(), stream_bytes=4 << 20,
                             stream_repeats=5, matmul_repeats=4)
    # every timed call lasts 1 ms: 4 MiB read in 1 ms is 4.194304 GB/s; a copy moves twice the bytes
    assert got["stream_read_gbps"]["peak"] == pytest.approx(4.194304)
    assert got["copy_gbps"]["median"] == pytest.approx(8.388608)
    assert got["memcpy_gbps"]["peak"] == pytest.approx(8.388608) and got["memcpy_gbps"]["from"] == "copy_gbps"
    # 2 * 8 * 576 * 960 FLOP in 1 ms
    assert got["matmul_tflops"]["peak"] == pytest.approx(2 * 8 * 576 * 960 / 1e-3 / 1e12)
    assert got["matmul_tflops"]["at"] == "qkv" and got["matmul_tflops"]["m"] == 8
    for key in ("memcpy_gbps", "stream_read_gbps", "copy_gbps", "matmul_tflops"):
        fig = got[key]
        assert fig["source"] == "microbenchmark" and {"peak", "median", "repeats", "unit"} <= set(fig)
        assert fig["peak"] >= fig["median"]
    assert got["stream_read_gbps"]["repeats"] == 5 and got["matmul_tflops"]["shapes"][0]["repeats"] == 4
    assert [s["flop"] for s in got["matmul_tflops"]["shapes"]] == [2 * 576 * 960, 2 * 8 * 576 * 960]


def test_a_microbenchmark_repeat_leaves_out_its_threads_wait_for_a_cpu(tmp_path):
    """A co-tenant holds the measuring thread off a CPU 3 ms of every 4: timed on the wall clock a 4 MiB
    copy ran at 2.1 GB/s; on uncontended_clock (the wall less the thread's run-queue wait, as steps.cpu_ms
    is for a step) at 8.4 GB/s, the rate the memory gave it. Where schedstat is hidden the clock is the
    wall's."""
    import torch

    stat, readings = tmp_path / "schedstat", itertools.count()

    def clock():  # each reading 4 ms of wall time after the last, 3 ms of it waiting on a run queue
        i = next(readings)
        stat.write_text(f"1000 {i * 3_000_000} 5\n")
        return microbench.uncontended_clock(str(stat), wall=lambda: i * 4e-3)

    got = microbench.measure("cpu", torch.float32, [{"name": "qkv", "m": 1, "k": 8, "n": 8}], timer=clock,
                             stream_bytes=4 << 20, stream_repeats=3, matmul_repeats=3, slice_s=10.0)
    assert got["copy_gbps"]["peak"] == pytest.approx(2 * (4 << 20) / 1e-3 / 1e9)  # 1 ms on a CPU, not 4
    assert got["stream_read_gbps"]["median"] == pytest.approx((4 << 20) / 1e-3 / 1e9)
    assert microbench.uncontended_clock(str(tmp_path / "absent"), wall=lambda: 7.5) == 7.5


def test_a_thread_preempted_between_its_clock_and_its_wait_is_timed_as_it_ran(tmp_path):
    """A repeat of 8 ms on a CPU whose measuring thread is preempted for 7 ms right after it reads the wall
    clock at the repeat's end: taking that wait off a clock reading that does not hold it timed the repeat at
    1 ms (8 times the rate); read again until the waits around the clock agree, it is 8 ms."""
    stat = tmp_path / "schedstat"
    stat.write_text("1000 0 5\n")
    walls = iter([100.0, 100.008, 100.015])

    def wall():
        now = next(walls)
        if now == 100.008:  # the repeat's end: the thread waits 7 ms on a run queue right after this reading
            stat.write_text("1000 7000000 6\n")  # counted as it gets its CPU back
        return now

    t0 = microbench.uncontended_clock(str(stat), wall=wall)
    t1 = microbench.uncontended_clock(str(stat), wall=wall)
    assert t1 - t0 == pytest.approx(0.008)  # not 0.001: the wait its first clock reading did not hold stays in
    assert t0 == 100.0 and t1 == pytest.approx(100.015 - 0.007)


def test_device_params_run_in_a_thread_placed_like_the_step_thread():
    import torch

    cfg = SimpleNamespace(shape=ModelShape(1, 8, 1, 1, 8, 16, 32, False, 4, 4, 4))
    bundle = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32, config=cfg,
                             model=torch.nn.Linear(8, 8))
    before = torch.get_num_threads()
    try:
        got = microbench.device_params(bundle, max_batch=2, max_tokens=4, cpu_threads=1, timer=fake_timer(),
                                       stream_bytes=1 << 20)
    finally:
        torch.set_num_threads(before)
    assert got["threads"] == 1 and got["placement"] == {"threads": 1, "pinned_cpus": None,
                                                        "cpus_left": got["placement"]["cpus_left"]}
    assert got["source"] == "microbenchmark" and got["dtype"] == "float32" and got["device"] == "cpu"
    assert isinstance(got["cpu_flags"], list)
    assert sorted({(s["name"], s["m"]) for s in got["matmul_tflops"]["shapes"]}) == sorted(
        [(n, m) for m in (1, 2) for n in ("qkv", "gate_up", "down", "lm_head")]
        + [(n, 4) for n in ("qkv", "gate_up", "down")])
    assert microbench.skipped("why")["source"] is None


# A decoder small enough to count by hand: one layer, d_model 4, one head of 4, FFN 8, vocab 16, 2-byte
# weights, activations and KV. Roofs 1 FLOP/s and 1 B/s, so a stage's bound in seconds is
# max(FLOPs, bytes). Prefill of 3 tokens, no cache (stage: FLOP / bytes -> bound):
#   embed 0 / 48 -> 48; qkv 288 / 200 -> 288; attention 96 / 96 -> 96; o_proj 96 / 80 -> 96;
#   gate_up 384 / 256 -> 384; down 192 / 136 -> 192; lm_head (1 row) 128 / 176 -> 176: 1280 s.
# Decode of 1 token at context 3:
#   embed 0 / 16; qkv 96 / 136; attention 64 / 80; o_proj 32 / 48; gate_up 128 / 176; down 64 / 88;
#   lm_head 128 / 176: 16 + 136 + 80 + 48 + 176 + 88 + 176 = 720 s.
TINY = ModelShape(1, 4, 1, 1, 4, 8, 16, False, 2, 2, 2)
ONE = Roofs.declared(1e-12, 1e-9, "1 FLOP/s, 1 B/s")
HALF = Roofs.declared(0.5e-12, 0.5e-9, "half")
REQ = [{"class": "tiny", "prompt_tokens": 3, "cached_tokens": 0, "output_tokens": 2, "weight": 1.0}]


def test_prediction_bounds_by_hand():
    doc = predict(TINY, REQ, ONE, max_batch=1, sustained=HALF)
    r = doc["requests"][0]
    assert r["ttft_lower_ms"] == pytest.approx(1_280_000)
    assert r["tpot_lower_ms"] == pytest.approx(720_000)
    # at half the rates every stage takes twice as long; alone at the batch limit 1, both ends agree
    assert r["ttft_expected_ms"]["sustained"] == pytest.approx([2_560_000, 2_560_000])
    assert r["tpot_expected_ms"]["sustained"][0] == pytest.approx(1_440_000)
    assert "fit" not in r["ttft_expected_ms"]
    prefill = next(s for s in doc["steps"] if s["kind"] == "prefill")
    assert prefill["bound_ms"] == pytest.approx(1_280_000) and prefill["tokens"] == 3
    assert doc["schema"] == SCHEMA and doc["roofs"]["peak"]["compute"]["source"] == "assumption"
    assert check(json.loads(json.dumps(doc)), "x") is not None


def test_a_malformed_prediction_is_refused_naming_the_field():
    doc = json.loads(json.dumps(predict(TINY, REQ, ONE, max_batch=1)))
    doc["requests"][0]["ttft_lower_ms"] = "soon"
    with pytest.raises(PredictionError, match=r"pred\.json: field requests\[0\]\.ttft_lower_ms = 'soon'"):
        check(doc, "pred.json")
    with pytest.raises(PredictionError, match="field schema"):
        check({**doc, "schema": "other/9"}, "pred.json")


def test_predict_command_writes_a_prediction_from_a_config_and_a_spec_device(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
                               "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
                               "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    wl = _workload(tmp_path)
    out = tmp_path / "pred.json"
    res = CliRunner().invoke(app, ["predict", "-w", str(wl), "--model-config", str(cfg), "--device", "H100 SXM",
                                   "-o", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = check(json.loads(out.read_text()), str(out))
    rows = json.loads(res.output)
    assert [r["class"] for r in rows] == ["chat"] and rows[0]["ttft_sustained_ms"] is None  # a spec has peaks only
    assert doc["roofs"]["peak"]["memory"]["source"] == "spec" and doc["workload"]["sha256"]
    # SmolLM2 in bf16 reads its 134,515,008 weights (tied) = 269,030,016 bytes each decode step at least
    assert rows[0]["tpot_lower_ms"] > 269_030_016 / 3350e9 * 1e3
    res = CliRunner().invoke(app, ["predict", "-w", str(wl), "--model-config", str(cfg), "-o", str(out)])
    assert res.exit_code == 2 and "--device NAME" in res.output
    # a prompt past the context the config declares: refused by class, before anything is written
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "max_position_embeddings": 32}))
    out.unlink()
    res = CliRunner().invoke(app, ["predict", "-w", str(wl), "--model-config", str(cfg), "--device", "H100 SXM",
                                   "-o", str(out)])
    assert res.exit_code == 2 and not out.exists()
    assert (f"{wl}: [[classes]][0].prompt_tokens: 40 + max_tokens 6 = 46 exceeds the model's context of 32 tokens "
            f"(allowed: prompt_tokens <= 26) ({cfg}: max_position_embeddings)") in " ".join(res.output.split())


def _workload(tmp: Path, n: int = 3) -> Path:
    (tmp / "tasks.jsonl").write_text(json.dumps({"kind": "lookup", "prompt": "Capital of France?",
                                                 "answer": "paris"}) + "\n")
    (tmp / "arrivals.txt").write_text("".join(f"{i * 30}\n" for i in range(n)))
    path = tmp / "w.toml"
    path.write_text('name = "predict-test"\nseed = 1\n[taskset]\nfile = "tasks.jsonl"\n'
                    '[arrivals]\nprocess = "replay"\nfile = "arrivals.txt"\n[contract]\ndeadline_ms = 120000\n'
                    '[client]\ntimeout_ms = 60000\n[generation]\nmax_tokens = 6\n'
                    'temperature = 0.0\n[[classes]]\nname = "chat"\nprompt_tokens = 40\n')
    return path


def test_without_shape_or_roofs_the_capture_registers_none_and_says_why(tmp_path):
    from inferledger.collectors.capture.registration import own_prediction

    wl = Workload.load(_workload(tmp_path))
    identity = {"architecture": {"n_layers": 1, "d_model": 4, "n_heads": 1, "n_kv_heads": 1, "head_dim": 4,
                                 "ffn_dim": 8, "vocab_size": 16}, "dtype": {"weights": "float32",
                                                                           "activations": "float32", "kv": "float32"}}
    data, why = own_prediction(wl, identity, microbench.skipped("not measured"), 4)
    assert data is None and why.startswith("no roofs")
    data, why = own_prediction(wl, {}, {"memcpy_gbps": {"peak": 1.0}, "matmul_tflops": {"peak": 1.0}}, 4)
    assert data is None and why.startswith("no model shape: manifest.json: no model.architecture")
    params = {"memcpy_gbps": {"peak": 2.0, "median": 1.0}, "matmul_tflops": {"peak": 2e-3, "median": 1e-3}}
    data, why = own_prediction(wl, identity, params, 4)
    doc = check(json.loads(data), "own")
    assert doc["roofs"]["sustained"]["memory"]["value"] == 1.0 and doc["requests"][0]["prompt_tokens"] == 40


def test_a_changed_prediction_file_stops_the_capture_naming_it(tmp_path):
    bad = tmp_path / "pred.json"
    bad.write_text(json.dumps({"schema": SCHEMA, "max_batch": 0}))
    with pytest.raises(PredictionError, match=r"pred\.json: field max_batch = 0"):
        capture(Workload.load(_workload(tmp_path)), tmp_path / "run",
                CaptureOptions(model=tmp_path / "never-loaded.gguf", prediction=bad))
    assert not (tmp_path / "run").exists()  # refused before anything was recorded


@pytest.fixture(scope="module")
def registered_run(bundle, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("registered")
    run = tmp / "run"
    capture(Workload.load(_workload(tmp)), run, CaptureOptions(max_num_seqs=4), bundle=bundle)
    reconstruct(run)
    return run


def test_the_capture_registers_its_prediction_before_the_first_event(registered_run):
    manifest = json.loads((registered_run / "manifest.json").read_text())
    block = manifest["prediction"]
    data = (registered_run / "prediction.json").read_bytes()
    assert block["sha256"] == hashlib.sha256(data).hexdigest() and block["file"] == "prediction.json"
    params = manifest["device_params"]
    assert params["source"] == "microbenchmark" and params["memcpy_gbps"]["peak"] >= params["memcpy_gbps"]["median"]
    with duckdb.connect(str(registered_run / "ledger.duckdb"), read_only=True) as con:
        reg = con.execute("SELECT valid, predates_data, lead_ms, registered_ns, first_event_ns, clock "
                          "FROM prediction_registration").fetchall()
        first = con.execute("SELECT min(ts_ns) FROM events WHERE clock = ?", [block["registered"]["clock"]]).fetchone()[0]
        rows = con.execute("SELECT class, n_attempts, n_ttft, ttft_lower_ms, ttft_below_bound, tpot_below_bound "
                           "FROM prediction_check").fetchall()
    assert reg == [(True, True, pytest.approx((first - block["registered"]["mono_ns"]) / 1e6),
                    block["registered"]["mono_ns"], first, block["registered"]["clock"])]
    assert reg[0][2] > 0
    assert [r[:3] for r in rows] == [("chat", 3, 3)]
    assert rows[0][3] > 0 and rows[0][4] == 0 and rows[0][5] == 0  # a bound is a bound


def test_a_prediction_changed_after_registration_is_a_gap(registered_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(registered_run, run)
    doc = json.loads((run / "prediction.json").read_text())
    doc["requests"][0]["ttft_lower_ms"] = 0.0
    (run / "prediction.json").write_text(json.dumps(doc))
    reconstruct(run)
    with duckdb.connect(str(run / "ledger.duckdb"), read_only=True) as con:
        assert con.execute("SELECT valid, predates_data FROM prediction_registration").fetchall() == [(False, None)]
        assert con.execute("SELECT count(*) FROM prediction_check").fetchone()[0] == 0
        gaps = con.execute("SELECT subject_id, detail FROM gaps WHERE subject_id = 'prediction.json'").fetchall()
    assert len(gaps) == 1 and "changed after registration" in gaps[0][1]
    # a capture that registered none says why in its manifest: no check, no gap
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["prediction"] = {"skipped": "no roofs"}
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "prediction.json").unlink()
    reconstruct(run)
    with duckdb.connect(str(run / "ledger.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM prediction_registration").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM gaps WHERE subject_id = 'prediction.json'").fetchone()[0] == 0


def test_the_report_draws_the_roofline_residuals_fit_and_the_registered_prediction(registered_run, tmp_path):
    import re

    from test_report import load_in_browser

    from inferledger.cli.summary import print_summary
    from inferledger.report.build import build_report

    report = build_report(registered_run, tmp_path / "report.html")
    dom, log = load_in_browser(report.path, tmp_path)
    hook = json.loads(re.search(r'<pre id="test-hook">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    assert hook["errors"] == [], hook
    html = report.path.read_text()
    for panel in ("a-roofline", "a-residuals", "a-calibration", "a-prediction", "a-roofline-fig",
                  "a-resid-num_seqs", "a-resid-context_tokens", "a-fit-fig"):
        assert f'id="{panel}"' in dom, panel
    roofline = dom[dom.index('id="a-roofline"'):dom.index('id="a-residuals"')]
    assert "main-svg" in roofline  # the chart was drawn
    assert "peak roof:" in html and "sustained roof:" in html and "(microbenchmark)" in html  # labelled roofs
    prediction = dom[dom.index('id="a-prediction"'):]
    assert re.search(r"registered [0-9.,]+ ms before the run's first event on mono:", prediction)
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    print_summary(registered_run / "ledger.duckdb", Console(file=out, width=300))
    assert re.search(r"workload model: median step at \d+ % of its bound .* dominant residual source: ", out.getvalue())


def test_the_matmul_roof_times_the_engines_own_linear(monkeypatch):
    # the engine multiplies through engine.cpu_linear (the panel kernel where bf16 is native, the gemv
    # kernel in fp32): a roof timed on another op could be slower than the steps it bounds
    import torch

    from inferledger.engine import cpu_kernels, cpu_linear

    calls = []
    real = cpu_linear.linear
    monkeypatch.setattr(cpu_linear, "linear",
                        lambda x, w, b, kind: calls.append((tuple(x.shape), kind, w.dim())) or real(x, w, b, kind))
    shapes = microbench.linear_shapes(SMOL, 2, 4)
    microbench.measure("cpu", torch.bfloat16, shapes, timer=fake_timer(), stream_bytes=4 << 20,
                       matmul_repeats=1, stream_repeats=1, slice_s=0.0)
    assert {c[0] for c in calls} == {(s["m"], s["k"]) for s in shapes}
    panels = cpu_linear.panelable(torch.empty(16, 2, dtype=torch.bfloat16))
    assert panels == (cpu_linear.packable(torch.empty(2, 2, dtype=torch.bfloat16)) and cpu_kernels.panel_kernel())
    assert {c[1] for c in calls} == {"kernels" if panels else "torch"}  # prepared exactly where the engine prepares its weights
    assert {c[2] for c in calls} == {4 if panels else 2}  # over the panel copies, as the step's, where it has them
    calls.clear()
    microbench.measure("cpu", torch.float32, shapes, timer=fake_timer(), stream_bytes=4 << 20,
                       matmul_repeats=1, stream_repeats=1, slice_s=0.0)
    assert {c[1] for c in calls} == {"kernels"}  # fp32: the kernel (this machine builds it), as the engine's step



# ---- a prediction belongs to its run, and is strict JSON ---------------------------------------------

def _doc(tmp_path) -> dict:
    from inferledger.collectors.capture.registration import own_prediction

    identity = {"architecture": {"n_layers": 1, "d_model": 4, "n_heads": 1, "n_kv_heads": 1, "head_dim": 4,
                                 "ffn_dim": 8, "vocab_size": 16}, "dtype": {"weights": "float32",
                                                                           "activations": "float32", "kv": "float32"}}
    params = {"memcpy_gbps": {"peak": 2.0, "median": 1.0}, "matmul_tflops": {"peak": 2e-3, "median": 1e-3}}
    data, _ = own_prediction(Workload.load(_workload(tmp_path)), identity, params, 4)
    return json.loads(data)


@pytest.mark.parametrize("text, field", [
    ("Infinity", "Infinity is not a JSON number"), ("NaN", "NaN is not a JSON number"),
    ("-Infinity", "-Infinity is not a JSON number"), ("1e400", "1e400 overflows a double"),
])
def test_infinity_and_nan_are_refused_as_roofs_bounds_or_range_ends(tmp_path, text, field):
    from inferledger.costmodel.prediction import load

    doc = _doc(tmp_path)
    doc["roofs"]["peak"]["compute"]["value"] = "@"
    raw = json.dumps(doc).replace('"@"', text)
    with pytest.raises(PredictionError, match=f"pred.json: not valid JSON \\({field}"):
        load(raw, "pred.json")
    doc = _doc(tmp_path)
    doc["requests"][0]["ttft_expected_ms"]["sustained"][1] = float("inf")
    with pytest.raises(PredictionError, match=r"requests\[0\]\.ttft_expected_ms\.sustained = \[.*inf\]"):
        check(doc, "pred.json")


@pytest.mark.parametrize("edit, refusal", [
    (lambda d: d["requests"].append(dict(d["requests"][0])),
     "field requests[1].class = 'chat': expected a class name no other request shape has"),
    (lambda d: d["requests"][0].update(prompt_tokens=10 ** 30),
     "field requests[0].prompt_tokens = 1000000000000000000000000000000: expected an integer in 1..16777216"),
    (lambda d: d["requests"][0].update(cached_tokens="all"),
     "field requests[0].cached_tokens = 'all': expected an integer in 0..prompt_tokens - 1"),
    (lambda d: d["requests"][0].update(cached_tokens=40), "field requests[0].cached_tokens = 40: expected"),
    (lambda d: d.update(max_batch=10 ** 20), "field max_batch = 100000000000000000000: expected an integer in 1.."),
])
def test_a_prediction_whose_shapes_no_run_can_hold_is_refused_naming_the_field(tmp_path, edit, refusal):
    """Two shapes for one class (which would an attempt be held to?), token counts no request has, a
    cached prefix as long as the prompt: refused by field, not stored to fail in the ledger."""
    doc = _doc(tmp_path)
    check(doc, "pred.json")
    edit(doc)
    with pytest.raises(PredictionError) as info:
        check(doc, "pred.json")
    assert str(info.value).startswith("pred.json: " + refusal)


def test_a_deeply_nested_file_is_refused_by_name(tmp_path):
    from inferledger.costmodel.prediction import load
    from inferledger.studies.predict import read_device_params

    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(PredictionError, match="pred.json: nested too deeply"):
        load(deep, "pred.json")
    (tmp_path / "params.json").write_text(deep)
    with pytest.raises(PredictionError, match="params.json: nested too deeply"):
        read_device_params(tmp_path / "params.json")


def test_a_median_above_the_peak_is_refused_not_an_expected_range_below_the_bound():
    from inferledger.costmodel.roofs import Roof

    peak = Roofs(Roof("compute", 1.0, "TFLOP/s", "microbenchmark", "peak", "p"),
                 Roof("memory", 10.0, "GB/s", "microbenchmark", "peak", "p"))
    high = Roofs(Roof("compute", 0.5, "TFLOP/s", "microbenchmark", "sustained", "m"),
                 Roof("memory", 50.0, "GB/s", "microbenchmark", "sustained", "m"))
    shapes = [{"class": "c", "prompt_tokens": 40, "cached_tokens": 0, "output_tokens": 6, "weight": 1.0}]
    with pytest.raises(PredictionError, match=r"roofs\.sustained\.memory = 50 GB/s is above roofs\.peak\.memory = 10"):
        predict(SMOL.shape, shapes, peak, max_batch=4, sustained=high)
    doc = predict(SMOL.shape, shapes, peak, max_batch=4)
    doc["requests"][0]["ttft_expected_ms"]["sustained"] = [doc["requests"][0]["ttft_lower_ms"] / 5, 1e9]
    with pytest.raises(PredictionError, match=r"starts below its own lower bound ttft_lower_ms"):
        check(doc, "pred.json")


def test_predict_writes_strict_json_or_refuses_naming_the_figure():
    from inferledger.costmodel.prediction import dumps

    with pytest.raises(PredictionError, match=r"prediction: requests\[0\]\.ttft_lower_ms = inf: not a finite number"):
        dumps({"schema": SCHEMA, "requests": [{"ttft_lower_ms": float("inf")}]})


def test_a_prediction_for_another_workload_shape_or_device_is_not_this_runs(tmp_path):
    from inferledger.ledger.prediction_check import _not_this_run
    from inferledger.probes.run_folder import Manifest

    doc = _doc(tmp_path)
    run = Manifest({"workload": {"sha256": doc["workload"]["sha256"]},
                    "model": {"architecture": {"n_layers": 1, "d_model": 4, "n_heads": 1, "n_kv_heads": 1,
                                               "head_dim": 4, "ffn_dim": 8, "vocab_size": 16},
                              "dtype": {"weights": "float32", "activations": "float32", "kv": "float32"}},
                    "device_params": {"device_name": "cpu-a"}})
    assert _not_this_run(doc, run) == []
    doc["workload"]["sha256"] = "f" * 64
    doc["model_shape"]["layers"] = 2
    doc["device"]["name"] = "cpu-b"
    wrong = _not_this_run(doc, run)
    assert wrong[0].startswith("workload sha256 ffffffffffff… is not the run's ")
    assert wrong[1:] == ["model shape layers 2 (the run's: 1)", "device 'cpu-b' is not the run's 'cpu-a'"]
    # a prediction that names no workload or shape cannot be shown to be this run's: it differs
    bare = {k: v for k, v in doc.items() if k not in ("workload", "model_shape", "device")}
    assert _not_this_run(bare, run) == [
        f"it names no workload sha256 (the run's: {run.block('workload')['sha256'][:12]}…)",
        "it names no model shape (the run's: layers 1, d_model 4, n_heads 1, n_kv_heads 1, head_dim 4, ffn 8, "
        "vocab 16, tied_embeddings False, weight_bytes_per_param 4, act_bytes 4, kv_bytes 4)"]


def test_a_registered_prediction_too_long_to_be_one_is_a_gap_not_read(registered_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(registered_run, run)
    with open(run / "prediction.json", "r+b") as f:  # 20 MiB, sparse: read whole, it was hashed and parsed
        f.truncate(20 << 20)
    reconstruct(run)
    with duckdb.connect(str(run / "ledger.duckdb"), read_only=True) as con:
        assert con.execute("SELECT valid FROM prediction_registration").fetchall() == [(False,)]
        assert con.execute("SELECT detail FROM gaps WHERE subject_id = 'prediction.json'").fetchall() == [
            (f"{run / 'prediction.json'}: 20971520 bytes: a prediction is at most 16777216 bytes",)]


def test_a_registered_prediction_of_another_run_is_not_valid_with_a_gap(registered_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(registered_run, run)
    doc = json.loads((run / "prediction.json").read_text())
    doc["workload"]["sha256"] = "0" * 64
    data = json.dumps(doc).encode()
    (run / "prediction.json").write_bytes(data)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["prediction"]["sha256"] = hashlib.sha256(data).hexdigest()  # registered as it is: not changed after
    (run / "manifest.json").write_text(json.dumps(manifest))
    reconstruct(run)
    with duckdb.connect(str(run / "ledger.duckdb"), read_only=True) as con:
        assert con.execute("SELECT valid FROM prediction_registration").fetchall() == [(False,)]
        assert con.execute("SELECT count(*) FROM prediction_check").fetchone()[0] == 0
        gaps = con.execute("SELECT detail FROM gaps WHERE subject_id = 'prediction.json'").fetchall()
    assert len(gaps) == 1 and "made for another run: workload sha256 000000000000… is not the run's" in gaps[0][0]
    from inferledger.report.build import build_report

    html = build_report(run, tmp_path / "report.html").path.read_text()
    section = html[html.index('id="a-prediction"'):]
    assert "not valid: prediction.json was made for another run: workload sha256 000000000000" in section


def test_generated_prediction_files_load_or_are_refused_by_name(tmp_path):
    """Any bytes as a prediction file: a checked document, or a PredictionError naming the file; never
    another exception (a RecursionError, a TypeError deep in the check)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from inferledger.costmodel.prediction import load

    good = _doc(tmp_path)
    leaves = st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=4) \
        | st.sampled_from(["Infinity", "NaN", "-Infinity", "1e400"])
    json_like = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                             | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)
    paths = [("max_batch",), ("schema",), ("roofs", "peak", "compute", "value"), ("roofs", "peak"),
             ("requests", 0, "ttft_lower_ms"), ("requests", 0, "ttft_expected_ms", "sustained"),
             ("requests", 0, "tpot_expected_ms"), ("requests", 0, "prompt_tokens"), ("requests",),
             ("workload", "sha256"), ("model_shape",), ("device",)]

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.sampled_from(paths), json_like), max_size=3), st.booleans())
    def check(changes, raw_tokens):
        doc = json.loads(json.dumps(good))
        tokens = {}
        for n, (path, value) in enumerate(changes):
            target = doc
            for key in path[:-1]:
                target = target[key] if isinstance(target, dict) and key in target or isinstance(target, list) \
                    and isinstance(key, int) and key < len(target) else None
                if target is None:
                    break
            if target is None or not isinstance(target, (dict, list)):
                continue
            if isinstance(target, list) and not (isinstance(path[-1], int) and path[-1] < len(target)):
                continue
            if raw_tokens and isinstance(value, str) and value in ("Infinity", "NaN", "-Infinity", "1e400"):
                tokens[f'"@{n}"'], value = value, f"@{n}"  # as a bare token in the file, not a string
            target[path[-1]] = value
        text = json.dumps(doc)
        for placeholder, token in tokens.items():
            text = text.replace(placeholder, token)
        try:
            out = load(text, "pred.json")
        except PredictionError as exc:
            assert str(exc).startswith("pred.json: ")
            return
        assert json.loads(json.dumps(out, allow_nan=False)) == out  # what loads is strict JSON

    check()


@pytest.mark.parametrize("params, refusal", [
    ('{"memcpy_gbps": {"peak": Infinity, "median": 1.0}, "matmul_tflops": {"peak": 1.0, "median": 0.5}}',
     "Infinity is not a JSON number"),
    ('{"memcpy_gbps": {"peak": 10.0, "median": 50.0}, "matmul_tflops": {"peak": 1.0, "median": 0.5}}',
     "roofs.sustained.memory = 50 GB/s is above roofs.peak.memory = 10 GB/s"),
])
def test_predict_refuses_roofs_that_are_not_finite_or_a_median_above_its_peak(tmp_path, params, refusal):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
                               "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
                               "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    (tmp_path / "params.json").write_text(params)
    out = tmp_path / "pred.json"
    res = CliRunner().invoke(app, ["predict", "-w", str(_workload(tmp_path)), "--model-config", str(cfg),
                                   "--device-params", str(tmp_path / "params.json"), "-o", str(out)])
    assert res.exit_code == 2 and refusal in res.output, res.output
    assert not out.exists()


def _smol_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
                               "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
                               "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    return cfg


@pytest.mark.parametrize("params, refusal", [
    ('{"memcpy_gbps": {"peak": 1e308, "median": 1}, "matmul_tflops": {"peak": 1.0, "median": 0.5}}',
     "memcpy_gbps.peak: must be a number of GB/s in 0.001..100000, not 1e+308"),
    ('{"memcpy_gbps": {"peak": 5, "median": -1}, "matmul_tflops": {"peak": 1.0, "median": 0.5}}',
     "memcpy_gbps.median: must be a number of GB/s in 0.001..100000, not -1"),
    ('{"memcpy_gbps": {"peak": 5, "median": 1}, "matmul_tflops": {"peak": 1e-300, "median": 1e-300}}',
     "matmul_tflops.peak: must be a number of TFLOP/s in 1e-06..10000, not 1e-300"),
    ('{"memcpy_gbps": {"peak": 5, "median": 1}, "matmul_tflops": {"peak": "1", "median": 0.5}}',
     'matmul_tflops.peak: must be a number of TFLOP/s in 1e-06..10000, not "1"'),
    ('{"device_params": {"memcpy_gbps": {"peak": 5, "median": 1}, "matmul_tflops": {"peak": 1, "median": 0.5}, '
     '"device_name": 7}}', "device_name: must be a string, not 7"),
    ('{"run_id": "r", "device_params": {"schema": 1, "skipped": "not measured (capture --no-microbench)", "source": null}}',
     "no device parameters: its capture did not measure them (not measured (capture --no-microbench))"),
])
def test_device_parameters_that_no_device_has_are_refused_by_key(tmp_path, params, refusal):
    """A median of -1 was taken as no median (a silently different range), 1e-300 TFLOP/s made bounds of
    10^300 ms, a name of 7 stood as the device's name."""
    (tmp_path / "params.json").write_text(params)
    out = tmp_path / "pred.json"
    res = CliRunner().invoke(app, ["predict", "-w", str(_workload(tmp_path)), "--model-config", str(_smol_config(tmp_path)),
                                   "--device-params", str(tmp_path / "params.json"), "-o", str(out)])
    assert res.exit_code == 2 and f"params.json: {refusal}" in res.output, res.output
    assert not out.exists()


def test_a_batch_limit_the_engine_cannot_take_is_refused_before_planning(tmp_path):
    """--max-num-seqs 10^8 planned steps for minutes; the engine takes 1..4096 (serve and capture refuse more)."""
    out = tmp_path / "pred.json"
    res = CliRunner().invoke(app, ["predict", "-w", str(_workload(tmp_path)), "--model-config", str(_smol_config(tmp_path)),
                                   "--device", "H100", "--max-num-seqs", "100000000", "-o", str(out)],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "Invalid value for '--max-num-seqs'" in res.output, res.output
    assert not out.exists()


def test_generated_device_parameters_predict_or_are_refused_by_key(tmp_path):
    """Device parameter files of hostile values (0, negative, tiny, huge, text, booleans, null, lists,
    Infinity / NaN / 1e400 tokens, keys missing): `predict` writes a strict-JSON prediction of finite,
    non-negative bounds, or exits 2 naming the file; never a traceback."""
    import copy
    import math
    import re
    import time

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    hostile = st.sampled_from([0, -1, 1e-9, 1e-4, 0.02, 1, 5.5, 300, 1e5, 2e5, 1e308, "5", True, None, [], {},
                               "@Infinity", "@NaN", "@1e400", "@-Infinity", "<gone>"]) | st.floats(1e-3, 1e4)
    good = st.floats(1e-3, 1e4)
    params = st.fixed_dictionaries({"memcpy_gbps": st.fixed_dictionaries({"peak": good, "median": good}),
                                    "matmul_tflops": st.fixed_dictionaries({"peak": good, "median": good}),
                                    "device_name": st.just("cpu-a")})
    where = st.sampled_from([("memcpy_gbps", "peak"), ("memcpy_gbps", "median"), ("matmul_tflops", "peak"),
                             ("matmul_tflops", "median"), ("device_name",), ("memcpy_gbps",), ("matmul_tflops",)])
    edits = st.lists(st.tuples(where, hostile), max_size=3)
    workload, cfg = _workload(tmp_path), _smol_config(tmp_path)
    out = tmp_path / "pred.json"

    def finite(doc) -> bool:
        if isinstance(doc, dict):
            return all(finite(v) for v in doc.values())
        if isinstance(doc, list):
            return all(finite(v) for v in doc)
        return not isinstance(doc, float) or math.isfinite(doc)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(params, edits, st.booleans())
    def check(doc, changes, wrapped):
        for path, value in changes:  # a good file with up to three values made hostile (or taken out)
            target = doc
            for key in path[:-1]:
                target = target.setdefault(key, {}) if isinstance(target.get(key), dict) else {}
            if value == "<gone>":
                target.pop(path[-1], None)
            else:  # a copy: sampled_from hands every example the same {} and [], which an edit would then fill
                target[path[-1]] = copy.deepcopy(value)  # (an earlier example's edits made one hold itself)
        text = json.dumps({"device_params": doc} if wrapped else doc)
        for token in ("Infinity", "NaN", "1e400", "-Infinity"):
            text = text.replace(f'"@{token}"', token)
        (tmp_path / "params.json").write_text(text)
        out.unlink(missing_ok=True)
        t0 = time.perf_counter()
        res = CliRunner().invoke(app, ["predict", "-w", str(workload), "--model-config", str(cfg),
                                       "--device-params", str(tmp_path / "params.json"), "-o", str(out)])
        assert time.perf_counter() - t0 < 10
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
        if res.exit_code == 2:  # named by file and key, or the two roofs that disagree by theirs
            flat = res.output.replace("\n", " ")
            assert not out.exists() and (f"error: {tmp_path / 'params.json'}: " in flat or
                                         re.search(r"roofs\.sustained\.\w+ = .* is above roofs\.peak\.", flat)), flat
            return
        assert res.exit_code == 0, res.output
        pred = json.loads(out.read_text())  # strict JSON: no NaN / Infinity token
        assert finite(pred)
        assert all(r["ttft_lower_ms"] >= 0 and r["ttft_lower_ms"] < 1e9 for r in pred["requests"])

    check()


def test_the_ttft_bound_of_a_cached_prefix_counts_the_tokens_computed():
    """128 prompt tokens of which the prefix cache served 112: the bound is a 16-token prefill at context
    112. By hand on SmolLM2-135M (30 layers, d 576, q 576, kv 192, ffn 1536, vocab 49152) at 1 TFLOP/s
    with memory free: linear 2 · 16 · 30 · (576 · 960 + 576 · 576 + 576 · 3072 + 1536 · 576) =
    3,397,386,240 FLOP; the LM head 2 · 576 · 49152 = 56,623,104 (one logit row); attention 4 · 30 · 576 ·
    (16 · 112 + 16 · 17 / 2) = 133,263,360: 3,587,272,704 FLOP, 3.587 ms."""
    smol = ModelShape(30, 576, 9, 3, 64, 1536, 49152, True, 2, 2, 2)
    shape = {"class": "cached", "prompt_tokens": 128, "cached_tokens": 112, "output_tokens": 4, "weight": 1.0}
    doc = predict(smol, [shape], Roofs.declared(1.0, 1e9), max_batch=1)
    assert doc["requests"][0]["ttft_lower_ms"] == pytest.approx(3.587272704, rel=1e-6)


def test_an_attempt_served_from_the_prefix_cache_is_held_to_the_bound_of_what_it_computed():
    """Two shapes of 128 prompt tokens: `chat` (nothing cached, bound 20 ms) and `cached` (112 cached,
    bound 3 ms). A1 had 112 tokens served by the cache (16 computed, TTFT 5 ms), A2 none (128 computed,
    TTFT 30 ms). Matched by the prompt alone, A1 fell to `chat` and "beat" its 20 ms bound; matched by the
    tokens computed, A1 is `cached` (5 ≥ 3) and A2 `chat` (30 ≥ 20): no bound is beaten."""
    from inferledger.ledger.prediction_check import PREDICTION_CHECK

    con = _check_connection()
    # marks: the engine's prompt count and what its prefix cache served (engine.prefill attrs.cached_tokens)
    con.execute("CREATE TABLE marks AS SELECT * FROM (VALUES ('A1', 128, 112), ('A2', 128, 0)) "
                "t(attempt_id, n_prompt_engine, n_prompt_cached)")
    con.execute("CREATE TABLE request_metrics AS SELECT * FROM (VALUES ('A1', 'T1', 5.0, 1.0), ('A2', 'T2', 30.0, 1.0)) "
                "t(attempt_id, task_id, ttft_server_ms, tpot_server_ms)")
    _shapes(con, "('chat', 128, 0, 4, 20.0, 0), ('cached', 128, 112, 4, 3.0, 1)")
    _task_classes(con, {})  # the run does not say which class a task is
    con.execute(PREDICTION_CHECK)
    got = con.execute("SELECT class, n_attempts, ttft_p50_ms, ttft_below_bound FROM prediction_check ORDER BY class").fetchall()
    assert got == [("cached", 1, 5.0, 0), ("chat", 1, 30.0, 0)]


def _check_connection() -> duckdb.DuckDBPyConnection:
    """An empty database with the ledger's macros and a run id, for PREDICTION_CHECK over hand-made tables."""
    con = duckdb.connect()
    con.execute((Path(__file__).resolve().parent.parent / "ledger" / "macros.sql").read_text())
    con.execute("SET VARIABLE run_id = 'r'")
    return con


def _shapes(con, values: str) -> None:
    cols = ", ".join(f"NULL::DOUBLE AS {c}" for c in ("ttft_sustained_low_ms", "ttft_sustained_high_ms",
                                                       "ttft_fit_low_ms", "ttft_fit_high_ms", "tpot_sustained_low_ms",
                                                       "tpot_sustained_high_ms", "tpot_fit_low_ms", "tpot_fit_high_ms"))
    con.execute(f"CREATE TABLE prediction_shapes AS SELECT t.*, {cols}, 0.1 AS tpot_lower_ms FROM (VALUES {values}) "
                "t(class, prompt_tokens, cached_tokens, output_tokens, ttft_lower_ms, ord)")


def _task_classes(con, classes: dict) -> None:
    """tasks: one row per task, with the class the client dealt it (task.start attrs.task_class)."""
    con.execute("CREATE TABLE tasks (task_id VARCHAR, task_class VARCHAR)")
    for task, cls in classes.items():
        con.execute("INSERT INTO tasks VALUES (?, ?)", [task, cls])


def test_an_attempt_is_held_to_its_own_classs_shape_when_the_run_names_its_class():
    """Three classes whose shapes assume the same 64 computed tokens: `chat` (64, none cached), `session`
    (64), `long` (320, 256 cached). By computed tokens alone every attempt fell to `chat`, the first
    listed. With task.start's task_class each is held to its own: L1 (long, 64 computed, 25 ms) to `long`,
    S1 (session turn 1, 64 computed) and S2 (a later turn, 140 computed) to `session`; S3 (a turn whose
    history the cache served: 40 computed, fewer than its shape assumes) to none, so no bound is wrongly
    beaten; C1 to `chat`."""
    from inferledger.ledger.prediction_check import PREDICTION_CHECK

    con = _check_connection()
    con.execute("CREATE TABLE marks AS SELECT * FROM (VALUES ('C1', 64, 0), ('L1', 320, 256), ('S1', 64, 0), "
                "('S2', 140, 0), ('S3', 140, 100)) t(attempt_id, n_prompt_engine, n_prompt_cached)")
    con.execute("CREATE TABLE request_metrics AS SELECT * FROM (VALUES ('C1', 'T1', 10.0, 1.0), "
                "('L1', 'T2', 25.0, 1.0), ('S1', 'T3', 11.0, 1.0), ('S2', 'T3', 19.0, 1.0), ('S3', 'T3', 6.0, 1.0)) "
                "t(attempt_id, task_id, ttft_server_ms, tpot_server_ms)")
    _shapes(con, "('chat', 64, 0, 4, 8.0, 0), ('session', 64, 0, 4, 8.0, 1), ('long', 320, 256, 4, 8.0, 2)")
    _task_classes(con, {"T1": "chat", "T2": "long", "T3": "session"})
    con.execute(PREDICTION_CHECK)
    got = con.execute("SELECT class, n_attempts, ttft_p50_ms, ttft_below_bound FROM prediction_check "
                      "ORDER BY class").fetchall()
    assert got == [("chat", 1, 10.0, 0), ("long", 1, 25.0, 0), ("session", 2, 15.0, 0)]


def test_the_last_level_cache_is_read_from_sysfs_and_the_stream_is_larger(tmp_path):
    for i, (level, kind, size) in enumerate(((1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                                             (3, "Unified", "32768K"))):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n"), (d / "type").write_text(f"{kind}\n"), (d / "size").write_text(f"{size}\n")
    assert microbench.llc_bytes(str(tmp_path)) == 32 << 20
    assert microbench.llc_bytes(str(tmp_path / "none")) is None
    # 4 x a 32 MiB LLC = 128 MiB, even for 10 MB of weights; 64 MiB without a known cache
    assert microbench.stream_bytes_for(10_000_000, 32 << 20) == 128 << 20
    assert microbench.stream_bytes_for(10_000_000) == 64 << 20
    assert microbench.stream_bytes_for(300_000_000, 64 << 20) == 256 << 20


def test_repeats_over_the_run_are_marked_in_samples_and_the_best_is_the_roof():
    import torch

    cfg = SimpleNamespace(shape=ModelShape(1, 8, 1, 1, 8, 16, 32, False, 4, 4, 4))
    bundle = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32, config=cfg, model=torch.nn.Linear(8, 8))
    start = {"source": "microbenchmark", "placement": None,
             "memcpy_gbps": {"peak": 10.0, "median": 9.0, "label": "start"},
             "stream_read_gbps": {"peak": 10.0, "buffer_bytes": 1 << 20},
             "matmul_tflops": {"peak": 0.5, "median": 0.4, "at": "qkv", "m": 2,
                               "shapes": [{"name": "qkv", "m": 2, "k": 8, "n": 24}]}}
    samples, clock = [], iter(range(1_000, 10_000_000_000, 1_000_000_000))
    bench = microbench.Rebench(bundle, start, lambda ts, v: samples.append((ts, v)), timer=fake_timer(),
                               now_ns=lambda: next(clock))
    got = bench.run("idle")
    # every timed call lasts 1 ms: 1 MiB read in 1 ms, copied (2 MiB moved) in 1 ms; 2 · 2 · 8 · 24 FLOP in 1 ms
    assert got["memcpy_gbps"] == pytest.approx(2 * 1.048576) and got["matmul_tflops"] == pytest.approx(768 / 1e-3 / 1e12)
    assert samples == [(1_000, 1.0), (1_000_001_000, 0.0)] and got["start_ns"] == 1_000
    assert not bench.due(None)  # no arrival left: the end's repeat comes next
    merged = microbench.with_repeats(start, bench.repeats + [{"at": "end", "memcpy_gbps": 12.5, "matmul_tflops": 0.3}],
                                     "mono:h")
    assert merged["memcpy_gbps"]["peak"] == 12.5 and merged["memcpy_gbps"]["best_at"] == "end"
    assert merged["memcpy_gbps"]["start_peak"] == 10.0 and merged["matmul_tflops"]["peak"] == 0.5
    assert [r["at"] for r in merged["repeats"]["runs"]] == ["start", "idle", "end"]
    assert merged["memcpy_gbps"]["label"] == ("the best of 3 measurements over the run (start × 1, idle × 1, end × 1); "
                                              "best at end")
    assert microbench.with_repeats(microbench.skipped("no"), bench.repeats) == microbench.skipped("no")
    # a repeat a task arrived during is listed but is no roof
    left = microbench.with_repeats(start, [{"at": "idle", "memcpy_gbps": 99.0, "matmul_tflops": 9.0, "overlapped": True}])
    assert left["memcpy_gbps"]["peak"] == 10.0 and len(left["repeats"]["runs"]) == 2
    assert left["memcpy_gbps"]["label"].endswith("1 left out: a task arrived during it); best at start")


def test_a_json_input_too_long_to_be_one_is_refused_before_it_is_read(tmp_path):
    """A prediction, device-parameters or config file of 20 MiB (sparse: nothing is written) was read
    whole and parsed (JSON takes several times its size in memory): refused by its size, naming it."""
    from inferledger.collectors.capture.registration import read_prediction
    from inferledger.probes.model_shape import ShapeError
    from inferledger.studies.predict import read_device_params

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(20 << 20)
    with pytest.raises(PredictionError, match=rf"^{big}: 20971520 bytes: the prediction is at most 16777216 bytes$"):
        read_prediction(big)
    with pytest.raises(PredictionError, match=r": 20971520 bytes: a device-parameters file is at most 16777216 bytes$"):
        read_device_params(big)
    with pytest.raises(ShapeError, match=r": 20971520 bytes: a config.json is at most 16777216 bytes$"):
        ModelShape.from_hf_config(big)


def test_the_verdict_judges_the_step_fits_range_where_the_prediction_carries_one(registered_run, tmp_path):
    """A prediction made with `predict --fit RUN` carries the engine's own efficiency; the summary's verdict
    judged it against the roofs' sustained range all the same. Here each request of the registered file gets
    a step-fit TTFT range of [1, 2] ms (below every measured TTFT: missed, above by (p50 − 2) / 2) and a
    TPOT range of [0.001, 100,000] ms (met); the same run without a fit is judged at the roofs."""
    import shutil

    from typer.testing import CliRunner

    from inferledger.cli.app import app

    def verdict(run):
        res = CliRunner().invoke(app, ["summary", str(run), "--format", "json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)["verdict_prediction"]

    plain = verdict(registered_run)
    assert plain and {r["basis"] for r in plain} == {"roofs"}
    run = tmp_path / "run"
    shutil.copytree(registered_run, run)
    doc = json.loads((run / "prediction.json").read_text())
    for r in doc["requests"]:
        r["ttft_expected_ms"]["fit"], r["tpot_expected_ms"]["fit"] = [1.0, 2.0], [0.001, 100000.0]
    data = json.dumps(doc).encode()
    (run / "prediction.json").write_bytes(data)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["prediction"]["sha256"] = hashlib.sha256(data).hexdigest()  # registered so: still valid
    (run / "manifest.json").write_text(json.dumps(manifest))
    reconstruct(run)
    rows = {r["figure"]: r for r in verdict(run)}
    ttft, tpot = rows["ttft"], rows["tpot"]
    assert (ttft["basis"], ttft["predicted_low_ms"], ttft["predicted_high_ms"]) == ("step fit", 1.0, 2.0)
    assert ttft["verdict"] == "missed: above"
    assert ttft["off_pct"] == pytest.approx((ttft["measured_p50_ms"] - 2.0) / 2.0 * 100)
    assert (tpot["basis"], tpot["verdict"], tpot["predicted_low_ms"]) == ("step fit", "met", 0.001)
    res = CliRunner().invoke(app, ["summary", str(run)], env={"COLUMNS": "250"})
    assert "the prediction's ranges through the registered step fit" in res.output


def _register(run: Path, doc: dict) -> None:
    """Write `doc` as the run's prediction.json and register its hash, as a capture would have."""
    data = json.dumps(doc).encode()
    (run / "prediction.json").write_bytes(data)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["prediction"]["sha256"] = hashlib.sha256(data).hexdigest()
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_a_fit_range_whose_busy_end_the_fit_could_not_see_is_a_gap_row(registered_run, tmp_path):
    """A step fit trained on steps of one batch size cannot tell its per-sequence terms (held at 0): the
    range's busy end, a step of max_batch = 4 sequences, leaves their cost out. The run's prediction_check
    says so in a gap row; a fit that saw batch sizes 1 to 4 leaves none."""
    import shutil

    from inferledger.ledger.query import open_ledger

    def gaps(fit) -> list[tuple]:
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        shutil.copytree(registered_run, run)
        doc = json.loads((run / "prediction.json").read_text())
        assert doc["max_batch"] == 4
        doc["roofs"]["fit"] = fit.to_dict()
        _register(run, doc)
        reconstruct(run)
        with open_ledger(run) as led:
            return led.rows("SELECT affects, detail FROM gaps WHERE subject_id = 'prediction.json'")[1]

    one = _flat_fit()
    one.covered, one.gap_covered_num_seqs = {"num_seqs": [1, 1]}, [1, 1]
    assert gaps(one) == [("prediction_check ttft_fit_high_ms, tpot_fit_high_ms",
                          "the fit range's busy end: a step of 4 sequences needs ms_per_seq (trained at batch size 1) "
                          "and gap_ms_per_seq (trained at batch size 1), unknown and held at 0: the prediction there "
                          "leaves the cost per sequence out (a run above that end may not have missed it)")]
    seen = _flat_fit()
    seen.covered, seen.gap_covered_num_seqs = {"num_seqs": [1, 4]}, [1, 4]
    assert gaps(seen) == []


def _flat_fit():
    """A step fit whose every step takes α = 5 ms and whose host time between steps is 0.5 ms: its
    expected ranges are [5, 5] ms for TTFT and [5.5, 5.5] ms for TPOT, whatever the shape."""
    from inferledger.costmodel.fit import StepFit

    return StepFit(alpha_ms=5.0, ms_per_gflop=0.0, ms_per_mb=0.0, gap_alpha_ms=0.5, gap_ms_per_seq=0.0,
                   combine="stage_max", kv_factor=0.0, trained_on="an earlier run")


def test_a_capture_given_a_step_fit_registers_its_ranges(bundle, tmp_path):
    run = tmp_path / "run"
    capture(Workload.load(_workload(tmp_path, n=1)), run,
            CaptureOptions(max_num_seqs=4, prediction_fit=_flat_fit()), bundle=bundle)
    doc = json.loads((run / "prediction.json").read_text())
    assert [(r["ttft_expected_ms"]["fit"], r["tpot_expected_ms"]["fit"]) for r in doc["requests"]] == [
        ([5.0, 5.0], [5.5, 5.5])]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["prediction"]["source"].endswith("the step fit of an earlier run)")


def test_capture_fit_is_refused_with_a_prediction_file_a_url_target_or_a_run_without_a_ledger(tmp_path):
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    wl = str(_workload(tmp_path))
    study = tmp_path / "study"  # a study folder: its runs are the runs, not itself
    study.mkdir()
    (study / "study.json").write_text(json.dumps({"study": "load", "state": "complete", "runs": []}))
    cases = [(["--fit", str(tmp_path), "--prediction", str(tmp_path / "p.json")], "--prediction registers a file"),
             (["--fit", str(tmp_path), "--target", "http://127.0.0.1:9"], "a URL target's capture registers no"),
             (["--fit", str(tmp_path)], f"--fit {tmp_path}: no ledger at {tmp_path / 'ledger.duckdb'}; run "
                                         f"`inferledger reconstruct {tmp_path}` first"),
             (["--fit", str(study)], f"--fit {study}: a study folder; name one of its runs ({study}/runs/NAME)")]
    for flags, refusal in cases:
        res = CliRunner().invoke(app, ["capture", "-w", wl, "-o", str(tmp_path / "run"), *flags], env={"COLUMNS": "1000"})
        assert res.exit_code == 2 and "--fit" in res.output and refusal in " ".join(res.output.split()), res.output
        assert not (tmp_path / "run").exists()


def test_a_step_fit_is_not_read_from_a_ledger_other_code_built(registered_run, tmp_path):
    """A ledger built by other ledger code may count its steps another way: `--fit` refuses it, naming the
    file and how to rebuild it, as `fit` and `summary` do."""
    import shutil

    from inferledger.costmodel.prediction import PredictionError
    from inferledger.studies.predict import fit_of

    run = tmp_path / "run"
    shutil.copytree(registered_run, run)
    with duckdb.connect(str(run / "ledger.duckdb")) as con:
        con.execute("UPDATE ledger_build SET modules_sha256 = 'older'")
    with pytest.raises(PredictionError, match=r"--fit .*built by other ledger code .*rebuild it: inferledger reconstruct"):
        fit_of(run)
    assert fit_of(registered_run).n_train > 0


def test_predict_refuses_device_parameters_measured_at_another_dtype(tmp_path):
    """The matmul roof is the engine's own GEMMs at its dtype: a bf16 capture's parameters are not the roofs
    of a float32 prediction (its lower bounds would be the bf16 rate's), so they are refused, not used."""
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"dtype": "bfloat16", "memcpy_gbps": {"peak": 5, "median": 4},
                                  "matmul_tflops": {"peak": 1, "median": 0.5}}))
    out = tmp_path / "pred.json"
    args = ["predict", "-w", str(_workload(tmp_path)), "--model-config", str(_smol_config(tmp_path)),
            "--device-params", str(params), "-o", str(out)]
    res = CliRunner().invoke(app, [*args, "--dtype", "float32"])
    assert res.exit_code == 2 and not out.exists()
    assert (f"--device-params {params}: measured at bfloat16 (its dtype), the prediction computes at float32: give "
            "device parameters measured at float32, or --dtype bfloat16") in " ".join(res.output.split()), res.output
    assert CliRunner().invoke(app, args).exit_code == 0 and out.exists()  # the config's own bfloat16: its roofs


def test_a_registered_step_fit_of_another_engine_is_not_checked_against_the_run(registered_run, tmp_path):
    """`capture --fit RUN` registers RUN's fit whatever engine the capture loads: a fit trained on the model
    at bf16 (2-byte elements) with two threads, registered in this fp32 run of one thread, would judge it by
    another engine's ranges. The fit records its run's engine: prediction_check drops its ranges (the verdict
    holds the run to the roofs') and a gap row names each difference; the run's own engine leaves them."""
    import shutil

    from typer.testing import CliRunner

    from inferledger.cli.app import app
    from inferledger.ledger.query import open_ledger
    from inferledger.probes.run_folder import Manifest

    engine = Manifest.read(registered_run).engine
    assert engine["shape"]["weight_bytes_per_param"] == 4 and engine["threads"] == 1

    def checked(fit_engine, name):
        run = tmp_path / name
        shutil.copytree(registered_run, run)
        doc = json.loads((run / "prediction.json").read_text())
        fit = _flat_fit()
        fit.covered, fit.gap_covered_num_seqs, fit.engine = {"num_seqs": [1, 4]}, [1, 4], fit_engine
        doc["roofs"]["fit"] = fit.to_dict()
        for r in doc["requests"]:
            r["ttft_expected_ms"]["fit"], r["tpot_expected_ms"]["fit"] = [5.0, 5.0], [5.5, 5.5]
        _register(run, doc)
        reconstruct(run)
        with open_ledger(run) as led:
            ranges = led.rows("SELECT ttft_fit_low_ms, tpot_fit_high_ms FROM prediction_check")[1]
            gaps = led.rows("SELECT affects, detail FROM gaps WHERE subject_id = 'prediction.json'")[1]
        res = CliRunner().invoke(app, ["summary", str(run), "--format", "json"])
        return ranges, gaps, {r["basis"] for r in json.loads(res.output)["verdict_prediction"]}

    assert checked(engine, "same") == ([(5.0, 5.5)], [], {"step fit"})
    bf16 = {**engine, "shape": {**engine["shape"], "weight_bytes_per_param": 2, "act_bytes": 2, "kv_bytes": 2},
            "threads": 2}
    ranges, gaps, basis = checked(bf16, "bf16")
    assert ranges == [(None, None)] and basis == {"roofs"}
    assert gaps == [("prediction_check ttft_fit_low_ms, ttft_fit_high_ms, tpot_fit_low_ms, tpot_fit_high_ms",
                     "prediction.json's step fit was trained on another engine: model shape: weight_bytes_per_param 4 "
                     "(the step fit's run: 2), act_bytes 4 (the step fit's run: 2), kv_bytes 4 (the step fit's run: 2); "
                     "engine threads 1 (the step fit's run: 2): its ranges are that engine's and are not checked here")]
