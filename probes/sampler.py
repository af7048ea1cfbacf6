"""The samplers: one background thread that reads its readers at a fixed rate (`PeriodicSampler`);
the energy sampler (below) and the host sampler (probes/host.py) are that loop with their readers.

The energy sampler reads every available energy source at 10–20 Hz. Each tick asks every reader
(NVML per GPU, RAPL for the CPU) for its raw values and writes them through a sink with `.sample(...)` (a `collectors.rundir.writer.RunWriter`) on the host monotonic clock
`mono:<host>`, the clock the engine's and the client's events use. Counters go out raw; the
ledger turns them into joules (`ledger/energy.sql`). Sources that are
unavailable write nothing (never a 0): `sources()` and `gap_rows()` say why.

    with EnergySampler(writer, hz=10) as s:    # reads once at start, then every 100 ms
        ...                                    # the run
    # stopped: one last reading closes the window
"""
from __future__ import annotations

import threading
import time

from .energy import GPU_ENERGY, SourceStatus, UNKNOWN_NOT_ZERO
from .nvml import NvmlReader
from .probe import host_id, mono_clock
from .rapl import DEFAULT_ROOT, GRANT_ACCESS, RaplReader

MIN_HZ, MAX_HZ = 1.0, 100.0


def default_readers(nvml=None, powercap_root=DEFAULT_ROOT) -> list:
    """A reader per GPU NVML sees (or one unavailable GPU reader) and the host's RAPL reader."""
    return [*NvmlReader.open_all(nvml), RaplReader.open(powercap_root)]


class PeriodicSampler:
    """One background thread that asks its readers for readings every 1/hz s and writes them through
    `sink.sample(...)` on the host monotonic clock; the energy and the host samplers are this loop
    with their own readers (each reader: `available`, `sources()`, `static_readings()`, `read()`,
    `close()`, `source`)."""

    THREAD_NAME = "inferledger-sampler"

    def __init__(self, sink, *, hz: float, readers: list, host: str | None = None) -> None:
        if not MIN_HZ <= hz <= MAX_HZ:
            raise ValueError(f"sampling rate {hz} Hz is outside [{MIN_HZ:g}, {MAX_HZ:g}]; 10-20 Hz suits "
                             "NVML's ~100 ms counter and RAPL's wrap period")
        self.sink = sink
        self.hz = float(hz)
        self.readers = readers
        self.host = host or host_id()
        self.clock = mono_clock(self.host)
        self.ticks = 0
        self.overruns = 0  # ticks skipped because a read took longer than the period
        self.errors = 0  # reader or sink failures (the thread keeps going)
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one tick at a time (thread vs the final tick in stop())

    # -- what is measured ---------------------------------------------------------------------
    @property
    def live_readers(self) -> list:
        return [r for r in self.readers if r.available]

    @property
    def available(self) -> bool:
        return bool(self.live_readers)

    def sources(self) -> list[SourceStatus]:
        """Every source of every reader, available or unavailable with the reason."""
        return [s for r in self.readers for s in r.sources()]

    # -- running ------------------------------------------------------------------------------
    def _write(self, reader, readings) -> None:
        for r in readings:
            self.sink.sample(ts_ns=r.ts_ns, clock=self.clock, source=reader.source, host=self.host,
                             metric=r.metric, value=r.value, unit=r.unit, device=r.device)

    def tick(self) -> None:
        """Read every available source once and write the values."""
        with self._lock:
            for reader in self.live_readers:
                try:
                    self._write(reader, reader.read())
                except Exception as exc:  # one bad read or write must not end the run's sampling
                    self.errors += 1
                    self.last_error = f"{reader.source}: {type(exc).__name__}: {exc}"
            self.ticks += 1

    def _run(self) -> None:
        period = int(1e9 / self.hz)
        due = time.monotonic_ns()
        while True:
            self.tick()
            due += period
            delay = due - time.monotonic_ns()
            if delay < 0:  # late: skip the missed ticks rather than burst to catch up
                missed = -delay // period + 1
                self.overruns += missed
                due += missed * period
                delay = due - time.monotonic_ns()
            if self._stop.wait(max(delay, 0) / 1e9):
                return

    def start(self) -> "PeriodicSampler":
        """Write each source's one-time values (RAPL wrap ranges) and start the thread. With no
        available source nothing starts and nothing is written."""
        if self._thread is not None or not self.available:
            return self
        if self.sink is None:
            raise ValueError(f"{type(self).__name__} needs a sink with .sample(...) (a RunWriter) to start")
        for reader in self.live_readers:
            self._write(reader, reader.static_readings())
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and take one last reading, so the run's last window has its end."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.tick()

    def close(self) -> None:
        self.stop()
        for r in self.readers:
            r.close()

    def __enter__(self) -> "PeriodicSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class EnergySampler(PeriodicSampler):
    """Every available energy source (NVML per GPU, RAPL), raw counters at 10–20 Hz."""

    THREAD_NAME = "inferledger-energy"

    def __init__(self, sink, *, hz: float = 10.0, readers: list | None = None, host: str | None = None,
                 nvml=None, powercap_root: str = DEFAULT_ROOT) -> None:
        super().__init__(sink, hz=hz, readers=readers if readers is not None else default_readers(nvml, powercap_root),
                         host=host)

    def gap_rows(self, run_id: str) -> list[dict]:
        """Gap-register rows (GAP_SCHEMA) for the energy counters this run cannot read."""
        rows = []
        for s in self.sources():
            if s.available or s.reason.startswith("skipped"):
                continue
            if s.source == "nvml" and s.metric == GPU_ENERGY:
                affects = "energy_gpu_j, energy_per_good_j"
                needs = "an NVIDIA driver with NVML and a Volta or newer GPU (its total energy counter)"
            elif s.source == "rapl" and (s.metric is None or s.metric == "cpu_package_energy_uj"):
                affects = "energy_cpu_j, energy_per_good_j"
                needs = GRANT_ACCESS if "permission denied" in s.reason else \
                    "read access to a powercap RAPL tree (bare metal; most VMs have none)"
            else:
                continue
            rows.append({"run_id": run_id, "gap_id": f"energy:{s.source}:{s.device or s.name}", "scope": "energy",
                         "subject_id": s.device, "affects": affects, "needs": needs,
                         "detail": f"{s.name}: {s.reason}; {UNKNOWN_NOT_ZERO}"})
        return rows

    def manifest(self) -> dict:
        """For manifest.json: GPU names and UUIDs, RAPL zones, the rate and the clock."""
        return {"sampler_hz": self.hz, "clock": self.clock,
                "gpus": [r.manifest() for r in self.readers if isinstance(r, NvmlReader)],
                "rapl": next((r.manifest() for r in self.readers if isinstance(r, RaplReader)), None)}
