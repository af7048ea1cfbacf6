"""A person's declaration of the model a peer served: its Hugging Face `config.json`, read into the
workload model's shape and recorded in the run's manifest as `model_shape` (evidence `declared`), so
the ledger can hold a run without our engine's model identity (a vLLM server's spans, a load tool's
records) against the workload model (docs/MODEL.md)."""
from __future__ import annotations

import json
from pathlib import Path

from inferledger.collectors.rundir.writer import write_json_atomic
from inferledger.costmodel.shape import ModelShape


def read_model_config(path: str | Path) -> dict:
    """The manifest entry for the model `path` (a config.json, or the folder holding one) describes;
    ShapeError naming the file and field when it cannot be read."""
    return ModelShape.from_hf_config(path).declared_entry()


def declare_model_shape(run_dir: str | Path, entry: dict) -> None:
    """Write `entry` as the run's manifest `model_shape` (the rest of the manifest unchanged)."""
    path = Path(run_dir) / "manifest.json"
    manifest = json.loads(path.read_text()) if path.exists() else {}
    write_json_atomic({**manifest, "model_shape": entry}, path)
