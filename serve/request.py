"""From an HTTP request to an engine stream: ids, API key, body, checks, admission.

Order, so that each refusal is the cheapest one that applies: id headers -> API key (401) -> JSON body
(400/413) -> `server.received` -> fields and ranges (400), model (404) -> admission (429/503/409) ->
prompt tokens and the engine's own checks (400) -> the first delta, and only then the response
headers (`stream.produce`). Every refusal with an attempt id is a `server.rejected` event.

The event loop never does work proportional to a request's size: a body over `OFF_LOOP_BYTES` is
decoded and checked in a worker thread, every prompt is templated and tokenised in one, and a text
whose bytes cannot fit the context even at the longest token of the vocabulary is refused before it
is tokenised at all (a lower bound, so nothing that fits is refused).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time

from aiohttp import web

OFF_LOOP_BYTES = 64 * 1024  # bodies above this are decoded off the event loop

from .protocol import (CHAT, COMPLETIONS, DEFAULT_COMPLETION_MAX_TOKENS, KNOWN_FIELDS, ApiError,
                              GenerationRequest, Shaper, engine_error, parse_chat, parse_completion)
from .ids import Ids
from .stream import Attempt, produce

def check_auth(api_key: str | None, headers) -> None:
    if api_key is None:
        return
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(401, "missing or incorrect API key: send the header 'Authorization: Bearer <key>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def max_token_bytes(tokenizer) -> int | None:
    """The longest token of the vocabulary in UTF-8 bytes (an upper bound on what one token can cover)."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None:
        return None
    return max((len(t.encode("utf-8")) for t in backend.get_vocab(with_added_tokens=True)), default=None)


async def off_loop(fn, *args):
    """`fn(*args)` in the default executor: the loop keeps serving /health and other streams meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def read_json(request: web.Request) -> dict:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"the request body is larger than {request.client_max_size} bytes",
                       code="body_too_large") from None
    if not raw.strip():
        raise ApiError(400, "the request body is empty: send a JSON object", code="invalid_json")
    try:
        body = json.loads(raw) if len(raw) <= OFF_LOOP_BYTES else await off_loop(json.loads, raw)
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(body).__name__}", code="invalid_json")
    return body


def _admit(server, ids: Ids) -> None:
    down = server.engine_down()
    if down:
        raise ApiError(503, down, code="engine_unavailable")
    if server.draining:
        raise ApiError(503, "the server is shutting down and admits no new request", code="server_shutting_down")
    if server.in_flight >= server.max_queue:
        raise ApiError(429, f"the server is at its admission limit ({server.max_queue} requests waiting or "
                            "running); retry after the delay in Retry-After", type="rate_limit_error",
                       code="rate_limit_exceeded", headers={"Retry-After": "1"})
    if ids.attempt_id in server.active:
        raise ApiError(409, f"attempt id {ids.attempt_id!r} is already in flight on this server; give each "
                            "attempt its own id", param="x-inferledger-attempt-id", code="duplicate_attempt_id")
    server.in_flight += 1
    server.active.add(ids.attempt_id)


def _too_long(server, req: GenerationRequest) -> None:
    """Refuse a text that needs more tokens than the context even if every token were the longest one."""
    per_token = getattr(server, "max_token_bytes", None)
    if not per_token:
        return
    if req.messages is not None:
        n_bytes = sum(len(m["content"].encode("utf-8")) for m in req.messages)
    elif isinstance(req.prompt, str):
        n_bytes = len(req.prompt.encode("utf-8"))
    else:
        return
    at_least = -(-n_bytes // per_token)
    if at_least > server.context_tokens:
        raise ApiError(400, f"'{req.prompt_field}' holds {n_bytes} bytes, at least {at_least} tokens (no token of "
                            f"this vocabulary spans more than {per_token} bytes): more than the context of "
                            f"{server.context_tokens} tokens; shorten the {req.prompt_field}",
                       param=req.prompt_field, code="context_length_exceeded")


def _served_model(server, req: GenerationRequest) -> None:
    """Refuse a request naming another model than the one served (absent: the served one)."""
    if req.model is not None and req.model != server.model_name:
        raise ApiError(404, f"the model {req.model!r} does not exist; this server serves {server.model_name!r} "
                            "(GET /v1/models)", param="model", code="model_not_found")


def _prompt_ids(tok, req: GenerationRequest) -> list[int]:
    """Same encoding as `LLM.encode`: text with the checkpoint's special tokens, chat via its template."""
    try:
        if req.messages is not None:
            return tok.encode(tok.apply_chat_template(req.messages, add_generation_prompt=True), add_special=False)
        if isinstance(req.prompt, str):
            return tok.encode(req.prompt, add_special=True)
        return list(req.prompt)
    except ValueError as exc:
        raise engine_error(exc, req) from None
    except Exception as exc:  # the template's own errors (jinja)
        raise ApiError(400, f"the chat template could not render these messages: {exc}", param="messages",
                       code="invalid_messages") from None


