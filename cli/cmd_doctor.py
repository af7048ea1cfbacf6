"""`inferledger doctor`: what this machine can measure, what it cannot, and what that means.

It opens the same readers the capture's energy sampler uses (NVML per GPU, RAPL zones), asks torch
for CUDA, reads the monotonic clock's resolution and looks for Chromium, and prints one row per
source: available or unavailable, the reason, and the consequence for the ledger.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from inferledger.cli.output import FORMAT_HELP, OutputFormat

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

DOCTOR_HELP = """Check which measurement sources this machine offers, and what each missing one costs.

One row per source, [bold]available[/] or [bold]unavailable[/], with the reason and what it means for the ledger. The capture's energy sampler opens the same readers, so what doctor sees is what a run records.

\b
  nvml    per GPU: energy counter (mJ), instant power (mW), 1 s average power, SM clock, memory, utilisation
  rapl    CPU energy counters (uJ) per powercap zone: package-N, dram, core, uncore, psys
  cuda    torch.cuda: the reference engine on a GPU, with CUDA device timings
  clock   the host monotonic clock that stamps every event and sample, and its resolution
  report  Chromium, the headless browser that checks the HTML report

Unknown is never zero: without a GPU energy counter or a readable RAPL package zone the ledger's energy_gpu_j, energy_cpu_j and energy per good result are NULL with a gap row saying why, not 0 J. RAPL counters are root-only on most kernels since CVE-2020-8694; the reason column says how to grant read access, docs/ENERGY.md has the details.

\b
Examples:
  inferledger doctor
  inferledger doctor --format json | jq '.sources[] | select(.status == "unavailable")'
  inferledger doctor --format csv
"""


def _cuda_source():
    from inferledger.probes.energy import SourceStatus

    meaning = "the reference engine runs on the CPU: no CUDA device timings, GPU-seconds per good result unknown"
    try:
        import torch
    except ImportError as exc:
        return SourceStatus("cuda", "CUDA (torch)", False, f"torch is not importable: {exc}", meaning)
    if not torch.cuda.is_available():
        build = torch.version.cuda
        why = ("torch.cuda.is_available() is False: " +
               (f"torch built for CUDA {build} but no usable GPU or driver" if build else "this torch is a CPU-only build"))
        return SourceStatus("cuda", "CUDA (torch)", False, why, meaning)
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return SourceStatus("cuda", "CUDA (torch)", True, f"CUDA {torch.version.cuda}: {names}", "", "cuda:0")


def _clock_sources(host: str):
    from inferledger.probes.energy import SourceStatus
    from inferledger.probes.probe import mono_clock

    out = []
    for clock, label, clock_id in (("monotonic", "monotonic clock", mono_clock(host)), ("time", "wall clock", f"wall:{host}")):
        info = time.get_clock_info(clock)
        res_ns = info.resolution * 1e9
        meaning = (f"events and samples are stamped on {clock_id}" if clock == "monotonic"
                   else "only measures how old an NVML power field is; wall times never enter the ledger")
        out.append(SourceStatus("clock", label, True,
                                f"{info.implementation}, resolution {res_ns:g} ns, adjustable={info.adjustable}",
                                meaning, clock_id))
    return out


def _chromium_source():
    from inferledger.probes.energy import SourceStatus

    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return SourceStatus("report", "Chromium (headless)", True, path, "the report's browser check can run")
    return SourceStatus("report", "Chromium (headless)", False, f"none of {', '.join(CHROMIUM_NAMES)} on PATH",
                        "the HTML report is still written; only its headless-browser check cannot run")


def collect(powercap_root: str | Path | None = None, nvml=None) -> dict:
    """Everything `doctor` reports, as plain data (the --format json output)."""
    from inferledger.probes.nvml import NvmlReader
    from inferledger.probes.probe import host_id, mono_clock
    from inferledger.probes.rapl import DEFAULT_ROOT, RaplReader

    host = host_id()
    gpus = NvmlReader.open_all(nvml)
    rapl = RaplReader.open(powercap_root or DEFAULT_ROOT)
    try:
        sources = [s for r in gpus for s in r.sources()] + rapl.sources()
        sources += [_cuda_source(), *_clock_sources(host), _chromium_source()]
    finally:
        for r in gpus:
            r.close()
    gpu_ok = any(s.available and s.source == "nvml" and s.metric == "gpu_energy_mj" for s in sources)
    cpu_ok = any(s.available and s.source == "rapl" and s.metric == "cpu_package_energy_uj" for s in sources)
    return {
        "host": host, "clock": mono_clock(host),
        "energy": {
            "gpu": "measured (NVML energy counter)" if gpu_ok else "unknown: no GPU energy counter",
            "cpu": "measured (RAPL package counter)" if cpu_ok else "unknown: no readable RAPL package zone",
            "per_good_result": ("measurable" if gpu_ok or cpu_ok else
                                "unknown, not zero: no energy source on this machine"),
        },
        "sources": [s.as_dict() for s in sources],
    }


def doctor_cmd(
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help=FORMAT_HELP + " json: the whole report (host, "
                                              "clock, energy verdicts, sources); csv: the sources, one per line.")]
    = OutputFormat.table,
    powercap_root: Annotated[Optional[Path], typer.Option(
        "--powercap-root", help="Read RAPL zones from this folder instead of /sys/class/powercap.")] = None,
) -> None:
    from inferledger.cli.output import echo_rows, section_rows

    report = collect(powercap_root)
    if fmt == OutputFormat.json:
        typer.echo(json.dumps(report, indent=2))
        return
    if echo_rows(fmt, *section_rows(report["sources"])):
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title=f"Measurement sources on {report['host']}", show_lines=False)
    for col in ("source", "what", "status", "reason", "meaning"):
        table.add_column(col, overflow="fold")
    previous = None
    for s in report["sources"]:
        status = "[green]available[/]" if s["status"] == "available" else "[red]unavailable[/]"
        reason = "(as above)" if s["reason"] == previous else escape(s["reason"])
        previous = s["reason"]
        table.add_row(s["source"], escape(s["name"]), status, reason, escape(s["meaning"]))
    console.print(table)
    e = report["energy"]
    console.print(f"GPU energy: {escape(e['gpu'])}\nCPU energy: {escape(e['cpu'])}\n"
                  f"Energy per good result: [bold]{escape(e['per_good_result'])}[/]")


def register(app: typer.Typer) -> None:
    app.command("doctor", help=DOCTOR_HELP)(doctor_cmd)
