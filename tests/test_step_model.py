"""The workload model in the ledger: every engine step of a captured run beside its work and bound,
old runs without the context as gaps, a synthetic run's step fit, the request-level split."""
from __future__ import annotations

import random

import duckdb
import pytest
from ledger_util import build_run, dict_rows as _rows

from inferledger.collectors.rundir.writer import RunWriter
from inferledger.costmodel import StepRow, step_work
from inferledger.costmodel.fit import StepFit, apply
from inferledger.probes.model_shape import ModelShape
from inferledger.engine import EngineConfig, LLMEngine, SamplingParams
from inferledger.ledger.reconstruct import reconstruct
from inferledger.ledger.fit_read import ledger_fit_points, run_fit

# a one-socket roof no two-core VM can exceed (the Xeon Platinum 8480+ entry: 56 cores, 8 × DDR5-4800)
ROOFS = {"tflops": 218.0, "gbps": 307.2, "label": "one Xeon 8480+ socket, above this VM's ceiling"}
SMOL_ARCH = {"n_layers": 30, "d_model": 576, "n_heads": 9, "n_kv_heads": 3, "head_dim": 64, "ffn_dim": 1536,
             "vocab_size": 49152, "tie_embeddings": True}
BF16 = {"weights": "bfloat16", "activations": "bfloat16", "kv": "bfloat16"}


