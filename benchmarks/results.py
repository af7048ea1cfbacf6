"""The results file every benchmark writes: one small JSON per run under benchmarks/results/.

A file holds what ran (the exact command line, its parameters, the git commit and whether the tree
was dirty), on what (CPU model and family, the CPU flags the figures depend on, what dtype "auto"
resolves to, core count, memory, library versions), how busy the machine was (load average at the
start and the end, the other processes using CPU then, by name only) and the figures, each named
with its unit (`_s`, `_ms`, `_gib`, `_tok_s`, `_ratio` ...). docs/BENCHMARKS.md's tables are
rendered from these files by benchmarks/render.py.

    rec = results.start("ledger_scale", vars(args))   # before the measurement: load, busy processes
    ...                                                # the benchmark
    path = rec.write({"reconstruct_s": 9.1, ...})       # after it: figures checked, file written

$INFERLEDGER_BENCH_RESULTS names another folder (the GPU machine writes under the folder it sends
back). Where the tree is no git checkout, $INFERLEDGER_BENCH_GIT may name a JSON file
{"commit": ..., "dirty": ...} recorded where it was (benchmarks/cuda_prepare.sh writes one).
"""
from __future__ import annotations

import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
SCHEMA = 1
# the flags the CPU figures depend on: the vector width, native bf16 / fp16, the matrix units
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
             "amx_tile", "amx_bf16", "amx_int8")
LIBRARIES = ("torch", "duckdb", "numpy", "pyarrow", "pandas", "transformers")
# a float figure's name ends in its unit; "_ratio" and "_share" for the unitless ones
UNIT_SUFFIXES = ("_ns", "_us", "_ms", "_s", "_j", "_w", "_kib", "_mib", "_gib", "_mb", "_gb", "_bytes", "_tokens",
                 "_tok_s", "_per_s", "_gib_s", "_gb_s", "_ratio", "_share", "_pct")
# the environment that changes the figures (threads, OpenMP waiting, dtype), recorded when set
ENV_VARS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
            "INFERLEDGER_DTYPE", "INFERLEDGER_MODEL", "CUDA_VISIBLE_DEVICES")
LOAD_PREFIX = "load_"  # load averages: runnable threads, no unit
BUSY_MIN_PCT = 10.0  # a process below this share of one CPU is not worth naming
BUSY_TOP = 8


class FigureError(ValueError):
    """A figure that cannot be recorded as it is (no unit in its name, NaN, not JSON)."""


def start(benchmark: str, parameters: dict | None = None, *, argv: list[str] | None = None,
          sample_s: float = 0.5, proc: Path = Path("/proc")) -> "Recorder":
    """Begin a run's record: the command, the date, the load and the busy processes now."""
    return Recorder(benchmark, parameters or {}, argv=argv, sample_s=sample_s, proc=proc)


class Recorder:
    def __init__(self, benchmark: str, parameters: dict, *, argv, sample_s: float, proc: Path) -> None:
        if not benchmark or not benchmark.replace("_", "").isalnum():
            raise ValueError(f"benchmark name {benchmark!r}: letters, digits and _ only (it names the file)")
        self.benchmark, self.sample_s, self.proc = benchmark, sample_s, proc
        self.parameters = _jsonable(parameters, "parameters")
        argv = list(sys.argv if argv is None else argv)
        self.command = shlex.join([_shown_path(sys.executable), _shown_path(argv[0]), *argv[1:]]) if argv else ""
        self.started = datetime.now(timezone.utc)
        self.t0 = time.perf_counter()
        self.load_start = load_average()
        self.busy_start = busy_processes(sample_s, proc)

    def write(self, figures: dict, *, notes: str | None = None, host: dict | None = None,
              out_dir: Path | None = None) -> Path:
        """Check the figures, add the end of the run, write the file; -> its path. Figures the check refuses
        are printed whole to stderr before the error, so a long run's measurements are not lost with it."""
        try:
            check_figures(figures)
        except FigureError:
            print(f"{self.benchmark}: the figures, not written (fix the name below and rerun):\n"
                  + json.dumps(figures, default=str), file=sys.stderr)
            raise
        doc = {"schema": SCHEMA, "benchmark": self.benchmark, "command": self.command,
               "parameters": self.parameters, "date_utc": self.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
               "wall_s": round(time.perf_counter() - self.t0, 3),
               "load": {"start": self.load_start, "end": load_average()},
               "busy_processes": {"start": self.busy_start, "end": busy_processes(self.sample_s, self.proc)},
               "git": git_state(), "host": host if host is not None else host_facts(self.proc),
               "versions": versions(), "environment": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
               "figures": figures}
        if notes:
            doc["notes"] = notes
        folder = Path(out_dir or os.environ.get("INFERLEDGER_BENCH_RESULTS") or RESULTS_DIR)
        folder.mkdir(parents=True, exist_ok=True)
        short = (doc["git"].get("commit") or "nogit")[:7]
        path = folder / f"{self.benchmark}-{self.started.strftime('%Y%m%dT%H%M%SZ')}-{short}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, path)
        return path


def check_figures(figures: dict, where: str = "figures") -> None:
    """Every float named with its unit, every number finite, every key a string: or FigureError."""
    if not isinstance(figures, dict):
        raise FigureError(f"{where}: must be a dict of named figures, got {type(figures).__name__}")
    for key, value in figures.items():
        if not isinstance(key, str):
            raise FigureError(f"{where}: key {key!r} is not a string")
        _check_value(value, key, f"{where}.{key}")


