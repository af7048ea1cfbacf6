"""Capture one run: serve (embedded) or reach (URL) a target, drive the workload, record both sides.

Embedded: the reference engine and its OpenAI-compatible server run in this process on a loopback
port (their own thread and event loop), the load client talks to them over real HTTP, and engine,
server and client events land in one run directory. A URL target is black-box: only the client's
events exist, and the gap register says so. The client watches its own overhead (event-loop lag,
pacing error) and the manifest marks a run client-bound when the lag exceeds 1 ms at p99.
"""
from __future__ import annotations

import asyncio
import contextlib
import platform
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from inferledger.collectors.capture.interrupt import Interrupted, signal_name, signals_held, sigterm_like_sigint
from inferledger.collectors.capture import microbench
from inferledger.collectors.capture.manifest import StartingManifest, finish_run
from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.capture.registration import own_prediction, read_prediction, register
from inferledger.collectors.capture.speed_probe import probe_throughput
from inferledger.collectors.capture.steps import Driven, Live, Prepared
from inferledger.collectors.load.loadgen import LoadClient, LoadResult
from inferledger.collectors.load.prompt_tokenizer import load_tokenizer
from inferledger.collectors.capture.warmup import warm_up
from inferledger.collectors.workload import Workload
from inferledger.collectors.rundir.writer import AUTOFLUSH_S, RunWriter
from inferledger.probes.probe import Probe, WallMapping, boot_id, host_id, mono_clock
from inferledger.probes.host import HostSampler
from inferledger.probes.sampler import EnergySampler

IDLE_BASELINE_S = 1.0  # sampled before load: the idle term of energy per good result
SOURCE = "inferledger capture"


@dataclass
class CaptureResult:
    run_dir: Path
    load: LoadResult
    wall_s: float
    loop_lag_p99_ms: float
    client_bound: bool
    manifest: dict = field(default_factory=dict)


async def _watch_loop_lag(samples: list[tuple[int, float]], stop: asyncio.Event, period_s: float = 0.01) -> None:
    """How late the client's event loop wakes: its own overhead, recorded so a client-bound run shows."""
    while True:
        t = time.monotonic_ns()
        await asyncio.sleep(period_s)
        now = time.monotonic_ns()
        samples.append((now, max(0.0, (now - t) / 1e6 - period_s * 1000)))
        if stop.is_set():
            break


async def _drive(prep: Prepared, live: Live, options: CaptureOptions, progress=None, on_stage=None) -> Driven:
    """The load, with the client's loop lag watched and (separate clocks) the server's clock mapped at both
    ends; `on_stage(text)` as a repeat of the microbenchmarks starts and ends."""
    stage = on_stage or (lambda text: None)
    from inferledger.collectors.capture.clocksync import ClockSyncError, ClockSyncFailure, estimate
    from inferledger.collectors.load.http_transport import HTTPTarget

    probe = Probe(live.writer, "client", run_id=live.writer.run_id, host=live.host, clock=live.client_clock)
    served_model = options.served_model or (live.server.model_name if live.server is not None else None) or \
        (live.servers.model_name if live.servers is not None else None)  # no model discovery through a router
    trace_salt = live.servers.salt if live.servers is not None else \
        live.evidence.trace_salt if live.evidence is not None else None
    mappings = []
    headers = {"authorization": f"Bearer {options.api_key}"} if options.api_key else None
    if options.separate_clocks:
        mappings.append(await estimate(live.url, probe.clock, headers=headers, label="start"))
    if live.servers is not None:  # a server on another clock: mapped before the load and after it
        await live.servers.map_clocks("start", headers)
    lags: list[tuple[int, float]] = []
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch_loop_lag(lags, stop))
    try:
        async with HTTPTarget(live.url, model=served_model, api_key=options.api_key, trace_salt=trace_salt) as target:
            client = LoadClient(prep.wl, target, probe, plans=prep.plans, on_task_done=progress)
            rebench = _rebench(prep, live)
            if rebench is not None:
                async def on_idle(next_ns):  # no task in flight: a short repeat when the next arrival is far
                    if rebench.due(next_ns):
                        stage("tasks (measuring the device in an idle gap)")
                        rec = await asyncio.to_thread(rebench.run, "idle")
                        rec["overlapped"] = client.in_flight > 0  # a task arrived during it: not a roof
                        stage("tasks")
                client.on_idle = on_idle
            result = await client.run()
            if rebench is not None:  # the load is over, nothing in flight: the end's repeat
                stage("measuring the device again (the end's microbenchmarks)")
                await asyncio.to_thread(rebench.run, "end")
                prep.device_params = microbench.with_repeats(prep.device_params, rebench.repeats, live.engine_clock)
    finally:
        stop.set()
        await watcher
    if options.separate_clocks:  # the load is recorded: a server that stopped answering /clock costs one mapping, not the run
        try:
            mappings.append(await estimate(live.url, probe.clock, headers=headers, label="end"))
        except ClockSyncError as exc:
            mappings.append(ClockSyncFailure("end", str(exc)))
    if live.servers is not None:
        await live.servers.map_clocks("end", headers)
    return Driven(result, lags, mappings)


