"""Energy probes: RAPL on a hand-built powercap tree, NVML through a fake module with pynvml's shapes,
the pure energy math, the sampler thread into a real run directory, and `inferledger doctor`.

The readers under test are the real ones; only the hardware is fake. Tests run as root here, where
chmod does not block reads, so "permission denied" is an opener that raises PermissionError.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pynvml
import pytest

from inferledger.collectors.rundir.writer import RunWriter
from inferledger.probes.events import GAP_SCHEMA, SAMPLE_SCHEMA
from inferledger.probes.nvml import NvmlReader
from inferledger.probes.probe import host_id, mono_clock
from inferledger.probes.rapl import RaplReader
from inferledger.probes.sampler import EnergySampler

MAX_UJ = 262_143_328_850  # a real package zone's max_energy_range_uj


# -- a powercap tree in tmp_path ------------------------------------------------------------------

def write_zone(folder: Path, name: str, energy_uj: int, max_uj: int = MAX_UJ) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "name").write_text(name + "\n")
    (folder / "energy_uj").write_text(f"{energy_uj}\n")
    (folder / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return folder


def set_energy(folder: Path, energy_uj: int) -> None:
    (folder / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def tree(tmp_path):
    """psys at index 0 and package-0 at index 1 (so only names can tell them apart), dram under the
    package (also linked at the top, as sysfs does), and an MMIO copy of package-0."""
    root = tmp_path / "powercap"
    zones = {
        "psys": write_zone(root / "intel-rapl:0", "psys", 5_000_000),
        "package": write_zone(root / "intel-rapl:1", "package-0", 1_000_000),
    }
    zones["dram"] = write_zone(root / "intel-rapl:1" / "intel-rapl:1:0", "dram", 200_000, max_uj=65_712_999_613)
    (root / "intel-rapl:1:0").symlink_to(root / "intel-rapl:1" / "intel-rapl:1:0")
    zones["mmio"] = write_zone(root / "intel-rapl-mmio:0", "package-0", 1_000_000)
    (root / "intel-rapl").mkdir()  # the controller folder itself is not a zone
    return root, zones


def by_metric(readings):
    return {r.metric: r for r in readings}


# -- RAPL -------------------------------------------------------------------------------------------

def test_rapl_zones_are_found_by_name_not_index(tree):
    root, zones = tree
    reader = RaplReader.open(root)
    assert reader.available
    got = {z.zone_id: (z.name, z.kind, z.metric) for z in reader.zones}
    assert got == {
        "intel-rapl:0": ("psys", "psys", "cpu_psys_energy_uj"),
        "intel-rapl:1": ("package-0", "package", "cpu_package_energy_uj"),
        "intel-rapl:1:0": ("dram", "dram", "cpu_dram_energy_uj"),
    }
    assert [zid for zid, _ in reader.skipped] == ["intel-rapl-mmio:0"]
    assert "duplicates intel-rapl:1" in reader.skipped[0][1]
    skipped_row = [s for s in reader.sources() if s.name == "RAPL intel-rapl-mmio:0"]
    assert skipped_row and skipped_row[0].reason.startswith("skipped")
    # raw counters, device = the zone's folder, wrap ranges written once
    reads = by_metric(reader.read())
    assert reads["cpu_package_energy_uj"].value == 1_000_000
    assert reads["cpu_package_energy_uj"].device == str(zones["package"])
    assert reads["cpu_package_energy_uj"].unit == "uJ"
    assert reads["cpu_dram_energy_uj"].value == 200_000
    ranges = {r.device: r.value for r in reader.static_readings()}
    assert ranges[str(zones["dram"])] == 65_712_999_613 and ranges[str(zones["package"])] == MAX_UJ
    assert len(ranges) == 3


def test_rapl_wraparound_is_unwrapped_exactly(tree):
    root, zones = tree
    reader = RaplReader.open(root)
    raw = []
    for value in (MAX_UJ - 300_000, MAX_UJ - 100_000, 50_000, 450_000):  # wraps between 2nd and 3rd
        set_energy(zones["package"], value)
        raw.append(by_metric(reader.read())["cpu_package_energy_uj"].value)
    # stored raw, wrap and all: the ledger unwraps with the zone's range (test_energy_ledger.py)
    assert raw == [MAX_UJ - 300_000, MAX_UJ - 100_000, 50_000, 450_000]


def test_psys_is_never_added_to_the_package(tree):
    root, zones = tree
    reader = RaplReader.open(root)
    first = by_metric(reader.read())
    set_energy(zones["package"], 3_000_000)  # +2 J
    set_energy(zones["dram"], 700_000)  # +0.5 J
    set_energy(zones["psys"], 9_000_000)  # +4 J: contains both
    last = by_metric(reader.read())
    kinds = {z.metric: z.kind for z in reader.zones}
    # each zone is its own metric: the ledger sums package zones only (test_energy_ledger.py)
    assert {kinds[m]: last[m].value - first[m].value for m in first} == {"psys": 4_000_000, "package": 2_000_000,
                                                                         "dram": 500_000}
    psys = next(z for z in reader.zones if z.kind == "psys")
    assert psys.contains_package
    row = next(s for s in reader.sources() if s.metric == "cpu_psys_energy_uj")
    assert "never added" in row.meaning


def test_rapl_permission_denied_makes_that_zone_unavailable_with_how_to_grant(tree):
    root, zones = tree
    denied = zones["package"] / "energy_uj"

    def opener(path: Path) -> str:
        if path == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    reader = RaplReader.open(root, opener=opener)
    package = next(z for z in reader.zones if z.kind == "package")
    assert not package.available
    assert "permission denied" in package.reason and "CVE-2020-8694" in package.reason
    assert "udev" in package.reason and "CAP_DAC_READ_SEARCH" in package.reason
    assert reader.available  # dram and psys still read
    assert "cpu_package_energy_uj" not in by_metric(reader.read())  # absent, never 0
    sampler = EnergySampler(sink=None, readers=[reader], host="h")
    gaps = sampler.gap_rows("r1")
    assert [g["subject_id"] for g in gaps] == [str(zones["package"])]
    assert "udev" in gaps[0]["needs"] and "energy_cpu_j" in gaps[0]["affects"]
    assert set(gaps[0]) == set(GAP_SCHEMA.names)


def test_rapl_unreadable_counter_path_is_unavailable(tree):
    root, zones = tree
    (zones["dram"] / "energy_uj").unlink()
    (zones["dram"] / "energy_uj").mkdir()  # reading it fails even as root
    reader = RaplReader.open(root)
    dram = next(z for z in reader.zones if z.kind == "dram")
    assert not dram.available and "cannot read" in dram.reason
    row = next(s for s in reader.sources() if s.metric == "cpu_dram_energy_uj")
    assert row.status == "unavailable" and row.reason == dram.reason


def test_no_powercap_tree_is_unavailable(tmp_path):
    reader = RaplReader.open(tmp_path / "missing")
    assert not reader.available and "no powercap tree" in reader.reason
    assert reader.read() == [] and reader.static_readings() == []
    [row] = reader.sources()
    assert row.status == "unavailable" and "not zero" in row.meaning
    (tmp_path / "empty").mkdir()
    assert "no intel-rapl zones" in RaplReader.open(tmp_path / "empty").reason


# -- NVML through a fake module -------------------------------------------------------------------

class FakeNvml:
    """pynvml's API and return shapes (its own ctypes structs), over a scripted GPU."""

    NVML_SUCCESS = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_CLOCK_SM = 1
    NVML_FI_DEV_POWER_INSTANT = 186

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(value)
            self.value = value

        def __str__(self):
            return {3: "Not Supported", 12: "NVML Shared Library Not Found"}.get(self.value, f"error {self.value}")

    class NVMLError_NotSupported(NVMLError):
        def __init__(self):
            super().__init__(3)

    class NVMLError_LibraryNotFound(NVMLError):
        def __init__(self):
            super().__init__(12)

    def __init__(self, *, energy_mj=(1000,), power_mw=250_000, field_return=0, field_age_us=40_000,
                 no_library=False, energy_supported=True, n_gpus=1):
        self.energy = list(energy_mj)
        self.power_mw = power_mw
        self.field_return = field_return
        self.field_age_us = field_age_us
        self.no_library = no_library
        self.energy_supported = energy_supported
        self.n_gpus = n_gpus
        self.init_count = 0
        self.field_requests = []

    def nvmlInit(self):
        if self.no_library:
            raise self.NVMLError_LibraryNotFound()
        self.init_count += 1

    def nvmlShutdown(self):
        self.init_count -= 1

    def nvmlDeviceGetCount(self):
        return self.n_gpus

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= self.n_gpus:
            raise self.NVMLError(2)
        return ("handle", index)

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-0000-{handle[1]}"

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.energy_supported:
            raise self.NVMLError_NotSupported()
        return self.energy.pop(0) if len(self.energy) > 1 else self.energy[0]

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        self.field_requests.append(list(fieldIds))
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, fid in enumerate(fieldIds):
            values[i].fieldId, values[i].scopeId = fid if isinstance(fid, tuple) else (fid, 0)
            values[i].timestamp = time.time_ns() // 1000 - self.field_age_us
            values[i].nvmlReturn = self.field_return
            values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            values[i].value.uiVal = self.power_mw
        return values

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.power_mw - 10_000

    def nvmlDeviceGetClockInfo(self, handle, clock_type):
        return 1980

    def nvmlDeviceGetMemoryInfo(self, handle):
        mem = pynvml.c_nvmlMemory_t()
        mem.total, mem.used, mem.free = 80 << 30, 12 << 30, 68 << 30
        return mem

    def nvmlDeviceGetUtilizationRates(self, handle):
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = 97, 40
        return util


