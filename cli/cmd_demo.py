"""`inferledger demo`: the whole loop on the embedded default, in one command."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

REPO = Path(__file__).resolve().parent.parent
DEFAULT_WORKLOAD = REPO / "samples" / "workloads" / "cpu_demo.toml"


def demo_cmd(
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run directory (default runs/demo-<time>)."),
    workload: Path = typer.Option(DEFAULT_WORKLOAD, "--workload", "-w", help="Workload TOML (arrivals, client, "
                                  "contract, task set)."),
    max_num_seqs: int = typer.Option(8, help="Engine batch size limit."),
) -> None:
    """The whole loop on the bundled model: capture, ledger, summary, report.

    Serves the bundled SmolLM2-135M-Instruct with the reference engine on loopback, drives it over HTTP
    with the load client near the engine's capacity (a mixed Poisson workload: chat, long context with
    a shared prefix, sessions with a tool call, parallel branches; client timeouts and retries, an
    abandoned timeout the server completes anyway, injected cancellations, a checker), capture both
    sides, rebuild the ledger, print its summary and write the HTML report.

    Example: [cyan]inferledger demo --out runs/demo[/], then
    [cyan]inferledger query runs/demo "select * from accounts"[/]
    """
    from inferledger.cli.output import console
    from inferledger.cli.capture_progress import run_capture
    from inferledger.cli.summary import print_summary
    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.ledger.reconstruct import reconstruct

    t0 = time.monotonic()
    out = out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    result = run_capture(workload, out, CaptureOptions(max_num_seqs=max_num_seqs))
    summary = reconstruct(out)
    console.print(f"ledger: {summary.n_events} events, {summary.n_attempts} attempts → {summary.path}")
    print_summary(summary.path, console)
    from inferledger.report.build import build_report

    report = build_report(out)
    console.print(f"\ndemo: {time.monotonic() - t0:.0f} s in all (model load, {result.wall_s:.0f} s of load, ledger, report)")
    console.print(f"report: [bold]{report.path}[/] (open it in a browser; it needs no network)")
    console.print(f"\nrun directory: [bold]{result.run_dir}[/]  "
                  f"(try: inferledger query {result.run_dir} \"select * from accounts\")")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
