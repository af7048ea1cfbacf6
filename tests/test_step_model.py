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
from inferledger.ledger.step_fit import ledger_fit_points

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
    assert con.execute("SELECT count(*) FROM gaps WHERE affects LIKE '%step_model%'").fetchone()[0] == 0


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


def _step_events(steps, *, items=4, gaps_ms=None, modes=None):
    """step.start / step.end pairs from (batch rows, ms): batch rows as [attempt, kind, tokens, context];
    0.25 ms from one step's end to the next's start, or gaps_ms[i] after step i + 1; modes {step_id:
    mode} for steps not eager."""
    ev, t = [], 0.0
    for sid, (batch, ms) in enumerate(steps, 1):
        ev.append({"name": "step.start", "ms": t, "step_id": sid, "source": "engine", "clock": "e",
                   "attrs": {"batch": [b[:items] for b in batch]}})
        ev.append({"name": "step.end", "ms": t + ms, "step_id": sid, "source": "engine", "clock": "e",
                   "attrs": {"mode": (modes or {}).get(sid, "eager")}})
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


def test_a_synthetic_runs_fit_recovers_its_device_and_applies_to_a_second_run(tmp_path):
    alpha, p_tflops, b_gbps = 3.0, 0.5, 20.0
    smol = ModelShape(30, 576, 9, 3, 64, 1536, 49152, True, 2, 2, 2)
    rng = random.Random(3)

    def steps(batches, contexts):
        out = []
        for batch in batches:
            for ctx in contexts:
                rows = [["A1", "decode", 1, ctx + i] for i in range(batch)]
                w = step_work(smol, [StepRow(k, t, c) for _, k, t, c in rows])
                out.append((rows, (alpha + w.flops / (p_tflops * 1e9) + w.bytes / (b_gbps * 1e6))
                            * (1 + rng.gauss(0, 0.01))))
        return out

    manifest = {"model": {"architecture": SMOL_ARCH, "dtype": BF16}, "declared_roofs": ROOFS}
    build_run(tmp_path / "a", _step_events(steps((1, 2, 4, 8, 16), (32, 256, 2048))), domains=("e",),
              manifest={"run_id": "a", **manifest}).close()
    con = duckdb.connect(str(tmp_path / "a" / "ledger.duckdb"), read_only=True)
    fit = {n: v for n, v in con.execute("SELECT name, value FROM step_fit").fetchall()}
    assert fit["alpha_ms"] == pytest.approx(alpha, abs=0.5)
    assert fit["b_eff_gbps"] == pytest.approx(b_gbps, rel=0.05)
    assert fit["held_out_median_abs_pct"] < 2.0 and fit["n_held_out"] > 0
    splits = dict(con.execute("SELECT split, count(*) FROM step_fit_points GROUP BY split").fetchall())
    assert splits["train"] + splits["held_out"] == 15
    # the fit of run a, trained in Python on a's ledger, held against run b's steps (other shapes)
    trained = StepFit.fit(ledger_fit_points(tmp_path / "a" / "ledger.duckdb"), trained_on="a")
    build_run(tmp_path / "b", _step_events(steps((3, 6), (100, 1000))), domains=("e",),
              manifest={"run_id": "b", **manifest, "step_fit": trained.to_dict()}).close()
    result = apply(trained, ledger_fit_points(tmp_path / "b"))
    assert result["n"] == 4 and result["median_abs_pct"] < 3.0
    con = duckdb.connect(str(tmp_path / "b" / "ledger.duckdb"), read_only=True)  # b judged by a's fit
    assert con.execute("SELECT DISTINCT split FROM step_fit_points").fetchall() == [("applied",)]
    assert con.execute("SELECT DISTINCT trained_on FROM step_fit").fetchall() == [("a",)]
    applied = con.execute("SELECT value FROM step_fit WHERE name = 'applied_median_abs_pct'").fetchone()[0]
    assert applied == pytest.approx(result["median_abs_pct"])


def test_steps_that_compiled_or_captured_are_left_out_of_the_fit(tmp_path):
    """A step whose time holds a compile (`compiling`) or a CUDA graph capture (`graph_capture`) is one-off
    build work, not the step's cost: neither the ledger's fit nor ledger_fit_points sees it, and the
    fit of the other steps recovers the device as if they were not there."""
    alpha, p_tflops, b_gbps = 3.0, 0.5, 20.0
    smol = ModelShape(30, 576, 9, 3, 64, 1536, 49152, True, 2, 2, 2)
    steps = []
    for batch in (1, 2, 4, 8, 16):
        for ctx in (32, 256, 2048):
            rows = [["A1", "decode", 1, ctx + i] for i in range(batch)]
            w = step_work(smol, [StepRow(k, t, c) for _, k, t, c in rows])
            steps.append((rows, alpha + w.flops / (p_tflops * 1e9) + w.bytes / (b_gbps * 1e6)))
    steps[0] = (steps[0][0], 2500.0)  # step 1 compiled its graph, step 9 captured one
    steps[8] = (steps[8][0], 900.0)
    manifest = {"run_id": "c", "model": {"architecture": SMOL_ARCH, "dtype": BF16}, "declared_roofs": ROOFS}
    build_run(tmp_path / "c", _step_events(steps, modes={1: "compiling", 9: "graph_capture"}), domains=("e",),
              manifest=manifest).close()
    con = duckdb.connect(str(tmp_path / "c" / "ledger.duckdb"), read_only=True)
    seen = {r[0] for r in con.execute("SELECT step_id FROM step_fit_points").fetchall()}
    assert seen == set(range(1, 16)) - {1, 9}
    assert {p.step_id for p in ledger_fit_points(tmp_path / "c" / "ledger.duckdb")} == seen
    fit = {n: v for n, v in con.execute("SELECT name, value FROM step_fit").fetchall()}
    assert fit["alpha_ms"] == pytest.approx(alpha, abs=0.5)
    assert fit["b_eff_gbps"] == pytest.approx(b_gbps, rel=0.05)
