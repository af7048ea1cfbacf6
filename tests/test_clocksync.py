"""The clock estimator recovers a deliberately shifted server clock within its own epsilon."""
from __future__ import annotations

import asyncio
import time

from aiohttp import web

from inferledger.collectors.capture.clocksync import best_offset, estimate
from inferledger.collectors.load.http_transport import chunk_from_event

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


def test_wall_mapping_takes_the_tightest_bracket_and_covers_drift():
    from inferledger.probes.probe import WallMapping, read_wall_offset

    class Clocks:
        """mono advances 100 ns per read, except every 3rd bracket which is slow (10 us); wall = mono
        + offset, the offset growing by `slew` per read (an NTP slew)."""

        def __init__(self, offset: int, slew: int = 0) -> None:
            self.mono, self.offset, self.slew, self.reads = 1_000_000, offset, slew, 0

        def mono_ns(self) -> int:
            self.reads += 1
            self.mono += 10_000 if self.reads % 9 == 0 else 100
            return self.mono

        def wall_ns(self) -> int:
            self.offset += self.slew
            return self.mono + self.offset

    c = Clocks(offset=1_700_000_000_000_000_000)
    off, eps = read_wall_offset(mono_ns=c.mono_ns, wall_ns=c.wall_ns)
    # tightest bracket: 100 ns wide; the wall read happened 0 ns after the first mono read of it,
    # so the midpoint estimate is 50 ns off, inside epsilon
    assert eps == 50 and abs(off - 1_700_000_000_000_000_000) <= eps
    c2 = Clocks(offset=5_000, slew=3)
    wm = WallMapping(mono_ns=c2.mono_ns, wall_ns=c2.wall_ns)
    start_offset = wm.offset_ns
    c2.offset += 40_000  # the wall clock moved 40 us against the monotonic one during the run
    offset, eps = wm.finish()
    assert offset == start_offset and wm.drift_ns >= 40_000
    assert eps >= abs(wm.drift_ns) + 50  # the end bracket (start offset + drift) lies inside epsilon


async def _server(handlers: dict):
    app = web.Application()
    for path, h in handlers.items():
        app.router.add_get(path, h)
    runner = web.AppRunner(app, handler_cancellation=True)  # a silent handler ends when its client gives up
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


def test_a_clock_that_never_answers_is_a_clear_error_within_its_deadline():
    import pytest

    from inferledger.collectors.capture.clocksync import ClockSyncError

    async def silent(request):
        await asyncio.sleep(3600)

    async def main():
        runner, port = await _server({"/clock": silent})
        try:
            t0 = time.monotonic()
            with pytest.raises(ClockSyncError, match=r"/clock: no clock reading within 0.3 s"):
                await estimate(f"http://127.0.0.1:{port}", "client-mono", round_timeout_s=0.3)
            return time.monotonic() - t0
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) < 5  # one round's deadline, not an hour


def test_a_clock_answer_without_a_reading_is_refused_by_what_it_lacks():
    import pytest

    from inferledger.collectors.capture.clocksync import ClockSyncError

    async def wrong(request):
        return web.json_response({"clock": "server-mono", "t_ns": 1.5e18})

    async def main():
        runner, port = await _server({"/clock": wrong})
        try:
            with pytest.raises(ClockSyncError, match=r"answered 200 without a reading"):
                await estimate(f"http://127.0.0.1:{port}", "client-mono")
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_a_target_that_never_names_its_model_is_refused_not_waited_on(monkeypatch):
    import pytest

    from inferledger.collectors.load import http_transport

    async def silent(request):
        await asyncio.sleep(3600)

    monkeypatch.setattr(http_transport, "MODELS_TIMEOUT_S", 0.3)

    async def main():
        runner, port = await _server({"/v1/models": silent})
        try:
            with pytest.raises(ValueError, match=r"/v1/models did not name a model"):
                async with http_transport.HTTPTarget(f"http://127.0.0.1:{port}"):
                    pass
        finally:
            await runner.cleanup()

    asyncio.run(main())
