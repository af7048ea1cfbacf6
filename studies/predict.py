"""A prediction for a planned workload, before any run (`inferledger predict`; docs/MODEL.md "Prediction").

The model's shape: an HF config.json (`model_config`, declared) or the model file the engine loads
(the bundled one by default). The roofs, each labelled with its source: a spec entry (`device`), a
file of measured device parameters (`device_params`: a run's manifest or its `device_params`
block), else the microbenchmarks run now on this host as a capture would run them. An earlier run's
step-time fit (`fit_run`) adds a fit-based expected range.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from inferledger.costmodel import spec_roofs
from inferledger.costmodel.prediction import PredictionError, predict, read_file, strict_json, sustained_roofs
from inferledger.costmodel.roofs import SPEC, microbenchmark_roofs
from inferledger.probes.model_shape import ModelShape, hf_config_context
from inferledger.probes.run_folder import MANIFEST_FILE, Manifest


# what a device measured here can be: the roofs' plausible range, far beyond any machine on both sides
DEVICE_PARAM_RANGES = {"memcpy_gbps": (1e-3, 1e5, "GB/s"), "matmul_tflops": (1e-6, 1e4, "TFLOP/s")}


def read_device_params(path: Path) -> dict:
    """device_params from a run's manifest (its `device_params` key) or a file holding only them; each
    roof's `peak` (and `median` where given) a number within DEVICE_PARAM_RANGES, else a PredictionError
    naming the file, the key and the value."""
    doc = strict_json(read_file(path, "a device-parameters file"), str(path))
    params = doc.get("device_params", doc) if isinstance(doc, dict) else None
    if isinstance(params, dict) and isinstance(params.get("skipped"), str):  # a capture that measured none
        raise PredictionError(f"{path}: no device parameters: its capture did not measure them ({params['skipped']})")
    if not isinstance(params, dict) or not all(isinstance(params.get(k), dict) for k in DEVICE_PARAM_RANGES):
        raise PredictionError(f"{path}: no device parameters: expected memcpy_gbps.peak and matmul_tflops.peak "
                              f"(a capture's {MANIFEST_FILE}, or its device_params block)")
    for key, (low, high, unit) in DEVICE_PARAM_RANGES.items():
        for stat in ("peak", "median"):
            value = params[key].get(stat)
            if value is None and stat == "median":
                continue  # a peak without its median: no sustained range, as the prediction says
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise PredictionError(f"{path}: {key}.{stat}: must be a number of {unit} in {low:g}..{high:g}, "
                                      f"not {json.dumps(value)[:40]}")
    name = params.get("device_name")
    if name is not None and not isinstance(name, str):
        raise PredictionError(f"{path}: device_name: must be a string, not {json.dumps(name)[:40]}")
    return params


def fit_of(run: Path):
    """The step-time fit of a reconstructed run (its step_model steps, trained as the ledger's step_fit)."""
    from inferledger.costmodel.fit import FitError
    from inferledger.ledger.fit_read import StepsUnreadable, run_fit
    from inferledger.probes.study_dir import not_a_run

    if why := not_a_run(run):
        raise PredictionError(f"--fit {why}")
    path = Path(run) / "ledger.duckdb"
    if not path.exists():
        raise PredictionError(f"--fit {run}: no ledger at {path}; run `inferledger reconstruct {run}` first")
    try:
        return run_fit(run)
    except (FitError, StepsUnreadable) as exc:  # too few steps; a damaged ledger, or one other code built
        raise PredictionError(f"--fit {run}: {exc}") from None
    except Exception as exc:  # a ledger without step_model (built before the model existed)
        raise PredictionError(f"--fit {run}: cannot read its step_model ({exc}); rebuild with "
                              f"`inferledger reconstruct {run}`") from None


@dataclass(frozen=True)
class PredictOptions:
    """What `inferledger predict` is asked (its flags): the batch limit, where the model's shape comes
    from, where the roofs come from, and an earlier run's fit."""
    max_batch: int
    device: str | None = None  # a spec entry's name: the roofs from the spec
    device_params_file: Path | None = None  # measured device parameters (a capture's manifest.json)
    fit_run: Path | None = None  # a reconstructed run whose step-time fit adds a fit-based range
    model: Path | None = None  # the model file the engine loads (None: the bundled one)
    model_config: Path | None = None  # an HF config.json instead: the shape declared, nothing loaded
    dtype: str | None = None
    cpu_threads: object = "auto"  # the microbenchmarks' placement, as EngineConfig.cpu_threads
    on_stage: Callable[[str], None] | None = None  # told each slow step as it starts (the command's spinner)


def predict_workload(wl, options: PredictOptions) -> dict:
    """The prediction document for workload `wl` (a loaded Workload)."""
    max_batch, device, device_params_file = options.max_batch, options.device, options.device_params_file
    fit_run, model, model_config, dtype = options.fit_run, options.model, options.model_config, options.dtype
    cpu_threads = options.cpu_threads
    stage = options.on_stage or (lambda what: None)
    from inferledger.collectors.capture.registration import workload_shapes

    bundle = None
    _check_context(wl, options)
    if model_config is not None:
        shape = ModelShape.from_hf_config(model_config, dtype=dtype)
        weights_dtype = dtype or {2: "bfloat16", 4: "float32"}.get(shape.weight_bytes_per_param, "")
    else:
        from inferledger.engine.loader import load_model

        stage(f"loading {model or 'the bundled model'}")
        bundle = load_model(model, dtype=dtype)
        shape = Manifest({"model": bundle.identity}).model_shape()
        weights_dtype = bundle.identity["dtype"]["weights"]
    params, name = None, device
    if device is not None:
        peak = spec_roofs(device, weights_dtype)
        if peak is None:
            names = ", ".join(p.replace("\\b", "") for p, *_ in SPEC)
            raise PredictionError(f"--device {device!r}: no spec entry at {weights_dtype} (entries: {names}); "
                                  "give --device-params FILE with measured ones instead")
    elif device_params_file is not None:
        params = read_device_params(device_params_file)
        measured_at = params.get("dtype")
        if isinstance(measured_at, str) and weights_dtype and measured_at != weights_dtype:
            # the matmul roof is the engine's own GEMMs at its dtype: another dtype's rate is another roof
            raise PredictionError(f"--device-params {device_params_file}: measured at {measured_at} (its dtype), "
                                  f"the prediction computes at {weights_dtype}: give device parameters measured at "
                                  f"{weights_dtype}, or --dtype {measured_at}")
        peak, name = microbenchmark_roofs(params), params.get("device_name")
    elif bundle is None:
        raise PredictionError("--model-config describes a model not loaded here: give --device NAME (a spec entry) "
                              f"or --device-params FILE (a capture's {MANIFEST_FILE})")
    else:
        from inferledger.collectors.capture.microbench import device_params

        stage("measuring this host's roofs (microbenchmarks)")
        params = device_params(bundle, max_batch=max_batch, cpu_threads=cpu_threads)
        peak, name = microbenchmark_roofs(params), params.get("device_name")
    if fit_run is not None:
        stage(f"reading the step-time fit of {fit_run}")
    fit = fit_of(fit_run) if fit_run is not None else None
    if fit is not None:
        _check_fit_engine(fit_run, fit, shape, name, params)
    stage("planning the steps")
    return predict(shape, workload_shapes(wl), peak, max_batch=max_batch, sustained=sustained_roofs(params),
                   fit=fit, workload={"name": wl.name, "path": wl.path, "sha256": wl.sha256},
                   device={"name": name, "dtype": weights_dtype, "device_params": params})


def _check_fit_engine(fit_run: Path, fit, shape: ModelShape, device_name, params) -> None:
    """A step fit is its run's engine: the model at its dtype (every element size), on its device, with its
    threads (the efficiencies and the rates held are that run's). A fit of another is refused, naming each
    field that differs (where both sides record it), never applied as if it were this engine's."""
    from inferledger.probes.run_folder import engine_differences, thread_count

    predicted = {"shape": shape.to_dict(), "device": device_name, "threads": thread_count((params or {}).get("threads"))}
    differ = engine_differences(fit.engine, predicted, "--fit's run")
    if differ:
        raise PredictionError(f"--fit {fit_run}: its run's engine is not the one predicted: {'; '.join(differ)}. "
                              "A step fit holds its run's model, dtype, device and threads (docs/MODEL.md \"Fit\"): "
                              "give --fit a run of the engine predicted")


def _check_context(wl, options: PredictOptions) -> None:
    """The workload's prompts and output budgets against the model's context before anything loads (a
    prediction for requests the engine would refuse predicts nothing): the context `--model-config`
    declares, else the model file's metadata; a PredictionError naming the class and the context."""
    if options.model_config is not None:
        context = hf_config_context(options.model_config)
        source = f"{options.model_config}: max_position_embeddings" if context else "--model-config declares none"
    else:
        from inferledger.engine.loader import model_context

        context, source = model_context(options.model), "the model file's context length"
    try:
        wl.check_context(context, source)
    except ValueError as exc:
        raise PredictionError(str(exc)) from None