@pytest.fixture(scope="module")
def captured(bundle, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("model") / "run"
    tok = bundle.tokenizer
    with RunWriter(run_dir, run_id="model") as writer:
        engine = LLMEngine(bundle, EngineConfig(num_blocks=32, max_num_batched_tokens=16), sink=writer, run_id="model")
        manifest = {"run_id": "model", **engine.manifest(), "declared_roofs": ROOFS}
        writer.write_manifest(manifest)
        for i, text in enumerate(["Hello there, how are you today?", "One two three", "The sky is"]):
            engine.add_request(tok.encode(text), SamplingParams(max_tokens=3, ignore_eos=True), request_id=f"r{i}")
        n_steps = 0
        while engine.has_unfinished():
            engine.step()
            n_steps += 1
        engine.close()
    reconstruct(run_dir)
    con = duckdb.connect(str(run_dir / "ledger.duckdb"), read_only=True)
    yield con, manifest, n_steps
    con.close()


def test_every_step_of_a_captured_run_has_its_work_and_no_step_beats_its_bound(captured):
    con, manifest, n_steps = captured
    steps = _rows(con, "SELECT * FROM step_model ORDER BY step_id")
    assert len(steps) == n_steps and n_steps >= 3
    kv_per_token = manifest["model"]["kv_bytes_per_token"]  # the engine's own figure
    for s in steps:
        assert s["bytes_kv_write"] == s["tokens"] * kv_per_token
        assert s["flops"] == s["flops_linear"] + s["flops_attention"] > 0
        assert s["bound_ms"] == pytest.approx(s["bound_linear_ms"] + s["bound_attention_ms"] + s["bound_lm_head_ms"])
        assert s["bound_ms"] >= s["aggregated_bound_ms"] - 1e-12
        assert s["roof_source"] == "assumption" and s["binding_roof"] in ("compute", "memory")
        assert s["beats_bound"] is False and s["measured_ms"] >= s["bound_ms"]
        assert s["residual_ms"] == pytest.approx(s["measured_ms"] - s["bound_ms"])
    assert steps[-1]["gap_after_ms"] is None and all(s["gap_after_ms"] >= 0 for s in steps[:-1])
    # each row's context is what its earlier rows computed (no prefix cache hit between these prompts)
    rows = _rows(con, "SELECT attempt_id, tokens, context_before FROM step_attribution ORDER BY step_id")
    done: dict[str, int] = {}
    for r in rows:
        assert r["context_before"] == done.get(r["attempt_id"], 0)
        done[r["attempt_id"]] = r["context_before"] + int(r["tokens"])
    gaps = _rows(con, "SELECT affects, detail FROM gaps WHERE affects LIKE '%step_model%'")
    # a step of several intra-op threads sleeps at their barriers too: its time blocked on a lock is unknown, said so
    workers = con.execute("SELECT count(*) FROM events WHERE name = 'step.end' AND json_extract(attrs, '$.workers')::INT > 0").fetchone()[0]
    assert [g["affects"] for g in gaps] == (["steps blocked_ms; step_model blocked_ms; attempt_causes blocked_ms"] if workers else [])


def test_request_bounds_never_exceed_the_measured_times(captured):
    con, _, _ = captured
    reqs = _rows(con, "SELECT * FROM request_model")
    assert {r["attempt_id"] for r in reqs} == {"r0", "r1", "r2"}
    fitted = con.execute("SELECT count(*) FROM step_fit").fetchone()[0] > 0
    if not fitted:  # too few steps of distinct shapes to train on: a gap says so
        assert con.execute("SELECT count(*) FROM gaps WHERE affects = 'step_fit, step_fit_points'").fetchone()[0] == 1
    for r in reqs:
        assert r["basis"] == "schedule"
        assert 0 < r["ttft_bound_ms"] <= r["ttft_measured_ms"]
        assert 0 < r["tpot_bound_ms"] <= r["tpot_measured_ms"]
        assert (r["ttft_predicted_ms"] is not None) == (r["residual_prefill_ms"] is not None) == fitted


def _step_events(steps, *, items=4, gaps_ms=None, modes=None, waits_ms=None):
    """step.start / step.end pairs from (batch rows, ms): batch rows as [attempt, kind, tokens, context];
    0.25 ms from one step's end to the next's start, or gaps_ms[i] after step i + 1; modes {step_id:
    mode} for steps not eager; waits_ms[i]: step i + 1 waited that long for a CPU (its schedstat readings
    on step.end, ms the step's wall time: its on-CPU time plus the wait)."""
    ev, t = [], 0.0
    for sid, (batch, ms) in enumerate(steps, 1):
        end = {"mode": (modes or {}).get(sid, "eager")}
        if waits_ms is not None:
            end |= {"cpu_ns": round((ms - waits_ms[sid - 1]) * 1e6), "wait_ns": round(waits_ms[sid - 1] * 1e6),
                    "workers": 0}
        ev.append({"name": "step.start", "ms": t, "step_id": sid, "source": "engine", "clock": "e",
                   "attrs": {"batch": [b[:items] for b in batch]}})
        ev.append({"name": "step.end", "ms": t + ms, "step_id": sid, "source": "engine", "clock": "e", "attrs": end})
        t += ms + (gaps_ms[sid - 1] if gaps_ms else 0.25)
    return ev


def test_only_a_gap_the_engine_worked_across_is_host_time(tmp_path):
    # A1 decodes in steps 1-2 and finishes; the engine waits 500 ms for B1, which then runs in steps 3-4
    manifest = {"run_id": "idle", "model": {"architecture": SMOL_ARCH, "dtype": BF16}, "declared_roofs": ROOFS}
    steps = [([["A1", "decode", 1, 7]], 5.0), ([["A1", "decode", 1, 8]], 5.0),
             ([["B1", "prefill", 4, 0]], 6.0), ([["B1", "decode", 1, 4]], 5.0)]
    con = build_run(tmp_path / "idle", _step_events(steps, gaps_ms=[0.5, 500.0, 0.75, 0.0]), domains=("e",),
                    manifest=manifest)
    got = con.execute("SELECT step_id, gap_after_ms, wait_after_ms FROM step_model ORDER BY step_id").fetchall()
    assert got == [(1, 0.5, None), (2, None, 500.0), (3, 0.75, None), (4, None, None)]
    median = con.execute("SELECT median_gap_after_ms FROM model_residuals WHERE median_gap_after_ms IS NOT NULL").fetchall()
    assert median and all(m[0] < 1.0 for m in median)  # the wait for B1 is not host overhead


def test_old_runs_without_context_keep_their_steps_and_name_the_gap(tmp_path):
    manifest = {"run_id": "old", "model": {"architecture": SMOL_ARCH, "dtype": BF16}, "declared_roofs": ROOFS}
    con = build_run(tmp_path / "old", _step_events([([["A1", "decode", 1, 7]], 5.0)] * 3, items=3),
                    domains=("e",), manifest=manifest)
    rows = _rows(con, "SELECT * FROM step_model")
    assert len(rows) == 3 and all(r["flops"] is None and r["bound_ms"] is None and r["measured_ms"] == 5.0 for r in rows)
    detail = con.execute("SELECT detail FROM gaps WHERE affects LIKE 'step_model%'").fetchall()
    assert detail == [("3 step(s) list batch rows without the context before the step",)]


def test_a_run_without_shape_or_roofs_leaves_null_with_gaps(tmp_path):
    steps = [([["A1", "decode", 1, 7]], 5.0)] * 2
    con = build_run(tmp_path / "noshape", _step_events(steps), domains=("e",), manifest={"run_id": "noshape"})
    assert con.execute("SELECT count(*), count(flops) FROM step_model").fetchone() == (2, 0)
    assert con.execute("SELECT count(*) FROM gaps WHERE needs LIKE '%model''s shape%'").fetchone()[0] == 1
    manifest = {"run_id": "noroof", "model": {"architecture": SMOL_ARCH, "dtype": BF16}}
    con = build_run(tmp_path / "noroof", _step_events(steps), domains=("e",), manifest=manifest)
    assert con.execute("SELECT count(flops), count(bound_ms) FROM step_model").fetchone() == (2, 0)
    assert con.execute("SELECT count(*) FROM gaps WHERE affects LIKE 'step_model bound_%'").fetchone()[0] == 1


# a run's own microbenchmarks (manifest device_params): the rates the fit holds fixed
P_TFLOPS, B_GBPS = 0.5, 20.0
BENCH = {"source": "microbenchmark", "memcpy_gbps": {"peak": B_GBPS, "label": "synthetic"},
         "matmul_tflops": {"peak": P_TFLOPS, "label": "synthetic"}}
SMOL = ModelShape(30, 576, 9, 3, 64, 1536, 49152, True, 2, 2, 2)


def _synthetic_ms(rows, alpha=3.0, per_seq=0.4, e=1.5) -> float:
    """The fit's form at BENCH's rates: α + a_seq · n + max(e F_lin / P, Q_lin / B) + max(e F_att / P, Q_kv / B)."""
    w = step_work(SMOL, [StepRow(k, t, c) for _, k, t, c in rows])
    kv = w.kv_read_bytes + w.kv_write_bytes
    p, b = P_TFLOPS * 1e12, B_GBPS * 1e9
    return alpha + per_seq * w.num_seqs + 1e3 * (max(e * w.linear_flops / p, (w.bytes - kv) / b)
                                                 + max(e * w.attention_flops / p, kv / b))


def _steps(batches, contexts, prefill=0, seed=3):
    rng, out = random.Random(seed), []
    for batch in batches:
        for ctx in contexts:
            rows = [["A1", "decode", 1, ctx + i] for i in range(batch)] + (
                [["P1", "prefill", prefill, 0]] if prefill else [])
            out.append((rows, _synthetic_ms(rows) * (1 + rng.gauss(0, 0.01))))
    return out


def test_a_synthetic_runs_fit_recovers_its_device_and_applies_to_a_second_run(tmp_path):
    manifest = {"model": {"architecture": SMOL_ARCH, "dtype": BF16}, "device_params": BENCH}
    build_run(tmp_path / "a", _step_events(_steps((1, 2, 4, 8, 16), (32, 256, 2048))
                                           + _steps((0, 1, 2), (64, 512), prefill=48)), domains=("e",),
              manifest={"run_id": "a", **manifest}).close()
    con = duckdb.connect(str(tmp_path / "a" / "ledger.duckdb"), read_only=True)
    fit = {n: v for n, v in con.execute("SELECT name, value FROM step_fit").fetchall()}
    assert fit["alpha_ms"] == pytest.approx(3.0, abs=0.5) and fit["ms_per_seq"] == pytest.approx(0.4, abs=0.1)
    assert fit["compute_efficiency"] == pytest.approx(1.5, rel=0.05)
    assert fit["b_eff_gbps"] == pytest.approx(B_GBPS)  # held at the measured rate
    assert fit["held_out_median_abs_pct"] < 2.0 and fit["n_held_out"] > 0
    splits = dict(con.execute("SELECT split, count(*) FROM step_fit_points GROUP BY split").fetchall())
    assert splits["train"] + splits["held_out"] == 21
    # the fit of run a, trained in Python on a's ledger, held against run b's steps (other shapes)
    trained = run_fit(tmp_path / "a")
    build_run(tmp_path / "b", _step_events(_steps((3, 6), (100, 1000))), domains=("e",),
              manifest={"run_id": "b", **manifest, "step_fit": trained.to_dict()}).close()
    result = apply(trained, ledger_fit_points(tmp_path / "b"))
    assert result["n"] == 4 and result["median_abs_pct"] < 3.0
    con = duckdb.connect(str(tmp_path / "b" / "ledger.duckdb"), read_only=True)  # b judged by a's fit
    assert con.execute("SELECT DISTINCT split FROM step_fit_points").fetchall() == [("applied",)]
    assert con.execute("SELECT DISTINCT trained_on FROM step_fit").fetchall() == [("a",)]
    applied = con.execute("SELECT value FROM step_fit WHERE name = 'applied_median_abs_pct'").fetchone()[0]
    assert applied == pytest.approx(result["median_abs_pct"])


def test_fit_cli_prints_the_transfer_as_one_json_object_and_refuses_a_run_without_ledger(tmp_path):
    import json

    from typer.testing import CliRunner

    from inferledger.cli.app import app

    manifest = {"model": {"architecture": SMOL_ARCH, "dtype": BF16}, "device_params": BENCH}
    build_run(tmp_path / "a", _step_events(_steps((1, 2, 4, 8), (32, 256, 2048)) + _steps((0, 1), (64, 512), 48)),
              domains=("e",), manifest={"run_id": "a", **manifest}).close()
    build_run(tmp_path / "b", _step_events(_steps((3, 6), (100, 1000)) + _steps((0,), (0,), 40, seed=4)
                                           + _steps((2,), (300,), 24, seed=5)),
              domains=("e",), manifest={"run_id": "b", **manifest}).close()
    runner = CliRunner()
    got = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "b"), "--format", "json"])
    assert got.exit_code == 0, got.output
    doc = json.loads(got.output)
    assert list(doc)[:3] == ["held_out_median_abs_error_pct", "held_out_p90_abs_error_pct", "by_kind"]
    assert list(doc["by_kind"]) == ["prefill", "decode", "mixed"] and "wall" in doc
    assert list(doc["wall"])[:3] == list(doc)[:3]
    assert [doc["by_kind"][k]["n_steps"] for k in ("prefill", "decode", "mixed")] == [1, 4, 1]
    assert list(doc["by_kind"]["decode"]) == ["n_steps", "median_abs_error_pct", "p90_abs_error_pct", "time_ratio"]
    assert doc["held_out_median_abs_error_pct"] < 3.0
    # both captures measured the same host rates: the fit is applied at TEST's host, scaled by 1
    assert doc["host"]["rescaled"] is True and (doc["host"]["memory_scale_ratio"], doc["host"]["compute_scale_ratio"]) == (1.0, 1.0)
    assert doc["as_trained"]["held_out_median_abs_error_pct"] == doc["held_out_median_abs_error_pct"]
    # both runs' steps follow the same physics: their time is the fit's, give or take the noise (signed, unlike |error|)
    assert 0.97 < doc["time_ratio"] < 1.03 and 0.97 < doc["by_kind"]["decode"]["time_ratio"] < 1.03
    csv = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "b"), "--format", "csv"])
    assert csv.exit_code == 0 and csv.output.splitlines()[0] == \
        "against,kind,n_steps,median_abs_error_pct,p90_abs_error_pct,time_ratio"
    bad = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2 and f"error: --test {tmp_path / 'nowhere'}: no such run folder" in \
        " ".join(bad.output.split())
    (tmp_path / "file.txt").write_text("not a run")
    bad = runner.invoke(app, ["fit", str(tmp_path / "file.txt"), "--test", str(tmp_path / "b")])
    assert bad.exit_code == 2 and f"error: TRAIN {tmp_path / 'file.txt'}: a file, not a run folder" in \
        " ".join(bad.output.split()), bad.output
    (tmp_path / "empty").mkdir()
    bad = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "empty")])
    assert bad.exit_code == 2 and f"--test {tmp_path / 'empty'}: no ledger there" in " ".join(bad.output.split())
    for broken in ("", "{not json"):  # --test's manifest gone or damaged after its ledger was built
        (tmp_path / "b" / "manifest.json").write_text(broken)
        bad = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "b")])
        assert bad.exit_code == 2, bad.output  # an uncaught error exits 1
        assert f"error: --test {tmp_path / 'b' / 'manifest.json'}" in " ".join(bad.output.split()), bad.output