def _check_value(value, key: str, where: str) -> None:
    if isinstance(value, dict):
        check_figures(value, where)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(item, key, f"{where}[{i}]")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise FigureError(f"{where}: {value} is no figure (an unknown is None)")
        if not (key.endswith(UNIT_SUFFIXES) or key.startswith(LOAD_PREFIX)):
            raise FigureError(f"{where}: name a float with its unit ({', '.join(UNIT_SUFFIXES)})")
    elif not (value is None or isinstance(value, (str, bool, int))):
        raise FigureError(f"{where}: {type(value).__name__} is not JSON")


def _jsonable(value, where: str):
    try:
        return json.loads(json.dumps(value, allow_nan=False, default=str))
    except ValueError as exc:
        raise FigureError(f"{where}: {exc}") from None


def _shown_path(program: str) -> str:
    """A path as seen from the repository root (.venv/bin/python, benchmarks/x.py), not this machine's."""
    try:
        return str(Path(os.path.abspath(program)).relative_to(ROOT))
    except ValueError:
        return program


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _cpu_ticks(proc: Path) -> dict[int, tuple[str, int, int]]:
    """pid -> (name, parent pid, user + system ticks), from /proc/<pid>/stat."""
    out = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        name = stat[stat.index("(") + 1: stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()  # state ppid ... utime(12th) stime(13th)
        out[int(d.name)] = (name, int(rest[1]), int(rest[11]) + int(rest[12]))
    return out


def busy_processes(sample_s: float = 0.5, proc: Path = Path("/proc")) -> list[dict] | None:
    """The processes using CPU over `sample_s`, grouped by name, ours (this process and its
    children) left out: [{"name", "processes", "cpu_pct"}] (100 = one CPU), busiest first; None when
    not sampled (no /proc, or no time to sample over)."""
    if not proc.is_dir() or sample_s <= 0:
        return None
    before = _cpu_ticks(proc)
    time.sleep(sample_s)
    after = _cpu_ticks(proc)
    ours = {os.getpid()}
    changed = True
    while changed:  # descendants, however deep
        grown = ours | {pid for pid, (_, ppid, _) in after.items() if ppid in ours}
        changed, ours = grown != ours, grown
    hz = os.sysconf("SC_CLK_TCK")
    by_name: dict[str, list[float]] = {}
    for pid, (name, _, ticks) in after.items():
        if pid in ours or pid not in before:
            continue
        pct = (ticks - before[pid][2]) / hz / sample_s * 100
        if pct > 0:
            by_name.setdefault(name, []).append(pct)
    rows = [{"name": n, "processes": len(p), "cpu_pct": round(sum(p), 1)} for n, p in by_name.items()]
    rows = [r for r in rows if r["cpu_pct"] >= BUSY_MIN_PCT]
    return sorted(rows, key=lambda r: (-r["cpu_pct"], r["name"]))[:BUSY_TOP]


def git_state(root: Path = ROOT) -> dict:
    """{"commit", "dirty", "changed"} of the checkout; results files themselves do not count as dirt."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout
    try:
        commit = git("rev-parse", "HEAD").strip()
        changed = [line[3:] for line in git("status", "--porcelain", "--", ".", ":!benchmarks/results").splitlines()]
        return {"commit": commit, "dirty": bool(changed), "changed": changed[:20]}
    except (OSError, subprocess.SubprocessError):
        recorded = os.environ.get("INFERLEDGER_BENCH_GIT")
        if recorded and Path(recorded).is_file():
            got = json.loads(Path(recorded).read_text())
            return {"commit": got.get("commit"), "dirty": got.get("dirty"), "recorded_by": recorded}
        return {"commit": None, "dirty": None, "why_none": "not a git checkout, and no $INFERLEDGER_BENCH_GIT"}


def cpu_info(proc: Path = Path("/proc")) -> dict:
    """Model, family / model numbers and the figure-relevant flags (present and absent) of CPU 0."""
    fields: dict[str, str] = {}
    try:
        for line in (proc / "cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor is enough
            k, _, v = line.partition(":")
            fields[k.strip()] = v.strip()
    except OSError:
        return {"model": platform.processor() or None, "flags": None, "flags_absent": None}
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name"), "vendor": fields.get("vendor_id"),
            "family": _int(fields.get("cpu family")), "model_number": _int(fields.get("model")),
            "flags": [f for f in CPU_FLAGS if f in flags], "flags_absent": [f for f in CPU_FLAGS if f not in flags]}


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


_TORCH_FACTS = """\
import json, torch
from inferledger.engine.cpu_host import resolve_dtype
dtype, why = resolve_dtype(torch.device("cpu"), "auto")
print(json.dumps({"torch_isa": torch.backends.cpu.get_cpu_capability(),
                  "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                  "dtype_auto": str(dtype).removeprefix("torch."), "dtype_auto_reason": why,
                  "torch_threads": torch.get_num_threads()}))
"""


def torch_facts() -> dict:
    """What torch sees on this CPU and what dtype "auto" resolves to, asked in a child process (the
    benchmark's own process may not have imported torch, and must not grow by it)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _TORCH_FACTS], capture_output=True, text=True, timeout=300)
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        why = repr(exc)
    return {"torch_isa": None, "dtype_auto": None, "why_none": why[:300]}


def host_facts(proc: Path = Path("/proc")) -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = None
    mem_gib = None
    try:
        kib = next(int(line.split()[1]) for line in (proc / "meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
        mem_gib = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    return {"cpu": cpu_info(proc), "cores": os.cpu_count(), "cpus_usable": usable, "memory_gib": mem_gib,
            "platform": platform.platform(), **torch_facts()}


def versions() -> dict:
    got = {"python": platform.python_version()}
    for lib in LIBRARIES:
        try:
            got[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            got[lib] = None
    return got