def test_nvml_reads_the_counter_and_instant_power_with_its_own_timestamp():
    fake = FakeNvml(energy_mj=(5_000, 5_000, 5_350), field_age_us=40_000)
    reader = NvmlReader.open(0, nvml=fake)
    assert reader.available and fake.init_count == 1
    assert reader.device == "gpu0/GPU-0000-0"
    assert reader.manifest()["name"] == "NVIDIA H100 80GB HBM3" and reader.manifest()["driver"] == "550.54.15"
    before = time.monotonic_ns()
    first = by_metric(reader.read())
    second = by_metric(reader.read())
    assert first["gpu_energy_mj"].value == 5_000 and second["gpu_energy_mj"].value == 5_350  # raw
    assert first["gpu_energy_mj"].unit == "mJ"
    inst = first["gpu_power_instant_mw"]
    assert inst.value == 250_000 and inst.unit == "mW"
    # stamped when the driver took the value, ~40 ms before the read, on the monotonic clock
    assert before - 60_000_000 < inst.ts_ns < before - 20_000_000
    assert "gpu_power_avg_mw" not in first  # only a fallback
    assert fake.field_requests[-1] == [(186, 0)]
    assert first["gpu_sm_clock_mhz"].value == 1980 and first["gpu_mem_used_bytes"].value == 12 << 30
    assert first["gpu_util_pct"].value == 97 and first["gpu_mem_util_pct"].value == 40
    assert all(s.available for s in reader.sources())
    reader.close()
    assert fake.init_count == 0 and reader.read() == []


