"""`inferledger capture`: run a workload against a target and record both sides."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def run_capture(workload: Path, out: Path, target: str, separate_clocks: bool, max_num_seqs: int,
                model: Optional[str], served_model: Optional[str] = None, api_key: Optional[str] = None,
                device: str = "cpu", engine_evidence: dict | None = None):
    """Capture with a progress bar; returns the CaptureResult (shared by `capture` and `demo`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from inferledger.cli.app import console
    from inferledger.collectors.capture.run import capture
    from inferledger.collectors.workload import Workload

    from inferledger.collectors.capture.interrupt import Interrupted
    from inferledger.collectors.out_dir import OutDirError, check_new_run_dir

    try:
        check_new_run_dir(out)
    except OutDirError as exc:
        raise typer.BadParameter(str(exc), param_hint="--out") from None
    if target != "embedded" and not target.startswith(("http://", "https://")):
        raise typer.BadParameter(f"{target!r} is neither 'embedded' nor an http(s):// base URL", param_hint="--target")
    try:
        wl = Workload.load(workload)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--workload")
    # a workload that cannot be built, a target that cannot be reached, a model or device that cannot load
    errors: tuple = (ValueError, OSError)
    if target == "embedded":  # (torch is imported only for the embedded engine)
        from inferledger.engine.loader import ModelLoadError

        errors += (ModelLoadError,)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        bar = progress.add_task(f"{wl.name}: " + ("loading the model" if target == "embedded" else "preparing"),
                                total=wl.n_tasks)
        try:
            result = capture(wl, out, target=target, separate_clocks=separate_clocks,
                             max_num_seqs=max_num_seqs, model=model, served_model=served_model, api_key=api_key,
                             device=device, **(engine_evidence or {}),
                             on_ready=lambda: progress.update(bar, description=f"{wl.name}: tasks", total=wl.n_tasks),
                             progress=lambda: progress.advance(bar))
        except errors as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2)
        except Interrupted as exc:  # the run directory is closed: say what it holds, no traceback
            progress.stop()
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
    pace = result.manifest["client"]["pacing_error_ms"]["arrival"]
    console.print(f"client overhead: event-loop lag p99 {result.loop_lag_p99_ms:.2f} ms; pacing error (sent − planned "
                  f"arrival) p50 {pace.get('p50', 0):.2f} ms, p99 {pace.get('p99', 0):.2f} ms over {pace['n']} arrivals")
    if result.client_bound:
        console.print(f"[yellow]warning:[/] the client's event loop lagged {result.loop_lag_p99_ms:.2f} ms at p99 "
                      "(> 1 ms): this run is client-bound, its client-side latencies include the client's own delay")
    return result


def capture_cmd(
    workload: Path = typer.Option(..., "--workload", "-w", help="Workload TOML (samples/workloads/*.toml)."),
    out: Path = typer.Option(..., "--out", "-o", help="New run directory to write."),
    target: str = typer.Option("embedded", help="'embedded' (serve the bundled engine on loopback) or the base URL "
                               "of any OpenAI-compatible server (black-box: client events only)."),
    separate_clocks: bool = typer.Option(False, help="Give the client its own clock domain and estimate the "
                                         "server's offset by round trips to /clock (as across hosts)."),
    max_num_seqs: int = typer.Option(8, help="Embedded engine: batch size limit."),
    model: Optional[str] = typer.Option(None, help="Embedded engine: a GGUF file or HF folder (default: bundled)."),
    served_model: Optional[str] = typer.Option(None, help="URL target: the model name to request (default: the "
                                               "first of its /v1/models)."),
    api_key: Optional[str] = typer.Option(None, envvar="INFERLEDGER_API_KEY", help="URL target: bearer token."),
    device: str = typer.Option("cpu", help="Embedded engine: 'cpu' or 'cuda' (bf16, CUDA graphs for decode, "
                               "device.step events on a cuda clock)."),
    otlp_port: Optional[int] = typer.Option(None, min=0, max=65535, help="URL target: receive the engine's OTLP "
                                            "spans on http://127.0.0.1:PORT/v1/traces (vLLM: --otlp-traces-endpoint) "
                                            "and send a traceparent per attempt; spans become reported server/engine "
                                            "events."),
    scrape_metrics: bool = typer.Option(False, help="URL target: scrape <target>/metrics at 2 Hz (vLLM's gauges "
                                        "and counters, as reported samples)."),
    engine_host: Optional[str] = typer.Option(None, help="URL target: the engine's host when not this one (its "
                                              "span times are on wall:<host>)."),
    engine_clock_epsilon_ms: float = typer.Option(5.0, min=0, help="With --engine-host: the declared bound of "
                                                  "that host's wall clock against this one's (NTP)."),
) -> None:
    """Drive a workload against a target and record the run.

    Records client events on the client's clock, server and engine events (embedded target), KV and
    energy samples, the clock mapping and the manifest.

    Example: [cyan]inferledger capture -w samples/workloads/cpu_demo.toml -o runs/r1 && inferledger reconstruct runs/r1[/]

    Against another server: [cyan]inferledger capture -w W.toml -o runs/v1 --target http://127.0.0.1:8000[/]

    Against vLLM with its own evidence: [cyan]... --target http://127.0.0.1:18100 --otlp-port 18101 --scrape-metrics[/]
    (docs/PEERS.md "Engines").
    """
    from inferledger.cli.app import console

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise typer.BadParameter(f"{device!r}: expected 'cpu', 'cuda' or 'cuda:N'", param_hint="--device")
    evidence = {"otlp_port": otlp_port, "scrape_metrics": scrape_metrics, "engine_host": engine_host,
                "engine_clock_epsilon_ms": engine_clock_epsilon_ms}
    if target == "embedded" and (otlp_port is not None or scrape_metrics):
        raise typer.BadParameter("--otlp-port / --scrape-metrics need a URL --target (the embedded engine "
                                 "records its own events)", param_hint="--otlp-port")
    result = run_capture(workload, out, target, separate_clocks, max_num_seqs, model, served_model, api_key,
                         device=device, engine_evidence=evidence)
    console.print(f"run directory: [bold]{result.run_dir}[/]  (next: inferledger reconstruct {result.run_dir})")


def register(app: typer.Typer) -> None:
    app.command("capture")(capture_cmd)
