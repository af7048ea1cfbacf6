"""`inferledger fit TRAIN --test TEST`: a step fit from one run held against another run's steps."""
from __future__ import annotations

import json
from pathlib import Path

import typer

from inferledger.cli.output import FORMAT_HELP, OutputFormat, command_name

COLUMNS = ("against", "kind", "n_steps", "median_abs_error_pct", "p90_abs_error_pct", "time_ratio")
# why a run has no step to fit or predict
NO_STEPS_WHY = ("a peer engine's run or a black box's records none; a simulated run's steps last what a fit said, "
                "measured nowhere")


def _rows(summary: dict) -> list[list]:
    rows = []
    for block in (summary, summary["wall"]):
        against = block["against"]
        rows.append([against, "all", block["n_steps"], block["held_out_median_abs_error_pct"],
                     block["held_out_p90_abs_error_pct"], block["time_ratio"]])
        rows += [[against, k, v["n_steps"], v["median_abs_error_pct"], v["p90_abs_error_pct"], v["time_ratio"]]
                 for k, v in block["by_kind"].items()]
    return rows


def fit_cmd(
    train: Path = typer.Argument(..., help="The reconstructed run whose steps train the fit."),
    test: Path = typer.Option(..., "--test", help="The reconstructed run whose every step the fit predicts."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help=FORMAT_HELP + " json is one "
                                     "object: held_out_median_abs_error_pct, held_out_p90_abs_error_pct, by_kind "
                                     "(prefill, decode, mixed), n_steps, time_ratio, against (work), wall (the same against wall "
                                     "time), fit."),
) -> None:
    """How well a step fit transfers: TRAIN's fit predicting every step of TEST, |error| in percent.

    The fit holds each step's work fixed (FLOPs, weight and KV bytes: docs/MODEL.md "Counting") at
    TRAIN's measured rates (its microbenchmarks' best, raised to what a step of TRAIN reached where
    that is higher; without any, what its steps reached) and fits a per-step overhead, a per-sequence
    overhead, a compute efficiency, the attention's KV traffic over its KV bytes and what a wait for a
    CPU costs on one (κ, where TRAIN's steps waited) on TRAIN's steps; the errors are
    on TEST's own work (`work`: its cpu_ms less its blocked_ms, the step without its wait for a CPU
    and its sleep on a lock; each prediction adds κ times that step's measured wait, counted up to its
    own time), then on its wall time (`wall`). A step is prefill, decode or mixed by its batch.

    Example: [cyan]inferledger fit runs/chat --test runs/mixed --format json[/]
    """
    from rich.table import Table

    from inferledger.cli.output import console, csv_text, fail, plain
    from inferledger.costmodel.fit import FitError
    from inferledger.ledger.fit_read import (StepsUnreadable, held_out_summary_on_host, ledger_fit_points, on_test_host,
                                             run_fit)
    from inferledger.probes.run_folder import Manifest, RunFolderError, engine_differences
    from inferledger.probes.study_dir import not_a_run

    steps, manifests = {}, {}
    for flag, run in (("TRAIN", train), ("--test", test)):
        if why := not_a_run(run):
            fail(f"error: {flag} {why}")
        if not run.is_dir():  # a typo or a file: no run to reconstruct there
            fail(f"error: {flag} {run}: " + ("no such run folder" if not run.exists() else
                                             "a file, not a run folder (the folder a capture or an import wrote)"))
        if not (run / "ledger.duckdb").is_file():
            fail(f"error: {flag} {run}: no ledger there (a run folder holds ledger.duckdb once "
                 f"`{command_name()} reconstruct {run}` has run)")
        try:  # refused, naming the file: a ledger other ledger code built (its steps may be counted another
            steps[flag] = ledger_fit_points(run)  # way, as summary refuses it), a damaged one, a bad manifest
            manifests[flag] = Manifest.read(run)
        except (StepsUnreadable, RunFolderError) as exc:
            fail(f"error: {flag} {exc}")
    points = steps["--test"]
    try:
        fit = run_fit(train, steps["TRAIN"])
    except FitError as exc:
        fail(f"error: TRAIN {train}: " + (str(exc) if steps["TRAIN"] else "no engine step with a shape and "
                                         f"a measured time to train on ({NO_STEPS_WHY})"))
    except RunFolderError as exc:
        fail(f"error: TRAIN {exc}")
    applied, host = on_test_host(fit, manifests["TRAIN"], manifests["--test"])
    summary = held_out_summary_on_host(fit, applied, host, points)
    if not summary["n_steps"]:
        fail(f"error: --test {test}: no engine step with a shape and a measured time to predict ({NO_STEPS_WHY})")
    if train.resolve() == test.resolve():
        typer.echo(f"note: --test {test} is TRAIN itself: the errors below include the steps the fit trained on "
                   "(they are not held out)", err=True)
    differ = engine_differences(fit.engine, manifests["--test"].engine, "TRAIN's")
    if differ:
        typer.echo(f"note: --test {test} ran another engine than TRAIN: {'; '.join(differ)}. The fit holds TRAIN's "
                   "rates and efficiencies: the errors below are how far they carry to that engine, not the fit's "
                   "error on its own engine", err=True)
    outside = fit.n_extrapolated(points)
    if outside:
        ranges = ", ".join(f"{k} {lo}–{hi}" for k, (lo, hi) in fit.covered.items())
        typer.echo(f"note: {outside} of the {len(points)} steps of --test {test} lie outside the shapes TRAIN's fit "
                   f"was trained on ({ranges}): their errors are the fit's extrapolation", err=True)
    if fmt == OutputFormat.json:
        typer.echo(json.dumps(plain({**summary, "fit": fit.to_dict()}), allow_nan=False))
        return
    rows = _rows(summary)
    if fmt == OutputFormat.csv:
        typer.echo(csv_text(COLUMNS, rows), nl=False)
        return
    table = Table(title=f"the fit of {train.name} predicting the steps of {test.name}: |error| %",
                  caption="work: the step less its wait for a CPU and its sleep on a lock (cpu_ms − blocked_ms), "
                          "what the fit learns; wall: the whole step. Σ measured / Σ predicted: above 1 the steps "
                          "took longer than the fit predicts (the host slower than during TRAIN, or the fit low)")
    for col in ("against", "kind", "steps", "median |error| %", "p90 |error| %", "Σ measured / Σ predicted"):
        table.add_column(col, justify="left" if col in ("against", "kind") else "right")
    for against, kind, n, med, p90, ratio in rows:
        table.add_row(against, kind, str(n), *("—" if v is None else f"{v:.{d}f}" for v, d in ((med, 1), (p90, 1),
                                                                                              (ratio, 3))))
    console.print(table)
    if host["rescaled"]:
        t, s = host["train"], host["test"]
        console.print(f"at TEST's host: memory term × {host['memory_scale_ratio']:.3f} ({t['memory_gb_s']:.4g} GB/s over TRAIN's "
                      f"capture against {s['memory_gb_s']:.4g} over TEST's, the median of {t['n']} and {s['n']} "
                      f"microbenchmark repeats), compute terms × {host['compute_scale_ratio']:.3f}; at TRAIN's rates: "
                      f"median {summary['as_trained']['held_out_median_abs_error_pct']:.1f} %, p90 "
                      f"{summary['as_trained']['held_out_p90_abs_error_pct']:.1f} %, Σ measured / Σ predicted "
                      f"{summary['as_trained']['time_ratio']:.3f}")
    else:
        console.print(f"at TRAIN's rates: {host['why']}")
    per_seq = (f"{fit.ms_per_seq:.3f} ms per sequence" if fit.ms_per_seq_known else
               f"per sequence unknown (every training step had {fit.covered['num_seqs'][0]})")
    console.print(f"fit: α {fit.alpha_ms:.3f} ms, {per_seq}, compute efficiency "
                  f"{fit.compute_efficiency:.3g} (attention {fit.attention_efficiency or fit.compute_efficiency:.3g}) on "
                  f"{fit.rates['compute_tflops']:.4g} TFLOP/s and "
                  f"{fit.rates['memory_gbps']:.4g} GB/s ({fit.rates['source']}), KV bytes read {fit.kv_factor:.3g} "
                  f"times over, {fit.ms_per_wait_ms:.3g} ms on a CPU per ms waited for one{_gap_words(fit)}")


def _gap_words(fit) -> str:
    """The fit's host time between steps, its per-sequence term named unknown where it was not fitted."""
    if fit.gap_alpha_ms is None:
        return ""
    if fit.gap_ms_per_seq_known:
        return f"; host time between steps {fit.gap_alpha_ms:.3f} ms + {fit.gap_ms_per_seq:.3f} ms per sequence"
    n = (fit.gap_covered_num_seqs or fit.covered["num_seqs"])[0]
    return (f"; host time between steps {fit.gap_alpha_ms:.3f} ms at {n} sequence(s), per sequence unknown "
            f"(every step with host time after it had {n})")


def register(app: typer.Typer) -> None:
    app.command("fit")(fit_cmd)
