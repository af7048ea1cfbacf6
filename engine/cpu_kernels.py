"""The engine's CPU kernels (engine/csrc/*.cpp): built once per machine into one library, loaded once per process.

`load()` compiles the C++ sources with the system's C++ compiler against the installed torch
(`-O3 -march=native`, OpenMP from torch's own runtime, so the kernel runs on torch's intra-op
threads) into `cache_dir()`, under a name keyed by the source, torch's version, the compiler and the
CPU's flags: a second start (or a second process) loads the built library, and a different CPU or
torch builds its own. The build is written to a temporary file and renamed, so processes that start
together never load half a library. Without a compiler, or when the build fails, `load()` says why
and the engine runs without them: attention gathers the paged rows into a contiguous copy
(engine/attention.py) and the linears stay with torch (engine/cpu_linear.py).

    paged_attention(q [T, H, D], k_cache, v_cache [blocks, KV, block_size, D], tables [S, W],
                    q_seq [T], q_ctx [T], scale) -> [T, H, D]

Row t of q attends over the first q_ctx[t] positions of the sequence whose block table is
tables[q_seq[t]], reading the cache's blocks in place; fp32 arithmetic (a bf16 decode's probabilities
rounded to bf16 before they weight V, where the CPU has AVX-512 BF16), the output in q's dtype.
`paged_attention_write` first writes a step's new K / V rows into the layer's cache, in the same call.

    small_linear(x [..., K], w [N, K], b [N] | None) -> [..., N]

x w^T + b in fp32 reading each weight row from memory once for up to GEMV_MAX_ROWS rows of x
(engine/csrc/linear.cpp); more rows, or another dtype, go to torch's own linear.

    panel_linear(x [..., K], p [N / 16, K / 2, 16, 2], b [N] | None) -> [..., N]

x w^T + b in bf16 with fp32 accumulation, any number of rows, over w repacked in panels of 16 output
rows (engine/cpu_linear.py `panel`); built only where the compiler targets AVX-512 BF16
(`panel_kernel()`).

    sample_rows(logits [R, V] fp32, inv_temperature [R] fp32, u [R] float64) -> [R] int64

Row r's token drawn from softmax(logits[r] * inv_temperature[r]) by u[r] (inverse transform; -1 for a
row with a NaN or no weight), for the sampler's plain sampled rows (engine/sampler.py).

    argmax_rows(logits [R, V] fp32) -> [R] int64

Each row's torch.argmax (the first of equal maxima; the first NaN where there is one), for the sampler's
greedy rows (engine/sampler.py).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

SOURCES = sorted((Path(__file__).resolve().parent / "csrc").glob("*.cpp"))
HEADERS = sorted((Path(__file__).resolve().parent / "csrc").glob("*.h"))  # in the build's key: a changed header rebuilds
# engine/csrc/linear.cpp MAX_ROWS; with the limit lifted, at 32 rows the BLAS's GEMM was faster for 2 of the model's 4
# matrix shapes on the Zen 3 (0.90-1.23x), at 64 for 3 of 4 (0.83-1.25x); to 16 the kernel was 1.02-2.1x faster
GEMV_MAX_ROWS = 16
_LOCK = threading.Lock()
_STATE: dict = {}  # "ok", "reason", "build_s"


def cache_dir() -> Path:
    """$XDG_CACHE_HOME (or ~/.cache) /inferledger/kernels."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "inferledger" / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX") or "g++")


