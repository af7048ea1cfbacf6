"""Offset estimation between the client's clock and a server's, by round trips to its `/clock`.

Each round trip brackets the server's reading t_s between the client's t0 and t1: the server read its
clock somewhere in [t0, t1], so t_client = t_s + offset with offset = (t0 + t1) / 2 − t_s, wrong by at
most half the round trip. The estimate keeps the round trip with the smallest delay (NTP's rule), and
its epsilon is half that round trip: a true bound, not a statistical guess, provided the two clocks
tick at the same rate over the run.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

ROUND_TIMEOUT_S = 2.0  # a round trip slower than this bounds nothing useful; a server that never answers cannot hang the run


class ClockSyncError(ValueError):
    """The server's /clock did not give a reading; the message names the URL and why."""


@dataclass(frozen=True)
class ClockSyncFailure:
    """A mapping that could not be taken (at `label`: start, end) and why; the run records it as a gap."""
    label: str
    reason: str


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
                   headers: dict | None = None, label: str = "",
                   round_timeout_s: float | None = None) -> ClockMapping:
    """Raises ClockSyncError when a round trip fails, takes longer than `round_timeout_s` or answers
    something that is not a reading."""
    round_timeout_s = ROUND_TIMEOUT_S if round_timeout_s is None else round_timeout_s
    own = session is None
    session = session or aiohttp.ClientSession()
    url = f"{base_url.rstrip('/')}/clock"
    samples, server_clock = [], None
    try:
        for _ in range(rounds):
            t0 = now_ns()
            try:
                async with session.get(url, headers=headers or {},
                                       timeout=aiohttp.ClientTimeout(total=round_timeout_s)) as resp:
                    body = await resp.json(content_type=None)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                raise ClockSyncError(f"{url}: no clock reading within {round_timeout_s:g} s "
                                     f"({type(exc).__name__}: {exc})") from None
            t1 = now_ns()
            ok = (resp.status == 200 and isinstance(body, dict) and isinstance(body.get("t_ns"), int)
                  and not isinstance(body.get("t_ns"), bool) and isinstance(body.get("clock"), str))
            if not ok:
                raise ClockSyncError(f"{url} answered {resp.status} without a reading "
                                     f"({{'clock': str, 't_ns': int}} expected): {str(body)[:200]}")
            server_clock = body["clock"]
            samples.append((t0, body["t_ns"], t1))
    finally:
        if own:
            await session.close()
    offset, eps = best_offset(samples)
    return ClockMapping(server_clock, client_clock, offset, eps, "round-trip", len(samples), label)
