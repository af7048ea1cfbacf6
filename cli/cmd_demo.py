"""`inferledger demo`: the whole loop on the embedded default, in one command."""
from __future__ import annotations

import shlex
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
    max_num_seqs: int = typer.Option(8, min=1, help="The engine's batch limit. The demo's workload is sized for "
                                     "8 (its arrivals are calibrated near that batch's capacity); serve, capture "
                                     "and predict default to the engine's 16."),
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
    from rich.markup import escape

    from inferledger.cli.output import command_name, console
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
    console.print(f"\nrun directory: [bold]{result.run_dir}[/]\nnext, from this folder:\n"
                  + escape(next_steps(command_name(), result.run_dir, workload, max_num_seqs)), soft_wrap=True)


def next_steps(cmd: str, run_dir, workload=DEFAULT_WORKLOAD, max_num_seqs: int = 8) -> str:
    """The commands the demo suggests, each runnable as pasted in the folder the demo ran in: the last one
    runs the same load again with this run's step fit registered, so its verdict judges the new run against
    the engine as this one measured it rather than against the roofs."""
    run, again = shlex.quote(str(run_dir)), shlex.quote(f"{run_dir}-again")
    return (f"  {cmd} query {run} \"select client_status, server_status, count(*) from accounts group by all\"\n"
            f"  {cmd} summary {run} --table accounts\n"
            f"  {cmd} report {run}\n"
            f"  {cmd} capture -w {shlex.quote(str(workload))} --max-num-seqs {max_num_seqs} -o {again} --fit {run}"
            f"   # the same load, predicted by this run's step fit")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
