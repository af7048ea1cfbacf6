"""The load client's HTTP transport: streaming `/v1/chat/completions` over aiohttp, SSE parsed by hand.

Every SSE event becomes one `Chunk` with the kinds it carries (content, reasoning, tool_call, finish,
usage), and the server's own per-request report where it sends one (vLLM's `metrics`, llama.cpp's
`timings`). The OpenAI protocol does not say how many tokens a chunk holds, so `tokens` stays None: the
ledger takes the count from `usage` (requested with `stream_options.include_usage`), never from the
number of chunks.

`attempt.sent` is the moment the request body is handed to the socket (aiohttp's request-chunk-sent
trace signal; headers are coalesced with the body), `attempt.first_byte` the moment the response
status line and headers have arrived. Transport failures (connect, reset, a stream cut short) raise
`TransportError`, which the client retries; a non-200 answer raises `HTTPError` with its status.
A stream event whose data is not JSON (a proxy's HTML error page, a truncated object) is a transport
failure too: nothing in it can be counted. SSE framing is `collectors/load/sse.py`.
"""
from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

import aiohttp

from inferledger.collectors.load.loadgen import Chunk, TransportError
from inferledger.collectors.load.sse import SSEDecoder
from inferledger.collectors.evidence.trace_context import traceparent_for

MODELS_TIMEOUT_S = 10.0  # asking a target its model name at start: a silent server is refused, never waited on


class HTTPError(Exception):
    def __init__(self, status: int, body: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {body[:200]}")
        self.status = status
        self.body = body
        self.retry_after_s = retry_after_s  # the server's Retry-After (seconds form), honoured by the client


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # the HTTP-date form is not used by inference servers; ignored


def chunk_from_event(event: dict) -> Chunk:
    kinds, text, finish = [], [], None
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            kinds.append("content")
            text.append(delta["content"])
        if delta.get("reasoning_content") or delta.get("reasoning"):
            kinds.append("reasoning")
        if delta.get("tool_calls"):
            kinds.append("tool_call")
        if choice.get("text"):  # /v1/completions
            kinds.append("content")
            text.append(choice["text"])
        if choice.get("finish_reason"):
            kinds.append("finish")
            finish = choice["finish_reason"]
    usage = event.get("usage")
    if usage:
        kinds.append("usage")
    # the choice index, when the event carries exactly one choice (n > 1 accounting)
    indexes = [c.get("index", 0) for c in event.get("choices") or [] if isinstance(c, dict)]
    one = indexes and type(indexes[0]) is int and all(i == indexes[0] for i in indexes)
    choice = indexes[0] if one else None
    # llama.cpp's per-response durations (on the final chunk when streaming), kept as received with the
    # build that sent them (system_fingerprint)
    timings = event.get("timings") if isinstance(event.get("timings"), dict) else None
    if timings is not None and isinstance(event.get("system_fingerprint"), str):
        timings = {"timings": timings, "system_fingerprint": event["system_fingerprint"]}
    elif timings is not None:
        timings = {"timings": timings}
    return Chunk(kinds=sorted(set(kinds)), text="".join(text), tokens=None, finish_reason=finish, usage=usage,
                 choice=choice, metrics=event.get("metrics") if isinstance(event.get("metrics"), dict) else None,
                 timings=timings)


def _event(payload: str) -> dict:
    try:
        event = json.loads(payload)
    except ValueError:
        raise TransportError(f"a stream event's data is not JSON: {payload[:120]!r}") from None
    if not isinstance(event, dict):
        raise TransportError(f"a stream event's data is not a JSON object: {payload[:120]!r}")
    return event


async def _on_chunk_sent(session, ctx, params) -> None:
    cb = getattr(ctx.trace_request_ctx, "on_sent", None) if ctx.trace_request_ctx is not None else None
    if cb is not None:
        cb()


class _TraceCtx:
    __slots__ = ("on_sent",)

    def __init__(self, on_sent) -> None:
        self.on_sent = on_sent


class HTTPTarget:
    """One aiohttp session for the whole run; ids travel in headers so the server can log them."""

    def __init__(self, base_url: str, *, model: str | None = None, api_key: str | None = None,
                 limit: int = 1000, trace_salt: str | None = None) -> None:
        """`trace_salt`: send a W3C `traceparent` per attempt (ids from salt + attempt id; None: none)."""
        self.base_url = base_url.rstrip("/")
        self.trace_salt = trace_salt
        self.model = model
        self.api_key = api_key
        self._session: aiohttp.ClientSession | None = None
        self._limit = limit

    async def __aenter__(self) -> "HTTPTarget":
        trace = aiohttp.TraceConfig()
        trace.on_request_chunk_sent.append(_on_chunk_sent)
        # no total timeout here: the client's own per-attempt timeout decides, and is recorded
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self._limit),
                                              timeout=aiohttp.ClientTimeout(total=None), trace_configs=[trace])
        if self.model is None:
            try:
                async with self._session.get(f"{self.base_url}/v1/models", headers=self._headers({}),
                                             timeout=aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)) as r:
                    data = await r.json(content_type=None)
                    self.model = data["data"][0]["id"]
            except aiohttp.ClientConnectorError as exc:  # nothing listens there, or the host is unknown
                await self._session.close()
                raise ValueError(f"{self.base_url}: cannot connect ({exc.os_error.strerror or exc.os_error}): is "
                                 "the server running there?") from exc
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
                await self._session.close()
                raise ValueError(f"{self.base_url}/v1/models did not name a model ({exc!r}); "
                                 "pass the model name explicitly") from exc
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, ids: dict) -> dict:
        h = {"content-type": "application/json"}
        if self.api_key:
            h["authorization"] = f"Bearer {self.api_key}"
        if ids:
            h["x-request-id"] = ids["attempt_id"]
            h["x-inferledger-attempt-id"] = ids["attempt_id"]
            h["x-inferledger-request-id"] = ids["request_id"]
            h["x-inferledger-task-id"] = ids["task_id"]
            if ids.get("session_id"):
                h["x-inferledger-session-id"] = ids["session_id"]
            if self.trace_salt is not None:  # W3C trace context: an engine's span joins the attempt's trace
                h["traceparent"] = traceparent_for(ids["attempt_id"], self.trace_salt)
        return h

    async def stream(self, messages: list[dict], params: dict, *, ids: dict, on_sent=None,
                     on_first_byte=None) -> AsyncIterator[Chunk]:
        body = {"model": self.model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **params}
        try:
            async with self._session.post(f"{self.base_url}/v1/chat/completions", json=body,
                                          headers=self._headers(ids), trace_request_ctx=_TraceCtx(on_sent)) as resp:
                if on_first_byte is not None:
                    on_first_byte()
                if resp.status != 200:
                    raise HTTPError(resp.status, await resp.text(), _retry_after(resp.headers.get("Retry-After")))
                decoder = SSEDecoder()
                async for data in resp.content.iter_any():
                    for payload in decoder.feed(data):
                        if payload.strip() == "[DONE]":
                            return
                        yield chunk_from_event(_event(payload))
                for payload in decoder.close():
                    if payload.strip() == "[DONE]":
                        return
                    yield chunk_from_event(_event(payload))
        except aiohttp.ClientError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