def test_instant_power_field_failing_falls_back_to_the_average():
    fake = FakeNvml(field_return=FakeNvml.NVML_ERROR_NOT_SUPPORTED)
    reader = NvmlReader.open(0, nvml=fake)
    assert not reader.metric_available("gpu_power_instant_mw")
    assert "Not Supported" in reader.metric_reason["gpu_power_instant_mw"]
    reads = by_metric(reader.read())
    assert "gpu_power_instant_mw" not in reads
    assert reads["gpu_power_avg_mw"].value == 240_000 and reads["gpu_power_avg_mw"].unit == "mW"
    row = next(s for s in reader.sources() if s.metric == "gpu_power_instant_mw")
    assert row.status == "unavailable" and "averaged" in row.meaning
    # a field that works at open and fails on one tick: that tick falls back, the next does not
    fake2 = FakeNvml()
    reader2 = NvmlReader.open(0, nvml=fake2)
    fake2.field_return = 15  # NVML_ERROR_GPU_IS_LOST, in the field's own return code only
    failed = by_metric(reader2.read())
    assert "gpu_power_instant_mw" not in failed and failed["gpu_power_avg_mw"].value == 240_000
    fake2.field_return = 0
    recovered = by_metric(reader2.read())
    assert "gpu_power_instant_mw" in recovered and "gpu_power_avg_mw" not in recovered
    assert reader2.errors == 1


def test_energy_counter_not_supported_makes_only_that_metric_unavailable():
    reader = NvmlReader.open(0, nvml=FakeNvml(energy_supported=False))
    assert reader.available and not reader.metric_available("gpu_energy_mj")
    assert "Volta" in reader.metric_reason["gpu_energy_mj"]
    reads = by_metric(reader.read())
    assert "gpu_energy_mj" not in reads and "gpu_power_instant_mw" in reads
    row = next(s for s in reader.sources() if s.metric == "gpu_energy_mj")
    assert row.status == "unavailable" and "not zero" in row.meaning


def test_nvml_library_not_found_is_unavailable():
    reader = NvmlReader.open(0, nvml=FakeNvml(no_library=True))
    assert not reader.available
    assert "NVML library not found" in reader.reason and "NVMLError_LibraryNotFound" in reader.reason
    assert reader.read() == []
    assert {s.status for s in reader.sources()} == {"unavailable"}
    [only] = NvmlReader.open_all(FakeNvml(no_library=True))
    assert not only.available


def test_open_all_gives_a_reader_per_gpu():
    readers = NvmlReader.open_all(FakeNvml(n_gpus=2))
    assert [r.device for r in readers] == ["gpu0/GPU-0000-0", "gpu1/GPU-0000-1"]


# -- the sampler thread ---------------------------------------------------------------------------

