"""`inferledger capture`: run a workload against a target and record both sides."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from inferledger.cli import engine_flags as ef
from inferledger.collectors.capture import SERVER_WAIT_S
from inferledger.serve import DRAIN_TIMEOUT_S


def capture_cmd(
    ctx: typer.Context,
    workload: Optional[Path] = typer.Option(None, "--workload", "-w", help="Workload TOML (samples/workloads/*.toml); "
                                            "the load flags below override its keys. Without it the flags alone "
                                            "make the workload (vLLM bench serve's random dataset by default)."),
    out: Path = typer.Option(..., "--out", "-o", help="New run directory to write."),
    target: Optional[str] = typer.Option(None, help="'embedded' (serve the bundled engine on loopback; the default "
                                         "unless the workload's \\[deployment] names a router) or the base URL of any "
                                         "OpenAI-compatible server (black-box: client events only); one nothing "
                                         "listens on (nor --router-metrics, --replica) is refused before the run "
                                         "folder exists."),
    separate_clocks: bool = typer.Option(False, help="Give the client its own clock domain and estimate the "
                                         "server's offset by round trips to /clock (as across hosts)."),
    request_rate: Optional[str] = typer.Option(None, "--request-rate", metavar="R|inf", help="Load: requests per "
                                               "second, Poisson arrivals (inf, the default without -w: every "
                                               "request at once).", rich_help_panel="Load (vLLM bench serve's names)"),
    sweep: Optional[str] = typer.Option(None, "--sweep", metavar="RATES", help="Load: a rate sweep instead of one "
                                        "run, e.g. 1,2,4 (req/s): `inferledger study load --set rates=RATES` against "
                                        "--target (with --server and --seed, its only other flags), -o the study "
                                        "folder; one capture per rate, then the knee and its first cause "
                                        "(docs/STUDIES.md).", rich_help_panel="Load (vLLM bench serve's names)"),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, help="Load: this many tasks, one "
                                              "attempt each unless the workload asks for retries (default 100).",
                                              rich_help_panel="Load (vLLM bench serve's names)"),
    duration: Optional[float] = typer.Option(None, "--duration", min=0.001, help="Load: seconds of arrivals at "
                                             "--request-rate (R x S tasks) instead of --num-prompts.",
                                             rich_help_panel="Load (vLLM bench serve's names)"),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", min=1, help="Load: at most this many "
                                                  "tasks in flight (a later arrival waits).",
                                                  rich_help_panel="Load (vLLM bench serve's names)"),
    burstiness: Optional[float] = typer.Option(None, "--burstiness", min=0.001, help="Load: gamma-shaped gaps at "
                                               "--request-rate (1: Poisson; < 1 burstier).",
                                               rich_help_panel="Load (vLLM bench serve's names)"),
    input_len: Optional[int] = typer.Option(None, "--input-len", "--random-input-len", min=1, help="Load: prompt "
                                            "tokens per request, the whole templated prompt (default 1024).",
                                            rich_help_panel="Load (vLLM bench serve's names)"),
    output_len: Optional[int] = typer.Option(None, "--output-len", "--random-output-len", min=1, help="Load: "
                                             "max_tokens per request (default 128; exact with --ignore-eos).",
                                             rich_help_panel="Load (vLLM bench serve's names)"),
    range_ratio: Optional[float] = typer.Option(None, "--random-range-ratio", min=0, max=0.999, help="Load: each "
                                                "request's lengths drawn uniformly in [L (1 - r), L (1 + r)].",
                                                rich_help_panel="Load (vLLM bench serve's names)"),
    dataset: Optional[str] = typer.Option(None, "--dataset", metavar="random|PATH|azure:PATH|burstgpt:PATH|"
                                          "mooncake:PATH", help="Load: random lengths (default), a task set "
                                          "(JSON Lines of prompt and answer) or a public trace replayed with its "
                                          "arrivals.", rich_help_panel="Load (vLLM bench serve's names)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Load: the seed of arrivals, lengths and prompts "
                                       "(default 0).", rich_help_panel="Load (vLLM bench serve's names)"),
    ignore_eos: Optional[bool] = typer.Option(None, "--ignore-eos/--no-ignore-eos", show_default=False,
                                              help="Load: generate exactly --output-len tokens.",
                                              rich_help_panel="Load (vLLM bench serve's names)"),
    num_warmups: int = typer.Option(0, "--num-warmups", min=0, max=1000, help="Load: requests sent before the run is opened "
                                    "(the first requests of the first tasks, one after another): not attempts, no "
                                    "events; the manifest counts them (client.warmups).",
                                    rich_help_panel="Load (vLLM bench serve's names)"),
    max_num_seqs: int = typer.Option(ef.MAX_NUM_SEQS, min=1, help="Embedded engine: " + ef.MAX_NUM_SEQS_HELP,
                                     rich_help_panel=ef.PANEL),
    max_num_batched_tokens: Optional[int] = ef.max_num_batched_tokens(),
    enable_chunked_prefill: Optional[bool] = ef.enable_chunked_prefill(),
    long_prefill_token_threshold: Optional[int] = ef.long_prefill_token_threshold(),
    enable_prefix_caching: Optional[bool] = ef.enable_prefix_caching(),
    block_size: Optional[int] = ef.block_size(),
    num_gpu_blocks_override: Optional[int] = ef.num_gpu_blocks_override(),
    max_model_len: Optional[int] = ef.max_model_len(),
    speculative_config: Optional[str] = ef.speculative_config(),
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
    scrape_metrics: bool = typer.Option(False, help="URL target: scrape <target>/metrics at 2 Hz (vLLM's or "
                                        "llama.cpp's gauges and counters, as reported samples)."),
    engine_host: Optional[str] = typer.Option(None, help="URL target: the engine's host when not this one (its "
                                              "span times are on wall:<host>)."),
    engine_clock_epsilon_ms: float = typer.Option(5.0, min=0, help="With --engine-host: the declared bound of "
                                                  "that host's wall clock against this one's (NTP)."),
    router_metrics: Optional[str] = typer.Option(None, "--router-metrics", metavar="URL", help="URL target that is a "
                                                 "router (vllm-router --prometheus-port P): its Prometheus /metrics, "
                                                 "scraped once before the load and once after it; per-worker "
                                                 "counters land per replica in the ledger's `replicas` table "
                                                 "(docs/CAPTURE.md \"A deployment\")."),
    router_traces: Optional[Path] = typer.Option(None, "--router-traces", metavar="FILE", help="URL target that is "
                                                 "vllm-router run with its tracing on: the file its spans are received "
                                                 "into (benchmarks/peers/router_traces.py), read after the load and "
                                                 "copied into the run; each upstream try no --server folder holds "
                                                 "(a refused connection, a reroute) becomes its own attempt, joined "
                                                 "by request id (docs/CAPTURE.md \"A deployment\")."),
    server: Optional[List[Path]] = typer.Option(None, "--server", help="URL target: the folder of `inferledger serve "
                                                "--out S` serving it (repeatable: one per server). After the load the "
                                                "capture waits until the folder's flushed parts hold the end of this "
                                                "run's attempts, then joins the server's and engine's events to the "
                                                "run (docs/CAPTURE.md \"Your own server, joined\")."),
    replica: Optional[List[str]] = typer.Option(None, "--replica", metavar="URL[=KIND]", help="URL target that is a "
                                                "router: a replica behind it that is no `serve --out` folder "
                                                "(repeatable), KIND ours, vllm, llamacpp or blackbox (default): its "
                                                "/metrics scraped by its kind, per replica; which attempts it served "
                                                "is a gap naming it (docs/CAPTURE.md \"A deployment\")."),
    server_wait: float = typer.Option(SERVER_WAIT_S, "--server-wait", min=0, help="With --server: seconds the "
                                      "folders get, after the load, to flush the end of this run's attempts; what is "
                                      "still missing then is a gap naming the folder."),
    drain_timeout: float = typer.Option(DRAIN_TIMEOUT_S, min=0, max=86400, help="Embedded engine: after the load, seconds "
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
    fit: Optional[Path] = typer.Option(None, "--fit", help="Embedded engine: a reconstructed run of this engine on "
                                       "this host whose step-time fit gives the capture's own prediction its expected "
                                       "ranges (the engine's own efficiency, beside the roofs' range); the verdict "
                                       "judges the run against them. Not with --prediction (`inferledger predict "
                                       "--fit RUN` makes such a file)."),
) -> None:
    """Drive a workload against a target and record the run.

    Records client events on the client's clock, server and engine events (embedded target), KV and
    energy samples, the clock mapping and the manifest.

    Example: [cyan]inferledger capture -w samples/workloads/cpu_demo.toml -o runs/r1 && inferledger reconstruct runs/r1[/]

    From flags, as vLLM bench serve: [cyan]inferledger capture -o runs/r2 --request-rate 2 --num-prompts 40
    --input-len 256 --output-len 32[/] (docs/CAPTURE.md "Load from flags")

    Against another server: [cyan]inferledger capture -w W.toml -o runs/v1 --target http://127.0.0.1:8000[/]

    Against your own server, joined with its events (two terminals): [cyan]inferledger serve --out runs/s1[/], then
    [cyan]inferledger capture -o runs/c1 --target http://127.0.0.1:8000 --server runs/s1 --num-prompts 20[/]

    Two replicas behind vLLM's router: [cyan]... --target http://127.0.0.1:18200 --router-metrics
    http://127.0.0.1:18201/metrics --server runs/s1 --server runs/s2[/] (docs/CAPTURE.md "A deployment"); a
    llama.cpp replica beside them: [cyan]--replica http://127.0.0.1:18113=llamacpp[/]; or all of it in the
    workload's \\[deployment] section (router, router_metrics, router_traces, servers, replicas), the flags
    overriding it. The router's own spans of each try: [cyan]--router-traces runs/router-spans.jsonl[/].

    Against vLLM with its own evidence: [cyan]... --target http://127.0.0.1:18100 --otlp-port 18101 --scrape-metrics[/]
    (docs/PEERS.md "Engines").
    """
    if sweep is not None:
        return _sweep(ctx, sweep, out)
    from inferledger.cli.capture_progress import run_capture
    from inferledger.cli.output import command_name, console
    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.collectors.evidence.engine_evidence import EvidenceOptions

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise typer.BadParameter(f"{device!r}: expected 'cpu', 'cuda' or 'cuda:N'", param_hint="--device")
    from inferledger.collectors.capture.deployment import Declared, DeploymentFlags, check_replicas, resolve
    from inferledger.collectors.workload.flags import FlagError, LoadFlags, flags_workload, parse_rate

    try:
        flags = LoadFlags(request_rate=None if request_rate is None else parse_rate(request_rate),
                          num_prompts=num_prompts, duration_s=duration, max_concurrency=max_concurrency,
                          burstiness=burstiness, input_len=input_len, output_len=output_len, range_ratio=range_ratio,
                          dataset=dataset, seed=seed, ignore_eos=ignore_eos)
        wl = flags_workload(workload, flags)
    except FlagError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.flag) from None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--workload" if workload else "the load flags") from None
    dep = resolve(DeploymentFlags(target, router_metrics, tuple(server or ()), tuple(replica or ()), router_traces),
                  wl.deployment)
    declared = Declared(workload=None if replica else str(wl.path),
                        router="--target" if target is not None else "[deployment].router")
    target, router_metrics, server = dep.target, dep.router_metrics, list(dep.servers)
    if target == "embedded" and (otlp_port is not None or scrape_metrics):
        raise typer.BadParameter("--otlp-port / --scrape-metrics need a URL --target (the embedded engine "
                                 "records its own events)", param_hint="--otlp-port")
    if router_metrics is not None:
        if not router_metrics.strip():
            raise typer.BadParameter(f"{router_metrics!r}: an empty value; give the router's metrics URL, e.g. "
                                     "http://127.0.0.1:18201/metrics, or leave the flag out", param_hint="--router-metrics")
        if target == "embedded":
            raise typer.BadParameter("--router-metrics scrapes the router a URL --target is; give its URL as --target",
                                     param_hint="--router-metrics")
        if not router_metrics.startswith(("http://", "https://")):
            raise typer.BadParameter(f"{router_metrics!r}: expected the router's metrics URL, e.g. "
                                     "http://127.0.0.1:18201/metrics", param_hint="--router-metrics")
    if dep.router_traces is not None:
        from inferledger.collectors.capture.router_tries import RouterTracesError, check_router_traces

        if target == "embedded":
            raise typer.BadParameter("--router-traces joins a router's spans: give the router's URL as --target",
                                     param_hint="--router-traces")
        try:
            check_router_traces(dep.router_traces)
        except RouterTracesError as exc:
            raise typer.BadParameter(str(exc), param_hint="--router-traces") from None
    folders = []
    if server:
        from inferledger.collectors.capture.servers import ServerFolderError, check_server_folders

        if target == "embedded":
            raise typer.BadParameter("--server joins a `serve --out` folder to a capture against that server: "
                                     "give its URL as --target", param_hint="--server")
        if separate_clocks or (otlp_port is not None and not dep.replicas):
            raise typer.BadParameter("--server maps the server's clock itself and is its account: leave out "
                                     "--separate-clocks and --otlp-port", param_hint="--server")
        try:
            folders = check_server_folders(server)
        except ServerFolderError as exc:
            raise typer.BadParameter(str(exc), param_hint="--server") from None
    replicas = ()
    if dep.replicas:
        if target == "embedded":
            raise typer.BadParameter("--replica declares a replica behind a router: give the router's URL as --target",
                                     param_hint="--replica")
        if scrape_metrics:
            raise typer.BadParameter("--scrape-metrics scrapes the target, here the router: each --replica's "
                                     "/metrics is scraped by its kind; leave it out", param_hint="--scrape-metrics")
        try:
            replicas = check_replicas(dep.replicas, {u: f.server_id for f in folders if (u := f.own_url(target))},
                                      otlp_port is not None, target, declared)
        except FlagError as exc:
            raise typer.BadParameter(str(exc), param_hint=exc.flag) from None

    engine = ef.engine_fields(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, chunked_prefill=enable_chunked_prefill,
        long_prefill_token_threshold=long_prefill_token_threshold, enable_prefix_caching=enable_prefix_caching,
        block_size=block_size, num_blocks=num_gpu_blocks_override, max_model_len=max_model_len,
        speculative=speculative_config)
    if target != "embedded" and set(engine) - {"max_num_seqs"}:
        raise typer.BadParameter("the engine's flags set the embedded engine; a URL target's server has its own",
                                 param_hint="--" + next(k for k in engine if k != "max_num_seqs").replace("_", "-"))
    step_fit = _step_fit(fit, prediction, target)
    options = CaptureOptions(
        target=target, separate_clocks=separate_clocks, max_num_seqs=max_num_seqs, model=model, device=device,
        drain_timeout_s=drain_timeout, microbenchmarks=microbench, served_model=served_model_name, api_key=api_key,
        evidence=EvidenceOptions(otlp_port=otlp_port, scrape_metrics=scrape_metrics, engine_host=engine_host,
                                 engine_clock_epsilon_ms=engine_clock_epsilon_ms),
        prediction=prediction, prediction_fit=step_fit, buckets=buckets, engine_config=engine, warmups=num_warmups,
        servers=tuple(server or ()), server_wait_s=server_wait, router_metrics=router_metrics, replicas=replicas,
        router_traces=dep.router_traces)
    result = run_capture(wl, out, options)
    console.print(f"run directory: [bold]{result.run_dir}[/]  (next: {command_name()} reconstruct {result.run_dir})")


def _step_fit(fit: Optional[Path], prediction: Optional[Path], target: str):
    """`--fit RUN`'s step fit (a costmodel StepFit) for the capture's own prediction; None without it."""
    if fit is None:
        return None
    from inferledger.costmodel.prediction import PredictionError
    from inferledger.studies.predict import fit_of

    if prediction is not None:
        why = ("--prediction registers a file made earlier; --fit gives the capture's own prediction a step fit: "
               "give one (`inferledger predict --fit RUN` puts a fit in a file)")
    elif target != "embedded":
        why = ("a URL target's capture registers no prediction of its own: make one with `inferledger predict "
               "--fit RUN` and give it as --prediction")
    else:
        try:
            return fit_of(fit)
        except PredictionError as exc:
            why = str(exc)
    raise typer.BadParameter(why, param_hint="--fit")


SWEEP_TAKES = ("sweep", "out", "target", "server", "seed")  # the flags that say something to `study load`


def _sweep(ctx: typer.Context, rates: str, out: Path) -> None:
    """`capture --sweep RATES`: the load study offering those rates to --target, into the study folder
    `out`; a flag the study has no option for is refused, not ignored."""
    from inferledger.cli.study_progress import run_and_print
    from inferledger.cli.output import OutputFormat, check_output, fail
    from inferledger.cli.progress import progress_bar
    from inferledger.studies.framework import StudyError, parse_sets

    given = [p.opts[0] for p in ctx.command.params if p.name not in SWEEP_TAKES
             and getattr(ctx.get_parameter_source(p.name), "name", "DEFAULT") != "DEFAULT"]
    if given:
        raise typer.BadParameter(f"a sweep runs `inferledger study load`, which takes -o, --target, --server and "
                                 f"--seed only; leave out {', '.join(given)}", param_hint="--sweep")
    target, servers, seed = ctx.params["target"], ctx.params["server"] or [], ctx.params["seed"]
    if len(servers) > 1:
        raise typer.BadParameter("a sweep joins one server's folder (the one --target is)", param_hint="--server")
    check_output(out, "--out", folder=True)
    try:
        with progress_bar("capture --sweep: reading the load study"):  # its code imports torch: seconds
            from inferledger.studies.load import rates as offered
            from inferledger.studies.registry import get_study

            study = get_study("load")
        try:
            offered({"rates": rates})
        except StudyError as exc:
            raise typer.BadParameter(str(exc).removeprefix("--set rates="), param_hint="--sweep") from None
        options = parse_sets(study, [f"rates={rates}", f"target={'embedded' if target is None else target}",
                                     *(f"server={s}" for s in servers), *([f"seed={seed}"] if seed is not None else [])])
    except StudyError as exc:
        fail(f"error: {exc}")
    run_and_print(study, out, options, False, OutputFormat.table)


def register(app: typer.Typer) -> None:
    app.command("capture")(capture_cmd)
