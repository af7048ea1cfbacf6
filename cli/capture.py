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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from inferledger.collectors.loadgen import LoadClient, LoadResult
from inferledger.collectors.out_dir import check_new_run_dir
from inferledger.collectors.prompt_tokenizer import load_tokenizer
from inferledger.collectors.workload import Workload
from inferledger.cli.embedded_server import EmbeddedServer, probe_throughput
from inferledger.cli.interrupt import Interrupted, signal_name, sigterm_like_sigint
from inferledger.collectors.writer import AUTOFLUSH_S, RunWriter, write_json_atomic, write_table_atomic
from inferledger.probes.events import GAP_SCHEMA
from inferledger.probes.quantile import quantile
from inferledger.probes.sampler import EnergySampler

IDLE_BASELINE_S = 1.0  # sampled before load: the idle term of energy per good result
from inferledger.probes.probe import Probe, WallMapping, host_id, mono_clock

CLIENT_BOUND_LAG_MS = 1.0  # p99 event-loop lag above which the client's own delay taints its figures


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
    from inferledger.collectors.clocksync import estimate
    from inferledger.collectors.http_transport import HTTPTarget

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
    if separate_clocks:
        mappings.append(await estimate(url, probe.clock, headers=headers, label="end"))
    return result, lags, mappings


def _lag_p99(values: list[float]) -> float:
    return quantile(values, 0.99)  # never empty: the watcher records a sample before it checks for the stop


def capture(workload: str | Path | Workload, out: str | Path, *, target: str = "embedded",
            separate_clocks: bool = False, max_num_seqs: int = 8, model: str | None = None, bundle=None,
            engine_config: dict | None = None, served_model: str | None = None, api_key: str | None = None,
            switch_interval_s: float | None = 0.0005, progress=None, on_ready=None,
            device: str = "cpu", otlp_port: int | None = None, scrape_metrics: bool = False,
            engine_host: str | None = None, engine_clock_epsilon_ms: float = 5.0) -> CaptureResult:
    """Run `workload` against `target` ('embedded' or a base URL) and write the run directory `out`.

    `bundle` reuses an already loaded model (tests), else `model` is loaded on `device` ("cpu" or
    "cuda": bf16, CUDA graphs, device.step events); `switch_interval_s` shortens the interpreter's
    thread switch interval during the run so the client's loop is not held for 5 ms by the server's
    or engine's threads (None leaves it alone). A URL target's own evidence (collectors.engine_evidence):
    `otlp_port` receives its OTLP spans, `scrape_metrics` scrapes its /metrics; `engine_host` names the
    engine's host when it is not this one (its wall clock then maps within `engine_clock_epsilon_ms`)."""
    wl = workload if isinstance(workload, Workload) else Workload.load(workload)
    out = Path(out)
    # The manifest exists from the first second (state "starting") while the model loads and the
    # prompts are built; if that fails, nothing was recorded and the folder is taken away again.
    starting = _StartingManifest(out, {"source": "inferledger capture", "state": "starting",
                                       "target": {"kind": "embedded" if target == "embedded" else "url", "url": target},
                                       "workload": {"path": wl.path, "name": wl.name, "sha256": wl.sha256}})
    with starting:
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
    host = host_id()
    writer = RunWriter(out, autoflush_s=AUTOFLUSH_S)  # a kill loses at most the last 2 s
    engine_clock = mono_clock(host)
    client_clock = f"client-mono:{host}" if separate_clocks else engine_clock
    head = {"source": "inferledger capture", "state": "running",
            "target": {"kind": "embedded" if target == "embedded" else "url", "url": target},
            "workload": {"path": wl.path, "name": wl.name, "sha256": wl.sha256, "spec": wl.spec,
                         **({"trace": wl.trace.summary} if wl.trace else {})},
            **({"slo": wl.slo} if wl.slo else {}), "client": {"clock": client_clock},
            "host": {"name": host, "platform": platform.platform(), "python": platform.python_version()}}
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
                server = EmbeddedServer(writer, host, max_num_seqs=max_num_seqs, bundle=bundle,
                                        engine_config=engine_config)
                head.update(server.engine.manifest())
                writer.write_manifest(head)
            url = server.start() if server is not None else target  # one host, one CLOCK_MONOTONIC
            if server is None and (otlp_port is not None or scrape_metrics):
                from inferledger.collectors.engine_evidence import EngineEvidence

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
                server.stop()
            sampler.stop()
            manifest = _finish(writer, wl, plans, tokenizer, server, sampler, evidence, result, lags, mappings,
                               wall, out, host=host, url=url, client_clock=client_clock, engine_clock=engine_clock,
                               separate_clocks=separate_clocks, calibration=calibration,
                               switch_interval_s=switch_interval_s, wall_s=time.monotonic() - t0,
                               engine_clock_epsilon_ms=engine_clock_epsilon_ms)
            clean = True
        except BaseException as exc:  # interrupted or failed: keep what was recorded, say so, re-raise
            why = signal_name(got, exc)
            sys.setswitchinterval(old_switch)
            _stop_quietly(server, sampler, evidence)
            writer.write_manifest({**head, "state": "interrupted", "interrupted": why,
                                   "wall_s": round(time.monotonic() - t0, 3)})
            if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Interrupted):
                raise Interrupted(got["signum"] or signal.SIGINT) from None
            raise
        finally:
            writer.close(compact_parts=clean)  # even when stopping the server or a timer failed
    return CaptureResult(out, result, manifest["wall_s"], manifest["client"]["loop_lag_p99_ms"],
                         manifest["client"]["client_bound"], manifest)


