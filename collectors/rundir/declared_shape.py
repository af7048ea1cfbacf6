"""A person's declaration of the model a peer served: its Hugging Face `config.json`, read into the
workload model's shape and recorded in the run's manifest as `model_shape` (evidence `declared`), so
the ledger can hold a run without our engine's model identity (a vLLM server's spans, a load tool's
records) against the workload model (docs/MODEL.md)."""
from __future__ import annotations

from pathlib import Path

from inferledger.probes.model_shape import ModelShape
from inferledger.probes.run_folder import Manifest


def read_model_config(path: str | Path) -> dict:
    """The manifest entry for the model `path` (a config.json, or the folder holding one) describes;
    ShapeError naming the file and field when it cannot be read."""
    return ModelShape.from_hf_config(path).declared_entry()


def declare_model_shape(run_dir: str | Path, entry: dict) -> None:
    """Write `entry` as the run's manifest `model_shape` (the rest of the manifest unchanged)."""
    manifest = Manifest.read(run_dir)
    Manifest({**manifest.body, "model_shape": entry}).write(run_dir)
