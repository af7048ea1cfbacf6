"""Device time of each engine step from CUDA events, on its own clock domain.

A CUDA event gives no absolute time, only the interval between two events of one device. So the
timer records an *anchor* event once and defines the domain `cuda:<host>:<device>` as nanoseconds
since that anchor: a `device.step` event's `ts_ns` is its start event's distance from the anchor,
`value` the device milliseconds from its start event to its end event, read as that one interval
(`start.elapsed_time(end)`), and `attrs.end_ns` = ts_ns + value. `elapsed_time` is a float32 count
of milliseconds: a minute from the anchor its resolution is ~4 us, so a step's length taken as the
difference of two anchor distances would lose the microseconds a graph-replayed step is made of;
only the placement on the run's axis carries that (relative 6e-8) rounding.

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
`Event(enable_timing=True)` / `synchronize()` / `device(i)` shape (tests pass a fake device). Every
event is recorded, and every synchronisation made, under `cuda.device(device_index)`: an event
records on the current device's stream, which is not the engine's when it runs on cuda:1. The events
come from their own probe (source `device`, the cuda clock) into the engine probe's sink.
`summary()` is what a manifest records: the device's UUID (to match NVML's readings to this device),
the anchor's epsilon and, after `close()`, the drift measured and the epsilon written.
"""
from __future__ import annotations

import contextlib
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
        self.mapped_epsilon_ns: int | None = None
        self.closed = False
        if sink is not None and hasattr(sink, "clock_domain"):
            sink.clock_domain(self.clock, host=probe.host, kind="cuda-event")
        # a device.step's ts_ns and end_ns are in this domain, whatever the engine's clock is

    def _on_device(self):
        device = getattr(self.cuda, "device", None)
        return device(self.device_index) if device is not None else contextlib.nullcontext()

    def _record(self):
        with self._on_device():
            ev = self.cuda.Event(enable_timing=True)
            ev.record()
        return ev

    def _bracket(self, event) -> tuple[int, int]:
        """Record `event` (a new one for the anchor) with the device idle; -> (host midpoint, half gap)."""
        with self._on_device():
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
        self._open = (step_id, self._record())

    def end(self, step_id: int, **attrs) -> None:
        """Close the step opened by start(step_id); attrs (mode, padded batch) go on its event."""
        if self._open is None or self._open[0] != step_id:
            raise RuntimeError(f"CudaStepTimer.end({step_id}) without a matching start")
        self._pending.append((step_id, self._open[1], self._record(), attrs))
        self._open = None

    def poll(self) -> int:
        """Emit device.step for every finished step, oldest first; -> how many."""
        n = 0
        while self._pending and self._pending[0][2].query():
            self._emit(*self._pending.popleft())
            n += 1
        return n

    def _emit(self, step_id: int, start, end, attrs: dict) -> None:
        t0, ms = self._ns(start), float(start.elapsed_time(end))  # the step's own interval, not t1 - t0
        self.probe.emit("device.step", ts_ns=t0, step_id=step_id,
                        value=ms, end_ns=t0 + round(ms * 1e6), device=self.device_index, **attrs)

    def close(self) -> None:
        """Wait for the pending steps, emit them, measure drift and write the mapping (once)."""
        if self.closed:
            return
        self.closed = True
        with self._on_device():
            self.cuda.synchronize()
            probe_event = self.cuda.Event(enable_timing=True)
        while self._pending:
            self._emit(*self._pending.popleft())
        host_mid, half_gap = self._bracket(probe_event)
        self.drift_ns = host_mid - (self.offset_ns + self._ns(probe_event))
        epsilon = self.mapped_epsilon_ns = max(self.epsilon_ns, abs(self.drift_ns) + half_gap)
        if self.sink is not None and hasattr(self.sink, "clock_map"):
            self.sink.clock_map(self.clock, self.host_clock, self.offset_ns, epsilon, "cuda-event-anchor")

    def summary(self) -> dict:
        """For the manifest: which device (UUID), the anchor's epsilon, the drift measured at close."""
        return {"clock": self.clock, "device_index": self.device_index, "device_uuid": self.device_uuid(),
                "anchor_epsilon_ns": self.epsilon_ns, "drift_ns": self.drift_ns,
                "mapped_epsilon_ns": self.mapped_epsilon_ns,
                "step_ms_from": "start.elapsed_time(end), float32 ms per step"}

    def device_uuid(self) -> str | None:
        """NVML's spelling ("GPU-<uuid>") of this device's UUID, or None where the device has none."""
        props = getattr(self.cuda, "get_device_properties", None)
        uuid = getattr(props(self.device_index), "uuid", None) if props is not None else None
        return None if uuid is None else "GPU-" + str(uuid).removeprefix("GPU-")
