"""Offset estimation between the client's clock and a server's, by round trips to its `/clock`.

Each round trip brackets the server's reading t_s between the client's t0 and t1: the server read its
clock somewhere in [t0, t1], so t_client = t_s + offset with offset = (t0 + t1) / 2 − t_s, wrong by at
most half the round trip. The estimate keeps the round trip with the smallest delay (NTP's rule), and
its epsilon is half that round trip: a true bound, not a statistical guess, provided the two clocks
tick at the same rate over the run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class ClockMapping:
    from_clock: str  # the server's domain
    to_clock: str  # the client's domain
    offset_ns: int  # t_to = t_from + offset_ns
    epsilon_ns: int
    method: str = "round-trip"
    samples: int = 0
    label: str = ""  # when in the run it was taken (start, end)


def best_offset(samples: list[tuple[int, int, int]]) -> tuple[int, int]:
    """(offset_ns, epsilon_ns) from (t0, t_server, t1) triples: the narrowest round trip wins."""
    if not samples:
        raise ValueError("no round trips to estimate a clock offset from")
    t0, ts, t1 = min(samples, key=lambda s: s[2] - s[0])
    return (t0 + t1) // 2 - ts, max(1, (t1 - t0 + 1) // 2)


async def estimate(base_url: str, client_clock: str, *, rounds: int = 16,
                   session: aiohttp.ClientSession | None = None, now_ns=time.monotonic_ns,
                   headers: dict | None = None, label: str = "") -> ClockMapping:
    own = session is None
    session = session or aiohttp.ClientSession()
    samples, server_clock = [], None
    try:
        for _ in range(rounds):
            t0 = now_ns()
            async with session.get(f"{base_url.rstrip('/')}/clock", headers=headers or {}) as resp:
                body = await resp.json()
            t1 = now_ns()
            if resp.status != 200 or "t_ns" not in body:
                raise ValueError(f"{base_url}/clock answered {resp.status}: {body}")
            server_clock = body["clock"]
            samples.append((t0, int(body["t_ns"]), t1))
    finally:
        if own:
            await session.close()
    offset, eps = best_offset(samples)
    return ClockMapping(server_clock, client_clock, offset, eps, "round-trip", len(samples), label)
