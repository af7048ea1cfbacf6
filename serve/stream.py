"""Producing one generation response: SSE stream or whole JSON body, and the server's evidence of it.

`produce()` runs as its own task per request so the disconnect watcher can cancel it without touching
the HTTP handler; cancelling it (or a failed write) closes the engine's stream, which aborts the
request in the engine. Events (docs/EVENTS.md): `server.write` for each event handed to the socket, stamped
at the hand-off (before the write call: on loopback the client can read the bytes before the call
returns) and emitted once the write succeeded (value = output tokens it carries, attrs.kinds ⊆ role,
content, finish, usage, done; attrs.choice on role / content / finish), `server.done`
once the response is complete, stamped at the hand-off of its last bytes (the `[DONE]` event, or the
whole body), so on one clock the server's E2E never exceeds the client's, `server.disconnect` when the
client went away first.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

from aiohttp import web

from .ids import Ids
from .protocol import CHAT, ApiError, Shaper, sse, usage

log = logging.getLogger(__name__)


@dataclass
class Attempt:
    """One generation request in flight: its ids, timings and what has been written so far."""

    ids: Ids
    endpoint: str
    stream: bool
    n: int
    t0: float  # time.monotonic() when received (metrics only; events carry their own timestamps)
    t_first: float | None = None
    phase: str = "queued"  # queued (no output) -> generating / streaming -> finished (engine done) -> done
    resp: web.StreamResponse | None = None
    tokens_out: int = 0
    tokens_written: int = 0
    pending: dict = field(default_factory=lambda: defaultdict(int))  # tokens not yet written, per choice


async def produce(server, request: web.Request, a: Attempt, shaper: Shaper, gen, first) -> web.StreamResponse:
    """Write the response for `gen` (whose first delta is `first`); returns the response object."""
    me = asyncio.current_task()
    try:
        if a.stream:
            await _stream(server, request, a, shaper, gen, first)
        else:
            await _whole(server, request, a, shaper, gen, first)
        return a.resp
    except (asyncio.CancelledError, ConnectionError) as exc:
        if isinstance(exc, asyncio.CancelledError) and me not in server.gone:
            # the handler itself was cancelled (server shutdown): the engine gets the abort below
            server.emit("server.done", a.ids, status=200 if a.resp is not None else None, stream=a.stream,
                        aborted="server shutting down", tokens_written=a.tokens_written)
            raise
        server.emit("server.disconnect", a.ids, phase=a.phase, tokens_out=a.tokens_out,
                    tokens_written=a.tokens_written, cause=type(exc).__name__)
        server.metrics.disconnects.inc()
        return a.resp or web.Response(status=499)  # nobody is left to read it
    except ApiError:
        raise
    except Exception as exc:  # a bug or a dead engine loop after the response started
        log.exception("generation %s failed", a.ids.attempt_id)
        if a.resp is None or not a.resp.prepared:
            raise ApiError(503 if isinstance(exc, RuntimeError) else 500,
                           f"the server could not finish this request: {exc}", code="engine_error") from exc
        err = ApiError(500, f"the server could not finish this request: {exc}", code="engine_error")
        try:
            await a.resp.write(sse(err.body()))
        except Exception:
            pass
        server.emit("server.done", a.ids, status=200, error=err.message, stream=a.stream)
        return a.resp
    finally:
        server.watched.pop(me, None)
        server.gone.discard(me)
        await gen.aclose()  # no-op when finished; otherwise aborts the request in the engine


def _tokens(server, a: Attempt, d) -> None:
    k = len(d.new_token_ids)
    if k and a.phase == "queued":
        a.phase = "generating"
    if k and a.t_first is None:
        a.t_first = time.monotonic()
        server.metrics.ttft.observe(a.t_first - a.t0)
    a.tokens_out += k
    a.pending[d.index] += k
    server.metrics.generation_tokens.inc(k)
    if d.request_finished:
        a.phase = "finished"
        server.watched.pop(asyncio.current_task(), None)  # the engine is done: nothing left to cancel


async def _write(server, a: Attempt, payload, kinds: list[str], tokens: int, choice: int | None = None) -> int:
    """Write one SSE event; returns the hand-off time it was stamped with."""
    data = sse(payload)
    handed = server.probe.now_ns()  # the hand-off to the socket: the client may read it before write() returns
    await a.resp.write(data)
    a.tokens_written += tokens
    server.metrics.sse_events.inc()
    extra = {} if choice is None else {"choice": choice}  # the choice index of a role / content / finish event
    server.emit("server.write", a.ids, value=tokens, kinds=kinds, bytes=len(data), ts_ns=handed, **extra)
    return handed


async def _stream(server, request, a: Attempt, shaper: Shaper, gen, d) -> None:
    a.resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                         **a.ids.headers()})
    await a.resp.prepare(request)
    a.phase = "streaming"
    if a.endpoint == CHAT:
        for i in range(a.n):
            await _write(server, a, shaper.role_chunk(i), ["role"], 0, i)
    while True:
        _tokens(server, a, d)
        if d.text:
            await _write(server, a, shaper.text_chunk(d.index, d.text), ["content"], a.pending.pop(d.index, 0), d.index)
        if d.finished:
            await _write(server, a, shaper.text_chunk(d.index, "", d.finish_reason), ["finish"],
                         a.pending.pop(d.index, 0), d.index)
        if d.request_finished:
            break
        d = await gen.__anext__()
    out = d.output
    u = usage(len(out.prompt_token_ids), sum(len(o.token_ids) for o in out.outputs), out.cached_tokens)
    if shaper.include_usage:
        await _write(server, a, shaper.usage_chunk(u), ["usage"], 0)
    handed = await _write(server, a, "[DONE]", ["done"], 0)
    try:
        await a.resp.write_eof()
    except ConnectionError:
        pass  # everything was handed to the socket; the client closed after [DONE]
    _done(server, a, out, u, handed)


async def _whole(server, request, a: Attempt, shaper: Shaper, gen, d) -> None:
    while True:
        _tokens(server, a, d)
        if d.request_finished:
            break
        d = await gen.__anext__()
    out = d.output
    if out.finish_reason == "error":
        raise ApiError(500, "the engine failed while computing this request; see the server log",
                       code="engine_error")
    u = usage(len(out.prompt_token_ids), sum(len(o.token_ids) for o in out.outputs), out.cached_tokens)
    a.resp = web.json_response(shaper.response(out.outputs, u), headers=a.ids.headers())
    handed = server.probe.now_ns()
    await a.resp.prepare(request)
    await a.resp.write_eof()
    kinds = (["content"] if any(o.text for o in out.outputs) else []) + ["finish", "usage"]
    a.tokens_written = u["completion_tokens"]
    server.emit("server.write", a.ids, value=u["completion_tokens"], kinds=kinds, bytes=a.resp.body_length,
                ts_ns=handed)
    _done(server, a, out, u, handed)


def _done(server, a: Attempt, out, u: dict, handed_ns: int) -> None:
    """Metrics and `server.done`, stamped `handed_ns`: when the response's last bytes went to the socket."""
    a.phase = "done"
    m, now = server.metrics, time.monotonic()
    if out.finish_reason in ("stop", "length"):
        m.success.inc(label_value=out.finish_reason)
    m.e2e.observe(now - a.t0)
    n0 = len(out.token_ids)
    if a.t_first is not None and n0 > 1:
        m.tpot.observe((now - a.t_first) / (n0 - 1))
    m.preemptions.inc(out.preemptions)
    m.http.inc(label_value="200")
    server.emit("server.done", a.ids, status=200, stream=a.stream, finish_reason=out.finish_reason,
                prompt_tokens=u["prompt_tokens"], completion_tokens=u["completion_tokens"], ts_ns=handed_ns)
