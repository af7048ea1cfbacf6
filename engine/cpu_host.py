"""What this CPU offers the engine: the compute dtype it resolves to, and where its step thread runs.

dtype "auto" resolves to bf16 only where the CPU multiplies bf16 natively (AMX or AVX512-BF16 flags,
and oneDNN's bf16 path available); elsewhere bf16 matmuls are emulated through fp32 and measured
slower than fp32 itself (docs/BENCHMARKS.md), so "auto" stays fp32 there. The reason is recorded.

Thread placement: when the engine's step loop runs beside an HTTP front end and a load client on the
same machine (AsyncEngine's background thread), "auto" gives the step thread one intra-op thread
fewer than this process has CPUs, so a core's worth of CPU stays to the front end and the client
instead of every thread competing for every core. Not pinned by default: on a shared, busy host a
thread pinned to one core cannot move to whichever core frees first (measured 1.5-3x slower decode,
docs/BENCHMARKS.md); "pinned" pins it to all CPUs but the first, for a quiet or dedicated machine.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's feature flags (Linux), or None where they cannot be read."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def native_bf16(flags: set[str] | None = None) -> tuple[bool, str]:
    """(does this CPU multiply bf16 natively, why) from its flags and oneDNN's view."""
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return False, "CPU flags unreadable (not Linux?): fp32"
    have = [f for f in NATIVE_BF16_FLAGS if f in flags]
    if not have:
        isa = torch.backends.cpu.get_cpu_capability()
        return False, f"no native bf16 matmul on this CPU (no {' / '.join(NATIVE_BF16_FLAGS)}; torch ISA {isa}): fp32"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        limit = os.environ.get("ONEDNN_MAX_CPU_ISA")
        why = f"ONEDNN_MAX_CPU_ISA={limit} limits oneDNN" if limit else "this torch's oneDNN has no bf16 path"
        return False, f"CPU has {', '.join(have)} but oneDNN will not use it ({why}): fp32"
    return True, f"native bf16 matmul ({', '.join(have)}): bf16"


def resolve_dtype(device: torch.device, dtype=None) -> tuple[torch.dtype, str]:
    """(dtype, reason). dtype: a torch dtype, a name ('float32', 'bfloat16', 'auto') or None (=
    $INFERLEDGER_DTYPE, else 'auto'). 'auto': bf16 on CUDA; on the CPU bf16 only where native."""
    source = "argument"
    if dtype is None:
        dtype, source = os.environ.get("INFERLEDGER_DTYPE") or "auto", "$INFERLEDGER_DTYPE"
        if dtype == "auto":
            source = "default"
    if isinstance(dtype, torch.dtype):
        return dtype, f"asked for ({source})"
    name = str(dtype).lower().removeprefix("torch.")
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16, "auto: bf16 on CUDA"
        native, why = native_bf16()
        return (torch.bfloat16 if native else torch.float32), f"auto: {why}"
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r} ({source}): use auto, float32 or bfloat16")
    return DTYPES[name], f"asked for ({source})"


def plan_placement(spec, cpus: list[int] | None = None) -> dict | None:
    """How the step thread should run: {'threads', 'pinned_cpus' (None: the OS places it),
    'cpus_left'}, or None to leave torch as it is. spec: 'auto' (one intra-op thread fewer than the
    CPUs, not pinned, when there are at least two), 'pinned' (the same, pinned to all CPUs but the
    first), an int n (n intra-op threads, not pinned), or None."""
    if spec is None:
        return None
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    if spec in ("auto", "pinned"):
        if len(cpus) < 2:
            return None
        n = len(cpus) - 1
    else:
        n = int(spec)
    pinned = cpus[-n:] if spec == "pinned" else None
    return {"threads": n, "pinned_cpus": pinned, "cpus_left": max(0, len(cpus) - n)}


def place_current_thread(plan: dict | None) -> int | None:
    """Apply a plan to the calling thread: torch's intra-op threads, then (when pinned) this thread's
    CPU affinity (Linux: the calling thread only; intra-op workers it starts inherit it). Returns the
    intra-op thread count read back in this thread, or None when there was nothing to do."""
    if not plan:
        return None
    torch.set_num_threads(plan["threads"])
    if plan["pinned_cpus"] and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, plan["pinned_cpus"])
    return torch.get_num_threads()


def run_in_own_thread(fn, name: str):
    """fn() in a new thread (which places itself, as the step thread does: `place_current_thread`),
    waited for: its result, or its exception raised again here. The capture's speed probe and
    microbenchmarks measure this way, so the caller's thread keeps its own placement."""
    got: dict = {}

    def run() -> None:
        try:
            got["result"] = fn()
        except BaseException as exc:  # raised again in the caller's thread
            got["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if "error" in got:
        raise got["error"]
    return got["result"]

