"""Capture one run: serve (embedded) or reach (URL) a target, drive the workload, record both sides.

Embedded: the reference engine and its OpenAI-compatible server run in this process on a loopback
port (their own thread and event loop), the load client talks to them over real HTTP, and engine,
server and client events land in one run directory. A URL target is black-box: only the client's
events exist, and the gap register says so. The client watches its own overhead (event-loop lag,
pacing error) and the manifest marks a run client-bound when the lag exceeds 1 ms at p99.
"""
from __future__ import annotations

import asyncio
import platform
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from inferledger.collectors.capture.interrupt import Interrupted, signal_name, sigterm_like_sigint
from inferledger.collectors.capture import microbench
from inferledger.collectors.capture.manifest import StartingManifest, finish_run
from inferledger.collectors.capture.registration import own_prediction, read_prediction, register
from inferledger.collectors.capture.speed_probe import probe_throughput
from inferledger.collectors.load.loadgen import LoadClient, LoadResult
from inferledger.collectors.load.prompt_tokenizer import load_tokenizer
from inferledger.collectors.workload import Workload
from inferledger.collectors.rundir.writer import AUTOFLUSH_S, RunWriter
from inferledger.probes.probe import Probe, WallMapping, host_id, mono_clock
from inferledger.probes.sampler import EnergySampler
from inferledger.serve import DRAIN_TIMEOUT_S

IDLE_BASELINE_S = 1.0  # sampled before load: the idle term of energy per good result


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


async def _drive(wl: Workload, plans, url: str, probe: Probe, writer: RunWriter, *, separate_clocks: bool,
                 served_model: str | None, api_key: str | None, progress=None, trace_salt: str | None = None):
    from inferledger.collectors.capture.clocksync import ClockSyncError, ClockSyncFailure, estimate
    from inferledger.collectors.load.http_transport import HTTPTarget

    mappings = []
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    if separate_clocks:
        mappings.append(await estimate(url, probe.clock, headers=headers, label="start"))
    lags: list[tuple[int, float]] = []
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch_loop_lag(lags, stop))
    try:
        async with HTTPTarget(url, model=served_model, api_key=api_key, trace_salt=trace_salt) as target:
            client = LoadClient(wl, target, probe, plans=plans, on_task_done=progress)
            result = await client.run()
    finally:
        stop.set()
        await watcher
    if separate_clocks:  # the load is recorded: a server that stopped answering /clock costs one mapping, not the run
        try:
            mappings.append(await estimate(url, probe.clock, headers=headers, label="end"))
        except ClockSyncError as exc:
            mappings.append(ClockSyncFailure("end", str(exc)))
    return result, lags, mappings