def test_fit_cli_names_a_stale_broken_or_stepless_ledger_and_notes_an_in_sample_or_extrapolated_test(tmp_path):
    """A ledger other ledger code built may count its steps another way: its fit would be silently another's."""
    import shutil

    from typer.testing import CliRunner

    from inferledger.cli.app import app
    from inferledger.probes.run_folder import StudyIndex

    manifest = {"run_id": "a", "model": {"architecture": SMOL_ARCH, "dtype": BF16}, "device_params": BENCH}
    build_run(tmp_path / "a", _step_events(_steps((1, 2, 4), (32, 256))), domains=("e",), manifest=manifest).close()
    for name in ("old", "broken"):
        shutil.copytree(tmp_path / "a", tmp_path / name)
    with duckdb.connect(str(tmp_path / "old" / "ledger.duckdb")) as con:
        con.execute("UPDATE ledger_build SET inferledger_version = '0.0.1', modules_sha256 = '0123456789abcdef'")
    (tmp_path / "broken" / "ledger.duckdb").write_bytes(b"not a ledger")
    build_run(tmp_path / "none", [{"name": "mem.returned", "source": "engine", "clock": "e", "ms": 1, "value": 4096,
                                   "request_id": None, "attempt_id": None}],  # no engine step
              domains=("e",), manifest={**manifest, "run_id": "none"}).close()
    runner = CliRunner()
    same = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "a")])
    assert same.exit_code == 0 and "is TRAIN itself: the errors below include the steps the fit trained on" in \
        " ".join(same.stderr.split())
    StudyIndex({"format": 1, "name": "s", "question": "q", "knob": "k", "state": "complete",
                "runs": [{"name": "a", "dir": "runs/a", "knob": {"x": 1}}]}).write(tmp_path / "study")
    study = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "study")])
    assert study.exit_code == 2 and f"--test {tmp_path / 'study'}: a study folder; name one of its runs" in \
        " ".join(study.output.split()), study.output
    assert "lie outside the shapes" not in same.stderr
    build_run(tmp_path / "wide", _step_events(_steps((8,), (2048,)) + _steps((2,), (64,))), domains=("e",),
              manifest={**manifest, "run_id": "wide"}).close()
    wide = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "wide"), "--format", "csv"])
    assert wide.exit_code == 0 and wide.stdout.startswith("against,kind,")  # the note is on stderr, not in the csv
    assert f"note: 1 of the 2 steps of --test {tmp_path / 'wide'} lie outside the shapes TRAIN's fit was trained on " \
           "(num_seqs 1–4, tokens 1–4, context_tokens 32–" in " ".join(wide.stderr.split()), wide.stderr
    none = runner.invoke(app, ["fit", str(tmp_path / "none"), "--test", str(tmp_path / "a")])
    assert none.exit_code == 2 and f"TRAIN {tmp_path / 'none'}: no engine step with a shape and a measured time to " \
        "train on" in " ".join(none.output.split()), none.output
    none = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "none")])
    assert none.exit_code == 2 and f"--test {tmp_path / 'none'}: no engine step with a shape and a measured time to " \
        "predict" in " ".join(none.output.split()), none.output
    assert "Traceback" not in none.output
    for args, line in (([str(tmp_path / "a"), "--test", str(tmp_path / "old")],
                        f"--test {tmp_path / 'old' / 'ledger.duckdb'}: built by other ledger code (inferledger 0.0.1, "
                        f"modules 0123456789ab against these"),
                       ([str(tmp_path / "old"), "--test", str(tmp_path / "a")], f"TRAIN {tmp_path / 'old' / 'ledger.duckdb'}: built by"),
                       ([str(tmp_path / "a"), "--test", str(tmp_path / "broken")],
                        f"--test {tmp_path / 'broken' / 'ledger.duckdb'}: cannot read its steps (cannot open "
                        f"{tmp_path / 'broken' / 'ledger.duckdb'}")):
        got = runner.invoke(app, ["fit", *args])
        assert got.exit_code == 2 and line in " ".join(got.output.split()), got.output


