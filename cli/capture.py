"""Capture one run: serve (embedded) or reach (URL) a target, drive the workload, record both sides.

Embedded: the reference engine and its OpenAI-compatible server run in this process on a loopback
port (their own thread and event loop), the load client talks to them over real HTTP, and engine,
server and client events land in one run directory. A URL target is black-box: only the client's
events exist, and the gap register says so.
"""
from __future__ import annotations

import asyncio
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from inferledger.collectors.loadgen import LoadClient, LoadResult, Workload
from inferledger.collectors.writer import RunWriter, write_table_atomic
from inferledger.probes.events import GAP_SCHEMA
from inferledger.probes.probe import Probe, host_id, mono_clock


@dataclass
class CaptureResult:
    run_dir: Path
    load: LoadResult
    wall_s: float
    loop_lag_p99_ms: float
    client_bound: bool
    manifest: dict = field(default_factory=dict)


class EmbeddedServer:
    """The engine plus its HTTP front end on 127.0.0.1:<ephemeral>, in a thread of its own."""

    def __init__(self, writer: RunWriter, host: str, *, max_num_seqs: int = 8, model: str | None = None) -> None:
        from inferledger.engine import AsyncEngine, EngineConfig, LLMEngine
        from inferledger.engine.loader import load_model
        from inferledger.engine.server import build_app
        from inferledger.engine.server_thread import ServerThread

        self.bundle = load_model(model)
        self.config = EngineConfig(max_num_seqs=max_num_seqs)
        self.engine = LLMEngine(self.bundle, self.config, sink=writer, run_id=writer.run_id, host=host)
        self.async_engine = AsyncEngine(self.engine)
        app = build_app(self.async_engine, self.bundle.tokenizer, model_name=Path(self.bundle.identity["path"]).stem,
                        sink=writer, run_id=writer.run_id, host=host)
        self.thread = ServerThread(app)

    def start(self) -> str:
        self.async_engine.start()
        return self.thread.start().url

    def stop(self, drain_s: float = 60.0) -> None:
        # Attempts the client gave up on are the server's to finish or cancel: let the engine reach
        # its own terminal states before stopping, so the ledger sees no unterminated work.
        deadline = time.monotonic() + drain_s
        while self.engine.has_unfinished() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.thread.stop()
        self.async_engine.close()


async def _watch_loop_lag(samples: list[tuple[int, float]], stop: asyncio.Event, period_s: float = 0.01) -> None:
    """How late the client's event loop wakes: its own overhead, recorded so a client-bound run shows."""
    while not stop.is_set():
        t = time.monotonic_ns()
        await asyncio.sleep(period_s)
        now = time.monotonic_ns()
        samples.append((now, max(0.0, (now - t) / 1e6 - period_s * 1000)))


async def _drive(wl: Workload, url: str, probe: Probe, writer: RunWriter, *, separate_clocks: bool,
                 progress=None) -> tuple[LoadResult, list[tuple[int, float]]]:
    from inferledger.collectors.clocksync import estimate
    from inferledger.collectors.http_transport import HTTPTarget

    if separate_clocks:
        mapping = await estimate(url, probe.clock)
        writer.clock_domain(mapping.from_clock, host=probe.host, kind="monotonic")
        writer.clock_map(mapping.from_clock, mapping.to_clock, mapping.offset_ns, mapping.epsilon_ns, mapping.method)
    lags: list[tuple[int, float]] = []
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch_loop_lag(lags, stop))
    async with HTTPTarget(url) as target:
        client = LoadClient(wl, target, probe, on_task_done=progress)
        result = await client.run()
    stop.set()
    await watcher
    return result, lags


def capture(workload: str | Path, out: str | Path, *, target: str = "embedded", separate_clocks: bool = False,
            max_num_seqs: int = 8, model: str | None = None, progress=None, on_ready=None) -> CaptureResult:
    wl = Workload.load(workload)
    out = Path(out)
    host = host_id()
    writer = RunWriter(out)
    engine_clock = mono_clock(host)
    client_clock = f"client-mono:{host}" if separate_clocks else engine_clock
    writer.clock_domain(client_clock, host=host, kind="monotonic")
    probe = Probe(writer, "client", run_id=writer.run_id, host=host, clock=client_clock)
    server = None
    if target == "embedded":
        server = EmbeddedServer(writer, host, max_num_seqs=max_num_seqs, model=model)
        url = server.start()  # one host, one CLOCK_MONOTONIC: unless told apart, both use mono:<host>
    else:
        url = target
    if on_ready:
        on_ready()
    t0 = time.monotonic()
    try:
        result, lags = asyncio.run(_drive(wl, url, probe, writer, separate_clocks=separate_clocks,
                                          progress=progress))
    finally:
        if server is not None:
            server.stop()
    wall_s = time.monotonic() - t0
    lag_values = [lag for _, lag in lags]
    lag_p99 = statistics.quantiles(lag_values, n=100)[98] if len(lag_values) >= 2 else 0.0
    for ts_ns, lag in lags[:: max(1, len(lags) // 2000)]:  # a bounded trace of the client's own lag
        writer.sample(ts_ns=ts_ns, clock=client_clock, source="client", host=host, metric="client_loop_lag_ms",
                      value=lag, unit="ms")
    gaps = []
    if server is None:
        gaps.append({"run_id": writer.run_id, "gap_id": "collector:black-box", "scope": "run", "subject_id": None,
                     "affects": "server_status, ttft_server_ms, e2e_server_ms, queue/prefill/decode, resources",
                     "needs": "server-side events: serve with `inferledger serve --out` or import the server's trace",
                     "detail": f"black-box target {url}: only the client's events were recorded"})
    write_table_atomic(pa.Table.from_pylist(gaps, schema=GAP_SCHEMA), out / "gaps.parquet")
    manifest = {
        "source": "inferledger capture",
        "target": {"kind": "embedded" if server else "url", "url": url},
        "workload": {"path": str(workload), "name": wl.name, "sha256": wl.sha256, "spec": wl.spec},
        "wall_s": round(wall_s, 3),
        "client": {"clock": client_clock, "loop_lag_p99_ms": round(lag_p99, 3), "client_bound": lag_p99 > 1.0,
                   "result": result.__dict__},
        "system_under_test": {
            "inside": ["reference engine", "OpenAI-compatible HTTP front end"] if server else [url],
            "outside": ["load client", "checker"]},
        "host": {"name": host, "platform": platform.platform(), "python": platform.python_version(),
                 "processor": platform.processor()},
        "evidence": {"engine_config": "declared", "model": "declared", "events": "observed",
                     "clock_mapping": "observed (round trips)" if separate_clocks else "same domain"},
    }
    if server is not None:
        manifest["model"] = server.bundle.identity
        manifest["engine_config"] = {k: v for k, v in vars(server.config).items()}
    writer.write_manifest(manifest)
    writer.close()
    return CaptureResult(out, result, wall_s, lag_p99, lag_p99 > 1.0, manifest)