def _rebench(prep: Prepared, live: Live):
    """The microbenchmarks' repeats over the load (embedded target whose start was measured), else None."""
    if live.server is None or prep.device_params.get("source") != microbench.SOURCE:
        return None

    def sample(ts_ns: int, value: float) -> None:
        live.writer.sample(ts_ns=ts_ns, clock=live.engine_clock, source="capture", host=live.host,
                           metric=microbench.RUNNING_METRIC, value=value, unit="1")
    return microbench.Rebench(prep.bundle, prep.device_params, sample)


def capture(workload: str | Path | Workload, out: str | Path, options: CaptureOptions = CaptureOptions(), *,
            bundle=None, progress=None, on_ready=None, on_stage=None) -> CaptureResult:
    """Run `workload` against `options.target` ('embedded' or a base URL) and write the run directory `out`.

    `bundle` reuses an already loaded model (tests), else `options.model` is loaded on `options.device`
    ("cpu" or "cuda": bf16, CUDA graphs, device.step events). `on_ready` is called as the load starts,
    `progress` after each task, `on_stage(text)` as a slow step starts (the model's load, the
    microbenchmarks at the start, in an idle gap and at the end). The steps: `_prepare` (model, prompts, device measurements, the
    prediction) while the manifest says "starting"; `_open_run` (writer, clocks, the prediction
    registered before the server exists); `_start_target` (the embedded server, or a URL target's own
    evidence); `_drive` (the load); `finish_run` (clock mappings, gaps, the full manifest). The
    embedded server stops by the serving drain rule (serve/lifecycle.py) within
    `options.drain_timeout_s`. A failure or a signal after the run is open leaves it "interrupted"
    with what was recorded."""
    wl = workload if isinstance(workload, Workload) else Workload.load(workload)
    out = Path(out)
    servers = _server_folders(options)  # refused before the run folder exists, naming the folder
    _check_replicas(options, servers)
    _check_router_traces(options)
    if not options.embedded:  # nothing listening there: refused now, not found with the run open (reach.py)
        from inferledger.collectors.capture.reach import check_listening

        check_listening([("--target", options.target)]
                        + ([("--router-metrics", options.router_metrics)] if options.router_metrics else [])
                        + [(r.where, r.url) for r in options.replicas])
    # refused before the run folder exists: a bad prediction file, a prompt past the model's context
    given = read_prediction(options.prediction) if options.prediction is not None else None
    context, source = _served_context(wl, options, bundle)
    # a session's later turns are counted with the tokenizer, read from the model file's header alone
    tokenizer = _tokenizer(wl, options, bundle) if context is not None and wl.has_later_turns else None
    wl.context = wl.check_context(context, source, tokenizer)
    # The manifest exists from the first second (state "starting") while the model loads, the prompts
    # are built and the run is opened; if that fails or a signal stops it, nothing was recorded and the
    # folder is taken away again.
    with sigterm_like_sigint() as got:
        try:
            with StartingManifest(out, {"source": SOURCE, "state": "starting", "target": options.target_entry(),
                                        "workload": {"path": wl.path, "name": wl.name, "sha256": wl.sha256}}):
                prep = _prepare(wl, options, bundle, given, on_stage or (lambda text: None), tokenizer)
                prep.servers = servers
                live, head = _open_run(out, prep, options)
        except KeyboardInterrupt:  # SIGINT or SIGTERM while preparing: the folder is gone again, say so
            raise Interrupted(got["signum"] or signal.SIGINT, recorded=False) from None
    return _record(live, head, prep, options, progress, on_ready, on_stage)


