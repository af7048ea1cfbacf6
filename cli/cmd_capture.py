"""`inferledger capture`: run a workload against a target and record both sides."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from inferledger.serve import DRAIN_TIMEOUT_S


def capture_cmd(
    workload: Path = typer.Option(..., "--workload", "-w", help="Workload TOML (samples/workloads/*.toml)."),
    out: Path = typer.Option(..., "--out", "-o", help="New run directory to write."),
    target: str = typer.Option("embedded", help="'embedded' (serve the bundled engine on loopback) or the base URL "
                               "of any OpenAI-compatible server (black-box: client events only)."),
    separate_clocks: bool = typer.Option(False, help="Give the client its own clock domain and estimate the "
                                         "server's offset by round trips to /clock (as across hosts)."),
    max_num_seqs: int = typer.Option(8, help="Embedded engine: batch size limit."),
    model: Optional[Path] = typer.Option(None, help="Embedded engine: a GGUF file or HF folder (default: "
                                         "$INFERLEDGER_MODEL, else the bundled SmolLM2-135M-Instruct)."),
    served_model_name: Optional[str] = typer.Option(None, help="URL target: the model name to request (default: "
                                                    "the first of its /v1/models)."),
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
    drain_timeout: float = typer.Option(DRAIN_TIMEOUT_S, min=0, help="Embedded engine: after the load, seconds "
                                        "requests still in flight get to finish before they are cancelled."),
    buckets: Optional[int] = typer.Option(None, min=1, max=9999, help="Write the events partitioned for large runs: "
                                          "by task into this many buckets, engine steps by engine instance "
                                          "(docs/SCALE.md); `reconstruct --engine ray` shards over them."),
    microbench: bool = typer.Option(True, "--microbench/--no-microbench", help="Embedded engine: measure the "
                                    "device's memory bandwidth and the engine's own matmuls for a few seconds before "
                                    "the load (manifest device_params, the roofs of the step bounds); without it the "
                                    "bounds use a spec entry for the device, else stay unknown."),
    prediction: Optional[Path] = typer.Option(None, "--prediction", help="A prediction file from `inferledger "
                                              "predict` to register in the run before the load starts (default: the "
                                              "capture makes its own from the workload, the model and the measured "
                                              "roofs). Copied to RUN/prediction.json, its sha256 and registration "
                                              "time in the manifest."),
) -> None:
    """Drive a workload against a target and record the run.

    Records client events on the client's clock, server and engine events (embedded target), KV and
    energy samples, the clock mapping and the manifest.

    Example: [cyan]inferledger capture -w samples/workloads/cpu_demo.toml -o runs/r1 && inferledger reconstruct runs/r1[/]

    Against another server: [cyan]inferledger capture -w W.toml -o runs/v1 --target http://127.0.0.1:8000[/]

    Against vLLM with its own evidence: [cyan]... --target http://127.0.0.1:18100 --otlp-port 18101 --scrape-metrics[/]
    (docs/PEERS.md "Engines").
    """
    from inferledger.cli.capture_progress import run_capture
    from inferledger.cli.output import console
    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.collectors.evidence.engine_evidence import EvidenceOptions

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise typer.BadParameter(f"{device!r}: expected 'cpu', 'cuda' or 'cuda:N'", param_hint="--device")
    if target == "embedded" and (otlp_port is not None or scrape_metrics):
        raise typer.BadParameter("--otlp-port / --scrape-metrics need a URL --target (the embedded engine "
                                 "records its own events)", param_hint="--otlp-port")
    options = CaptureOptions(
        target=target, separate_clocks=separate_clocks, max_num_seqs=max_num_seqs, model=model, device=device,
        drain_timeout_s=drain_timeout, microbenchmarks=microbench, served_model=served_model_name, api_key=api_key,
        evidence=EvidenceOptions(otlp_port=otlp_port, scrape_metrics=scrape_metrics, engine_host=engine_host,
                                 engine_clock_epsilon_ms=engine_clock_epsilon_ms),
        prediction=prediction, buckets=buckets)
    result = run_capture(workload, out, options)
    console.print(f"run directory: [bold]{result.run_dir}[/]  (next: inferledger reconstruct {result.run_dir})")


def register(app: typer.Typer) -> None:
    app.command("capture")(capture_cmd)
