"""One time axis for drawing a run: the reference clock and the ledger's clock mappings into it.

Drawing (the report's timelines, the Perfetto export) needs every point on one axis. The rule is the
ledger's (docs/LEDGER.md "Clock rule"): a clock is drawn on the reference axis when it *is* the
reference clock or when `clocks` holds a direct mapping between the two (either direction, the one
with the smallest epsilon); mappings are never chained. Anything else stays off the shared axis and
the caller says so. Nothing here computes a metric: it only places points.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Timebase:
    ref: str | None                      # the reference clock domain
    origin_ns: int = 0                   # t = 0 of the drawn axis, in the reference clock
    conv: dict[str, tuple[int, int]] = field(default_factory=dict)  # clock -> (offset_ns, eps_ns) into ref

    def offset(self, clock: str | None) -> int | None:
        """ns to add to a `clock` reading to read the reference clock; None when not comparable."""
        c = self.conv.get(clock) if clock is not None else None
        return None if c is None else c[0]

    def eps_ns(self, clock: str | None) -> int:
        c = self.conv.get(clock) if clock is not None else None
        return 0 if c is None else c[1]

    def aligned(self, clock: str | None) -> bool:
        return clock is not None and clock in self.conv

    def ms(self, ns: int | None, clock: str | None) -> float | None:
        """A reading of `clock` as ms since the axis origin, or None (unknown reading or clock)."""
        off = self.offset(clock)
        if ns is None or off is None:
            return None
        return (ns + off - self.origin_ns) / 1e6

    def unaligned(self, clocks) -> list[str]:
        return sorted({c for c in clocks if c is not None and c not in self.conv})


def mappings(led) -> dict[tuple[str, str], tuple[int, int]]:
    """(from, to) -> (offset_ns, eps_ns): each `clocks` mapping and its inverse, smallest epsilon kept."""
    best: dict[tuple[str, str], tuple[int, int]] = {}
    rows = led.rows("SELECT from_clock, to_clock, offset_ns, epsilon_ns FROM clocks "
                    "WHERE from_clock IS NOT NULL AND to_clock IS NOT NULL AND offset_ns IS NOT NULL")[1]
    for a, b, off, eps in rows:
        eps = int(eps or 0)
        for key, val in (((a, b), (int(off), eps)), ((b, a), (-int(off), eps))):
            if key[0] != key[1] and (key not in best or (val[1], val[0]) < (best[key][1], best[key][0])):
                best[key] = val
    return best


def build_timebase(led, ref: str | None = None) -> Timebase:
    """The reference is `ref`, else the clock most intervals are in (ties by name); the origin is the
    earliest attempt event (or planned arrival) among the clocks that map onto it."""
    if ref is None:
        rows = led.rows("SELECT clock, count(*) AS n FROM intervals WHERE clock IS NOT NULL "
                        "GROUP BY clock ORDER BY n DESC, clock LIMIT 1")[1]
        if not rows:
            rows = led.rows("SELECT clock, count(*) AS n FROM events WHERE clock IS NOT NULL "
                            "GROUP BY clock ORDER BY n DESC, clock LIMIT 1")[1]
        ref = rows[0][0] if rows else None
    tb = Timebase(ref)
    if ref is None:
        return tb
    tb.conv[ref] = (0, 0)
    for (a, b), val in mappings(led).items():
        if b == ref:
            tb.conv[a] = val
    firsts = led.rows("SELECT clock, min(ts_ns) FROM events WHERE attempt_id IS NOT NULL OR name = 'arrival.planned' "
                     "GROUP BY clock")[1]
    starts = [ns + tb.conv[c][0] for c, ns in firsts if c in tb.conv and ns is not None]
    tb.origin_ns = min(starts) if starts else 0
    return tb