def test_a_step_faster_than_its_bound_is_a_gap_row_naming_the_roof(tmp_path):
    """Roofs declared far too low: a decode step's bound is its ~269 MB of weights at 1 GB/s (~269 ms); the
    5 ms steps beat it, and each is a gap row naming the roof and by how much, never silently."""
    manifest = {"run_id": "beat", "model": {"architecture": SMOL_ARCH, "dtype": BF16},
                "declared_roofs": {"tflops": 1.0, "gbps": 1.0, "label": "too low"}}
    con = build_run(tmp_path / "beat", _step_events([([["A1", "decode", 1, 7]], 5.0), ([["A1", "decode", 1, 8]], 5.0)]),
                    domains=("e",), manifest=manifest)
    steps = con.execute("SELECT step_id, bound_ms, beats_bound, beaten_roof FROM step_model ORDER BY step_id").fetchall()
    assert [s[2] for s in steps] == [True, True] and steps[0][3] == "memory 1 GB/s (assumption peak)"
    rows = con.execute("SELECT scope, subject_id, affects, detail FROM gaps WHERE scope = 'step' ORDER BY subject_id").fetchall()
    assert [r[:2] for r in rows] == [("step", "1"), ("step", "2")]
    by = steps[0][1] - 5.0
    assert rows[0][3] == (f"step 1 ran 5.000 ms, {by:.3f} ms ({by / steps[0][1] * 100:.1f} %) below its bound "
                          f"{steps[0][1]:.3f} ms on the memory 1 GB/s (assumption peak) roof: that roof is wrong")


