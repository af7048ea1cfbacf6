"""Emitting events with clock-domain tags.

A `Probe` stamps each event with its source, host, clock and a per-source sequence number and hands
the row to a sink (usually a `collectors.rundir.writer.RunWriter`). With `enabled=False` every call returns
at the first branch, so instrumented code pays almost nothing when nobody is listening. Who an event
is about (its task, session, request and attempt) travels as one `EventIds`, built once where the
ids are known (a sequence, an attempt) and handed to every event about it.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from typing import NamedTuple, Protocol


def host_id() -> str:
    return socket.gethostname() or "localhost"


def boot_id() -> str | None:
    """This kernel's boot id (Linux): two processes share CLOCK_MONOTONIC only within one boot of one host.
    None where the kernel does not say; a reader then cannot prove two runs share a clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def mono_clock(host: str | None = None) -> str:
    """The CLOCK_MONOTONIC domain of this host: every process of one host can subtract in it."""
    return f"mono:{host or host_id()}"


def wall_clock(host: str | None = None) -> str:
    """The CLOCK_REALTIME (Unix time) domain of this host."""
    return f"wall:{host or host_id()}"


def read_wall_offset(tries: int = 16, *, mono_ns=time.monotonic_ns, wall_ns=time.time_ns) -> tuple[int, int]:
    """(offset_ns, epsilon_ns) with wall = mono + offset: each try reads mono, wall, mono; the try with
    the tightest bracket wins, offset from its midpoint, epsilon = half its width (at least 1 ns)."""
    best = None
    for _ in range(tries):
        m0 = mono_ns()
        w = wall_ns()
        m1 = mono_ns()
        if best is None or m1 - m0 < best[1] - best[0]:
            best = (m0, m1, w)
    m0, m1, w = best
    return w - (m0 + m1) // 2, max(1, (m1 - m0 + 1) // 2)


class WallMapping:
    """The mono -> wall mapping of one process's run: measured when built and again at finish(); the
    epsilon covers both brackets and how far the two clocks moved apart in between (NTP slewing or a
    step of the wall clock), so `t_wall = t_mono + offset ± epsilon` holds across the run."""

    def __init__(self, *, mono_ns=time.monotonic_ns, wall_ns=time.time_ns) -> None:
        self._read = lambda: read_wall_offset(mono_ns=mono_ns, wall_ns=wall_ns)
        self.offset_ns, self.epsilon_ns = self._read()
        self.drift_ns: int | None = None

    def finish(self) -> tuple[int, int]:
        end_offset, end_eps = self._read()
        self.drift_ns = end_offset - self.offset_ns
        self.epsilon_ns = max(self.epsilon_ns, abs(self.drift_ns) + end_eps)
        return self.offset_ns, self.epsilon_ns

    def write(self, sink, from_clocks: list[str], host: str) -> None:
        """Declare wall:<host> and map each monotonic domain to it (RunWriter.clock_map)."""
        if self.drift_ns is None:
            self.finish()
        to = wall_clock(host)
        sink.clock_domain(to, host=host, kind="wall")
        for frm in dict.fromkeys(from_clocks):
            sink.clock_map(frm, to, self.offset_ns, self.epsilon_ns, "clock pair (monotonic, realtime)")


class EventIds(NamedTuple):
    """Who an event is about: the id columns of its row (docs/EVENTS.md), None where not known."""
    task_id: str | None = None
    session_id: str | None = None
    request_id: str | None = None
    attempt_id: str | None = None


NO_IDS = EventIds()


class EventSink(Protocol):
    def emit(self, row: dict) -> None: ...


class ListSink:
    """Keeps rows in memory (tests, and engines run without a run directory)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self._lock = threading.Lock()

    def emit(self, row: dict) -> None:
        with self._lock:
            self.rows.append(row)


class Probe:
    def __init__(self, sink: EventSink | None, source: str, *, run_id: str = "run",
                 host: str | None = None, clock: str | None = None, enabled: bool = True,
                 now_ns=time.monotonic_ns) -> None:
        self.sink = sink
        self.source = source
        self.run_id = run_id
        self.host = host or host_id()
        self.clock = clock or mono_clock(self.host)
        self.enabled = enabled and sink is not None
        self.now_ns = now_ns
        self._seq = 0
        self._lock = threading.Lock()

    def emit(self, name: str, ids: EventIds = NO_IDS, *, ts_ns: int | None = None, step_id: int | None = None,
             value: float | None = None, clock: str | None = None, **attrs) -> None:
        if not self.enabled:
            return
        with self._lock:
            seq = self._seq
            self._seq += 1
        task_id, session_id, request_id, attempt_id = ids
        self.sink.emit({
            "run_id": self.run_id,
            "event_id": f"{self.source}:{seq}",
            "seq": seq,
            "source": self.source,
            "host": self.host,
            "name": name,
            "ts_ns": self.now_ns() if ts_ns is None else int(ts_ns),
            "clock": clock or self.clock,
            "task_id": task_id,
            "session_id": session_id,
            "request_id": request_id,
            "attempt_id": attempt_id,
            "step_id": step_id,
            "value": None if value is None else float(value),
            "attrs": json.dumps(attrs, separators=(",", ":"), sort_keys=True) if attrs else "{}",
        })
