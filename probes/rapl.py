"""Reading CPU energy from Linux powercap (Intel RAPL; recent kernels expose AMD packages the same way).

`RaplReader.open(root)` walks a powercap tree (default `/sys/class/powercap`; tests pass a folder
they built) for zones `intel-rapl:N` and sub-zones `intel-rapl:N:M`, names them by their `name`
file (`package-N`, `dram`, `core`, `uncore`, `psys`), never by index, and reads `energy_uj` raw.
Wraps are unwrapped by the ledger (`ledger/energy.sql`) with the zone's `max_energy_range_uj`, written
once at start. `intel-rapl-mmio:*` zones that repeat a zone already found are skipped, and said so.

No tree, a zone that refuses reading (root-only since CVE-2020-8694), a counter that does not parse:
each is "unavailable" with the reason and what would fix it, never a 0.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from .energy import RAPL_MAX_RANGE, UNIT_UJ, Reading, SourceStatus, unknown_not_zero

DEFAULT_ROOT = "/sys/class/powercap"
_ZONE = re.compile(r"^(intel-rapl(?:-mmio)?):(\d+(?::\d+)*)$")

GRANT_ACCESS = (
    "energy_uj is readable by root only since the fix for CVE-2020-8694. Grant read access with a udev rule "
    '(SUBSYSTEM=="powercap", ACTION=="add", RUN+="/bin/chmod a+r /sys%p/energy_uj"), or give the capturing '
    "process CAP_DAC_READ_SEARCH, or run it as root or through a root helper; until reboot: "
    "sudo chmod a+r /sys/class/powercap/intel-rapl:*/energy_uj (see docs/ENERGY.md)"
)


def _read_text(path: Path) -> str:
    return path.read_text()


def zone_kind(name: str) -> str:
    """`package-0` -> package; dram, core, uncore, psys as they are; anything else made a safe word."""
    if re.match(r"^package-\d+", name):
        return "package"
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "zone"


@dataclass
class RaplZone:
    zone_id: str  # intel-rapl:0:0
    path: Path
    name: str  # the zone's `name` file: package-0, dram, psys ...
    parent: str | None  # zone_id of the enclosing zone
    max_energy_range_uj: int | None = None
    available: bool = False
    reason: str = ""

    @property
    def kind(self) -> str:
        return zone_kind(self.name)

    @property
    def metric(self) -> str:
        return f"cpu_{self.kind}_energy_uj"

    @property
    def device(self) -> str:
        return str(self.path)

    @property
    def contains_package(self) -> bool:
        """psys is the whole platform: package (and dram) are inside it, so never add them."""
        return self.kind == "psys"


def _sort_key(zone_id: str):
    prefix, nums = _ZONE.match(zone_id).groups()
    return (prefix != "intel-rapl", tuple(int(x) for x in nums.split(":")))


class RaplReader:
    """All RAPL zones of one powercap tree. `available` is true when at least one zone reads."""

    source = "rapl"

    def __init__(self, root: Path, *, opener=_read_text, now_ns=time.monotonic_ns) -> None:
        self.root = root
        self.opener = opener
        self.now_ns = now_ns
        self.zones: list[RaplZone] = []
        self.skipped: list[tuple[str, str]] = []  # (zone_id, why)
        self.reason = ""
        self.errors = 0

    @classmethod
    def open(cls, root: str | Path = DEFAULT_ROOT, opener=None, **kw) -> "RaplReader":
        """Find and probe every zone under `root`. `opener(path) -> str` reads one sysfs file
        (tests inject one that raises PermissionError). Never raises for a missing tree."""
        reader = cls(Path(root), opener=opener or _read_text, **kw)
        if not reader.root.is_dir():
            reader.reason = (f"no powercap tree at {reader.root} (a VM, a non-Linux host, or a kernel without the "
                             "intel_rapl / powercap driver): CPU energy cannot be read")
            return reader
        found = reader._discover()
        if not found:
            reader.reason = f"no intel-rapl zones under {reader.root} (the RAPL driver is not loaded)"
            return reader
        seen: dict[str, str] = {}  # name path (package-0/dram) -> zone_id, to spot MMIO duplicates
        names: dict[str, str] = {}
        for zone_id in sorted(found, key=_sort_key):
            path = found[zone_id]
            parent = zone_id.rsplit(":", 1)[0] if zone_id.count(":") > 1 else None
            try:
                name = reader.opener(path / "name").strip()
            except OSError as exc:
                reader.zones.append(RaplZone(zone_id, path, zone_id, parent, reason=f"cannot read {path / 'name'}: {exc}"))
                continue
            names[zone_id] = name
            key = f"{names.get(parent, parent)}/{name}" if parent else name
            if zone_id.startswith("intel-rapl-mmio") and key in seen:
                reader.skipped.append((zone_id, f"{name} duplicates {seen[key]}; the same counter through MMIO, read once"))
                continue
            seen.setdefault(key, zone_id)
            reader.zones.append(reader._probe_zone(RaplZone(zone_id, path, name, parent)))
        if not reader.available:
            reader.reason = "no RAPL zone could be read: " + "; ".join(f"{z.zone_id}: {z.reason}" for z in reader.zones)
        return reader

    def _discover(self) -> dict[str, Path]:
        """zone_id -> folder. sysfs lists sub-zones both at the top and inside their parent."""
        found: dict[str, Path] = {}

        def visit(folder: Path, depth: int) -> None:
            try:
                entries = sorted(folder.iterdir())
            except OSError:
                return
            for entry in entries:
                if _ZONE.match(entry.name) and entry.name not in found and entry.is_dir():
                    found[entry.name] = entry
                    if depth < 4:
                        visit(entry, depth + 1)

        visit(self.root, 0)
        return found

    def _read_int(self, path: Path) -> int:
        return int(self.opener(path).strip())

    def _probe_zone(self, zone: RaplZone) -> RaplZone:
        for fname in ("max_energy_range_uj", "energy_uj"):
            path = zone.path / fname
            try:
                value = self._read_int(path)
            except PermissionError:
                zone.reason = f"permission denied reading {path}: {GRANT_ACCESS}"
                return zone
            except OSError as exc:
                zone.reason = f"cannot read {path}: {exc}"
                return zone
            except ValueError as exc:
                zone.reason = f"{path} does not hold an integer: {exc}"
                return zone
            if fname == "max_energy_range_uj":
                if value <= 0:
                    zone.reason = f"{path} = {value}: wraps could not be unwrapped"
                    return zone
                zone.max_energy_range_uj = value
        zone.available = True
        return zone

    # -- state --------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return any(z.available for z in self.zones)

    def sources(self) -> list[SourceStatus]:
        if not self.zones:
            return [SourceStatus("rapl", "RAPL (CPU energy)", False, self.reason, unknown_not_zero("CPU"))]
        rows = []
        for z in self.zones:
            if z.available:
                reason = f"{z.path / 'energy_uj'}, uJ, wraps at {z.max_energy_range_uj} uJ"
                meaning = ("contains package and dram: recorded apart, never added to them" if z.contains_package
                           else "inside the package zone: never added to it" if z.kind in ("core", "uncore") else "")
            else:
                reason = z.reason
                meaning = (unknown_not_zero("CPU") if z.kind == "package" else f"no {z.name} energy figure")
            rows.append(SourceStatus("rapl", f"RAPL {z.name} ({z.zone_id})", z.available, reason, meaning,
                                     z.device, z.metric))
        for zone_id, why in self.skipped:
            rows.append(SourceStatus("rapl", f"RAPL {zone_id}", False, f"skipped: {why}", "nothing lost",
                                     str(self.root / zone_id)))
        return rows

    def manifest(self) -> dict:
        return {"root": str(self.root), "available": self.available, "reason": self.reason or None,
                "zones": [{"zone_id": z.zone_id, "name": z.name, "kind": z.kind, "device": z.device,
                           "metric": z.metric, "max_energy_range_uj": z.max_energy_range_uj,
                           "contains_package": z.contains_package, "available": z.available,
                           "reason": z.reason or None} for z in self.zones],
                "skipped": [{"zone_id": zid, "why": why} for zid, why in self.skipped]}

    # -- reading ------------------------------------------------------------------------------
    def static_readings(self) -> list[Reading]:
        """Each zone's wrap range, written once per run so the ledger can unwrap the counters."""
        now = self.now_ns()
        return [Reading(RAPL_MAX_RANGE, float(z.max_energy_range_uj), UNIT_UJ, z.device, now)
                for z in self.zones if z.available]

    def read(self) -> list[Reading]:
        """Raw `energy_uj` of every readable zone; a read that fails now is skipped and counted."""
        out = []
        for z in self.zones:
            if not z.available:
                continue
            t0 = self.now_ns()
            try:
                value = self._read_int(z.path / "energy_uj")
            except (OSError, ValueError):
                self.errors += 1
                continue
            out.append(Reading(z.metric, float(value), UNIT_UJ, z.device, (t0 + self.now_ns()) // 2))
        return out

    def close(self) -> None:
        pass