def test_the_report_shows_the_steps_that_beat_their_bound(tmp_path):
    from inferledger.report.build import build_report

    manifest = {"run_id": "beat", "model": {"architecture": SMOL_ARCH, "dtype": BF16},
                "declared_roofs": {"tflops": 1.0, "gbps": 1.0, "label": "too low"}}
    build_run(tmp_path / "beat", _step_events([([["A1", "decode", 1, 7]], 5.0), ([["A1", "decode", 1, 8]], 5.0)]),
              domains=("e",), manifest=manifest).close()
    html = build_report(tmp_path / "beat").path.read_text(encoding="utf-8")
    assert "2 step(s) ran faster than their lower bound" in html and "memory 1 GB/s (assumption peak)" in html


def test_steps_that_compiled_or_captured_are_left_out_of_the_fit(tmp_path):
    """A step whose time holds a compile (`compiling`) or a CUDA graph capture (`graph_capture`) is one-off
    build work, not the step's cost: neither the ledger's fit nor ledger_fit_points sees it, and the
    fit of the other steps recovers the device as if they were not there."""
    steps = _steps((1, 2, 4, 8, 16), (32, 256, 2048))
    steps[0] = (steps[0][0], 2500.0)  # step 1 compiled its graph, step 9 captured one
    steps[8] = (steps[8][0], 900.0)
    manifest = {"run_id": "c", "model": {"architecture": SMOL_ARCH, "dtype": BF16}, "device_params": BENCH}
    build_run(tmp_path / "c", _step_events(steps, modes={1: "compiling", 9: "graph_capture"}), domains=("e",),
              manifest=manifest).close()
    con = duckdb.connect(str(tmp_path / "c" / "ledger.duckdb"), read_only=True)
    seen = {r[0] for r in con.execute("SELECT step_id FROM step_fit_points").fetchall()}
    assert seen == set(range(1, 16)) - {1, 9}
    assert {p.step_id for p in ledger_fit_points(tmp_path / "c" / "ledger.duckdb")} == seen
    fit = {n: v for n, v in con.execute("SELECT name, value FROM step_fit").fetchall()}
    assert fit["alpha_ms"] == pytest.approx(3.0, abs=0.5) and fit["ms_per_seq"] == pytest.approx(0.4, abs=0.1)


