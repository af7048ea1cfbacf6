"""`inferledger serve`: the reference engine behind an OpenAI-compatible HTTP server."""
from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Optional

import typer


def default_model_name(identity: dict) -> str:
    """What clients pass as `model`: the checkpoint's file or folder name without `.gguf`."""
    return Path(identity.get("path", "model")).name.removesuffix(".gguf")


def serve_cmd(
    host: str = typer.Option("127.0.0.1", help="Address to bind. The default, loopback, serves this machine only; "
                             "0.0.0.0 listens on every interface (then also set --api-key)."),
    port: int = typer.Option(8000, help="TCP port."),
    model: Optional[Path] = typer.Option(None, help="GGUF file or Hugging Face folder (default: $INFERLEDGER_MODEL, "
                                         "else the bundled SmolLM2-135M-Instruct)."),
    served_model_name: Optional[str] = typer.Option(None, help="The name clients send as `model` (default: the "
                                                    "checkpoint's file name without .gguf; see GET /v1/models)."),
    api_key: Optional[str] = typer.Option(None, envvar="INFERLEDGER_API_KEY", help="Require 'Authorization: Bearer "
                                          "KEY' on /v1/* (401 otherwise); /health, /metrics and /clock stay open."),
    max_num_seqs: int = typer.Option(16, help="Engine batch size limit (sequences decoded together)."),
    max_queue: int = typer.Option(512, help="Requests waiting + running before new ones get 429 with Retry-After."),
    out: Optional[Path] = typer.Option(None, help="Run directory: the engine's and server's events, KV samples and "
                                       "manifest.json go there (then `inferledger reconstruct RUN_DIR`)."),
    flush_every: float = typer.Option(2.0, help="Seconds between flushes of --out (events, samples, manifest; and "
                                      "once more on shutdown): a kill loses at most this much."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
) -> None:
    """Serve a checkpoint with the reference engine over an OpenAI-compatible HTTP API.

    POST /v1/completions and /v1/chat/completions (streaming with usage), GET /v1/models, /health,
    /metrics (Prometheus), /clock (the server's monotonic clock, for offset estimation). Binds
    127.0.0.1 by default. A client that disconnects cancels its request in the engine. Send
    x-request-id or traceparent (or x-inferledger-attempt-id / -request-id / -task-id) and the ids
    appear in every server and engine event.

    Example, in one terminal:

    [cyan]inferledger serve --served-model-name smol --out runs/s1[/]

    and in another:

    [cyan]curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{"model": "smol",
    "messages": \\[{"role": "user", "content": "Hi"}], "max_tokens": 16}'[/]

    [cyan]python -c "import openai; c = openai.OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='x');
    print(c.completions.create(model='smol', prompt='The capital of France is', max_tokens=8).choices\\[0].text)"[/]

    Stop it with Ctrl-C; with --out, then run [cyan]inferledger reconstruct runs/s1[/].
    """
    from inferledger.cli.app import console
    from inferledger.collectors.writer import RunWriter
    from inferledger.engine import AsyncEngine, EngineConfig, LLMEngine
    from inferledger.engine.loader import DeviceUnavailableError, ModelLoadError, load_model
    from inferledger.serve.app import serve
    from inferledger.probes.probe import WallMapping, host_id, mono_clock

    from inferledger.collectors.capture.interrupt import sigterm_like_sigint
    from inferledger.collectors.out_dir import OutDirError, check_new_run_dir

    if out is not None:
        try:
            check_new_run_dir(out)
        except OutDirError as exc:
            raise typer.BadParameter(str(exc), param_hint="--out") from None
    try:
        with console.status(f"loading {model or 'the bundled model'} ..."):
            bundle = load_model(model, device=device)
    except ModelLoadError as exc:
        hint = "--device" if isinstance(exc, DeviceUnavailableError) else "--model"
        raise typer.BadParameter(str(exc), param_hint=hint) from exc
    name = served_model_name or default_model_name(bundle.identity)
    hostname = host_id()
    writer = RunWriter(out, autoflush_s=flush_every) if out is not None else None
    config = EngineConfig(max_num_seqs=max_num_seqs)
    engine = LLMEngine(bundle, config, sink=writer, run_id=writer.run_id if writer else "serve", host=hostname)
    async_engine = AsyncEngine(engine)
    manifest = {
        "source": "inferledger serve", "target": "http", **engine.manifest(), "served_model_name": name,
        "server": {"host": host, "port": port, "max_queue": max_queue, "api_key": api_key is not None},
        "host": {"name": hostname, "platform": platform.platform(), "python": platform.python_version()},
        "system_under_test": {"inside": ["HTTP front end", "reference engine"], "outside": ["clients"]},
        "evidence": {"engine_config": "declared", "events": "observed"},
    }
    wall = WallMapping() if writer is not None else None  # mono -> Unix time for exports, checked at the end
    if writer is not None:
        writer.clock_domain(mono_clock(hostname), host=hostname, kind="monotonic")
        writer.write_manifest({**manifest, "state": "running"})
    t0 = time.monotonic()

    def banner(_msg: str) -> None:
        console.print(f"serving [bold]{name}[/] on [bold]http://{host}:{port}/v1[/]"
                      + (f", events into [bold]{out}[/]" if out else "") + "  (Ctrl-C stops)")

    stopped_by = "SIGINT"
    try:
        with sigterm_like_sigint() as got:  # SIGTERM (docker stop, a CI timeout) stops it as Ctrl-C does
            serve(async_engine, bundle.tokenizer, host=host, port=port, model_name=name, sink=writer,
                  api_key=api_key, max_queue=max_queue, print=banner, handle_signals=False)
        stopped_by = "SIGTERM" if got["signum"] else "SIGINT"
    finally:
        deadline = time.monotonic() + 5  # let aborted requests reach their terminal event
        while engine.has_unfinished() and time.monotonic() < deadline:
            time.sleep(0.02)
        async_engine.close()
        if writer is not None:
            wall.write(writer, [mono_clock(hostname)], hostname)
            writer.write_manifest({**manifest, "state": "interrupted", "interrupted": stopped_by,
                                   "wall_s": round(time.monotonic() - t0, 3)})
            writer.close(compact_parts=True)
            console.print(f"run directory: [bold]{out}[/]  (next: inferledger reconstruct {out})")
    if stopped_by == "SIGTERM":
        raise typer.Exit(143)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
