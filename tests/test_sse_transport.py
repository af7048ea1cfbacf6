"""The load client's SSE reader against a real aiohttp server that frames its stream awkwardly: a CR LF
split across two reads, one JSON object over several `data:` lines, a payload that is not JSON."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest
from aiohttp import web

from inferledger.collectors.load.http_transport import HTTPTarget
from inferledger.collectors.load.loadgen import TransportError
from inferledger.collectors.load.sse import SSEDecoder
from inferledger.serve.thread import ServerThread

IDS = {"attempt_id": "A1", "request_id": "R1", "task_id": "T1"}
WAIT_S = 20.0  # how long the server waits for the client to have read an event (a bound, not a timing)


def _delta(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode()


class _Server:
    """Streams `pieces` with a pause after each; `read_first` is set by the client once it has the first
    event, and the server waits for it (bounded) before the rest, so a held-back event shows."""

    def __init__(self, pieces: list[bytes], wait_for_client_after: int | None = None) -> None:
        self.pieces, self.wait_after = pieces, wait_for_client_after
        self.read_first = threading.Event()
        self.client_had_it: bool | None = None
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.thread = ServerThread(app)

    async def chat(self, request):
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        for i, piece in enumerate(self.pieces):
            await resp.write(piece)
            await asyncio.sleep(0.05)  # separate reads on the client's side
            if i == self.wait_after:
                self.client_had_it = await loop.run_in_executor(None, self.read_first.wait, WAIT_S)
        return resp


def _read(server: _Server) -> list:
    async def go():
        got = []
        async with HTTPTarget(server.thread.url, model="m") as target:
            async for chunk in target.stream([{"role": "user", "content": "hi"}], {}, ids=IDS):
                got.append(chunk)
                server.read_first.set()
        return got

    with server.thread:
        return asyncio.run(go())


def test_a_cr_lf_split_across_reads_ends_the_event_at_once():
    server = _Server([b"data: " + _delta("Paris") + b"\r\n\r", b"\ndata: " + _delta("!") + b"\r\n\r\n",
                      b"data: [DONE]\r\n\r\n"], wait_for_client_after=0)
    chunks = _read(server)
    assert [c.text for c in chunks] == ["Paris", "!"]
    assert server.client_had_it is True  # the first event was handed on before the server sent more


def test_multi_line_data_is_one_event_joined_by_line_feeds():
    obj = json.dumps({"choices": [{"index": 0, "delta": {"content": "Pa\nris"}}]}, indent=1).encode()
    body = b"".join(b"data: " + line + b"\n" for line in obj.split(b"\n")) + b"\n"
    chunks = _read(_Server([b": a comment\nevent: message\n" + body, b"data:[DONE]\n\n"]))
    assert [c.text for c in chunks] == ["Pa\nris"] and chunks[0].kinds == ["content"]


@pytest.mark.parametrize("payload", [b"<html>502 Bad Gateway</html>", b'{"choices": [', b"[1, 2]"])
def test_a_payload_that_is_not_a_json_object_is_a_transport_error(payload):
    server = _Server([b"data: " + _delta("a") + b"\n\n", b"data: " + payload + b"\n\n", b"data: [DONE]\n\n"])
    with pytest.raises(TransportError, match="not a JSON object|not JSON"):
        _read(server)


@pytest.mark.parametrize("split", range(1, 40))
def test_the_decoder_gives_the_same_events_for_every_split_of_the_bytes(split):
    raw = b"data: a\r\n\r\ndata: b1\rdata: b2\r\rdata:c\n\n: note\r\nid: 3\r\ndata:  d\r\n\r\n"
    whole = SSEDecoder().feed(raw)
    assert whole == ["a", "b1\nb2", "c", " d"]  # by hand from the spec: one space after the colon is dropped
    dec = SSEDecoder()
    assert dec.feed(raw[:split]) + dec.feed(raw[split:]) == whole