def test_the_fit_learns_what_a_wait_for_a_cpu_costs_on_cpu_from_the_ledger(tmp_path):
    """A run beside co-tenants: every other step waited 10 to 20 ms for a CPU and, for it, ran 0.3 ms
    longer on a CPU per ms it waited, up to its own time (cpu_ms = the work T_0 + κ · min(contention_ms,
    T_0)). The ledger hands the fit
    each step's wait (ledger_fit_points), step_fit lists κ as ms_per_wait_ms, and each step's prediction
    in step_fit_points carries its own κ · wait."""
    rng, kappa = random.Random(9), 0.3
    steps, waits = [], []
    for rows, ms in _steps((1, 2, 4, 8, 16), (32, 256, 2048)) + _steps((0, 1, 2), (64, 512), prefill=48):
        wait = rng.uniform(10.0, 20.0) if len(steps) % 2 else 0.0
        steps.append((rows, ms + kappa * min(wait, ms) + wait))  # the wall time: the on-CPU time and the wait
        waits.append(wait)
    manifest = {"run_id": "co", "model": {"architecture": SMOL_ARCH, "dtype": BF16}, "device_params": BENCH}
    build_run(tmp_path / "co", _step_events(steps, waits_ms=waits), domains=("e",), manifest=manifest).close()
    points = ledger_fit_points(tmp_path / "co")
    assert [p.wait_ms for p in points] == pytest.approx(waits, abs=1e-6)
    con = duckdb.connect(str(tmp_path / "co" / "ledger.duckdb"), read_only=True)
    fit = {n: (v, u) for n, v, u in con.execute("SELECT name, value, unit FROM step_fit").fetchall()}
    assert fit["ms_per_wait_ms"][0] == pytest.approx(kappa, abs=0.03) and fit["ms_per_wait_ms"][1] == "ms/ms"
    assert fit["alpha_ms"][0] == pytest.approx(3.0, abs=0.5) and fit["held_out_median_abs_pct"][0] < 2.0
    got = con.execute("SELECT max(abs(error_pct)) FROM step_fit_points").fetchone()[0]
    assert got < 5.0


