"""Energy measurement: the vocabulary the samplers share.

The readers live in `probes/nvml.py` (GPU) and `probes/rapl.py` (CPU), the background thread in
`probes/sampler.py`. This module owns what they share: `Reading`, `SourceStatus`, metric names and
units, and what a missing source means. Counters are stored raw in `samples` (NVML mJ since driver
load, RAPL µJ that wraps); turning them into joules has one definition, the ledger's SQL
(`ledger/energy.sql`, docs/LEDGER.md "Energy"): RAPL unwrapping, driver resets, deltas
apportioned at the window's edges, the idle term. Nothing here repeats it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

# Metric names written to `samples` (docs/EVENTS.md "Samples"). Units are in the names and in the `unit` column.
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


# RAPL domains that do not overlap. core and uncore lie inside package; psys (the whole platform)
# contains package and dram: adding any of them to package double counts (the ledger adds none).
DISJOINT_RAPL_KINDS = ("package", "dram")