def test_sampler_writes_schema_valid_samples_at_the_configured_rate(tree, tmp_path):
    root, zones = tree
    run_dir = tmp_path / "run"
    fake = FakeNvml(energy_mj=range(1000, 100_000, 7))
    writer = RunWriter(run_dir, run_id="r1")
    readers = [NvmlReader.open(0, nvml=fake), RaplReader.open(root)]
    sampler = EnergySampler(writer, hz=20, readers=readers)
    t0 = time.monotonic_ns()
    with sampler:
        time.sleep(0.6)
        set_energy(zones["package"], 2_000_000)
        time.sleep(0.1)
    t1 = time.monotonic_ns()
    assert sampler._thread is None and fake.init_count == 0
    n_written = writer.n_samples
    time.sleep(0.15)
    assert writer.n_samples == n_written  # nothing after stop
    writer.close()

    table = pq.read_table(run_dir / "samples")
    assert table.schema.equals(SAMPLE_SCHEMA)
    rows = table.to_pylist()
    energy = sorted((r for r in rows if r["metric"] == "gpu_energy_mj"), key=lambda r: r["ts_ns"])
    expected = 0.7 * 20 + 1  # ticks in 0.7 s plus the final reading at stop
    assert 0.5 * expected <= len(energy) <= 1.3 * expected + 1, len(energy)
    assert sampler.ticks == len(energy)
    assert all(r["clock"] == mono_clock(host_id()) and r["run_id"] == "r1" for r in rows)
    assert all(t0 <= r["ts_ns"] <= t1 for r in energy)
    assert {r["source"] for r in rows} == {"nvml", "rapl"}
    assert [r["value"] for r in energy] == sorted(r["value"] for r in energy)  # raw counter, rising
    assert {r["device"] for r in energy} == {"gpu0/GPU-0000-0"}
    ranges = [r for r in rows if r["metric"] == "rapl_max_energy_range_uj"]
    assert len(ranges) == 3  # once per zone
    package = [r["value"] for r in rows if r["metric"] == "cpu_package_energy_uj"]
    assert package[0] == 1_000_000 and package[-1] == 2_000_000
    assert sampler.errors == 0


def test_sampler_rate_bounds_and_no_source(tmp_path):
    with pytest.raises(ValueError, match="outside"):
        EnergySampler(None, hz=500, readers=[])
    writer = RunWriter(tmp_path / "run", run_id="r0")
    readers = [NvmlReader.open(0, nvml=FakeNvml(no_library=True)), RaplReader.open(tmp_path / "none")]
    sampler = EnergySampler(writer, hz=10, readers=readers)
    with sampler:
        time.sleep(0.05)
    assert sampler._thread is None and sampler.ticks == 0 and writer.n_samples == 0  # no zeros written
    gaps = sampler.gap_rows("r0")
    assert {g["affects"] for g in gaps} == {"energy_gpu_j, energy_per_good_j", "energy_cpu_j, energy_per_good_j"}
    manifest = sampler.manifest()
    assert manifest["gpus"][0]["available"] is False and manifest["rapl"]["available"] is False


def test_on_this_machine_the_real_readers_never_read_zero():
    gpu = NvmlReader.open(0)  # the real pynvml
    cpu = RaplReader.open()  # the real /sys/class/powercap
    try:
        for reader in (gpu, cpu):
            if reader.available:  # a host with a driver or a readable RAPL tree
                energy = [r for r in reader.read() if "energy" in r.metric]
                assert energy and all(r.value > 0 for r in energy)
            else:  # this VM: no NVML driver, no powercap tree
                assert reader.reason and reader.read() == []
                assert all(s.status == "unavailable" and s.reason for s in reader.sources())
    finally:
        gpu.close()


# -- inferledger doctor ---------------------------------------------------------------------------

def test_doctor_json_lists_sources_with_status_and_reason(tree):
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    runner = CliRunner()
    res = runner.invoke(app, ["doctor", "--format", "json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    sources = report["sources"]
    assert {s["source"] for s in sources} >= {"nvml", "rapl", "cuda", "clock", "report"}
    assert all(s["status"] in ("available", "unavailable") and s["reason"] for s in sources)
    mono = next(s for s in sources if s["name"] == "monotonic clock")
    assert mono["status"] == "available" and "resolution" in mono["reason"]
    real = NvmlReader.open(0)
    real.close()
    if not real.available:
        gpu = next(s for s in sources if s["metric"] == "gpu_energy_mj")
        assert gpu["status"] == "unavailable" and "NVML" in gpu["reason"] and "not zero" in gpu["meaning"]
    # a readable tree makes its zones available, the MMIO copy says it was skipped
    root, _ = tree
    res = runner.invoke(app, ["doctor", "--format", "json", "--powercap-root", str(root)])
    rapl = [s for s in json.loads(res.output)["sources"] if s["source"] == "rapl"]
    assert [s["status"] for s in rapl] == ["available", "available", "available", "unavailable"]
    assert "measured" in json.loads(res.output)["energy"]["cpu"]
    table = runner.invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "Energy per good result" in table.output
