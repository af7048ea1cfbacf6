"""AsyncEngine: the engine loop on one background thread, streams for asyncio coroutines.

    engine = AsyncEngine(LLMEngine(bundle, config, sink=writer))
    async for delta in engine.generate(prompt_ids, params, request_id="r1"):
        ...
    await engine.aclose()

One thread owns `LLMEngine.step()`; coroutines only add requests and abort them (both thread-safe)
and read their deltas from an asyncio.Queue, filled through one `loop.call_soon_threadsafe` per step. A consumer
that stops early (task cancelled, client disconnected, generator closed) aborts its request.

While any AsyncEngine of the process runs, what was alive when the first one started (the model's
modules, the compiled step's graphs, the tokenizer: about 870,000 objects for the bundled model,
compiled) is frozen out of Python's cyclic collector (`gc.freeze`), thawed when the last one closes. A
full collection scanned them in 270 ms with the interpreter lock held, and every in-flight step slept
behind it (`steps.blocked_ms`: docs/MODEL.md "Contention"); frozen, it scans what serving made.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import threading
from typing import AsyncIterator

from .llm_engine import EngineStepError, LLMEngine
from .outputs import RequestDelta
from .params import SamplingParams

log = logging.getLogger(__name__)

_RUNNING = set()  # the AsyncEngines of this process whose loop runs: the first freezes, the last thaws
_RUNNING_LOCK = threading.Lock()


def _serving(engine: "AsyncEngine", running: bool) -> None:
    """Count `engine` in or out of the running ones: the startup objects frozen as the first starts,
    thawed as the last stops (module docstring)."""
    with _RUNNING_LOCK:
        before = bool(_RUNNING)
        (_RUNNING.add if running else _RUNNING.discard)(engine)
        if bool(_RUNNING) != before:
            (gc.freeze if running else gc.unfreeze)()


class AsyncEngine:
    def __init__(self, engine: LLMEngine, *, idle_wait_s: float = 0.05) -> None:
        self.engine = engine
        self.idle_wait_s = idle_wait_s
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                _serving(self, True)
                self._thread = threading.Thread(target=self._run, name="inferledger-engine", daemon=True)
                self._thread.start()

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the loop (requests still running are left as they are) and close the engine's
        device timer (its last device.step events and clock mapping)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        _serving(self, False)
        self.engine.close()

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    async def __aenter__(self) -> "AsyncEngine":
        self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # -- the loop thread --------------------------------------------------------------------------
    def _run(self) -> None:
        self.engine.place_step_thread()  # its own CPUs, the rest left to the front end (cpu_threads)
        while not self._stop.is_set():
            if not self.engine.has_unfinished():
                self._wake.wait(self.idle_wait_s)
                self._wake.clear()
                continue
            try:
                deltas = self.engine.step()
            except EngineStepError as exc:  # that batch finished with reason "error"; go on
                log.exception("engine step failed")
                self.last_error, deltas = exc.__cause__ or exc, exc.deltas
            except Exception as exc:  # a bug: fail every open stream rather than hang it
                log.exception("engine loop failed")
                self.last_error = exc
                self._fail_all(exc)
                return
            self._dispatch(deltas)

    def _dispatch(self, deltas: list[RequestDelta]) -> None:
        """A step's deltas to their streams: one hand-over per event loop, not one per delta (each
        `call_soon_threadsafe` takes the loop's lock and writes its wake-up pipe, a system call in the
        step thread; at 16 streams a step that was 16 writes), each queue getting its deltas in order."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestDelta]]] = {}
        with self._lock:
            for d in deltas:
                stream = self._streams.get(d.attempt_id)
                if stream is not None:
                    by_loop.setdefault(stream[0], []).append((stream[1], d))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_deliver, items)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            streams = list(self._streams.values())
        for loop, queue in streams:
            loop.call_soon_threadsafe(queue.put_nowait, exc)

    # -- coroutine side ---------------------------------------------------------------------------
    async def generate(self, prompt_token_ids: list[int], params: SamplingParams | None = None, *,
                       request_id: str, attempt_id: str | None = None, task_id: str | None = None,
                       session_id: str | None = None) -> AsyncIterator[RequestDelta]:
        """Deltas of one request until it finishes (the last has request_finished=True and the
        whole RequestOutput). A request the engine refuses raises ValueError on the first
        iteration (call validate() first to answer before streaming)."""
        self.start()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        aid = attempt_id or request_id
        with self._lock:
            if aid in self._streams:
                raise ValueError(f"attempt_id {aid!r} is already streaming; give each attempt its own id")
            self._streams[aid] = (loop, queue)
        try:
            self.engine.add_request(prompt_token_ids, params, request_id=request_id, attempt_id=aid,
                                    task_id=task_id, session_id=session_id)
        except BaseException:
            with self._lock:
                self._streams.pop(aid, None)
            raise
        self._wake.set()
        done = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    done = True
                    raise RuntimeError("the engine loop stopped") from item
                done = item.request_finished
                yield item
                if done:
                    return
        finally:
            with self._lock:
                self._streams.pop(aid, None)
            if not done:  # cancelled, disconnected or closed early
                self.abort(aid)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams | None = None) -> None:
        """Raise now the ValueError that generate() would raise on its first iteration."""
        self.engine.validate(prompt_token_ids, params)

    def abort(self, attempt_or_request_id: str) -> bool:
        ok = self.engine.abort(attempt_or_request_id)
        self._wake.set()
        return ok


def _deliver(items: list[tuple[asyncio.Queue, RequestDelta]]) -> None:
    """On the streams' event loop: each delta into its stream's queue, in the order the step made them."""
    for queue, delta in items:
        queue.put_nowait(delta)
