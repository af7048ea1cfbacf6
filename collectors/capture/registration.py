"""The prediction a capture registers before its load starts (docs/CAPTURE.md "Registered prediction").

Either a file made earlier (`inferledger predict ... -o FILE`, given as `--prediction FILE`), checked
before anything slow so a bad one stops the capture naming the file and field; or the capture's own,
made from the workload's request shapes, the loaded model's shape and the roofs just measured. The
file's bytes are copied into the run directory as `prediction.json`; the manifest's `prediction`
block holds their sha256 and the registration time on the host's monotonic clock and on the wall
clock, read just before the engine starts serving, so every event of the run comes after it.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from inferledger.costmodel import spec_roofs
from inferledger.costmodel.prediction import (PredictionError, dumps, load, predict, read_file, request_shapes,
                                              sustained_roofs)
from inferledger.costmodel.roofs import microbenchmark_roofs
from inferledger.probes.model_shape import ShapeError
from inferledger.probes.run_dir import PREDICTION_FILE
from inferledger.probes.run_folder import Manifest


def read_prediction(path: str | Path) -> bytes:
    """The bytes of a prediction file, checked (PredictionError names the file and the field)."""
    path = Path(path)
    data = read_file(path, "the prediction")
    load(data, str(path))
    return data


def workload_shapes(wl) -> list[dict]:
    """The request shapes a workload declares: one per class with a prompt length."""
    return request_shapes((c.name, c.prompt_tokens, c.shared_prefix_tokens, c.max_tokens or wl.max_tokens, c.weight)
                          for c in wl.classes)


def own_prediction(wl, identity: dict, device_params: dict, max_batch: int, fit=None) -> tuple[bytes | None, str]:
    """(the capture's own prediction, where it came from), or (None, why there is none): no shape, no
    roofs, or no class with a prompt length. A capture never stops for want of a prediction. `fit` (a
    costmodel StepFit, `capture --fit RUN`) adds its expected ranges, which the verdict judges the run by."""
    manifest = Manifest({"model": identity, "device_params": device_params})
    try:
        shape = manifest.model_shape()
    except ShapeError as exc:
        return None, f"no model shape: {exc}"
    dtype = manifest.weights_dtype
    peak = spec_roofs(manifest.device_name, dtype) or microbenchmark_roofs(device_params)
    shapes = workload_shapes(wl)
    if peak is None:
        return None, "no roofs: no spec entry for the device and no microbenchmarks (device_params)"
    if not shapes:
        return None, "no request shape: no workload class declares prompt_tokens"
    doc = predict(shape, shapes, peak, max_batch=max_batch, sustained=sustained_roofs(device_params), fit=fit,
                  workload={"name": wl.name, "path": wl.path, "sha256": wl.sha256},
                  device={"name": manifest.device_name, "dtype": dtype})
    with_fit = "" if fit is None else f", the step fit of {fit.trained_on or 'an earlier run'}"
    return dumps(doc).encode(), f"computed by the capture (workload classes, the loaded model, device_params{with_fit})"


def register(out: Path, data: bytes, source: str, clock: str) -> dict:
    """Write `data` as the run's prediction.json and return the manifest's `prediction` block."""
    tmp = out / f".{PREDICTION_FILE}.tmp-{os.getpid()}"
    tmp.write_bytes(data)
    os.replace(tmp, out / PREDICTION_FILE)
    mono_ns, wall_ns = time.monotonic_ns(), time.time_ns()
    return {"file": PREDICTION_FILE, "sha256": hashlib.sha256(data).hexdigest(), "source": source,
            "schema": json.loads(data).get("schema"),
            "registered": {"clock": clock, "mono_ns": mono_ns, "wall_clock": "wall (Unix time)", "wall_ns": wall_ns,
                           "wall_utc": datetime.fromtimestamp(wall_ns / 1e9, timezone.utc).isoformat()}}
