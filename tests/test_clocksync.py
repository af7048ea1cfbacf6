"""The clock estimator recovers a deliberately shifted server clock within its own epsilon."""
from __future__ import annotations

import asyncio
import time

from aiohttp import web

from inferledger.collectors.clocksync import best_offset, estimate
from inferledger.collectors.http_transport import chunk_from_event

SHIFT_NS = -123_456_789_012  # the server's clock reads this much off the client's


async def _shifted_clock_server():
    async def clock(request):
        await asyncio.sleep(0.001)  # some server-side delay either side of the reading
        t = time.monotonic_ns() + SHIFT_NS
        await asyncio.sleep(0.001)
        return web.json_response({"clock": "server-mono", "t_ns": t})

    app = web.Application()
    app.router.add_get("/clock", clock)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


def test_estimator_recovers_shift_within_epsilon():
    async def main():
        runner, port = await _shifted_clock_server()
        try:
            return await estimate(f"http://127.0.0.1:{port}", "client-mono", rounds=12)
        finally:
            await runner.cleanup()

    m = asyncio.run(main())
    assert (m.from_clock, m.to_clock, m.method, m.samples) == ("server-mono", "client-mono", "round-trip", 12)
    # t_client = t_server + offset, so the true offset is -SHIFT_NS; the estimate is within epsilon
    assert abs(m.offset_ns - (-SHIFT_NS)) <= m.epsilon_ns
    assert 0 < m.epsilon_ns < 1_000_000_000


def test_best_offset_takes_the_narrowest_round_trip():
    samples = [(0, 1_000, 100), (1_000, 2_010, 1_020), (5_000, 5_500, 9_000)]
    assert best_offset(samples) == (1_010 - 2_010, 10)


def test_sse_events_become_chunks_with_kinds_never_tokens():
    c = chunk_from_event({"choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]})
    assert (c.kinds, c.text, c.tokens) == (["content"], "Hi", None)
    c = chunk_from_event({"choices": [{"delta": {"reasoning_content": "hmm"}}]})
    assert c.kinds == ["reasoning"]
    c = chunk_from_event({"choices": [], "usage": {"completion_tokens": 7}})
    assert (c.kinds, c.usage) == (["usage"], {"completion_tokens": 7})
    c = chunk_from_event({"choices": [{"delta": {}, "finish_reason": "length"}]})
    assert (c.kinds, c.finish_reason) == (["finish"], "length")
    c = chunk_from_event({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    assert c.kinds == []
