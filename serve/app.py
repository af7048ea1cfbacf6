"""The OpenAI-compatible HTTP front end of the reference engine (aiohttp).

    app = build_app(AsyncEngine(LLMEngine(bundle, sink=writer)), bundle.tokenizer, ServeOptions(model_name="smollm2"))
    ServerThread(app, port=8000).start()       # or serve/lifecycle.py's Serving, or: inferledger serve

Endpoints: POST /v1/completions and /v1/chat/completions (SSE streaming or whole, usage), POST
/v1/chat/completions/render (vLLM's: the prompt's token ids, no attempt), GET
/v1/models, /health, /metrics (Prometheus text), /clock (this server's clock domain and its
monotonic now, for client-side offset estimation). Ids come from the client's headers
(x-inferledger-attempt-id / -request-id / -task-id / -session-id, x-request-id, W3C traceparent) or
are generated, and travel into every server and engine event. A disconnect watcher polls each
in-flight request's transport; a client that goes away cancels its request in the engine.

Status codes: 400 bad JSON / field / range (the engine's ValueError text, param named), 401 missing
or wrong API key (only /v1/* when an api_key is set), 404 unknown model (always 404, OpenAI's
`model_not_found`) or route, 409 an explicit attempt id already in flight, 413 body too large, 429
admission limit reached (Retry-After), 500 engine failure, 503 engine loop down.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from inferledger.probes.probe import Probe

from .protocol import CHAT, COMPLETIONS, ApiError
from .metrics import ServerMetrics
from .ids import IdAssigner, Ids
from .options import ServeOptions
from .request import check_auth, handle_generation, handle_render, max_token_bytes

log = logging.getLogger(__name__)
SERVER_KEY = web.AppKey("inferledger_server", object)


class OpenAIServer:
    """The front end's state: engine, probe, metrics, admission count, watched requests."""

    def __init__(self, async_engine, tokenizer, options: ServeOptions, *, sink=None, run_id: str | None = None,
                 host: str | None = None, clock: str | None = None) -> None:
        if options.model_name is None:
            raise ValueError("the front end needs ServeOptions.model_name: the name clients send as `model`")
        self.engine, self.llm = async_engine, async_engine.engine
        self.tokenizer, self.model_name = tokenizer, options.model_name
        self.api_key, self.max_queue, self.default_max_tokens = options.api_key, options.max_queue, options.default_max_tokens
        ep = self.llm.probe  # same host and clock as the engine unless told otherwise
        self.probe = Probe(sink, "server", run_id=run_id or ep.run_id, host=host or ep.host,
                           clock=clock or ep.clock, now_ns=ep.now_ns if clock is None else time.monotonic_ns)
        self.sink, self.poll_s, self.flush_every_s = sink, options.poll_s, options.flush_every_s
        self.metrics = ServerMetrics(self.model_name, self.llm, self)
        bm = self.llm.block_manager
        self.context_tokens = min(self.llm.max_model_len, bm.num_blocks * bm.block_size)
        self.max_token_bytes = max_token_bytes(tokenizer)  # bounds a prompt's tokens before tokenising it
        self.ids = IdAssigner()
        self.in_flight = 0  # admitted here and not finished: the admission count
        self.active: set[str] = set()  # attempt ids in flight here
        self.watched: dict[asyncio.Task, web.Request] = {}  # producing tasks whose client we watch
        self.gone: set[asyncio.Task] = set()  # tasks cancelled because their client went away
        self.draining = False  # stopping: admit nothing new (serve/lifecycle.py's drain rule)
        self.shut: set[asyncio.Task] = set()  # tasks cancelled because the server is stopping
        self._background: list[asyncio.Task] = []
        self.created = int(time.time())

    def emit(self, name: str, ids: Ids, value=None, **attrs) -> None:
        self.probe.emit(name, ids.event_ids, value=value, **attrs)

    def engine_down(self) -> str | None:
        """Why the engine cannot serve (its loop thread died on an error), or None."""
        thread, err = getattr(self.engine, "_thread", None), getattr(self.engine, "last_error", None)
        if err is not None and (thread is None or not thread.is_alive()):
            return f"the engine loop stopped after an error ({err!r}); restart the server"
        return None

    # -- client disconnects -----------------------------------------------------------------------
    def watch(self, task: asyncio.Task, request: web.Request) -> None:
        self.watched[task] = request
        if not any(t.get_name() == "disconnect-watcher" and not t.done() for t in self._background):
            self._background.append(asyncio.create_task(self._watch_disconnects(), name="disconnect-watcher"))

    async def _watch_disconnects(self) -> None:
        """One loop for all requests: a closed transport cancels the request's producing task, which
        closes its engine stream (= abort in the engine)."""
        while True:
            await asyncio.sleep(self.poll_s)
            for task, request in list(self.watched.items()):
                tr = request.transport
                if tr is None or tr.is_closing():
                    self.watched.pop(task, None)
                    self.gone.add(task)
                    task.cancel()

    async def cancel_in_flight(self) -> int:
        """Cancel every request still producing (the end of a drain); each records `server.done` with
        `aborted` and its engine request is aborted. Returns how many were cancelled."""
        tasks = [t for t in self.watched if not t.done()]
        for task in tasks:
            self.shut.add(task)
            task.cancel()
        return len(tasks)

    # -- handlers ---------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await handle_generation(self, request, COMPLETIONS)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await handle_generation(self, request, CHAT)

    async def render(self, request: web.Request) -> web.Response:
        return await handle_render(self, request)

    async def models(self, request: web.Request) -> web.Response:
        try:
            check_auth(self.api_key, request.headers)
        except ApiError as exc:
            return web.json_response(exc.body(), status=exc.status, headers=exc.headers)
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "inferledger",
                "root": self.model_name, "max_model_len": self.llm.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        down = self.engine_down()
        body = {"status": "error" if down else "ok", "model": self.model_name, "in_flight": self.in_flight}
        return web.json_response({**body, "error": down} if down else body, status=503 if down else 200)

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def clock(self, request: web.Request) -> web.Response:
        clock = json.dumps(self.probe.clock)
        t_ns = self.probe.now_ns()  # read last: only string formatting between it and the write
        return web.Response(text=f'{{"clock":{clock},"t_ns":{t_ns}}}', content_type="application/json")

    # -- lifecycle --------------------------------------------------------------------------------
    async def on_startup(self, app: web.Application) -> None:
        if self.flush_every_s and hasattr(self.sink, "flush"):
            self._background.append(asyncio.create_task(self._flush_loop(), name="sink-flush"))

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.flush_every_s)
            try:
                await loop.run_in_executor(None, self.sink.flush)
            except Exception:
                log.exception("periodic flush of the run directory failed; will retry")

    async def on_cleanup(self, app: web.Application) -> None:
        for t in self._background:
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background.clear()