def _server_folders(options: CaptureOptions) -> list:
    """The --server folders checked (collectors/capture/servers.py); ValueError for a combination that
    cannot join them."""
    if not options.servers:
        return []
    if options.embedded:
        raise ValueError("--server joins a `serve --out` folder to a capture against its URL; the embedded "
                         "target records its engine itself (give --target URL)")
    if options.separate_clocks:
        raise ValueError("--server maps each server's clock itself (one domain on this host and boot, else round "
                         "trips to its /clock): leave out --separate-clocks")
    if options.evidence.otlp_port is not None and not options.replicas:
        raise ValueError("--server and --otlp-port both give the server's account: pass one")
    from inferledger.collectors.capture.servers import check_server_folders

    return check_server_folders(options.servers)


def _check_replicas(options: CaptureOptions, servers: list) -> None:
    """The --replica values against each other and the --server folders (deployment.py); ValueError for a
    combination that cannot record them."""
    if not options.replicas:
        return
    if options.embedded:
        raise ValueError("--replica declares a replica behind a router: give the router's URL as --target")
    if options.evidence.scrape_metrics:
        raise ValueError("--scrape-metrics scrapes the target, here the router: each --replica's /metrics is "
                         "scraped by its kind; leave it out")
    from inferledger.collectors.capture.deployment import check_replicas

    check_replicas([f"{r.url}={r.kind}" for r in options.replicas],
                   {u: f.server_id for f in servers if (u := f.own_url(options.target))},
                   options.evidence.otlp_port is not None, options.target)


def _check_router_traces(options: CaptureOptions) -> None:
    """--router-traces: the router's spans of a URL target; ValueError naming the file or the combination."""
    if options.router_traces is None:
        return
    if options.embedded:
        raise ValueError("--router-traces joins a router's spans: give the router's URL as --target")
    from inferledger.collectors.capture.router_tries import check_router_traces

    check_router_traces(options.router_traces)


def _served_context(wl: Workload, options: CaptureOptions, bundle) -> tuple[int | None, str]:
    """The served model's context and where it comes from, read before any weights load: the embedded
    model file's metadata (or `max_model_len` when lower); a URL target's is unknown."""
    if not options.embedded:
        return None, "a URL target: its context is not known here"
    if bundle is not None:
        context, source = bundle.config.max_position, "the loaded model's positions"
    else:
        from inferledger.engine.loader import model_context

        context, source = model_context(options.model), "the model file's context length"
    limit = options.engine_config.get("max_model_len")
    return (limit, "the engine's max_model_len") if limit and limit < context else (context, source)


def _tokenizer(wl: Workload, options: CaptureOptions, bundle):
    """The tokenizer the prompts are built and counted with: the embedded model's own (its bundle's once
    loaded, else read from the model file without its weights), else the workload's [prompt] tokenizer."""
    if options.embedded and (wl.tokenizer is None or (wl.tokenizer == "bundled" and options.model is None)):
        if bundle is not None:
            return bundle.tokenizer
        from inferledger.engine.loader import load_tokenizer as checkpoint_tokenizer

        return checkpoint_tokenizer(options.model)
    return load_tokenizer(wl.tokenizer)