class _StartingManifest:
    """manifest.json with state "starting" before anything slow, in a folder that holds no run yet; on a
    failure inside the block the manifest goes again, and the folder too when this capture made it (a
    bad workload leaves no run)."""

    def __init__(self, out: Path, body: dict) -> None:
        check_new_run_dir(out)  # so the clean-up below can only take away what this capture wrote
        self.out, self.made = out, [p for p in (out, *out.parents) if not p.exists()]
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic({"run_id": out.name, **body}, out / "manifest.json")

    def __enter__(self) -> "_StartingManifest":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            return
        (self.out / "manifest.json").unlink(missing_ok=True)
        for p in self.made:  # innermost first; a folder something else wrote into stays
            try:
                p.rmdir()
            except OSError:
                break


def _stop_quietly(server, sampler, evidence=None) -> None:
    """Stop what runs, each part on its own: one failing (a CUDA timer's close) must not stop the rest."""
    for stop in ((lambda: server.stop(drain_s=5.0)) if server is not None else None, sampler.stop,
                 evidence.abort if evidence is not None else None):
        if stop is None:
            continue
        try:
            stop()
        except BaseException as exc:  # reported, not raised: the run directory still gets closed
            print(f"inferledger capture: while stopping: {exc!r}", file=sys.stderr)


