"""The request-level model on the recorded vLLM-CPU run: no engine steps, so each attempt alone on
the declared shape (the bundled SmolLM2 served at bf16), the gap naming what vLLM does not expose."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from inferledger.collectors.evidence.vllm_rejoin import rejoin
from inferledger.costmodel import StepRow, stage_bounds, step_work
from inferledger.probes.model_shape import ModelShape
from inferledger.costmodel.roofs import Roofs
from inferledger.engine.loader import default_model_path
from inferledger.ledger.reconstruct import reconstruct

pytestmark = pytest.mark.slow  # imports the recorded vLLM run and reads the bundled GGUF's shape

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "peers" / "vllm-0.32-cpu"


@pytest.fixture(scope="module")
def gguf_shape() -> ModelShape:
    """The bundled model's shape at bf16, read from its GGUF's header and tensor index."""
    return ModelShape.from_gguf(default_model_path(), "bfloat16")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, gguf_shape):
    base = tmp_path_factory.mktemp("vllm_model")
    shape = gguf_shape  # what was served (the sample's README)
    run = base / "run"
    rejoin(SAMPLE, run)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "model_shape": shape.declared_entry(),
                                                   "declared_roofs": {"tflops": 218.0, "gbps": 307.2}}))
    reconstruct(run)
    con = duckdb.connect(str(run / "ledger.duckdb"), read_only=True)
    yield shape, con
    con.close()


def test_vllm_attempts_are_modelled_alone_and_the_missing_step_figures_are_named(runs):
    _, con = runs
    n, solo, predicted = con.execute("SELECT count(*), count(*) FILTER (WHERE basis = 'solo'), "
                                     "count(ttft_predicted_ms) FROM request_model").fetchone()
    assert n >= 38 and solo == n and predicted == 0  # no step fit declared: no prediction, bounds only
    assert con.execute("SELECT count(*) FROM step_model").fetchone()[0] == 0
    needs = [r[0] for r in con.execute("SELECT needs FROM gaps WHERE affects LIKE '%request_model%'").fetchall()]
    assert sorted(needs) == ["per-step events (batch composition, step start and end)",
                             "the prompt tokens the server served from its prefix cache, per request"]
    # transport is the client's TTFT less the server's, as request_metrics has them
    diff = con.execute("SELECT max(abs(m.transport_ms - (r.ttft_client_ms - r.ttft_server_ms))) FROM request_model m "
                       "JOIN request_metrics r USING (attempt_id)").fetchone()[0]
    assert diff == pytest.approx(0.0, abs=1e-9)


def test_vllm_solo_bounds_are_the_prompts_own_prefill_and_below_the_measured_ttft(runs):
    shape, con = runs
    roofs = Roofs.declared(218.0, 307.2)
    rows = con.execute("SELECT m.attempt_id, m.ttft_bound_ms, m.ttft_measured_ms, s.prompt_tokens FROM request_model m "
                       "JOIN reported_spans s ON s.attempt_id = m.attempt_id").fetchall()
    assert len(rows) >= 38
    for _, bound, measured, prompt in rows:
        assert bound == pytest.approx(stage_bounds(step_work(shape, [StepRow("prefill", prompt, 0)]), roofs).bound_ms)
        assert bound <= measured


SMOLLM2_CONFIG = {  # SmolLM2-135M-Instruct's config.json, as its model card publishes it (the fields read)
    "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
    "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}


def test_import_model_config_declares_the_served_models_shape(tmp_path, gguf_shape):
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(SMOLLM2_CONFIG))
    out = tmp_path / "vllm"
    res = CliRunner().invoke(app, ["import", "--from", "otlp", str(SAMPLE / "otlp" / "traces.jsonl"), "--out", str(out),
                                   "--reporter", "vllm-0.32.0", "--model-config", str(cfg)])
    assert res.exit_code == 0, res.output
    declared = json.loads((out / "manifest.json").read_text())["model_shape"]
    gguf = gguf_shape.to_dict()  # the same model, read from its weights
    assert declared["evidence"] == "declared" and declared["source"] == f"hf config {cfg}"
    assert {k: v for k, v in declared.items() if k not in ("evidence", "source")} == \
        {k: v for k, v in gguf.items() if k != "source"}


def test_import_refuses_a_model_config_it_cannot_read_and_writes_nothing(tmp_path):
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**SMOLLM2_CONFIG, "hidden_size": "576"}))
    out = tmp_path / "vllm"
    res = CliRunner().invoke(app, ["import", "--from", "otlp", str(SAMPLE / "otlp" / "traces.jsonl"), "--out", str(out),
                                   "--model-config", str(cfg)])
    assert res.exit_code == 2
    assert res.output.splitlines()[0] == (f"inferledger import --model-config: {cfg}: field(s) hidden_size missing or "
                                          "not integers; nothing was written")
    assert not out.exists()