def _prepare(wl: Workload, options: CaptureOptions, bundle, given: bytes | None, stage, tokenizer=None) -> Prepared:
    """Everything slow or refusable before anything is recorded (`given`: the prediction file's checked
    bytes; `stage(text)` as each slow step starts; `tokenizer`: the prompts' when it was read already): a
    model, workload or tokenizer that fails stops here and leaves no run."""
    if options.embedded and bundle is None:
        stage("loading the model")
        from inferledger.engine.loader import load_model

        bundle = load_model(options.model, device=options.device)
    calibration = None
    if wl.calibrate_tok_s and options.embedded:
        stage("measuring the engine's speed (calibration)")
        speed = probe_throughput(bundle, options.max_num_seqs, engine_config=options.engine_config)
        calibration = {**wl.calibrate(speed.tok_s), "probe_threads": speed.threads}
    tokenizer = (tokenizer if tokenizer is not None else _tokenizer(wl, options, bundle)) if wl.needs_tokenizer else None
    # the engine refuses prompt + max_tokens past its context: a trace's rows are fitted to it
    context = min(bundle.config.max_position, options.engine_config.get("max_model_len") or 1 << 62) \
        if options.embedded else None
    plans = wl.plan(tokenizer, context_tokens=context)
    limits = options.engine_settings
    if not options.embedded:
        device_params = microbench.skipped("URL target: its device is the server's, not measured from here")
    elif not options.microbenchmarks:
        device_params = microbench.skipped("not measured (capture --no-microbench)")
    else:
        stage("measuring the device (microbenchmarks)")
        device_params = microbench.device_params(
            bundle, max_batch=limits["max_num_seqs"], cpu_threads=limits.get("cpu_threads", "auto"),
            max_tokens=limits.get("max_num_batched_tokens"))
    source = str(options.prediction) if given is not None else "no file given (capture --prediction)"
    if given is None and options.embedded:
        given, source = own_prediction(wl, bundle.identity, device_params, limits["max_num_seqs"],
                                       options.prediction_fit)
    if options.warmups:
        stage(f"{options.warmups} warm-ups")
    warmups = warm_up(options.warmups, plans, wl, options, bundle)  # before anything is recorded
    return Prepared(wl, bundle, tokenizer, plans, calibration, device_params, given, source, warmups)


def _open_run(out: Path, prep: Prepared, options: CaptureOptions) -> tuple[Live, dict]:
    """The run's writer, clocks and first manifest (state "running"), with the prediction registered."""
    writer = RunWriter(out, options.run_id, autoflush_s=AUTOFLUSH_S, buckets=options.buckets)  # a kill loses at most the last 2 s
    try:
        return _open_writer(writer, out, prep, options)
    except BaseException:  # nothing recorded yet: its flush thread stops, and what it wrote goes with the folder
        with contextlib.suppress(Exception):
            writer.close()
        raise


def _open_writer(writer: RunWriter, out: Path, prep: Prepared, options: CaptureOptions) -> tuple[Live, dict]:
    wl, host = prep.wl, host_id()
    engine_clock = mono_clock(host)
    client_clock = f"client-mono:{host}" if options.separate_clocks else engine_clock
    head = {"source": SOURCE, "state": "running", "target": options.target_entry(),
            "workload": {"path": wl.path, "name": wl.name, "sha256": wl.sha256, "spec": wl.spec, "taskset": wl.taskset,
                         **({"replay": wl.replay} if wl.replay else {}),
                         **({"trace": wl.trace.summary} if wl.trace else {})},
            **({"slo": wl.slo} if wl.slo else {}), "client": {"clock": client_clock, "warmups": prep.warmups},
            "host": {"name": host, "boot_id": boot_id(), "platform": platform.platform(),
                     "python": platform.python_version()}}
    head["device_params"] = prep.device_params
    if wl.context is not None:  # the prompts against the served model's context: checked, or why not
        head["workload"]["context"] = wl.context
    # registered before the server exists: every event of the run comes after it
    head["prediction"] = register(out, prep.prediction, prep.prediction_source,
                                  engine_clock if options.embedded else client_clock) \
        if prep.prediction is not None else {"skipped": prep.prediction_source}
    writer.write_manifest(head)  # from the first second: a killed run still says what it was
    writer.clock_domain(client_clock, host=host, kind="monotonic")
    wall = WallMapping()  # checked again at the end
    host_samples = HostSampler(writer, host=host, applies_to_server=_host_samples_apply(options))
    return Live(out, writer, host, engine_clock, client_clock, wall, EnergySampler(writer, hz=10, host=host),
                host_samples), head