@web.middleware
async def _openai_errors(request: web.Request, handler):
    """aiohttp's own 404 / 405 / 413 with an OpenAI-style JSON body."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err = ApiError(exc.status, f"{request.method} {request.path}: {exc.reason}",
                       code="not_found" if exc.status == 404 else None)
        extra = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return web.json_response(err.body(), status=exc.status, headers=extra)


def build_app(async_engine, tokenizer, options: ServeOptions, *, sink=None, run_id: str | None = None,
              host: str | None = None, clock: str | None = None) -> web.Application:
    """The aiohttp application. `sink` receives the server's events (source "server"; by default on the
    engine's host and clock); `options` name what it serves and bound it (serve/options.py)."""
    server = OpenAIServer(async_engine, tokenizer, options, sink=sink, run_id=run_id, host=host, clock=clock)
    app = web.Application(middlewares=[_openai_errors], client_max_size=options.client_max_size)
    app[SERVER_KEY] = server
    app.router.add_post(COMPLETIONS, server.completions)
    app.router.add_post(CHAT, server.chat)
    app.router.add_post(CHAT + "/render", server.render)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/health", server.health)
    app.router.add_get("/metrics", server.prometheus)
    app.router.add_get("/clock", server.clock)
    app.on_startup.append(server.on_startup)
    app.on_cleanup.append(server.on_cleanup)
    return app
