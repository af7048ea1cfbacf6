"""Energy measurement: the shared vocabulary of the samplers and the pure energy math of the ledger.

The readers live in `probes/nvml.py` (GPU) and `probes/rapl.py` (CPU), the background thread in
`probes/sampler.py`. This module owns what they share (`Reading`, `SourceStatus`, metric names) and
the functions that turn raw counter samples into joules. Those functions are the one definition of
each step (CONVENTIONS: one definition per metric); the ledger calls them, the report does not
re-derive them.

Counters are stored raw in `samples` (NVML mJ since driver load, RAPL µJ that wraps); everything
below works on those raw values. Unknown is `None` with a reason, never 0.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

# NVML's energy counter refreshes about every 100 ms: a window shorter than that can read 0 J.
NVML_UPDATE_PERIOD_NS = 100_000_000

# Metric names written to `samples` (DESIGN §4). Units are in the names and in the `unit` column.
GPU_ENERGY = "gpu_energy_mj"  # mJ, raw counter since driver load (restarts on reload)
GPU_POWER_INSTANT = "gpu_power_instant_mw"  # mW, NVML_FI_DEV_POWER_INSTANT, stamped with its own time
GPU_POWER_AVG = "gpu_power_avg_mw"  # mW, nvmlDeviceGetPowerUsage: a 1 s average on Ampere and newer
GPU_SM_CLOCK = "gpu_sm_clock_mhz"
GPU_MEM_USED = "gpu_mem_used_bytes"
GPU_UTIL = "gpu_util_pct"  # % of the last sample period a kernel ran
GPU_MEM_UTIL = "gpu_mem_util_pct"  # % of the last sample period memory was read or written
RAPL_MAX_RANGE = "rapl_max_energy_range_uj"  # written once per zone, at start
# RAPL zone counters are f"cpu_{kind}_energy_uj": cpu_package_energy_uj, cpu_dram_energy_uj,
# cpu_psys_energy_uj, cpu_core_energy_uj, cpu_uncore_energy_uj.

UNIT_MJ, UNIT_UJ, UNIT_MW, UNIT_MHZ, UNIT_BYTES, UNIT_PCT = "mJ", "uJ", "mW", "MHz", "B", "%"

# Meaning of a missing energy source for the ledger, shared by gap rows and `inferledger doctor`.
UNKNOWN_NOT_ZERO = "energy per good result will be unknown (NULL with a gap row), not zero"


def unknown_not_zero(what: str) -> str:
    """What a missing `what` ("GPU", "CPU") energy source means for the ledger."""
    return f"{what} energy, and so energy per good result, will be unknown (NULL with a gap row), not zero"


@dataclass(frozen=True)
class Reading:
    """One value a reader took: the sampler adds run, clock, source and host and writes it."""

    metric: str
    value: float
    unit: str
    device: str
    ts_ns: int  # host CLOCK_MONOTONIC


@dataclass(frozen=True)
class SourceStatus:
    """One measurement source on this machine: available or not, and why."""

    source: str  # nvml, rapl, cuda, clock, report
    name: str  # what a person calls it: "GPU 0 energy counter", "RAPL package-0"
    available: bool
    reason: str  # unavailable: why, and what to do; available: what is read
    meaning: str = ""  # what a missing source means for the ledger (or a caveat when available)
    device: str | None = None
    metric: str | None = None

    @property
    def status(self) -> str:
        return "available" if self.available else "unavailable"

    def as_dict(self) -> dict:
        return {**asdict(self), "status": self.status}


# -- RAPL ---------------------------------------------------------------------------------------

def unwrap_rapl(values: Sequence[float], max_range: float) -> list[float]:
    """Energy deltas (µJ) between consecutive raw readings of one RAPL zone's `energy_uj`.

    `values` are the raw counter readings in time order, `max_range` the zone's
    `max_energy_range_uj`. delta = cur − prev, or (max_range − prev) + cur when cur < prev (the
    counter wrapped). Returns len(values) − 1 deltas. Only one wrap per interval can be seen, so the
    sampler must read more often than the wrap period (minutes at high power; it reads at 10–20 Hz).
    A reading above max_range means the wrong range was given: ValueError, not a guess.
    """
    if not max_range or max_range <= 0:
        raise ValueError(f"max_energy_range_uj must be positive, got {max_range!r}")
    out: list[float] = []
    for i, cur in enumerate(values):
        if cur < 0 or cur > max_range:
            raise ValueError(f"reading {i} = {cur} lies outside the counter's range [0, {max_range}]")
        if i:
            prev = values[i - 1]
            out.append(cur - prev if cur >= prev else (max_range - prev) + cur)
    return out


def rapl_window_energy_j(values: Sequence[float], max_range: float) -> float | None:
    """Joules one RAPL zone counted between its first and last reading (wraps unwrapped); None
    with fewer than two readings (unknown, not zero)."""
    if len(values) < 2:
        return None
    return math.fsum(unwrap_rapl(values, max_range)) / 1e6


# RAPL domains that do not overlap. core and uncore lie inside package; psys (the whole platform)
# contains package and dram: adding any of them to package double counts.
DISJOINT_RAPL_KINDS = ("package", "dram")


def rapl_energy_by_kind(zone_j: Iterable[tuple[str, float | None]]) -> dict[str, float | None]:
    """Sum per-zone joules over sockets, one total per zone kind, never across kinds.

    `zone_j` holds (kind, joules) pairs, e.g. [("package", 12.0), ("package", 11.5), ("psys", 40.0)].
    A kind with any unknown zone is unknown (None): a partial sum would read as a low total.
    psys stays its own figure; it is never added to package.
    """
    out: dict[str, float | None] = {}
    for kind, joules in zone_j:
        if kind in out and out[kind] is None:
            continue
        out[kind] = None if joules is None else (out.get(kind) or 0.0) + joules
    return out


# -- NVML ---------------------------------------------------------------------------------------

def short_window(duration_ns: int, update_period_ns: int = NVML_UPDATE_PERIOD_NS) -> bool:
    """True when a window is shorter than the NVML counter's update period (~100 ms): its counter
    difference can be 0 J or one whole update, so its energy must not be trusted alone."""
    return duration_ns < update_period_ns


@dataclass(frozen=True)
class WindowEnergy:
    """GPU energy of one observation window from the raw NVML counter."""

    energy_j: float | None  # None when invalid
    valid: bool
    short_window: bool  # shorter than the counter's update period: flag, not reject
    start_ns: int | None
    end_ns: int | None
    reason: str | None = None  # why invalid (or what the flag means)


def nvml_window_energy(samples: Iterable[tuple[int, float]]) -> WindowEnergy:
    """Energy (J) between the first and last (ts_ns, gpu_energy_mj) sample of a window.

    The counter counts mJ since the driver was loaded. Any negative step (the driver was reloaded
    and the counter restarted) makes the window invalid: energy None with the reason, because what
    was spent around the reload is not known. Fewer than two samples: invalid. A window shorter than
    the counter's ~100 ms update period is valid but carries `short_window=True`.
    """
    pts = sorted((int(t), float(v)) for t, v in samples)
    if len(pts) < 2:
        return WindowEnergy(None, False, False, pts[0][0] if pts else None, pts[0][0] if pts else None,
                            "fewer than two GPU energy counter samples in the window")
    start, end = pts[0][0], pts[-1][0]
    short = short_window(end - start)
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if v1 < v0:
            return WindowEnergy(None, False, short, start, end,
                                f"GPU energy counter went down at ts_ns={t1} ({v0:.0f} -> {v1:.0f} mJ): "
                                "the driver was reloaded; the window's energy is unknown")
    reason = "window shorter than the NVML counter's ~100 ms update period: may read 0 J" if short else None
    return WindowEnergy((pts[-1][1] - pts[0][1]) / 1000.0, True, short, start, end, reason)


def integrate_power(ts_ns: Sequence[int], mw: Sequence[float]) -> float | None:
    """Trapezoid integral of a power series: joules between the first and last point.

    Used to cross-check the energy counter (they can disagree widely; show both). `ts_ns` must be
    non-decreasing and as long as `mw`; fewer than two points give None (no duration, unknown).
    """
    if len(ts_ns) != len(mw):
        raise ValueError(f"{len(ts_ns)} timestamps but {len(mw)} power values")
    if len(ts_ns) < 2:
        return None
    terms = []
    for i in range(1, len(ts_ns)):
        dt = ts_ns[i] - ts_ns[i - 1]
        if dt < 0:
            raise ValueError(f"timestamps go backwards at index {i} ({ts_ns[i - 1]} -> {ts_ns[i]})")
        terms.append(dt * (mw[i] + mw[i - 1]))
    return math.fsum(terms) / 2e12  # ns * mW = 1e-12 J
