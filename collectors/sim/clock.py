"""The simulated clock: a time that moves only when the simulation says so, and the events due on it.

`now_ns` is what the engine's probe reads instead of CLOCK_MONOTONIC; nothing here reads the host's
time, so however long the host takes (a slow step-time model, a loaded machine) the simulated
figures are the same. `at(t, fn)` plans an action (an arrival, a cancellation) for simulated time
t; `advance(dur)` moves the clock forward over a step, running every planned action that falls
inside it at its own time, in time order (ties in the order they were planned).
"""
from __future__ import annotations

import heapq
import itertools
from typing import Callable


class SimClock:
    def __init__(self, start_ns: int = 0) -> None:
        self._now = int(start_ns)
        self._due: list[tuple[int, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def now_ns(self) -> int:
        return self._now

    def at(self, t_ns: int, action: Callable[[], None]) -> None:
        if t_ns < self._now:
            raise ValueError(f"cannot plan an action at {t_ns} ns: the simulated clock is already at {self._now} ns")
        heapq.heappush(self._due, (int(t_ns), next(self._order), action))

    def has_due(self) -> bool:
        return bool(self._due)

    def _run_due(self, until_ns: int) -> None:
        while self._due and self._due[0][0] <= until_ns:
            t, _, action = heapq.heappop(self._due)
            self._now = t
            action()

    def advance(self, dur_ns: int) -> None:
        """A step of dur_ns: actions due inside it run at their own times, then the clock is at its end."""
        if dur_ns <= 0:
            raise ValueError(f"a simulated step must last more than 0 ns, got {dur_ns}")
        end = self._now + int(dur_ns)
        self._run_due(end)
        self._now = end

    def run_next(self) -> None:
        """Idle until the next planned action: jump there and run it (and any others due at that time)."""
        if self._due:
            self._run_due(self._due[0][0])
