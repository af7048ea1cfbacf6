"""A capture on the terminal: a progress bar while it runs (cli/progress.py), then what it did (shared by
`capture` and `demo`)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.collectors.workload import Workload


def run_capture(workload: "Path | Workload", out: Path, options: "CaptureOptions"):
    """Capture with a progress bar; returns the CaptureResult (shared by `capture` and `demo`). The
    workload is a file, or one already built (from `capture`'s flags)."""
    from rich.markup import escape

    from inferledger.cli.output import console
    from inferledger.cli.progress import progress_bar
    from inferledger.collectors.capture.interrupt import Interrupted
    from inferledger.collectors.workload.schema import url_problem
    from inferledger.collectors.rundir.out_dir import OutDirError, check_new_run_dir
    from inferledger.collectors.workload import Workload
    from inferledger.probes.run_folder import Manifest

    try:
        check_new_run_dir(out)
    except OutDirError as exc:
        raise typer.BadParameter(str(exc), param_hint="--out") from None
    target = options.target
    if target != "embedded" and url_problem(target):
        raise typer.BadParameter(f"{url_problem(target)}: give 'embedded' or a server's http(s):// base URL",
                                 param_hint="--target")
    try:
        wl = workload if isinstance(workload, Workload) else Workload.load(workload)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--workload")
    with progress_bar(f"{wl.name}: " + ("loading the model" if target == "embedded" else "preparing"),
                      wl.n_tasks, transient=False) as bar:
        t0 = time.monotonic()
        # the capture's imports (torch among them: seconds on a busy host) under the bar and its clock
        from inferledger.collectors.capture.run import capture

        # a workload that cannot be built, a target that cannot be reached, a model or device that cannot load
        errors: tuple = (ValueError, OSError)
        if target == "embedded" or wl.needs_tokenizer:  # (torch is imported only for the model or its tokenizer)
            from inferledger.engine.loader import ModelLoadError

            errors += (ModelLoadError,)

        def ready() -> None:  # the load starts: the bar's clock counts the tasks' time, not the preparation's
            what = ("the model, " if target == "embedded" else "") + "prompts, measurements" + \
                (f", {options.warmups} warm-ups" if options.warmups else "")
            bar.say(f"{wl.name}: ready in {time.monotonic() - t0:.1f} s ({what})")
            bar.restart(f"{wl.name}: tasks", wl.n_tasks)

        try:
            result = capture(wl, out, options, on_ready=ready, progress=bar.advance,
                             on_stage=lambda text: bar.update(f"{wl.name}: {text}"))
        except errors as exc:  # (escaped: a refusal names keys like [[classes]][1], not markup)
            bar.stop()
            console.print(f"[red]error:[/] {escape(str(exc))}")
            if Manifest.exists(out):  # the run was open: what it recorded stays, and the folder is named
                console.print(f"the run folder {escape(str(out))} keeps what was recorded before the error (manifest "
                              f"state {Manifest.read(out).body.get('state')!r}); remove it before capturing into it again")
            raise typer.Exit(2)
        except Interrupted as exc:  # the run directory is closed: say what it holds, no traceback
            bar.stop()
            if exc.finished:
                console.print(f"[yellow]stopped[/] ({exc}) as the finished run was being closed: the run in {out} "
                              "is whole (manifest state 'finished')")
                raise typer.Exit(exc.exit_code)
            if not exc.recorded:
                console.print(f"[yellow]interrupted[/] ({exc}) while preparing: nothing was recorded, no run "
                              f"left in {out}")
                raise typer.Exit(exc.exit_code)
            console.print(f"[yellow]interrupted[/] ({exc}): everything recorded so far is in {out} (manifest "
                          f"state 'interrupted'); the attempts in flight show as unterminated after "
                          f"[cyan]inferledger reconstruct {out}[/]")
            raise typer.Exit(exc.exit_code)
    r = result.load
    console.print(f"[bold]{wl.name}[/] against {result.manifest['target']['url']}: {r.tasks} tasks, "
                  f"{r.attempts} attempts ({r.completed} completed, {r.timeouts} client timeouts of which "
                  f"{r.abandoned} abandoned, {r.retries} retries, {r.cancelled} cancelled, {r.errors} errors, "
                  f"{r.tool_calls} tool calls; {r.correct} answers correct) in {result.wall_s:.1f} s")
    cal = result.manifest.get("calibration")
    if cal and cal["factor"] < 1:
        b, a = cal["before"], cal["after"]
        console.print(f"calibrated: the engine makes {cal['measured_tok_s']:.0f} tok/s here (tuned for "
                      f"{cal['reference_tok_s']:.0f}): arrivals {b['rate_rps']:g}/s x {b['n_tasks']} → "
                      f"{a['rate_rps']:.3g}/s x {a['n_tasks']}, timeout {b['timeout_ms']:.0f} → {a['timeout_ms']:.0f} ms, "
                      f"deadline {b['deadline_ms']:.0f} → {a['deadline_ms']:.0f} ms")
    console.print(overhead_line(result.loop_lag_p99_ms, result.manifest["client"]["pacing_error_ms"]["arrival"]))
    if result.client_bound:  # the rule stated once (report/tables.py client_bound; docs/CAPTURE.md)
        from inferledger.report.tables import client_bound

        effect = client_bound(result.manifest)["effect"] or (
            f"client-bound: the client's event loop lagged {result.loop_lag_p99_ms:.2f} ms at p99")
        console.print(f"[yellow]warning:[/] {effect}")
    return result


def overhead_line(loop_lag_p99_ms: float, pace: dict) -> str:
    """The client's own overhead; a pacing percentile over no arrivals is unknown, not 0."""
    p50, p99 = (f"{pace[k]:.2f} ms" if pace.get(k) is not None else "unknown" for k in ("p50", "p99"))
    return (f"client overhead: event-loop lag p99 {loop_lag_p99_ms:.2f} ms; pacing error (sent − planned arrival) "
            f"p50 {p50}, p99 {p99} over {pace['n']} arrivals")