def _host_samples_apply(options: CaptureOptions) -> tuple[bool, str]:
    """Whether this host's samples describe the server's host: yes for the embedded engine and for a URL
    target on this host; not when --engine-host names another (its contention is then unknown)."""
    if options.embedded:
        return True, "the embedded engine runs in this process"
    other = options.evidence.engine_host
    if other:
        return False, f"the server runs on {other} (--engine-host): these samples describe the capture's host only"
    return True, "the URL target's server is taken to run on this host (no --engine-host given)"


def _start_target(live: Live, head: dict, prep: Prepared, options: CaptureOptions) -> None:
    """The embedded server started (its engine's manifest added to `head`), or a URL target's evidence
    receivers; `live.url` is what the client then talks to (one host, one CLOCK_MONOTONIC)."""
    if options.embedded:
        from inferledger.engine import EngineConfig
        from inferledger.serve.lifecycle import Serving

        live.server = Serving(prep.bundle, EngineConfig(**options.engine_settings), sink=live.writer,
                              host=live.host, source=SOURCE)
        head.update(live.server.engine.manifest())
        live.writer.write_manifest(head)
    live.url = live.server.start() if live.server is not None else options.target
    if prep.servers:
        from inferledger.collectors.capture.servers import ServerJoin

        live.servers = ServerJoin(prep.servers, host=live.host, client_clock=live.client_clock, target=live.url,
                                  deployment=bool(options.replicas))
        live.servers.start_scrapes(live.out, live.writer)  # a replica folder's server's own counters
    if options.replicas:  # each declared replica's own evidence, by its kind
        from inferledger.collectors.capture.deployment import Replicas

        live.replicas = Replicas(options.replicas, live.out, live.writer, clock=live.client_clock, host=live.host)
        live.replicas.start()
    if options.router_metrics or options.router_traces is not None:
        from inferledger.collectors.evidence.router_metrics import worker_key

        urls = {**(live.servers.replica_urls() if live.servers else {}), **(live.replicas.urls() if live.replicas else {})}
        by_worker = {worker_key(u): r for u, r in urls.items()}  # how the router names each replica -> replica id
    if options.router_metrics:  # the router's counters before the load (and after it, _record)
        from inferledger.collectors.evidence.router_metrics import RouterScraper

        live.router = RouterScraper(options.router_metrics, live.out, live.writer, clock=live.client_clock,
                                    host=live.host)
        live.router.replicas = by_worker
        live.router.scrape_once()
    if options.router_traces is not None:  # the router's own spans of its tries, joined after the load (_record)
        from inferledger.collectors.capture.router_tries import RouterTries

        live.router_tries = RouterTries(Path(options.router_traces), live.host, live.url, by_worker)
    if live.server is None and options.evidence.wanted:
        from inferledger.collectors.evidence.engine_evidence import EngineEvidence

        vllm = next((r for r in options.replicas if r.kind == "vllm"), None)  # a deployment's one vLLM replica
        live.evidence = EngineEvidence(live.writer, options.evidence, host=live.host, client_clock=live.client_clock,
                                       target_url=vllm.url if vllm is not None else live.url)
        live.evidence.replica_id = vllm.replica_id if vllm is not None else None


