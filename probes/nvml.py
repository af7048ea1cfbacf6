"""Reading one GPU through NVML: the energy counter, instant power, clocks, memory, utilisation.

`NvmlReader.open(index, nvml=...)` takes any module object with pynvml's API (the real `pynvml`
from nvidia-ml-py by default, a fake in tests). Everything NVML refuses becomes "unavailable" with
the reason: no driver at all, an energy counter the GPU does not have (pre-Volta), a power field a
MIG slice does not report. Nothing is ever read as 0 in place of a failure.

The readings are whole-device: other processes' work on the GPU is inside them.
"""
from __future__ import annotations

import time

from .energy import (GPU_ENERGY, GPU_MEM_USED, GPU_MEM_UTIL, GPU_POWER_AVG, GPU_POWER_INSTANT, GPU_SM_CLOCK,
                     GPU_UTIL, UNIT_BYTES, UNIT_MHZ, UNIT_MJ, UNIT_MW, UNIT_PCT, Reading,
                     SourceStatus, unknown_not_zero)

FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT
SCOPE_GPU = 0  # NVML_POWER_SCOPE_GPU
# nvmlValueType_t -> the member of the nvmlValue_t union that holds the value
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# A field timestamp older than this (or in the future) is not trusted; the read time is used.
MAX_FIELD_AGE_NS = 5_000_000_000


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # pynvml's __str__ calls into the library, which may be gone
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlReader:
    """One GPU. Build with `open()` / `open_all()`; `available` says whether anything can be read."""

    source = "nvml"

    def __init__(self, nvml, index: int, *, reason: str = "", now_ns=time.monotonic_ns, wall_ns=time.time_ns):
        self.nvml = nvml
        self.index = index
        self.handle = None
        self.reason = reason  # why the whole device is unavailable
        self.name: str | None = None
        self.uuid: str | None = None
        self.driver_version: str | None = None
        self.now_ns = now_ns
        self.wall_ns = wall_ns
        self.metric_reason: dict[str, str] = {}  # metric -> why unavailable; absent = available
        self.errors = 0  # reads that failed after open
        self._initialised = False
        self._closed = False

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, index: int = 0, nvml=None, **clocks) -> "NvmlReader":
        """Initialise NVML and probe what GPU `index` can report. Never raises for a missing GPU."""
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                return cls(None, index, reason="nvidia-ml-py is not installed (pip install nvidia-ml-py)", **clocks)
        reader = cls(nvml, index, **clocks)
        try:
            nvml.nvmlInit()
        except (nvml.NVMLError, OSError) as exc:
            reader.reason = reader._init_reason(exc)
            return reader
        reader._initialised = True
        try:
            reader.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            reader.reason = f"no GPU {index}: nvmlDeviceGetHandleByIndex failed ({_describe(exc)})"
            reader.close()
            return reader
        reader._identify()
        reader._probe_metrics()
        return reader

    @classmethod
    def open_all(cls, nvml=None, **clocks) -> list["NvmlReader"]:
        """A reader per GPU NVML sees; one unavailable reader (with the reason) when there is none."""
        first = cls.open(0, nvml, **clocks)
        if not first.available:
            return [first]
        try:
            count = first.nvml.nvmlDeviceGetCount()
        except first.nvml.NVMLError:
            count = 1
        return [first] + [cls.open(i, first.nvml, **clocks) for i in range(1, count)]

    @staticmethod
    def for_uuid(readers: list["NvmlReader"], uuid: str | None) -> "NvmlReader | None":
        """The reader of the GPU with this UUID ("GPU-..." as NVML spells it, as CUDA's device
        properties give it once prefixed): NVML numbers devices its own way, and CUDA_VISIBLE_DEVICES
        renumbers CUDA's, so index 0 on one side need not be index 0 on the other. None: no match."""
        bare = lambda u: (u or "").lower().removeprefix("gpu-")
        want = bare(uuid)
        return next((r for r in readers if want and r.uuid and bare(r.uuid) == want), None)

    def _init_reason(self, exc: BaseException) -> str:
        lib_missing = getattr(self.nvml, "NVMLError_LibraryNotFound", None)
        if lib_missing is not None and isinstance(exc, lib_missing):
            return (f"NVML library not found ({_describe(exc)}): no NVIDIA driver on this machine, "
                    "so no GPU energy or power")
        return f"nvmlInit failed ({_describe(exc)}): the NVIDIA driver did not answer"

    def _is_not_supported(self, exc: BaseException) -> bool:
        cls = getattr(self.nvml, "NVMLError_NotSupported", None)
        return (cls is not None and isinstance(exc, cls)) or \
            getattr(exc, "value", None) == getattr(self.nvml, "NVML_ERROR_NOT_SUPPORTED", 3)

    def _identify(self) -> None:
        n, h = self.nvml, self.handle
        for attr, fn in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
            try:
                setattr(self, attr, _text(getattr(n, fn)(h)))
            except n.NVMLError:
                pass
        try:
            self.driver_version = _text(n.nvmlSystemGetDriverVersion())
        except (n.NVMLError, AttributeError):
            pass

    def _probe_metrics(self) -> None:
        """Try each reading once; what fails now is unavailable for the whole run, with the reason."""
        n, h = self.nvml, self.handle
        probes = {
            GPU_ENERGY: lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
            GPU_POWER_AVG: lambda: n.nvmlDeviceGetPowerUsage(h),
            GPU_SM_CLOCK: lambda: n.nvmlDeviceGetClockInfo(h, getattr(n, "NVML_CLOCK_SM", 1)),
            GPU_MEM_USED: lambda: n.nvmlDeviceGetMemoryInfo(h),
            GPU_UTIL: lambda: n.nvmlDeviceGetUtilizationRates(h),
        }
        for metric, call in probes.items():
            try:
                call()
            except n.NVMLError as exc:
                why = "not supported by this GPU" if self._is_not_supported(exc) else "refused"
                if metric == GPU_ENERGY and self._is_not_supported(exc):
                    why += " (the total energy counter needs Volta or newer)"
                self.metric_reason[metric] = f"{why}: {_describe(exc)}"
            except AttributeError as exc:  # an nvidia-ml-py too old to have the call
                self.metric_reason[metric] = f"this nvidia-ml-py lacks it: {exc}"
        if GPU_UTIL in self.metric_reason:
            self.metric_reason[GPU_MEM_UTIL] = self.metric_reason[GPU_UTIL]
        _, why = self._instant_power()
        if why:
            self.metric_reason[GPU_POWER_INSTANT] = why

    # -- state --------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self.handle is not None

    @property
    def device(self) -> str:
        """The `device` column of this GPU's samples: index and, when known, UUID."""
        return f"gpu{self.index}/{self.uuid}" if self.uuid else f"gpu{self.index}"

    def metric_available(self, metric: str) -> bool:
        return self.available and metric not in self.metric_reason

    def sources(self) -> list[SourceStatus]:
        label = f"GPU {self.index}" + (f" ({self.name})" if self.name else "")
        if not self.available:
            return [
                SourceStatus("nvml", f"{label} energy counter", False, self.reason, unknown_not_zero("GPU"),
                             self.device, GPU_ENERGY),
                SourceStatus("nvml", f"{label} instant power", False, self.reason,
                             "no power series: no counter-vs-power cross-check", self.device, GPU_POWER_INSTANT),
            ]
        avg_ok = self.metric_available(GPU_POWER_AVG)
        inst_ok = self.metric_available(GPU_POWER_INSTANT)
        rows = [
            SourceStatus("nvml", f"{label} energy counter", self.metric_available(GPU_ENERGY),
                         self.metric_reason.get(GPU_ENERGY, "nvmlDeviceGetTotalEnergyConsumption, mJ since driver load"),
                         "whole-device: other processes on this GPU are inside the reading" if self.metric_available(GPU_ENERGY)
                         else unknown_not_zero("GPU") + " (integrated power is only a cross-check)",
                         self.device, GPU_ENERGY),
            SourceStatus("nvml", f"{label} instant power", inst_ok,
                         self.metric_reason.get(GPU_POWER_INSTANT, "field NVML_FI_DEV_POWER_INSTANT, mW, own timestamp"),
                         "" if inst_ok else ("falls back to the 1 s averaged power" if avg_ok else "no power series"),
                         self.device, GPU_POWER_INSTANT),
            SourceStatus("nvml", f"{label} average power", avg_ok,
                         self.metric_reason.get(GPU_POWER_AVG, "nvmlDeviceGetPowerUsage, mW (a 1 s average on Ampere and newer)"),
                         "read only when instant power fails" if avg_ok else "MIG slices and some boards report no power",
                         self.device, GPU_POWER_AVG),
        ]
        for metric, what in ((GPU_SM_CLOCK, "SM clock"), (GPU_MEM_USED, "memory used"), (GPU_UTIL, "utilisation")):
            ok = self.metric_available(metric)
            rows.append(SourceStatus("nvml", f"{label} {what}", ok, self.metric_reason.get(metric, metric), "",
                                     self.device, metric))
        return rows

    def manifest(self) -> dict:
        return {"index": self.index, "name": self.name, "uuid": self.uuid, "driver": self.driver_version,
                "available": self.available, "reason": self.reason or None,
                "unavailable_metrics": dict(self.metric_reason)}

    # -- reading ------------------------------------------------------------------------------
    def _instant_power(self) -> tuple[tuple[float, int] | None, str | None]:
        """((mW, ts_ns on the host monotonic clock), None) or (None, why). Checks the field's own
        return code; stamps the value with the field's own timestamp (µs since 1970), carried over
        to the monotonic clock as an age measured on the wall clock at the moment of the read."""
        n = self.nvml
        try:
            fv = n.nvmlDeviceGetFieldValues(self.handle, [(FI_POWER_INSTANT, SCOPE_GPU)])[0]
        except n.NVMLError as exc:
            return None, f"nvmlDeviceGetFieldValues failed: {_describe(exc)}"
        except AttributeError as exc:
            return None, f"this nvidia-ml-py lacks field values: {exc}"
        mono, wall = self.now_ns(), self.wall_ns()
        ret = int(fv.nvmlReturn)
        if ret != getattr(n, "NVML_SUCCESS", 0):
            try:
                err = _describe(n.NVMLError(ret))
            except Exception:
                err = f"NVML return code {ret}"
            return None, f"field POWER_INSTANT returned {err}"
        member = _VALUE_MEMBER.get(int(fv.valueType))
        if member is None:
            return None, f"field POWER_INSTANT has unknown value type {fv.valueType}"
        age_ns = wall - int(fv.timestamp) * 1000
        ts = mono - age_ns if 0 <= age_ns <= MAX_FIELD_AGE_NS else mono
        return (float(getattr(fv.value, member)), ts), None

    def _timed(self, call):
        t0 = self.now_ns()
        value = call()
        return value, (t0 + self.now_ns()) // 2  # the read's midpoint

    def read(self) -> list[Reading]:
        """One reading of every available metric. A call that fails now is skipped (and counted),
        never written as 0."""
        if not self.available or self._closed:
            return []
        n, h, dev, out = self.nvml, self.handle, self.device, []

        def add(metric, unit, call, pick=lambda v: v):
            if not self.metric_available(metric):
                return
            try:
                value, ts = self._timed(call)
            except n.NVMLError:
                self.errors += 1
                return
            out.append(Reading(metric, float(pick(value)), unit, dev, ts))

        add(GPU_ENERGY, UNIT_MJ, lambda: n.nvmlDeviceGetTotalEnergyConsumption(h))
        got = None
        if self.metric_available(GPU_POWER_INSTANT):
            got, why = self._instant_power()
            if got is None:
                self.errors += 1
            else:
                out.append(Reading(GPU_POWER_INSTANT, got[0], UNIT_MW, dev, got[1]))
        if got is None:  # the 1 s average stands in, under its own name
            add(GPU_POWER_AVG, UNIT_MW, lambda: n.nvmlDeviceGetPowerUsage(h))
        add(GPU_SM_CLOCK, UNIT_MHZ, lambda: n.nvmlDeviceGetClockInfo(h, getattr(n, "NVML_CLOCK_SM", 1)))
        add(GPU_MEM_USED, UNIT_BYTES, lambda: n.nvmlDeviceGetMemoryInfo(h), lambda m: m.used)
        if self.metric_available(GPU_UTIL):
            try:
                util, ts = self._timed(lambda: n.nvmlDeviceGetUtilizationRates(h))
                out += [Reading(GPU_UTIL, float(util.gpu), UNIT_PCT, dev, ts),
                        Reading(GPU_MEM_UTIL, float(util.memory), UNIT_PCT, dev, ts)]
            except n.NVMLError:
                self.errors += 1
        return out

    def static_readings(self) -> list[Reading]:
        return []

    def close(self) -> None:
        self._closed = True
        if self._initialised:
            self._initialised = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass
