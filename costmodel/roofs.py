"""Device roofs, each labelled with where its number came from (docs/MODEL.md "Roofs").

A roof is one number with a source: `spec` (the vendor's datasheet, the table below), `microbenchmark`
(measured at capture start: manifest `device_params`), `fit` (the step-time fit's effective rates),
`assumption` (declared by a person). A peak and a sustained figure never share a name: `statistic`
says which one a roof is. Lower bounds use peaks only.
"""
from __future__ import annotations

import math

import re
from dataclasses import asdict, dataclass

from inferledger.probes.run_folder import Manifest

SOURCES = ("spec", "microbenchmark", "fit", "assumption")
STATISTICS = ("peak", "sustained", "effective")


@dataclass(frozen=True)
class Roof:
    quantity: str    # "compute" (FLOP/s) or "memory" (bytes/s)
    value: float     # in `unit`
    unit: str        # "TFLOP/s" or "GB/s"
    source: str      # one of SOURCES
    statistic: str   # one of STATISTICS
    label: str       # what it is, with its citation or measurement

    def __post_init__(self):
        if self.source not in SOURCES or self.statistic not in STATISTICS:
            raise ValueError(f"roof {self.label!r}: source must be one of {SOURCES}, statistic one of {STATISTICS}")
        if not self.value > 0:
            raise ValueError(f"roof {self.label!r}: value {self.value} must be positive")

    @property
    def per_s(self) -> float:
        """FLOP/s or bytes/s."""
        return self.value * (1e12 if self.unit == "TFLOP/s" else 1e9)


@dataclass(frozen=True)
class Roofs:
    compute: Roof
    memory: Roof

    @property
    def ridge(self) -> float:
        """FLOP per byte where the two roofs meet."""
        return self.compute.per_s / self.memory.per_s

    def to_dict(self) -> dict:
        return {"compute": asdict(self.compute), "memory": asdict(self.memory)}

    @classmethod
    def from_dict(cls, d: dict) -> "Roofs":
        return cls(Roof(**d["compute"]), Roof(**d["memory"]))

    @classmethod
    def declared(cls, tflops: float, gbps: float, label: str = "declared") -> "Roofs":
        """Roofs a person states (source `assumption`)."""
        return cls(Roof("compute", tflops, "TFLOP/s", "assumption", "peak", label),
                   Roof("memory", gbps, "GB/s", "assumption", "peak", label))


# Dense peaks (no structured sparsity). fp32 on NVIDIA parts is the TF32 tensor-core peak: torch may
# route an fp32 matmul through TF32, and a bound must not be slower than what the device can do.
# The first matching pattern wins, so a variant (NVL, PCIe) precedes its family.
SPEC = (
    (r"H200 NVL", {"bfloat16": 835.0, "float16": 835.0, "float32": 417.5}, 4800.0, "NVIDIA H200 datasheet (2024), H200 NVL column"),
    (r"H200", {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7}, 4800.0, "NVIDIA H200 datasheet (2024), H200 SXM column"),
    (r"H100 NVL", {"bfloat16": 835.0, "float16": 835.0, "float32": 417.5}, 3938.0, "NVIDIA H100 datasheet (2023), H100 NVL column"),
    (r"H100 PCIe", {"bfloat16": 756.5, "float16": 756.5, "float32": 378.0}, 2000.0, "NVIDIA H100 datasheet (2023), H100 PCIe column"),
    (r"H100", {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7}, 3350.0, "NVIDIA H100 datasheet (2023), H100 SXM column"),
    (r"A100", {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0}, 2039.0, "NVIDIA A100 datasheet (2021), 80GB SXM column"),
    (r"\bL4\b", {"bfloat16": 121.0, "float16": 121.0, "float32": 60.0}, 300.0, "NVIDIA L4 datasheet (2023), dense figures"),
    # CPUs: cores × max turbo × FLOP per cycle per core (AMX bf16 1024, AVX-512 fp32 2 FMA × 16 × 2 = 64);
    # memory: channels × DDR5 transfer rate × 8 bytes, one socket
    (r"Xeon.*8480", {"bfloat16": 56 * 3.8 * 1024 / 1000, "float32": 56 * 3.8 * 64 / 1000}, 8 * 4.8 * 8,
     "Intel Xeon Platinum 8480+ (ark.intel.com: 56 cores, 3.8 GHz, 8 × DDR5-4800); Intel AMX: 1024 bf16 FLOP/cycle/core"),
    (r"EPYC 9654", {"bfloat16": 96 * 3.7 * 64 / 1000, "float32": 96 * 3.7 * 32 / 1000}, 12 * 4.8 * 8,
     "AMD EPYC 9654 (amd.com: 96 cores, 3.7 GHz, 12 × DDR5-4800); Zen 4: 2 × 256-bit FMA pipes"),
)