def _max_tokens(server, req: GenerationRequest, n_prompt: int) -> int:
    if "max_tokens" in req.sampling:
        return req.sampling["max_tokens"]
    if req.endpoint == COMPLETIONS:
        return DEFAULT_COMPLETION_MAX_TOKENS
    room = server.context_tokens - n_prompt  # chat: the rest of the context, as OpenAI does
    if room < 1:
        raise ApiError(400, f"the prompt has {n_prompt} tokens and fills the context of {server.context_tokens} "
                            "tokens; shorten the messages", param="messages", code="context_length_exceeded")
    return min(room, server.default_max_tokens or room)


def _params(req: GenerationRequest, max_tokens: int):
    try:
        return req.params(max_tokens)
    except ValueError as exc:
        raise engine_error(exc, req) from None


async def handle_render(server, request: web.Request) -> web.Response:
    """POST /v1/chat/completions/render (vLLM's): the messages' prompt token ids, encoded as the chat endpoint
    encodes them, as `{"token_ids": [...]}`. No attempt: nothing is admitted, generated or recorded (a
    router's cache-aware policy asks it of every worker for each request it routes)."""
    try:
        check_auth(server.api_key, request.headers)
        body = await read_json(request)
        req = await off_loop(parse_chat, body)
        _served_model(server, req)
        _too_long(server, req)
        ids = await off_loop(_prompt_ids, server.tokenizer, req)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status, headers=exc.headers)
    return web.json_response({"token_ids": ids})


async def handle_generation(server, request: web.Request, endpoint: str) -> web.StreamResponse:
    t0 = time.monotonic()
    ids = server.ids.assign(request.headers)
    admitted, received = False, False
    try:
        if ids.problem:
            raise ApiError(400, ids.problem[1], param=ids.problem[0], code="invalid_header")
        check_auth(server.api_key, request.headers)
        body = await read_json(request)
        big = request.content_length is None or request.content_length > OFF_LOOP_BYTES
        ignored = sorted(k for k in body if k not in KNOWN_FIELDS[endpoint])
        server.emit("server.received", ids, endpoint=endpoint, stream=body.get("stream") is True,
                    **({"ignored_fields": ignored} if ignored else {}), **ids.trace)
        received = True
        parse = parse_chat if endpoint == CHAT else parse_completion
        req = await off_loop(parse, body) if big else parse(body)
        _served_model(server, req)
        _params(req, max(1, req.sampling.get("min_tokens", 1)))  # range checks before admission
        _admit(server, ids)
        admitted = True
        _too_long(server, req)
        prompt = await off_loop(_prompt_ids, server.tokenizer, req)
        params = _params(req, _max_tokens(server, req, len(prompt)))
        gen = server.engine.generate(prompt, params, **ids.columns())
        a = Attempt(ids, endpoint, req.stream, params.n, t0)
        work = asyncio.create_task(_start(server, request, a, req, gen, len(prompt)))
        server.watch(work, request)
        try:
            return await work
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise  # this handler is being cancelled (shutdown)
            if work in server.shut:  # cancelled at the end of a drain; server.done says so
                if a.resp is not None and a.resp.prepared:
                    return a.resp  # the stream ends here, without [DONE]
                err = ApiError(503, "the server stopped before this request finished", code="server_shutting_down")
                return web.json_response(err.body(), status=503, headers=ids.headers())
            return web.Response(status=499)  # the client left; produce() has recorded it
        finally:
            server.watched.pop(work, None)
            server.gone.discard(work)
            server.shut.discard(work)
    except ApiError as exc:
        server.emit("server.rejected", ids, status=exc.status, error=exc.message, code=exc.code, param=exc.param,
                    endpoint=endpoint, **({} if received else ids.trace))
        server.metrics.http.inc(label_value=str(exc.status))
        return web.json_response(exc.body(), status=exc.status, headers={**exc.headers, **ids.headers()})
    finally:
        if admitted:
            server.in_flight -= 1
            server.active.discard(ids.attempt_id)


async def _start(server, request, a: Attempt, req: GenerationRequest, gen, n_prompt: int):
    try:
        first = await gen.__anext__()  # the engine's refusal (ValueError) surfaces here, before any byte
    except ValueError as exc:
        raise engine_error(exc, req) from None
    except RuntimeError as exc:
        raise ApiError(503, f"the engine loop stopped: {exc.__cause__ or exc}", code="engine_unavailable") from None
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if me not in server.gone:  # server shutdown; the engine gets the abort as the generator closes
            server.emit("server.done", a.ids, status=None, stream=a.stream, aborted="server shutting down")
            raise
        server.gone.discard(me)  # the client left while its request was still queued
        server.emit("server.disconnect", a.ids, phase="queued", tokens_out=0, tokens_written=0, cause="CancelledError")
        server.metrics.disconnects.inc()
        return web.Response(status=499)
    server.metrics.prompt_tokens.inc(n_prompt)
    shaper = Shaper(a.endpoint, ("chatcmpl-" if a.endpoint == CHAT else "cmpl-") + a.ids.request_id,
                    int(time.time()), server.model_name, req.include_usage)
    return await produce(server, request, a, shaper, gen, first)
