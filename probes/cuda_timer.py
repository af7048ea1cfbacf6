"""Device time of each engine step from CUDA events, on its own clock domain.

A CUDA event gives no absolute time, only the interval between two events of one device. So the
timer records an *anchor* event once and defines the domain `cuda:<host>:<device>` as nanoseconds
since that anchor: a `device.step` event's `ts_ns` is its start event's distance from the anchor,
`attrs.end_ns` its end event's, and `value` the device milliseconds in between (measured: both ends
are in the same domain).

The mapping to the host's monotonic clock comes from bracketing: with the device idle, read the host
clock (t0), record the anchor, synchronise, read it again (t1). The anchor ran somewhere in [t0, t1],
so offset = (t0 + t1) / 2, epsilon = (t1 - t0) / 2: the synchronisation gap. At `close()` the timer
brackets a second event the same way; the distance between where the mapping puts it and where the
host saw it is the drift of the two clocks over the run, and the mapping's epsilon is widened to
cover it. The mapping is written to the sink (`clock_map`) only at `close()`: an engine that is never
closed leaves the domain unmapped and the ledger refuses cross-domain differences (with a gap) rather
than use an unchecked offset.

Events are read without blocking: `poll()` emits the steps whose end event has completed, in order;
`close()` waits for the rest. `cuda` is the `torch.cuda` module or anything with its
`Event(enable_timing=True)` / `synchronize()` shape (tests pass a fake device). The events come from
their own probe (source `device`, the cuda clock) into the engine probe's sink.
"""
from __future__ import annotations

import time
from collections import deque

from .probe import Probe


class CudaStepTimer:
    def __init__(self, probe, sink=None, *, cuda=None, device_index: int = 0,
                 now_ns=time.monotonic_ns) -> None:
        if cuda is None:
            import torch

            cuda = torch.cuda
        self.sink, self.cuda, self.now_ns = sink, cuda, now_ns
        self.clock = f"cuda:{probe.host}:{device_index}"
        self.host_clock = probe.clock  # the domain the mapping leads to: the engine's
        # its own source ("device") and clock; same sink, run and host as the engine's probe
        self.probe = Probe(probe.sink, "device", run_id=probe.run_id, host=probe.host, clock=self.clock,
                           enabled=probe.enabled)
        self.device_index = device_index
        self._pending: deque = deque()  # (step_id, start event, end event, attrs)
        self._open = None
        self.offset_ns, self.epsilon_ns = self._bracket(None)
        self.drift_ns: int | None = None
        self.closed = False
        if sink is not None and hasattr(sink, "clock_domain"):
            sink.clock_domain(self.clock, host=probe.host, kind="cuda-event")
        # a device.step's ts_ns and end_ns are in this domain, whatever the engine's clock is

    def _bracket(self, event) -> tuple[int, int]:
        """Record `event` (a new one for the anchor) with the device idle; -> (host midpoint, half gap)."""
        self.cuda.synchronize()
        t0 = self.now_ns()
        if event is None:
            event = self.anchor = self.cuda.Event(enable_timing=True)
        event.record()
        self.cuda.synchronize()
        t1 = self.now_ns()
        return (t0 + t1) // 2, (t1 - t0 + 1) // 2

    def _ns(self, event) -> int:
        return round(self.anchor.elapsed_time(event) * 1e6)

    def start(self, step_id: int) -> None:
        ev = self.cuda.Event(enable_timing=True)
        ev.record()
        self._open = (step_id, ev)

    def end(self, step_id: int, **attrs) -> None:
        """Close the step opened by start(step_id); attrs (mode, padded batch) go on its event."""
        if self._open is None or self._open[0] != step_id:
            raise RuntimeError(f"CudaStepTimer.end({step_id}) without a matching start")
        ev = self.cuda.Event(enable_timing=True)
        ev.record()
        self._pending.append((step_id, self._open[1], ev, attrs))
        self._open = None

    def poll(self) -> int:
        """Emit device.step for every finished step, oldest first; -> how many."""
        n = 0
        while self._pending and self._pending[0][2].query():
            self._emit(*self._pending.popleft())
            n += 1
        return n

    def _emit(self, step_id: int, start, end, attrs: dict) -> None:
        t0, t1 = self._ns(start), self._ns(end)
        self.probe.emit("device.step", ts_ns=t0, step_id=step_id,
                        value=(t1 - t0) / 1e6, end_ns=t1, device=self.device_index, **attrs)

    def close(self) -> None:
        """Wait for the pending steps, emit them, measure drift and write the mapping (once)."""
        if self.closed:
            return
        self.closed = True
        self.cuda.synchronize()
        while self._pending:
            self._emit(*self._pending.popleft())
        probe_event = self.cuda.Event(enable_timing=True)
        host_mid, half_gap = self._bracket(probe_event)
        self.drift_ns = host_mid - (self.offset_ns + self._ns(probe_event))
        epsilon = max(self.epsilon_ns, abs(self.drift_ns) + half_gap)
        if self.sink is not None and hasattr(self.sink, "clock_map"):
            self.sink.clock_map(self.clock, self.host_clock, self.offset_ns, epsilon, "cuda-event-anchor")
