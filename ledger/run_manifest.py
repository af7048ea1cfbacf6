"""A run's manifest.json for the stages that read it (the workload model: shape, roofs, a declared fit).
reconstruct refuses an unreadable manifest before any stage runs, so here an absent one is {}."""
from __future__ import annotations

import json
from pathlib import Path


def read(run_dir: Path) -> dict:
    path = Path(run_dir) / "manifest.json"
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        return {}
