"""`inferledger predict`: bounds and expected ranges for a workload before it runs, written to a file."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from inferledger.cli.engine_flags import MAX_NUM_SEQS
from inferledger.cli.output import FORMAT_HELP, OutputFormat
from inferledger.probes.run_folder import MANIFEST_FILE

COLUMNS = ("class", "prompt_tokens", "cached_tokens", "output_tokens", "ttft_lower_ms", "ttft_sustained_ms",
           "ttft_fit_ms", "tpot_lower_ms", "tpot_sustained_ms", "tpot_fit_ms")


def rows(doc: dict) -> list[list]:
    """One row per request shape; a range is [low, high] (None: no such roofs)."""
    return [[r["class"], r["prompt_tokens"], r["cached_tokens"], r["output_tokens"], r["ttft_lower_ms"],
             r["ttft_expected_ms"].get("sustained"), r["ttft_expected_ms"].get("fit"), r["tpot_lower_ms"],
             r["tpot_expected_ms"].get("sustained"), r["tpot_expected_ms"].get("fit")] for r in doc["requests"]]


def _ms(v) -> str:
    if v is None:
        return "—"
    return f"{v[0]:.1f}–{v[1]:.1f}" if isinstance(v, list) else f"{v:.1f}"


def predict_cmd(
    workload: Path = typer.Option(..., "--workload", "-w", help="Workload TOML: its classes' prompt_tokens, "
                                  "shared_prefix_tokens and max_tokens are the request shapes."),
    out: Path = typer.Option(..., "--out", "-o", help="Prediction file to write (JSON; register it with "
                             "`inferledger capture --prediction FILE`)."),
    device: Optional[str] = typer.Option(None, help="Roofs from the spec table for this device name (H200, H100, "
                                         "A100, L4, Xeon 8480, EPYC 9654; docs/MODEL.md). Default: measure this "
                                         "host now, as a capture does."),
    device_params: Optional[Path] = typer.Option(None, "--device-params", help="Roofs measured earlier: a "
                                                 f"capture's {MANIFEST_FILE} (its device_params) or that block alone."),
    fit: Optional[Path] = typer.Option(None, "--fit", help="A reconstructed run whose step-time fit gives a "
                                       "second expected range (labelled fit)."),
    model: Optional[Path] = typer.Option(None, help="The model file the engine would load (default: "
                                         "$INFERLEDGER_MODEL, else the bundled SmolLM2-135M-Instruct)."),
    model_config: Optional[Path] = typer.Option(None, "--model-config", help="An HF config.json instead of a "
                                                "model file (declared shape; needs --device or --device-params)."),
    dtype: Optional[str] = typer.Option(None, help="Compute dtype (float32, bfloat16; default: what the engine "
                                        "resolves, or the config's torch_dtype)."),
    max_num_seqs: int = typer.Option(MAX_NUM_SEQS, min=1, max=4096, help="The engine's batch limit the prediction plans for "
                                     "(vLLM's --max-num-seqs; the engine's default, as serve and capture)."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help=FORMAT_HELP + " One row per "
                                     "request shape: " + ", ".join(COLUMNS) + " (ranges as \\[low, high])."),
) -> None:
    """Predict per-request TTFT and TPOT bounds and expected ranges for a workload, before running it.

    Lower bounds come from the peak roofs (a request's prefill, or one decode step, alone on the device); expected ranges from the sustained roofs (the microbenchmarks' medians) and, with --fit, from an earlier run's step-time fit, each from the request alone up to the request at the batch limit. Queueing is not in them. docs/MODEL.md "Prediction" defines every figure.

    Example: [cyan]inferledger predict -w samples/workloads/cpu_demo.toml -o pred.json[/]

    Then register it: [cyan]inferledger capture -w samples/workloads/cpu_demo.toml -o runs/r1 --prediction pred.json[/]
    """
    from rich.table import Table

    from inferledger.cli.output import check_output, console, echo_rows, fail
    from inferledger.cli.progress import progress_bar
    from inferledger.studies.predict import PredictOptions, predict_workload
    from inferledger.collectors.workload import Workload
    from inferledger.costmodel.prediction import PredictionError, dumps
    from inferledger.probes.model_shape import ShapeError

    if device is not None and device_params is not None:
        raise typer.BadParameter("give at most one of --device and --device-params", param_hint="--device")
    check_output(out, "--out")  # before a minute of work
    try:
        wl = Workload.load(workload)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--workload")
    try:
        with progress_bar("reading the shape" if model_config is not None else "predicting") as bar:
            doc = predict_workload(wl, PredictOptions(max_batch=max_num_seqs, device=device,
                                                      device_params_file=device_params, fit_run=fit, model=model,
                                                      model_config=model_config, dtype=dtype, on_stage=bar.update))
    except (PredictionError, ShapeError) as exc:
        fail(f"error: {exc}")
    except Exception as exc:  # a model that cannot load
        from inferledger.engine.loader import ModelLoadError

        if not isinstance(exc, ModelLoadError):
            raise
        fail(f"error: {exc}")
    try:
        text = dumps(doc)
    except PredictionError as exc:
        fail(f"error: {exc}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    _note_fit_blind_spots(doc)
    if echo_rows(fmt, COLUMNS, rows(doc)):
        return
    roofs = doc["roofs"]
    peak = roofs["peak"]
    table = Table(title=f"{wl.name}: predicted per request shape (ms; batch limit {doc['max_batch']})")
    fitted = doc["roofs"].get("fit") is not None  # the fit columns only where a fit gave them
    keep = [i for i in range(len(COLUMNS)) if fitted or not COLUMNS[i].endswith("_fit_ms")]
    heads = ("class", "prompt", "cached", "out", "TTFT ≥", "TTFT sust.", "TTFT fit", "TPOT ≥", "TPOT sust.", "TPOT fit")
    for i in keep:
        ranged = COLUMNS[i].endswith(("_sustained_ms", "_fit_ms"))
        table.add_column(heads[i], justify="left" if i == 0 else "right", no_wrap=i > 0,
                         min_width=11 if ranged else (8 if i == 0 else None), overflow="fold")
    for r in rows(doc):
        cells = [str(r[0]), *map(str, r[1:4]), *map(_ms, r[4:])]
        table.add_row(*[cells[i] for i in keep])
    console.print(table)
    for key, label in (("peak", "lower bounds"), ("sustained", "sustained range")):
        if roofs.get(key):
            c, m = roofs[key]["compute"], roofs[key]["memory"]
            console.print(f"{label}: {c['value']:.4g} {c['unit']} ({c['source']}: {c['label']}), "
                          f"{m['value']:.4g} {m['unit']} ({m['source']}: {m['label']})")
    if peak and not roofs.get("sustained"):
        console.print("sustained range: unknown (no measured medians: --device gives peaks only)")
    console.print(f"prediction: [bold]{out}[/] (schema {doc['schema']}, {len(doc['steps'])} planned steps)")


def register(app: typer.Typer) -> None:
    app.command("predict")(predict_cmd)


def _note_fit_blind_spots(doc: dict) -> None:
    """A note (standard error) where the fit range's busy end needs a per-sequence term the fit could not see."""
    from inferledger.costmodel.prediction import fit_range_note

    note = fit_range_note(doc)
    if note:
        typer.echo(f"note: the fit ranges' busy end: {note} (train --fit on a run that batched)", err=True)