def _finish(writer, wl, plans, tokenizer, server, sampler, evidence, result, lags, mappings, wall, out, *, host,
            url, client_clock, engine_clock, separate_clocks, calibration, switch_interval_s, wall_s,
            engine_clock_epsilon_ms) -> dict:
    """After a clean run: clock mappings, the client's lag trace, gaps and the full manifest."""
    evidence_gaps, evidence_manifest = evidence.finish(result.completed + result.abandoned) if evidence else ([], None)
    for m in mappings:
        writer.clock_domain(m.from_clock, host=host if server else None, kind="monotonic")
        writer.clock_map(m.from_clock, m.to_clock, m.offset_ns, m.epsilon_ns, m.method)
    # both of this process's monotonic domains (one clock, two names in a separate-clocks run); a
    # black-box server's clock is another host's and gets no wall mapping from here
    wall.write(writer, [client_clock] + ([engine_clock] if server is not None else []), host)
    if evidence is not None:
        evidence.write_clock(wall, client_clock, engine_clock_epsilon_ms)
    lag_values = [lag for _, lag in lags]
    lag_p99 = _lag_p99(lag_values)
    for ts_ns, lag in lags[:: max(1, len(lags) // 2000)]:  # a bounded trace of the client's own lag
        writer.sample(ts_ns=ts_ns, clock=client_clock, source="client", host=host, metric="client_loop_lag_ms",
                      value=lag, unit="ms")
    gaps = list(sampler.gap_rows(writer.run_id)) + evidence_gaps
    if server is None and not (evidence_manifest or {}).get("spans", {}).get("joined"):
        gaps.append({"run_id": writer.run_id, "gap_id": "collector:black-box", "scope": "run", "subject_id": None,
                     "affects": "server_status, ttft_server_ms, e2e_server_ms, queue/prefill/decode, resources",
                     "needs": "server-side events: serve with `inferledger serve --out` or import the server's trace",
                     "detail": f"black-box target {url}: only the client's events were recorded"})
    write_table_atomic(pa.Table.from_pylist(gaps, schema=GAP_SCHEMA), out / "gaps.parquet")
    client_bound = lag_p99 > CLIENT_BOUND_LAG_MS
    classes = Counter(p.cls.name for p in plans)
    manifest = {
        "source": "inferledger capture",
        "target": {"kind": "embedded" if server else "url", "url": url},
        "workload": {"path": wl.path, "name": wl.name, "sha256": wl.sha256, "spec": wl.spec,
                     "arrivals": wl.process, "n_tasks": wl.n_tasks, "classes": dict(classes),
                     "requests": sum(len(p.requests) for p in plans),
                     **({"trace": wl.trace.summary} if wl.trace else {})},  # what was done to the trace's rows
        **({"slo": wl.slo} if wl.slo else {}),  # vLLM-style goodput thresholds (after calibration)
        "prompts": {"tokenizer": (tokenizer.hash if tokenizer is not None else None),
                    "tokenizer_source": (wl.tokenizer or ("embedded model" if server else "bundled"))
                    if tokenizer is not None else None,
                    "exact_prompt_tokens": sorted({r.prompt_tokens for p in plans for r in p.requests
                                                   if r.prompt_tokens})},
        "calibration": calibration,
        "state": "complete",
        "wall_s": round(wall_s, 3),
        "client": {"clock": client_clock, "loop_lag_p99_ms": round(lag_p99, 3),
                   "loop_lag_max_ms": round(max(lag_values, default=0.0), 3), "client_bound": client_bound,
                   "client_bound_rule": f"event-loop lag p99 > {CLIENT_BOUND_LAG_MS} ms",
                   "pacing_error_ms": result.pacing_summary(), "switch_interval_s": switch_interval_s,
                   "result": result.counts()},
        "clock_mappings": [m.__dict__ for m in mappings],
        "system_under_test": {
            "inside": ["reference engine", "OpenAI-compatible HTTP front end"] if server else [url],
            "outside": ["load client", "checker", "simulated tools"]},
        "host": {"name": host, "platform": platform.platform(), "python": platform.python_version(),
                 "processor": platform.processor()},
        "evidence": {"engine_config": "declared", "model": "declared", "events": "observed",
                     "clock_mapping": "observed (round trips)" if separate_clocks else "same domain",
                     "client_overhead": "observed (loop lag, pacing error)",
                     **(evidence.evidence_kinds() if evidence is not None else {})},
    }
    manifest["energy"] = sampler.manifest()
    if evidence_manifest is not None:
        manifest["engine_evidence"] = evidence_manifest
    if server is not None:
        manifest.update(server.engine.manifest())
    writer.flush()  # every part on disk before the manifest says "complete" (a failed write says interrupted)
    writer.write_manifest(manifest)
    return manifest
