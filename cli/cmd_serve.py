"""`inferledger serve`: the reference engine behind an OpenAI-compatible HTTP server."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from inferledger.cli import engine_flags as ef
from inferledger.probes.run_folder import MANIFEST_FILE
from inferledger.serve import DRAIN_TIMEOUT_S


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
    max_num_seqs: int = typer.Option(ef.MAX_NUM_SEQS, min=1, help=ef.MAX_NUM_SEQS_HELP, rich_help_panel=ef.PANEL),
    max_num_batched_tokens: Optional[int] = ef.max_num_batched_tokens(),
    enable_chunked_prefill: Optional[bool] = ef.enable_chunked_prefill(),
    long_prefill_token_threshold: Optional[int] = ef.long_prefill_token_threshold(),
    enable_prefix_caching: Optional[bool] = ef.enable_prefix_caching(),
    block_size: Optional[int] = ef.block_size(),
    num_gpu_blocks_override: Optional[int] = ef.num_gpu_blocks_override(),
    max_model_len: Optional[int] = ef.max_model_len(),
    speculative_config: Optional[str] = ef.speculative_config(),
    max_queue: int = typer.Option(512, help="Requests waiting + running before new ones get 429 with Retry-After."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run directory: the engine's and server's events, KV samples and "
                                       f"{MANIFEST_FILE} go there (then `inferledger reconstruct RUN_DIR`)."),
    flush_every: float = typer.Option(2.0, help="Seconds between flushes of --out (events, samples, manifest; and "
                                      "once more on shutdown): a kill loses at most this much."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    drain_timeout: float = typer.Option(DRAIN_TIMEOUT_S, min=0, max=86400, help="On Ctrl-C / SIGTERM: seconds in-flight requests get to "
                                        "finish (new ones get 503); what is still running then is cancelled, so "
                                        "every request ends with a terminal event."),
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

    The engine's knobs take vLLM's names: [cyan]inferledger serve --max-num-batched-tokens 256
    --no-enable-prefix-caching --num-gpu-blocks-override 512[/].

    Drive it with a workload and join its events into the client's run: [cyan]inferledger capture -o runs/c1
    --target http://127.0.0.1:8000 --server runs/s1 --num-prompts 20[/] (docs/CAPTURE.md "Your own server, joined").

    Stop it with Ctrl-C; with --out, then run [cyan]inferledger reconstruct runs/s1[/].
    """
    from inferledger.cli.output import command_name, console
    from inferledger.cli.progress import progress_bar
    from inferledger.collectors.capture.interrupt import sigterm_like_sigint
    from inferledger.collectors.rundir.out_dir import OutDirError, check_new_run_dir
    from inferledger.collectors.rundir.writer import RunWriter
    from inferledger.engine import EngineConfig
    from inferledger.serve.options import ServeOptions

    engine = ef.engine_fields(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, chunked_prefill=enable_chunked_prefill,
        long_prefill_token_threshold=long_prefill_token_threshold, enable_prefix_caching=enable_prefix_caching,
        block_size=block_size, num_blocks=num_gpu_blocks_override, max_model_len=max_model_len,
        speculative=speculative_config)
    if out is not None:
        try:
            check_new_run_dir(out)
        except OutDirError as exc:
            raise typer.BadParameter(str(exc), param_hint="--out") from None
    busy = port_taken(host, port)  # before the model loads: a busy port is told in a second, not after it
    if busy:
        raise typer.BadParameter(busy, param_hint="--port")
    # a spinner on stderr through the start-up's two slow steps: the load, then the engine's first
    # (compiled) step, which takes as long again on a CPU
    with progress_bar(f"loading {model or 'the bundled model'}") as bar:
        # (torch behind these: seconds on a busy host, under the spinner)
        from inferledger.engine.loader import DeviceUnavailableError, ModelLoadError, load_model
        from inferledger.serve.lifecycle import Serving

        try:
            bundle = load_model(model, device=device)
        except ModelLoadError as exc:
            bar.stop()
            hint = "--device" if isinstance(exc, DeviceUnavailableError) else "--model"
            raise typer.BadParameter(str(exc), param_hint=hint) from exc
        bar.update("warming up the engine (its compiled step)")
        writer = RunWriter(out, autoflush_s=flush_every) if out is not None else None
        options = ServeOptions(model_name=served_model_name, api_key=api_key, max_queue=max_queue)
        life = Serving(bundle, EngineConfig(**engine), options, sink=writer, owns_run=True)
    # SIGTERM (docker stop, a CI timeout) stops it as Ctrl-C does, from the first moment on; a second
    # signal during the drain cancels what is left at once
    unbound = None
    with sigterm_like_sigint() as got:
        try:
            try:
                life.start(host, port)
            except OSError as exc:
                unbound = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
                raise typer.BadParameter(unbound, param_hint="--port") from None
            console.print(f"serving [bold]{life.model_name}[/] on [bold]http://{host}:{life.thread.port}/v1[/]"
                          + (f", events into [bold]{out}[/]" if out else "") + "  (Ctrl-C stops)")
            life.wait()
        except KeyboardInterrupt:
            pass
        finally:
            stopped_by = unbound or ("SIGTERM" if got["signum"] else "SIGINT")
            try:
                if unbound is None:
                    console.print(f"stopping ({stopped_by}): in-flight requests get up to {drain_timeout:g} s, "
                                  "then are cancelled")
            except KeyboardInterrupt:  # a second signal while printing must not skip the stop
                pass
            drain = life.stop(0 if unbound else drain_timeout, stopped_by=stopped_by)
    console.print(f"stopped: {drain.in_flight} request(s) were in flight, {drain.cancelled} cancelled after the "
                  "drain timeout")
    if out is not None:
        console.print(f"run directory: [bold]{out}[/]  (next: {command_name()} reconstruct {out})")
    if stopped_by == "SIGTERM":
        raise typer.Exit(143)


def port_taken(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on now (in use, no such address), or None. The server binds
    again later; this only answers before the slow model load."""
    import socket

    if port == 0:
        return None
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no conflict
            s.bind(addr)
    except OSError as exc:
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
