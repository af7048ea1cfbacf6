"""Bounded memory for the ledger's DuckDB: a limit, a spill folder, and what the size strings mean.

DuckDB keeps its working set under `memory_limit` by spilling joins, sorts, aggregates and the
database's own pages to `temp_directory` (the ledger is a file-backed database, so built tables go to
disk as they grow). The default limit is `DEFAULT_PER_CPU` for each CPU this process may run on, and
never more than `DEFAULT_FRACTION` of the machine's physical memory (`default_memory_limit`). Python
never holds event-sized data: every stage is SQL over DuckDB tables, and the Python stages fetch
only attempt- or task-sized rows.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

DEFAULT_FRACTION = 0.25  # of physical memory at most: a shared host keeps three quarters for others
# DuckDB's performance guide puts aggregation-heavy work (the ledger's: windows and group-bys over
# events) at 1-2 GB a thread; its threads are one a CPU. Memory past that buys no speed on a small host
# (100 M events on 2 CPUs: 518 CPU s at 2.5 GiB, 516 at 3 GiB) and costs its neighbours.
DEFAULT_PER_CPU = 5 * 2 ** 28  # 1.25 GiB
_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
MIN_BYTES = 64 * 2 ** 20  # below this DuckDB cannot run the ledger's joins at all


class SizeError(ValueError):
    """A memory size that cannot be read; the message names the parameter and the forms accepted."""


def parse_size(text: str) -> int:
    """Bytes of "4GB", "512MiB", "2.5GiB" or a plain byte count, from 64 MiB to this machine's physical
    memory; SizeError for anything else."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise SizeError(f"memory limit {text!r}: expected a size such as 4GB, 512MiB or 2.5GiB "
                        f"(units {', '.join(u for u in _UNITS if u)})")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size < MIN_BYTES:
        raise SizeError(f"memory limit {text!r}: at least {MIN_BYTES // 2 ** 20} MiB is needed")
    if size > physical_memory_bytes():  # DuckDB would not spill before the machine ran out
        raise SizeError(f"memory limit {text!r}: more than this machine's memory "
                        f"({physical_memory_bytes() / 2 ** 30:.1f} GiB); the build spills beyond the limit, "
                        f"so a smaller one still fits any run")
    return size


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a container's cpuset narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_memory_limit() -> int:
    """`DEFAULT_PER_CPU` a usable CPU, at most `DEFAULT_FRACTION` of physical memory, at least `MIN_BYTES`."""
    by_cpu = DEFAULT_PER_CPU * usable_cpus()
    return max(MIN_BYTES, min(int(physical_memory_bytes() * DEFAULT_FRACTION), by_cpu))


def bound(con, limit_bytes: int, spill: Path) -> None:
    """Hold `con` to `limit_bytes`, spilling to `spill` (created here)."""
    spill.mkdir(parents=True, exist_ok=True)
    con.execute("SET enable_progress_bar = false")
    con.execute(f"SET memory_limit = '{limit_bytes // 2 ** 20}MiB'")
    con.execute("SET temp_directory = ?", [str(spill)])
