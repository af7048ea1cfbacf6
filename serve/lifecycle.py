"""One serving life of the reference engine: build engine and front end, serve, drain, write the run.

    life = Serving(bundle, EngineConfig(max_num_seqs=16), ServeOptions(model_name="smol"), sink=writer, owns_run=True)
    url = life.start(host="127.0.0.1", port=8000)
    ...                                  # clients send requests
    life.stop()                          # the drain rule below; then the run is written and closed

`inferledger serve`, the embedded capture and the benchmarks all stop through `stop`, so they share one
drain rule (docs/CAPTURE.md "Stopping a server"): the front end stops admitting (a new request gets
503 `server_shutting_down`), requests in flight run to their end for up to `drain_timeout_s`, and
whatever is still running then is cancelled the way a client disconnect cancels it, so every attempt
ends with a terminal event (`server.done` with `aborted`, `engine.finished` with reason `cancelled`)
before the engine stops. `sink` is the run's event sink (a RunWriter); with `owns_run` this object
also writes the run's manifest, its wall-clock mapping and closes it.
"""
from __future__ import annotations

import platform
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from inferledger.engine import AsyncEngine, EngineConfig, LLMEngine
from inferledger.probes.host import HostSampler
from inferledger.probes.probe import WallMapping, boot_id, host_id, mono_clock

from . import DRAIN_TIMEOUT_S
from .app import SERVER_KEY, build_app
from .options import ServeOptions
from .thread import ServerThread

CANCEL_WAIT_S = 10.0    # after the cancel: each request leaves at the engine's next iteration boundary
POLL_S = 0.01


def default_model_name(identity: dict) -> str:
    """What clients pass as `model`: the checkpoint's file or folder name without `.gguf`."""
    return Path(identity.get("path", "model")).name.removesuffix(".gguf")


@dataclass
class DrainResult:
    """How a stop went: `in_flight` requests were running when it began; `cancelled` of them were
    cancelled after the drain timeout; `left` were still in the engine after the cancel wait (the
    ledger shows those as unterminated); `waited_s` is the whole stop."""
    timeout_s: float
    in_flight: int
    cancelled: int
    left: int
    waited_s: float