def _command(cxx: str, out: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths

    lib = Path(torch.__file__).resolve().parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [cxx, "-O3", "-march=native", "-fopenmp", "-std=c++20", "-shared", "-fPIC", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *(f"-I{p}" for p in include_paths()), *map(str, SOURCES),
            f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu", "-o", str(out)]


def library_path(cxx: str) -> Path:
    """Where the build for these sources, torch, compiler and CPU lives."""
    key = hashlib.sha256()
    for part in (*(p.read_bytes() for p in SOURCES + HEADERS), torch.__version__.encode(), cxx.encode(), _cpu_flags().encode(),
                 sys.platform.encode()):
        key.update(part)
    return cache_dir() / f"inferledger_cpu-{key.hexdigest()[:16]}.so"


def load() -> tuple[bool, str]:
    """(the kernels are loaded, why or why not); builds them first when this machine has no build yet."""
    with _LOCK:
        if not _STATE:
            _STATE.update(_load())
        return _STATE["ok"], _STATE["reason"]


def build_seconds() -> float | None:
    """How long this process spent building the kernels (None: it loaded an earlier build, or none)."""
    return _STATE.get("build_s")


def _load() -> dict:
    if sys.platform != "linux":
        return {"ok": False, "reason": f"the CPU kernels are built on Linux only (this is {sys.platform})"}
    cxx = _compiler()
    if cxx is None:
        return {"ok": False, "reason": f"no C++ compiler ({os.environ.get('CXX') or 'g++'}) to build the CPU kernels"}
    path, built = library_path(cxx), None
    if not path.exists():
        t0 = time.perf_counter()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
            os.close(fd)
        except OSError as exc:
            return {"ok": False, "reason": f"the CPU kernels' cache {path.parent} is not writable: {exc}"[:500]}
        try:
            proc = subprocess.run(_command(cxx, Path(tmp)), capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                return {"ok": False, "reason": f"building the CPU kernels failed: {proc.stderr.strip()[-400:]}"}
            os.replace(tmp, path)
        except (OSError, subprocess.SubprocessError) as exc:
            return {"ok": False, "reason": f"building the CPU kernels failed: {exc!r}"[:500]}
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        built = round(time.perf_counter() - t0, 2)
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        return {"ok": False, "reason": f"loading the CPU kernels {path} failed: {exc!r}"[:500]}
    torch.library.register_fake("inferledger_cpu::small_linear")(_small_linear_shape)  # for the compiled step
    torch.library.register_fake("inferledger_cpu::panel_linear")(_panel_linear_shape)
    how = f"built in {built} s" if built is not None else "an earlier build"
    return {"ok": True, "reason": f"CPU kernels loaded ({how}: {path})", "build_s": built}


def _small_linear_shape(x, w, b):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def _panel_linear_shape(x, p, b):
    return x.new_empty((*x.shape[:-1], p.shape[0] * 16))


def loaded() -> bool:
    """Whether the kernels are loaded in this process already (never builds them)."""
    return bool(_STATE.get("ok"))


def sample_rows(logits: torch.Tensor, inv_temperature: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return torch.ops.inferledger_cpu.sample_rows(logits, inv_temperature, u)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    return torch.ops.inferledger_cpu.argmax_rows(logits)


def panel_kernel() -> bool:
    """Whether the loaded kernels have panel_linear's AVX-512 BF16 path (False when they are not loaded)."""
    return load()[0] and bool(torch.ops.inferledger_cpu.panel_kernel_built())


def paged_attention(q, k_cache, v_cache, tables, q_seq, q_ctx, scale: float) -> torch.Tensor:
    return torch.ops.inferledger_cpu.paged_attention(q, k_cache, v_cache, tables, q_seq, q_ctx, scale)


def paged_attention_write(q, k, v, k_caches, v_caches, layer: int, rows, tables, q_seq, q_ctx, scale: float) -> torch.Tensor:
    """k, v written into layer `layer` of the caches [layers, blocks, KV, block_size, D] at `rows` (of
    the layer viewed as [blocks * KV * block_size, D]), then paged_attention over that layer: one
    call, as a step's layer makes it."""
    return torch.ops.inferledger_cpu.paged_attention_write(q, k, v, k_caches, v_caches, layer, rows, tables, q_seq,
                                                           q_ctx, scale)


def small_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.inferledger_cpu.small_linear(x, w, b)