def _record(live: Live, head: dict, prep: Prepared, options: CaptureOptions, progress, on_ready,
            on_stage) -> CaptureResult:
    """Start the target, drive the load, finish the run; on a failure or a signal, keep what was
    recorded, mark the run interrupted and re-raise."""
    old_switch = sys.getswitchinterval()
    t0 = time.monotonic()
    clean = False
    with sigterm_like_sigint() as got:
        try:
            _start_target(live, head, prep, options)
            # Energy counters (NVML, RAPL) where this machine has them, raw, on the host clock; a short idle
            # stretch before load gives the ledger its idle baseline. Without a source nothing runs.
            live.host_sampler.start()  # the host's pressure and CPU time, where its files are readable
            if any(src.available for src in live.sampler.sources()):
                live.sampler.start()
                time.sleep(IDLE_BASELINE_S)
            if on_ready:
                on_ready()
            if options.switch_interval_s:
                sys.setswitchinterval(options.switch_interval_s)
            t0 = time.monotonic()
            driven = asyncio.run(_drive(prep, live, options, progress, on_stage))
            sys.setswitchinterval(old_switch)
            if live.server is not None:
                live.server.stop(options.drain_timeout_s)
            if live.router is not None:  # every attempt has ended: the router's counters after the load
                live.router.stop()
            if live.replicas is not None:  # and each declared replica's last scrape
                live.replicas.stop()
            if live.servers is not None:  # and each replica folder's server's
                live.servers.stop_scrapes()
            if live.servers is not None:  # the --server folders' events of this run's attempts, once on disk
                live.servers.join(live.writer, live.out, options.server_wait_s,
                                  say=lambda line: print(f"inferledger capture: {line}", file=sys.stderr))
            if live.router_tries is not None:  # then the router's tries no folder holds
                live.router_tries.join(live.writer, live.out, options.server_wait_s,
                                       say=lambda line: print(f"inferledger capture: {line}", file=sys.stderr))
            live.sampler.stop()
            live.host_sampler.stop()
            manifest = finish_run(live, prep, driven, options, wall_s=time.monotonic() - t0,
                                  registered={**{k: head[k] for k in ("prediction",) if k in head},
                                              "device_params": prep.device_params})
            clean = True
        except BaseException as exc:  # interrupted or failed: keep what was recorded, say so, re-raise
            why = signal_name(got, exc)
            sys.setswitchinterval(old_switch)
            _stop_quietly(live, options.drain_timeout_s)
            live.writer.write_manifest({**head, "state": "interrupted", "interrupted": why,
                                        "wall_s": round(time.monotonic() - t0, 3)})
            if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Interrupted):
                raise Interrupted(got["signum"] or signal.SIGINT) from None
            raise
        finally:
            with signals_held() as held:  # a signal now would cut the close (its compaction, its renames) half-way
                live.writer.close(compact_parts=clean)  # even when stopping the server or a timer failed
        if held["signum"] is not None:  # a signal during the last close: the run is whole; the process stops for it
            raise Interrupted(held["signum"], finished=True)
    return CaptureResult(live.out, driven.result, manifest["wall_s"], manifest["client"]["loop_lag_p99_ms"],
                         manifest["client"]["client_bound"], manifest)


def _stop_quietly(live: Live, drain_timeout_s: float) -> None:
    """Stop what runs, each part on its own: one failing (a CUDA timer's close) must not stop the rest."""
    server, evidence, replicas, servers = live.server, live.evidence, live.replicas, live.servers
    for stop in ((lambda: server.stop(drain_timeout_s)) if server is not None else None, live.sampler.stop,
                 live.host_sampler.stop, evidence.abort if evidence is not None else None,
                 (lambda: replicas.stop(final_scrape=False)) if replicas is not None else None,
                 (lambda: servers.stop_scrapes(final_scrape=False)) if servers is not None else None):
        if stop is None:
            continue
        try:
            stop()
        except BaseException as exc:  # reported, not raised: the run directory still gets closed
            print(f"inferledger capture: while stopping: {exc!r}", file=sys.stderr)
