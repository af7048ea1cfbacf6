"""The step fit of a built ledger, read through the query surface: what `inferledger fit`, `predict --fit`,
`capture --fit`, the fidelity study and the benchmarks train on or apply a fit to. Apart from the build's
stage (ledger/step_fit.py) because it opens ledgers the way a reader does (ledger/query.py), which the
build's stages must not import.
"""
from __future__ import annotations

from pathlib import Path

from inferledger.costmodel.fit import FitPoint, StepFit, held_out_summary, run_step_fit
from inferledger.costmodel.roofs import host_rates
from inferledger.ledger.query import LedgerError, open_ledger
from inferledger.ledger.step_fit import POINTS_SQL
from inferledger.probes.run_folder import Manifest


class StepsUnreadable(Exception):
    """A ledger whose steps cannot be read: the message names its file and how to rebuild it."""


def ledger_fit_points(ledger: str | Path) -> list[FitPoint]:
    """`fit_points` of a built ledger file (RUN/ledger.duckdb, or the run folder holding it), read-only:
    what a study or a benchmark trains a fit on, or applies another run's fit to (costmodel.fit.apply).
    FileNotFoundError without a ledger; StepsUnreadable naming the file for one that cannot be read (a
    damaged file, one whose step_model lacks a column) or that other ledger code built (its steps may be
    counted another way: refused, as the summary refuses it)."""
    path = Path(ledger)
    path = path / "ledger.duckdb" if path.is_dir() else path
    if not path.exists():
        raise FileNotFoundError(f"{path}: no ledger; run `inferledger reconstruct {path.parent}` first")
    try:
        with open_ledger(path) as led:
            if led.stale:
                raise StepsUnreadable("; ".join(led.stale))
            return [FitPoint(*r) for r in led.rows(POINTS_SQL)[1]]
    except LedgerError as exc:
        raise StepsUnreadable(f"{path}: cannot read its steps ({' '.join(str(exc).split())}); rebuild it: "
                              f"inferledger reconstruct {path.parent}") from None


def run_fit(run_dir: str | Path, points: list[FitPoint] | None = None) -> StepFit:
    """The step fit of a reconstructed run folder, at the rates of its own manifest (its microbenchmarks
    first; without any, the rates its steps reached): what `inferledger fit` trains. `points`: its steps
    already read (`ledger_fit_points`). FileNotFoundError without a ledger, FitError when it cannot fit."""
    run_dir = Path(run_dir)
    points = ledger_fit_points(run_dir) if points is None else points
    return run_step_fit(points, Manifest.read(run_dir), run_dir.name)[0]


def on_test_host(fit: StepFit, train: Manifest, test: Manifest) -> tuple[StepFit, dict]:
    """TRAIN's fit at TEST's host: its memory and compute terms scaled by TRAIN's host rates over TEST's (the
    median of each capture's microbenchmark repeats, costmodel.roofs.host_rates), so a host that ran TEST's
    capture slower than TRAIN's, as a shared host does minutes apart, is priced by what its microbenchmarks
    measured then, not by TEST's steps. Where either run has no microbenchmarks the fit as trained, and
    `host` says why. -> (the fit to apply, the `host` block of `inferledger fit --test`)."""
    a, b = host_rates(train.block("device_params")), host_rates(test.block("device_params"))
    if a is None or b is None:
        which = " and ".join(n for n, r in (("TRAIN", a), ("TEST", b)) if r is None)
        return fit, {"rescaled": False, "why": f"{which} recorded no microbenchmarks: the fit at TRAIN's rates"}
    memory, compute = a["memory_gb_s"] / b["memory_gb_s"], a["compute_tflop_per_s"] / b["compute_tflop_per_s"]
    return fit.on_host(memory, compute), {"rescaled": True, "train": a, "test": b, "memory_scale_ratio": memory,
                                           "compute_scale_ratio": compute}


def transfer(train_run: str | Path, test_run: str | Path) -> tuple[StepFit, dict]:
    """TRAIN's fit and its |error| on every step of TEST (costmodel.fit.held_out_summary), at TEST's host
    (`on_test_host`; `host` says how), with the errors at TRAIN's rates beside them (`as_trained`)."""
    fit = run_fit(train_run)
    points = ledger_fit_points(test_run)
    applied, host = on_test_host(fit, Manifest.read(train_run), Manifest.read(test_run))
    return fit, held_out_summary_on_host(fit, applied, host, points)


def held_out_summary_on_host(fit: StepFit, applied: StepFit, host: dict, points) -> dict:
    """held_out_summary of the fit applied at TEST's host, with `host` and the as-trained figures
    (`as_trained`: its median, p90 and time ratio at TRAIN's rates) beside them."""
    out = held_out_summary(applied, points)
    plain = out if applied is fit else held_out_summary(fit, points)
    out["host"] = host
    out["as_trained"] = {k: plain[k] for k in ("held_out_median_abs_error_pct", "held_out_p90_abs_error_pct",
                                               "time_ratio")}
    return out