def _served(steps, enqueued_ms, gap_ms=0.25):
    """step events (as _step_events, gap_ms between steps) and each attempt's engine events: enqueued at
    enqueued_ms[attempt], a token at the end of each step it is in, finished at its last step's end."""
    ev, t, last = _step_events(steps, gaps_ms=[gap_ms] * len(steps)), 0.0, {}
    for sid, (batch, ms) in enumerate(steps, 1):
        for attempt, *_ in batch:
            ev.append({"name": "engine.token", "ms": t + ms, "step_id": sid, "source": "engine", "clock": "e",
                       "attempt_id": attempt, "request_id": attempt, "value": 1})
            last[attempt] = (sid, t + ms)
        t += ms + gap_ms
    for attempt, ms in enqueued_ms.items():
        ev.append({"name": "engine.enqueued", "ms": ms, "source": "engine", "clock": "e", "attempt_id": attempt,
                   "request_id": attempt, "value": 4})
        sid, end = last[attempt]
        ev.append({"name": "engine.finished", "ms": end, "step_id": sid, "source": "engine", "clock": "e",
                   "attempt_id": attempt, "request_id": attempt, "value": sum(a == attempt for b, _ in steps
                                                                              for a, *_ in b),
                   "attrs": {"reason": "length"}})
    return ev


def test_a_gap_term_trained_on_one_batch_size_is_unknown_per_sequence_not_a_fitted_zero(tmp_path):
    """Run one decodes one sequence at a time, 0.25 ms of host time after each step: the gap's γ0 and
    γ1 · 1 are one column. γ1 is held at 0 and reported unknown (step_fit gap_ms_per_seq NULL with a
    gap row), never as a fitted 0 ms per sequence (before, NNLS put all of it in γ0 and step_fit showed
    gap_ms_per_seq 0.0). Its fit applied to run two: attempt X, alone (batch 1), keeps its predictions,
    the gaps at 0.25 ms each; Y and Z decode together (batch 2): the host time of a second sequence is
    unknown, so their TPOT prediction and host residual are NULL with a gap row, while their TTFT (no
    gap in their prefill window) keeps its value."""
    manifest = {"model": {"architecture": SMOL_ARCH, "dtype": BF16}, "device_params": BENCH}
    build_run(tmp_path / "one", _step_events(_steps((1,), (32, 100, 256, 1000, 2048, 4000))), domains=("e",),
              manifest={"run_id": "one", **manifest}).close()
    con = duckdb.connect(str(tmp_path / "one" / "ledger.duckdb"), read_only=True)
    fit = dict(con.execute("SELECT name, value FROM step_fit").fetchall())
    assert fit["gap_alpha_ms"] == pytest.approx(0.25) and fit["gap_ms_per_seq"] is None
    assert (fit["gap_covered_num_seqs_lo"], fit["gap_covered_num_seqs_hi"]) == (1, 1)
    assert con.execute("SELECT count(*) FROM gaps WHERE affects = 'step_fit gap_ms_per_seq'").fetchone()[0] == 1
    con.close()
    trained = run_fit(tmp_path / "one")
    assert not trained.gap_ms_per_seq_known and trained.gap_ms_per_seq_reported is None
    assert trained.predict_gap_ms(1) == pytest.approx(0.25)
    steps = [([["X", "prefill", 4, 0]], 6.0), ([["X", "decode", 1, 4]], 5.0), ([["X", "decode", 1, 5]], 5.0),
             ([["Y", "prefill", 4, 0], ["Z", "prefill", 4, 0]], 7.0),
             ([["Y", "decode", 1, 4], ["Z", "decode", 1, 4]], 5.5), ([["Y", "decode", 1, 5], ["Z", "decode", 1, 5]], 5.5)]
    build_run(tmp_path / "two", _served(steps, {"X": 0.0, "Y": 16.5, "Z": 16.5}), domains=("e",),
              manifest={"run_id": "two", **manifest, "step_fit": trained.to_dict()}).close()
    con = duckdb.connect(str(tmp_path / "two" / "ledger.duckdb"), read_only=True)
    pred = dict(con.execute("SELECT step_id, predicted_ms FROM step_fit_points").fetchall())
    got = {r["attempt_id"]: r for r in _rows(con, "SELECT * FROM request_model")}
    assert got["X"]["ttft_predicted_ms"] == pytest.approx(pred[1])
    assert got["X"]["tpot_predicted_ms"] == pytest.approx((pred[2] + pred[3] + 2 * 0.25) / 2)
    assert got["X"]["residual_host_ms"] == pytest.approx(0.0, abs=1e-9)
    for a in ("Y", "Z"):
        assert got[a]["ttft_predicted_ms"] == pytest.approx(pred[4])
        assert got[a]["tpot_predicted_ms"] is None and got[a]["residual_host_ms"] is None
    detail = con.execute("SELECT detail FROM gaps WHERE affects LIKE 'request_model ttft_predicted_ms%'").fetchall()
    assert len(detail) == 1 and detail[0][0].startswith("2 attempt(s)")
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    out = CliRunner().invoke(app, ["fit", str(tmp_path / "one"), "--test", str(tmp_path / "two")])
    assert out.exit_code == 0, out.output
    assert "host time between steps 0.250 ms at 1 sequence(s), per sequence unknown" in " ".join(out.output.split())


