"""The host, sampled: how busy the machine a run shares is, as a clock-tagged sample stream.

`HostReader` reads, at each tick, the Linux files that say whether the run's threads had to wait
for a CPU and who else was using them; `HostSampler` is the sampler loop (probes/sampler.py) over
it, started and stopped by the capture and by `inferledger serve --out`. Samples of source `host`,
device `host`, on `mono:<host>` (metric names in docs/EVENTS.md "Samples"):

  psi_cpu_some_avg10_pct, psi_cpu_full_avg10_pct,        /proc/pressure/cpu, memory: % of the
  psi_memory_some_avg10_pct, psi_memory_full_avg10_pct   last 10 s some (full) runnable task stalled
  psi_cpu_some_total_us, ... (counters, µs)              the same stall time, cumulative
  host_cpu_total_ns, host_cpu_busy_ns, host_cpu_steal_ns /proc/stat's first line, every CPU (counters)
  host_other_cpu_ns                                      busy − this process's CPU time (counter)
  host_load1, host_runnable                              /proc/loadavg: 1-min load, runnable tasks now

A file that is missing (PSI needs Linux 4.20 and CONFIG_PSI; a container may hide it) or unreadable
writes nothing: its metrics are absent, never 0, and `sources()` says why. Torch-free.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from .energy import Reading, SourceStatus
from .sampler import PeriodicSampler

SOURCE, DEVICE = "host", "host"
PSI_RESOURCES = ("cpu", "memory")
HOST_HZ = 5.0  # PSI's shortest average spans 10 s; the counters give finer deltas between ticks


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    """'some avg10=1.00 avg60=... total=123' lines -> {'some': {'avg10': 1.0, 'total': 123.0, ...}}."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        if kind not in ("some", "full"):
            raise ValueError(f"pressure file line {line!r}: expected 'some' or 'full'")
        out[kind] = {k: float(v) for k, v in (p.split("=", 1) for p in pairs)}
    return out


def parse_cpu_line(text: str) -> dict[str, int]:
    """/proc/stat's aggregate 'cpu ...' line -> its fields in ticks (user ... steal; guest is inside user)."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            if len(values) < len(names):
                raise ValueError(f"/proc/stat cpu line has {len(values)} fields, expected at least {len(names)}")
            return dict(zip(names, values))
    raise ValueError("/proc/stat has no aggregate 'cpu' line")


def parse_self_cpu_ticks(text: str) -> int:
    """utime + stime (ticks, every thread) from /proc/<pid>/stat (fields 14 and 15; the name may hold spaces)."""
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


class HostReader:
    """The host's pressure, CPU time and load under `proc_root` (a tmp tree in tests)."""

    source = SOURCE

    def __init__(self, proc_root: str | Path = "/proc", *, now_ns=time.monotonic_ns, clk_tck: int | None = None) -> None:
        self.root = Path(proc_root)
        self.now_ns = now_ns
        self.clk_tck = clk_tck or os.sysconf("SC_CLK_TCK")
        self._status = {name: self._probe(name) for name in self._files()}

    def _files(self) -> list[str]:
        return [*(f"pressure/{r}" for r in PSI_RESOURCES), "stat", "self/stat", "loadavg"]

    def _probe(self, name: str) -> str | None:
        """None when the file reads and parses, else why not."""
        try:
            self._parse(name, (self.root / name).read_text())
        except (OSError, ValueError, IndexError, KeyError) as exc:
            return f"{self.root / name}: {type(exc).__name__}: {exc}"
        return None

    @staticmethod
    def _parse(name: str, text: str):
        if name.startswith("pressure/"):
            return parse_psi(text)
        if name == "stat":
            return parse_cpu_line(text)
        if name == "self/stat":
            return parse_self_cpu_ticks(text)
        load1, _, _, running, _ = text.split()
        return float(load1), int(running.split("/")[0])

    @property
    def available(self) -> bool:
        return any(why is None for why in self._status.values())

    def sources(self) -> list[SourceStatus]:
        return [SourceStatus(SOURCE, f"{self.root / name}", why is None, why or "read at each tick",
                             "" if why is None else "its host metrics are absent (unknown, not 0)")
                for name, why in self._status.items()]

    def manifest(self) -> dict:
        return {"files": {name: ("read" if why is None else why) for name, why in self._status.items()},
                "clk_tck": self.clk_tck, "cpus": os.cpu_count()}

    def static_readings(self) -> list[Reading]:
        return []

    def read(self) -> list[Reading]:
        ts = self.now_ns()
        values: dict[str, tuple[float, str]] = {}
        parsed = {}
        for name, why in self._status.items():
            if why is not None:
                continue
            try:
                parsed[name] = self._parse(name, (self.root / name).read_text())
            except (OSError, ValueError, IndexError, KeyError):
                continue  # this tick lacks it; the next may have it
        for res in PSI_RESOURCES:
            for kind, fields in parsed.get(f"pressure/{res}", {}).items():
                values[f"psi_{res}_{kind}_avg10_pct"] = (fields["avg10"], "%")
                values[f"psi_{res}_{kind}_total_us"] = (fields["total"], "us")
        ns = 1_000_000_000 // self.clk_tck  # ticks are 1/CLK_TCK s (100 Hz: exactly 10 ms)
        cpu = parsed.get("stat")
        if cpu is not None:
            busy = cpu["user"] + cpu["nice"] + cpu["system"] + cpu["irq"] + cpu["softirq"]
            values["host_cpu_total_ns"] = (float(sum(cpu.values()) * ns), "ns")
            values["host_cpu_busy_ns"] = (float(busy * ns), "ns")
            values["host_cpu_steal_ns"] = (float(cpu["steal"] * ns), "ns")
            if "self/stat" in parsed:
                values["host_other_cpu_ns"] = (float((busy - parsed["self/stat"]) * ns), "ns")
        if "loadavg" in parsed:
            load1, running = parsed["loadavg"]
            values["host_load1"] = (load1, "1")
            values["host_runnable"] = (float(running), "tasks")
        return [Reading(metric, value, unit, DEVICE, ts) for metric, (value, unit) in values.items()]

    def close(self) -> None:
        pass


class HostSampler(PeriodicSampler):
    """The host reader at `hz` (default 5 Hz). `applies_to_server`: whether the server measured runs on
    this host (an embedded engine, `serve`, a URL target without --engine-host), said in the manifest."""

    THREAD_NAME = "inferledger-host"

    def __init__(self, sink, *, hz: float = HOST_HZ, reader: HostReader | None = None, host: str | None = None,
                 applies_to_server: tuple[bool, str] = (True, "the engine runs in this process")) -> None:
        self.reader = reader or HostReader()
        super().__init__(sink, hz=hz, readers=[self.reader], host=host)
        self.applies_to_server = applies_to_server

    def manifest(self) -> dict:
        """For manifest.json `host_samples`: rate, clock, which files were read, and whom they describe."""
        applies, why = self.applies_to_server
        return {"sampler_hz": self.hz, "clock": self.clock, "source": SOURCE, **self.reader.manifest(),
                "started": self.ticks > 0, "applies_to_server": applies, "applies_why": why}