def spec_roofs(device_name: str | None, dtype: str) -> Roofs | None:
    """The datasheet roofs for a device name and compute dtype, None when no entry matches."""
    if not device_name:
        return None
    for pattern, tflops, gbps, cite in SPEC:
        if re.search(pattern, device_name, re.IGNORECASE) and dtype in tflops:
            return Roofs(Roof("compute", round(tflops[dtype], 3), "TFLOP/s", "spec", "peak", f"{dtype} dense peak: {cite}"),
                         Roof("memory", round(gbps, 3), "GB/s", "spec", "peak", f"memory bandwidth: {cite}"))
    return None


def _rate(x) -> bool:
    """A roof's number as a manifest may hold it: finite and positive (JSON's Infinity, NaN, a boolean or
    a string is no rate: a roof of Infinity would make every bound 0)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def microbenchmark_roofs(params: dict) -> Roofs | None:
    """The best (peak) of a run's own microbenchmarks (its manifest's `device_params`), None without both
    as finite positive numbers."""
    mem, mm = params.get("memcpy_gbps") or {}, params.get("matmul_tflops") or {}
    if not (isinstance(mem, dict) and isinstance(mm, dict) and _rate(mem.get("peak")) and _rate(mm.get("peak"))):
        return None
    return Roofs(Roof("compute", float(mm["peak"]), "TFLOP/s", "microbenchmark", "peak",
                      mm.get("label") or "the best of the capture's matmul repeats"),
                 Roof("memory", float(mem["peak"]), "GB/s", "microbenchmark", "peak",
                      mem.get("label") or "the best of the capture's memcpy repeats"))


def host_rates(params: dict) -> dict | None:
    """The host's rates over a capture: the median of its microbenchmarks' repeats (start, idle gaps, end; those a
    task arrived during left out), each repeat's best, as `device_params` records them; the start alone where the
    capture repeated none. {"memory_gb_s", "compute_tflop_per_s", "n"}; None without microbenchmarks. Not a roof (a
    bound holds a peak): how fast this host ran while the capture ran, which moves from one capture to the next
    on a shared host (docs/MODEL.md "Across runs")."""
    runs = (params.get("repeats") or {}).get("runs") if isinstance(params.get("repeats"), dict) else None
    if isinstance(runs, list) and runs:
        clean = [r for r in runs if isinstance(r, dict) and not r.get("overlapped")
                 and _rate(r.get("memcpy_gbps")) and _rate(r.get("matmul_tflops"))]
    else:
        bench = microbenchmark_roofs(params)
        clean = [] if bench is None else [{"memcpy_gbps": bench.memory.value, "matmul_tflops": bench.compute.value}]
    if not clean:
        return None
    from inferledger.probes.quantile import quantile

    return {"memory_gb_s": quantile([float(r["memcpy_gbps"]) for r in clean], 0.5),
            "compute_tflop_per_s": quantile([float(r["matmul_tflops"]) for r in clean], 0.5), "n": len(clean)}


def run_roofs(manifest: Manifest) -> tuple[Roofs | None, str]:
    """Peak roofs for a run: the spec entry of its device, else its microbenchmarks' best, else roofs a
    person declared (`declared_roofs`: tflops, gbps, label; source assumption); with why."""
    dtype = manifest.weights_dtype
    name = manifest.device_name
    spec = spec_roofs(name, dtype)
    if spec is not None:
        return spec, f"spec entry for {name} ({dtype})"
    bench = microbenchmark_roofs(manifest.block("device_params"))
    if bench is not None:
        return bench, "the run's microbenchmarks (manifest device_params)"
    declared = manifest.block("declared_roofs")
    if _rate(declared.get("tflops")) and _rate(declared.get("gbps")):
        return (Roofs.declared(float(declared["tflops"]), float(declared["gbps"]), declared.get("label") or "declared"),
                "roofs a person declared (manifest declared_roofs)")
    return None, (f"no spec entry for device {name!r} at {dtype or 'an unknown dtype'}, no microbenchmarks "
                  "(manifest device_params memcpy_gbps.peak and matmul_tflops.peak, finite and positive) and no "
                  "declared_roofs")


def fit_rates(manifest: Manifest) -> tuple[Roofs | None, str]:
    """The rates a step fit holds fixed: the run's own microbenchmarks first (what this host reached),
    else the run's peak roofs (`run_roofs`: spec, declared); with why."""
    bench = microbenchmark_roofs(manifest.block("device_params"))
    if bench is not None:
        return bench, "the run's microbenchmarks (manifest device_params)"
    return run_roofs(manifest)