class Serving:
    """The engine, its HTTP front end and (optionally) the run they write, from start to stop."""

    def __init__(self, bundle, config: EngineConfig | None = None, options: ServeOptions = ServeOptions(), *,
                 sink=None, host: str | None = None, run_id: str | None = None, owns_run: bool = False,
                 source: str = "inferledger serve") -> None:
        self.host = host or host_id()
        self.sink, self.owns_run, self.source = sink, owns_run and sink is not None, source
        run_id = run_id or getattr(sink, "run_id", None) or "serve"
        self.engine = LLMEngine(bundle, config or EngineConfig(), sink=sink, run_id=run_id, host=self.host)
        self.async_engine = AsyncEngine(self.engine)
        self.model_name = options.model_name or default_model_name(bundle.identity)
        self.options = replace(options, model_name=self.model_name)
        self.app = build_app(self.async_engine, bundle.tokenizer, self.options, sink=sink, run_id=run_id, host=self.host)
        self.front = self.app[SERVER_KEY]
        self.thread: ServerThread | None = None
        self.wall: WallMapping | None = None
        self.t0 = time.monotonic()
        self.drain: DrainResult | None = None
        self._closed = threading.Event()
        # an owned run samples its host (pressure, CPU time, load) from start to stop, as a capture does
        self.host_sampler = HostSampler(sink, host=self.host, applies_to_server=(True, "the server runs in this process")) \
            if self.owns_run else None

    @property
    def clock(self) -> str:
        return mono_clock(self.host)

    @property
    def url(self) -> str:
        return self.thread.url

    def manifest(self) -> dict:
        """What a run manifest says about this server: the engine's identity and configuration, the
        name it serves, its address and admission limit."""
        bind = {"host": self.thread.host, "port": self.thread.port} if self.thread else {}
        return {"source": self.source, "target": "http", **self.engine.manifest(), "served_model_name": self.model_name,
                "server": {**bind, "max_queue": self.options.max_queue, "api_key": self.options.api_key is not None},
                "host": {"name": self.host, "boot_id": boot_id(), "platform": platform.platform(),
                         "python": platform.python_version()},
                "system_under_test": {"inside": ["HTTP front end", "reference engine"], "outside": ["clients"]},
                "evidence": {"engine_config": "declared", "events": "observed"},
                **({"host_samples": self.host_sampler.manifest()} if self.host_sampler is not None else {})}

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start the engine loop and the front end on `host:port` (0: an ephemeral port); returns the URL.
        An address that cannot be bound raises OSError; `stop` then still closes the engine and the run."""
        self.t0 = time.monotonic()
        if self.owns_run:
            self.wall = WallMapping()  # mono -> Unix time for the exports, checked again at the end
            self.sink.clock_domain(self.clock, host=self.host, kind="monotonic")
            self.host_sampler.start()
        self.async_engine.start()
        self.thread = ServerThread(self.app, host, port)
        if self.owns_run:  # before the first request can arrive; again below with the port it got
            self.sink.write_manifest({**self.manifest(), "state": "running"})
        try:
            self.thread.start()
        except RuntimeError as exc:
            cause = exc.__cause__
            raise cause if isinstance(cause, OSError) else exc
        if self.owns_run and port == 0:
            self.sink.write_manifest({**self.manifest(), "state": "running"})
        return self.thread.url

    def wait(self) -> None:
        """Block until interrupted (KeyboardInterrupt: Ctrl-C, or SIGTERM under `sigterm_like_sigint`)."""
        while not self._closed.wait(0.25):
            if self.thread is not None and not self.thread.alive():
                raise RuntimeError("the HTTP front end's thread stopped")

    def stop(self, drain_timeout_s: float = DRAIN_TIMEOUT_S, *, stopped_by: str | None = None) -> DrainResult:
        """The drain rule; then the front end and the engine loop stop, and an owned run is written."""
        if self.drain is not None:
            return self.drain
        t0 = time.monotonic()
        self.front.draining = True
        busy = self._busy()
        self._wait_idle(t0 + drain_timeout_s)
        cancelled = 0
        if self._busy() and self.thread is not None and self.thread.alive():
            try:
                cancelled = self.thread.call(self.front.cancel_in_flight(), timeout=CANCEL_WAIT_S)
            except TimeoutError:  # the front end's loop does not answer: the engine's requests are aborted
                for rid in list(self.engine.requests):
                    self.engine.abort(rid)
            self._wait_idle(time.monotonic() + CANCEL_WAIT_S)
        left = len(self.engine.requests)
        self.drain = DrainResult(drain_timeout_s, busy, cancelled, left, round(time.monotonic() - t0, 3))
        try:
            if self.thread is not None:
                self.thread.stop()
        finally:
            self.async_engine.close()
            self._closed.set()
            if self.host_sampler is not None:
                self.host_sampler.stop()
            if self.owns_run:
                self._write_run(stopped_by)
        return self.drain

    def _wait_idle(self, deadline: float) -> None:
        try:
            while self._busy() and time.monotonic() < deadline:
                time.sleep(POLL_S)
        except KeyboardInterrupt:  # another Ctrl-C (or SIGTERM): stop waiting, go on to the next step
            pass

    def _busy(self) -> int:
        """Requests not yet at their end: admitted at the front end, or still in the engine."""
        return max(self.front.in_flight, len(self.engine.requests)) or int(self.engine.has_unfinished())

    def _write_run(self, stopped_by: str | None) -> None:
        (self.wall or WallMapping()).write(self.sink, [self.clock], self.host)
        state = {"state": "interrupted", "interrupted": stopped_by} if stopped_by else {"state": "complete"}
        self.sink.write_manifest({**self.manifest(), **state, "drain": asdict(self.drain),
                                  "wall_s": round(time.monotonic() - self.t0, 3)})
        self.sink.close(compact_parts=True)
