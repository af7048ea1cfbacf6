"""`inferledger demo`: the whole loop on the embedded default, in one command."""
from __future__ import annotations

import asyncio
import platform
import time
from pathlib import Path
from typing import Optional

import typer

REPO = Path(__file__).resolve().parent.parent
DEFAULT_WORKLOAD = REPO / "samples" / "workloads" / "cpu_demo.toml"


def demo_cmd(
    out: Optional[Path] = typer.Option(None, help="Run directory (default runs/demo-<time>)."),
    workload: Path = typer.Option(DEFAULT_WORKLOAD, help="Workload TOML (arrivals, client, contract, task set)."),
    max_num_seqs: int = typer.Option(8, help="Engine batch size limit."),
) -> None:
    """Serve the bundled SmolLM2-135M-Instruct with the reference engine on this CPU, drive it with the
    load client (Poisson arrivals, client timeouts and retries, an injected cancellation, a checker),
    capture both sides into a run directory, rebuild the ledger and print its summary.

    Example: [cyan]inferledger demo --out runs/demo[/], then
    [cyan]inferledger query runs/demo "select * from accounts"[/]
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from inferledger.cli.app import console
    from inferledger.cli.embedded import EmbeddedTarget
    from inferledger.cli.summary import print_summary
    from inferledger.collectors.loadgen import LoadClient, Workload
    from inferledger.collectors.writer import RunWriter
    from inferledger.engine import AsyncEngine, EngineConfig, LLMEngine
    from inferledger.engine.loader import load_model
    from inferledger.ledger.reconstruct import reconstruct
    from inferledger.probes.probe import Probe, host_id, mono_clock

    out = out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    if out.exists() and any(out.iterdir()):
        raise typer.BadParameter(f"{out} already holds files; choose a new --out", param_hint="--out")
    wl = Workload.load(workload)
    host = host_id()
    with console.status("loading the bundled model ..."):
        bundle = load_model()
    writer = RunWriter(out)
    writer.clock_domain(mono_clock(host), host=host, kind="monotonic")
    config = EngineConfig(max_num_seqs=max_num_seqs)
    engine = LLMEngine(bundle, config, sink=writer, run_id=writer.run_id, host=host)
    client_probe = Probe(writer, "client", run_id=writer.run_id, host=host)

    async def drive(progress, bar) -> None:
        client = LoadClient(wl, EmbeddedTarget(AsyncEngine(engine), bundle.tokenizer), client_probe,
                            on_task_done=lambda: progress.advance(bar))
        async with client.transport.engine:
            await client.run()
            # Attempts the client gave up on are still the server's to finish or cancel: let the
            # engine reach its own terminal state before the loop stops, so nothing is unterminated.
            while engine.has_unfinished():
                await asyncio.sleep(0.01)
        return client.result

    t0 = time.monotonic()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task(f"{wl.name}: tasks", total=wl.n_tasks)
        result = asyncio.run(drive(progress, bar))
    wall_s = time.monotonic() - t0
    assert engine.check_integrity(), "KV block accounting broken after the run"
    writer.write_manifest({
        "source": "inferledger demo", "target": "embedded", "wall_s": round(wall_s, 3),
        "model": bundle.identity, "engine_config": config.__dict__ if hasattr(config, "__dict__") else str(config),
        "workload": {"path": str(workload), "spec": wl.spec},
        "host": {"name": host, "platform": platform.platform(), "python": platform.python_version()},
        "system_under_test": {"inside": ["reference engine (in-process)"], "outside": ["load client"]},
        "evidence": {"engine_config": "declared", "events": "observed"},
    })
    writer.close()
    summary = reconstruct(out)
    console.print(f"\n[bold]{wl.name}[/]: {result.tasks} tasks, {result.attempts} attempts "
                  f"({result.completed} completed, {result.timeouts} client timeouts, {result.cancelled} cancelled), "
                  f"{summary.n_events} events in {wall_s:.1f} s")
    print_summary(summary.path, console)
    console.print(f"\nrun directory: [bold]{out}[/]  (try: inferledger query {out} \"select * from accounts\")")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