def capture(workload: str | Path | Workload, out: str | Path, *, target: str = "embedded",
            separate_clocks: bool = False, max_num_seqs: int = 8, model: str | None = None, bundle=None,
            engine_config: dict | None = None, served_model: str | None = None, api_key: str | None = None,
            switch_interval_s: float | None = 0.0005, progress=None, on_ready=None,
            device: str = "cpu", otlp_port: int | None = None, scrape_metrics: bool = False,
            engine_host: str | None = None, engine_clock_epsilon_ms: float = 5.0,
            drain_timeout_s: float = DRAIN_TIMEOUT_S, microbenchmarks: bool = True,
            prediction: str | Path | None = None, run_id: str | None = None,
            buckets: int | None = None) -> CaptureResult:
    """Run `workload` against `target` ('embedded' or a base URL) and write the run directory `out`.

    `bundle` reuses an already loaded model (tests), else `model` is loaded on `device` ("cpu" or
    "cuda": bf16, CUDA graphs, device.step events); `switch_interval_s` shortens the interpreter's
    thread switch interval during the run so the client's loop is not held for 5 ms by the server's
    or engine's threads (None leaves it alone). A URL target's own evidence (collectors.evidence.engine_evidence):
    `otlp_port` receives its OTLP spans, `scrape_metrics` scrapes its /metrics; `engine_host` names the
    engine's host when it is not this one (its wall clock then maps within `engine_clock_epsilon_ms`).
    `buckets`: a clean run's events end in the partitioned layout of that many task buckets.
    The embedded server stops by the serving drain rule (serve/lifecycle.py) within `drain_timeout_s`.
    Before the load: the embedded engine's device is measured (`microbenchmarks`; manifest
    `device_params`) and a prediction registered (`prediction`, a file from `inferledger predict`, else
    the capture's own; run file prediction.json, manifest `prediction`). `run_id` names the run
    (default: the folder's name)."""
    wl = workload if isinstance(workload, Workload) else Workload.load(workload)
    out = Path(out)
    # The manifest exists from the first second (state "starting") while the model loads and the
    # prompts are built; if that fails, nothing was recorded and the folder is taken away again.
    starting = StartingManifest(out, {"source": "inferledger capture", "state": "starting",
                                       "target": {"kind": "embedded" if target == "embedded" else "url", "url": target},
                                       "workload": {"path": wl.path, "name": wl.name, "sha256": wl.sha256}})
    with starting:
        given = read_prediction(prediction) if prediction is not None else None  # a bad file stops here, named
        if target == "embedded" and bundle is None:
            from inferledger.engine.loader import load_model

            bundle = load_model(model, device=device)
        calibration = None
        if wl.calibrate_tok_s and target == "embedded":
            speed = probe_throughput(bundle, max_num_seqs, engine_config=engine_config)
            calibration = {**wl.calibrate(speed.tok_s), "probe_threads": speed.threads}
        tokenizer = None
        if wl.needs_tokenizer:  # prompts are built before anything is recorded: a bad workload leaves no run
            own = target == "embedded" and (wl.tokenizer is None or (wl.tokenizer == "bundled" and model is None))
            tokenizer = bundle.tokenizer if own else load_tokenizer(wl.tokenizer)
        # the engine refuses prompt + max_tokens past its context: a trace's rows are fitted to it
        context = min(bundle.config.max_position, (engine_config or {}).get("max_model_len") or 1 << 62) \
            if target == "embedded" else None
        plans = wl.plan(tokenizer, context_tokens=context)
        limits = {"max_num_seqs": max_num_seqs, **(engine_config or {})}
        if target != "embedded":
            device_params = microbench.skipped("URL target: its device is the server's, not measured from here")
        elif not microbenchmarks:
            device_params = microbench.skipped("not measured (capture --no-microbench)")
        else:
            device_params = microbench.device_params(
                bundle, max_batch=limits["max_num_seqs"], cpu_threads=limits.get("cpu_threads", "auto"),
                max_tokens=limits.get("max_num_batched_tokens"))
        source = str(prediction) if given is not None else "no file given (capture --prediction)"
        if given is None and target == "embedded":
            given, source = own_prediction(wl, bundle.identity, device_params, limits["max_num_seqs"])
    host = host_id()
    writer = RunWriter(out, run_id, autoflush_s=AUTOFLUSH_S, buckets=buckets)  # a kill loses at most the last 2 s
    engine_clock = mono_clock(host)
    client_clock = f"client-mono:{host}" if separate_clocks else engine_clock
    head = {"source": "inferledger capture", "state": "running",
            "target": {"kind": "embedded" if target == "embedded" else "url", "url": target},
            "workload": {"path": wl.path, "name": wl.name, "sha256": wl.sha256, "spec": wl.spec,
                         **({"trace": wl.trace.summary} if wl.trace else {})},
            **({"slo": wl.slo} if wl.slo else {}), "client": {"clock": client_clock},
            "host": {"name": host, "platform": platform.platform(), "python": platform.python_version()}}
    head["device_params"] = device_params
    # registered before the server exists: every event of the run comes after it
    head["prediction"] = register(out, given, source, engine_clock if target == "embedded" else client_clock) \
        if given is not None else {"skipped": source}
    writer.write_manifest(head)  # from the first second: a killed run still says what it was
    writer.clock_domain(client_clock, host=host, kind="monotonic")
    probe = Probe(writer, "client", run_id=writer.run_id, host=host, clock=client_clock)
    wall = WallMapping()  # mono -> Unix time, for exports in wall time (OTLP); checked again at the end
    server = None
    old_switch = sys.getswitchinterval()
    t0 = time.monotonic()
    sampler = EnergySampler(writer, hz=10, host=host)
    evidence = None
    clean = False
    with sigterm_like_sigint() as got:
        try:
            if target == "embedded":
                from inferledger.engine import EngineConfig
                from inferledger.serve.lifecycle import Serving

                config = EngineConfig(**{"max_num_seqs": max_num_seqs, **(engine_config or {})})
                server = Serving(bundle, config, sink=writer, host=host, source="inferledger capture")
                head.update(server.engine.manifest())
                writer.write_manifest(head)
            url = server.start() if server is not None else target  # one host, one CLOCK_MONOTONIC
            if server is None and (otlp_port is not None or scrape_metrics):
                from inferledger.collectors.evidence.engine_evidence import EngineEvidence

                evidence = EngineEvidence(out, writer, host=host, client_clock=client_clock, target_url=url,
                                          otlp_port=otlp_port, scrape_metrics=scrape_metrics,
                                          engine_host=engine_host)
            # Energy counters (NVML, RAPL) where this machine has them, raw, on the host clock; a short idle
            # stretch before load gives the ledger its idle baseline. Without a source nothing runs.
            if any(src.available for src in sampler.sources()):
                sampler.start()
                time.sleep(IDLE_BASELINE_S)
            if on_ready:
                on_ready()
            if switch_interval_s:
                sys.setswitchinterval(switch_interval_s)
            t0 = time.monotonic()
            result, lags, mappings = asyncio.run(_drive(wl, plans, url, probe, writer, separate_clocks=separate_clocks,
                                                        served_model=served_model or (server.model_name if server else None),
                                                        api_key=api_key, progress=progress,
                                                        trace_salt=evidence.trace_salt if evidence else None))
            sys.setswitchinterval(old_switch)
            if server is not None:
                server.stop(drain_timeout_s)
            sampler.stop()
            manifest = finish_run(writer, wl, plans, tokenizer, server, sampler, evidence, result, lags, mappings,
                               wall, out, host=host, url=url, client_clock=client_clock, engine_clock=engine_clock,
                               separate_clocks=separate_clocks, calibration=calibration,
                               switch_interval_s=switch_interval_s, wall_s=time.monotonic() - t0,
                               engine_clock_epsilon_ms=engine_clock_epsilon_ms,
                               registered={k: head[k] for k in ("device_params", "prediction") if k in head})
            clean = True
        except BaseException as exc:  # interrupted or failed: keep what was recorded, say so, re-raise
            why = signal_name(got, exc)
            sys.setswitchinterval(old_switch)
            _stop_quietly(server, sampler, evidence, drain_timeout_s)
            writer.write_manifest({**head, "state": "interrupted", "interrupted": why,
                                   "wall_s": round(time.monotonic() - t0, 3)})
            if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Interrupted):
                raise Interrupted(got["signum"] or signal.SIGINT) from None
            raise
        finally:
            writer.close(compact_parts=clean)  # even when stopping the server or a timer failed
    return CaptureResult(out, result, manifest["wall_s"], manifest["client"]["loop_lag_p99_ms"],
                         manifest["client"]["client_bound"], manifest)


def _stop_quietly(server, sampler, evidence=None, drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:
    """Stop what runs, each part on its own: one failing (a CUDA timer's close) must not stop the rest."""
    for stop in ((lambda: server.stop(drain_timeout_s)) if server is not None else None, sampler.stop,
                 evidence.abort if evidence is not None else None):
        if stop is None:
            continue
        try:
            stop()
        except BaseException as exc:  # reported, not raised: the run directory still gets closed
            print(f"inferledger capture: while stopping: {exc!r}", file=sys.stderr)