F32 = {"weights": "float32", "activations": "float32", "kv": "float32"}


def _threads(n: int) -> dict:
    return {"engine_config": {"resolved": {"cpu_placement": {"threads": n}}}}


def test_a_fit_held_against_another_engines_steps_says_so_and_predict_refuses_it(tmp_path):
    """TRAIN's fit holds TRAIN's rates and efficiencies: held against the steps of a run of the model at
    another dtype, or with another thread count, `fit` answers (the transfer is the question) but notes the
    difference; `predict --fit` for an engine its fit's run was not refuses, naming each field."""
    import json

    from typer.testing import CliRunner

    from inferledger.cli.app import app

    steps = _steps((1, 2, 4), (32, 256)) + _steps((0, 1), (64,), 48)
    bf16 = {"model": {"architecture": SMOL_ARCH, "dtype": BF16}, "device_params": BENCH, **_threads(1)}
    build_run(tmp_path / "a", _step_events(steps), domains=("e",), manifest={"run_id": "a", **bf16}).close()
    build_run(tmp_path / "same", _step_events(_steps((3,), (100, 1000))), domains=("e",),
              manifest={"run_id": "same", **bf16}).close()
    build_run(tmp_path / "f32", _step_events(steps), domains=("e",),
              manifest={"run_id": "f32", **bf16, "model": {"architecture": SMOL_ARCH, "dtype": F32},
                        **_threads(2)}).close()
    runner = CliRunner()
    other = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "f32"), "--format", "csv"])
    assert other.exit_code == 0 and other.stdout.startswith("against,kind,")
    assert (f"note: --test {tmp_path / 'f32'} ran another engine than TRAIN: model shape: weight_bytes_per_param 4 "
            "(TRAIN's: 2), act_bytes 4 (TRAIN's: 2), kv_bytes 4 (TRAIN's: 2); engine threads 2 (TRAIN's: 1). The fit "
            "holds TRAIN's rates and efficiencies") in " ".join(other.stderr.split()), other.stderr
    same = runner.invoke(app, ["fit", str(tmp_path / "a"), "--test", str(tmp_path / "same"), "--format", "csv"])
    assert same.exit_code == 0 and "another engine" not in same.stderr
    # predict for the bf16 model (declared) at the fit's own rates: a's fit applies, f32's is refused
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"kind": "lookup", "prompt": "Capital?", "answer": "x"}) + "\n")
    (tmp_path / "w.toml").write_text('name = "w"\nseed = 1\n[taskset]\nfile = "tasks.jsonl"\n[arrivals]\nprocess = '
                                     '"poisson"\nrate_rps = 1\nn_tasks = 2\n[contract]\ndeadline_ms = 1000\n[client]\n'
                                     'timeout_ms = 1000\n[generation]\nmax_tokens = 4\n'
                                     '[[classes]]\nname = "chat"\nprompt_tokens = 40\n')
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
        "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    (tmp_path / "params.json").write_text(json.dumps({**BENCH, "threads": 1, "dtype": "bfloat16",
                                                      "memcpy_gbps": {"peak": B_GBPS, "median": B_GBPS},
                                                      "matmul_tflops": {"peak": P_TFLOPS, "median": P_TFLOPS}}))

    def predict(fit_run):
        return runner.invoke(app, ["predict", "-w", str(tmp_path / "w.toml"), "--model-config", str(tmp_path / "config.json"),
                                   "--device-params", str(tmp_path / "params.json"), "--fit", str(fit_run),
                                   "-o", str(tmp_path / f"{fit_run.name}.json"), "--format", "csv"])
    ok = predict(tmp_path / "a")
    assert ok.exit_code == 0 and json.loads((tmp_path / "a.json").read_text())["roofs"]["fit"] is not None, ok.output
    refused = predict(tmp_path / "f32")
    assert refused.exit_code == 2 and not (tmp_path / "f32.json").exists()
    assert (f"--fit {tmp_path / 'f32'}: its run's engine is not the one predicted: model shape: weight_bytes_per_param 2 "
            "(--fit's run: 4), act_bytes 2 (--fit's run: 4), kv_bytes 2 (--fit's run: 4); engine threads 1 (--fit's "
            "run: 2)") in " ".join(refused.output.split()), refused.output
