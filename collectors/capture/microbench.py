"""The device's roofs: memory bandwidth and matmul speed, measured at capture start and again over the
run (docs/MODEL.md "Device parameters").

A few seconds before the load, in a thread placed as the run's step thread will be (the engine's
intra-op thread count, pinned where the engine pins): a read-only stream over and a copy of a buffer
larger than the last-level cache, and the engine's own matmuls (fused QKV, fused gate-up, down, LM head) in
its compute dtype at batch 1 and at the run's batch limit. Each is repeated; the best repeat (peak)
and the median repeat (sustained) are recorded under their own names, never as one figure, with the
source label `microbenchmark`, the thread count, dtype, shapes, repeats and the CPU flags they ran
with. The manifest keeps the result under `device_params`.

Every repeat is timed on `uncontended_clock`: the wall clock less the measuring thread's run-queue wait
(Linux schedstat), the clock steps.cpu_ms keeps for a step, so a co-tenant holding the thread off a CPU
does not lower a roof (on a 2-vCPU host at load 13 the wall-timed memory roof read 8 to 18 GB/s against
27 quiet, and the step fit held at it put decode steps below it). The intra-op workers' waits are not
taken out (a rate measured with them is at most understated); where schedstat is hidden the repeats are
wall-timed, and `device_params.timed` says which.

A shared host lends the run less than the device can do at any one moment, so one measurement at
start can understate a roof (then steps beat their "lower bound"). `Rebench` repeats a short version
(the stream, the copy and the start's fastest matmul) in the load's idle gaps (no task in flight and
the next planned arrival far enough away) and at the end; each repeat is marked in the run's samples
(`microbench.running` 1 at its start, 0 at its end, on the engine's clock) so the engine's wait behind
it is not read as contention, and `with_repeats` records every repeat, labelled, in `device_params`
with the peaks the best over all of them.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from inferledger.engine import cpu_linear
from inferledger.probes.schedstat import parse_schedstat

SCHEMA = 1
SOURCE = "microbenchmark"
STREAM_MIN_BYTES, STREAM_MAX_BYTES = 64 << 20, 128 << 20  # the stream's buffer: the weights' size, within these
LLC_FACTOR = 4            # ... and at least this many times the last-level cache, so it streams from memory
REPEAT_STREAM, REPEAT_MATMUL, REPEAT_SLICE_S = 4, 5, 0.05  # a repeat over the run: short
REPEAT_NEEDS_S = 1.5      # an idle gap is used only when the next planned arrival is at least this far away
REPEAT_EVERY_S = 5.0      # and the last repeat at least this long ago
RUNNING_METRIC = "microbench.running"
MATMUL_REPEATS = 10
STREAM_REPEATS = 8
SLICE_S = 0.1             # about this long per measured shape (repeats stop early past it, 3 at least)
# the flags the figures depend on: vector width, native bf16 / fp16, the matrix units
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
             "amx_tile", "amx_bf16", "amx_int8")


SCHEDSTAT_SELF = "/proc/thread-self/schedstat"
TIMED = {True: "wall less the measuring thread's run-queue wait (schedstat)", False: "wall (schedstat hidden)"}


def _wait_s(path: str) -> float | None:
    """The calling thread's run-queue wait so far, in seconds; None where schedstat is hidden."""
    try:
        with open(path, "rb") as f:
            return parse_schedstat(f.read()).wait_ns / 1e9
    except (OSError, ValueError):
        return None


CLOCK_TRIES = 8  # readings of the wait around the wall clock until they agree (a preemption between them)


def uncontended_clock(path: str = SCHEDSTAT_SELF, wall=time.perf_counter) -> float:
    """Seconds on the wall clock less the calling thread's run-queue wait so far: the difference of two
    readings is the time the thread ran or slept, not the time it was runnable but off a CPU. Where
    schedstat is hidden, the wall clock.

    The wait is read before and after the wall clock and the three taken again until the two waits agree:
    a thread preempted between reading the clock and reading its wait would otherwise take off a wait its
    clock reading does not hold, and a repeat ending so would measure a rate many times the device's (a
    2.09 TFLOP/s matmul on a core whose bf16 peak is 0.22, beside two CPU burners). Where they never agree
    (CLOCK_TRIES preemptions in a row) the last clock reading less the wait read before it."""
    for _ in range(CLOCK_TRIES):
        before, now, after = _wait_s(path), wall(), _wait_s(path)
        if before is None or after is None:
            return now
        if before == after:
            return now - after
    return now - before


def linear_shapes(config, max_batch: int, max_tokens: int | None = None) -> list[dict]:
    """The engine's matmuls as {name, m, k, n} (the weight n x k, m rows of activations): each at batch
    1 and at the batch limit, and the layers' GEMMs also at the step's token budget (a prefill step's
    rows); the LM head only ever sees one row per sequence."""
    qkv = (config.shape.n_heads + 2 * config.shape.n_kv_heads) * config.shape.head_dim
    mats = (("qkv", config.shape.d_model, qkv), ("gate_up", config.shape.d_model, 2 * config.shape.ffn),
            ("down", config.shape.ffn, config.shape.d_model), ("lm_head", config.shape.d_model, config.shape.vocab))
    batches = sorted({1, max(1, int(max_batch))})
    out = [{"name": name, "m": m, "k": k, "n": n} for m in batches for name, k, n in mats]
    if max_tokens and max_tokens > batches[-1]:
        out += [{"name": name, "m": int(max_tokens), "k": k, "n": n} for name, k, n in mats if name != "lm_head"]
    return out


def _repeat(fn, repeats: int, timer, sync, slice_s: float) -> list[float]:
    """Seconds per call of fn after one warm-up call; stops early once slice_s is spent (at least 3 kept)."""
    fn()
    sync()
    times: list[float] = []
    start = timer()
    while len(times) < repeats:
        t0 = timer()
        fn()
        sync()
        times.append(timer() - t0)
        if len(times) >= 3 and timer() - start > slice_s:
            break
    return times


def _figure(per_s: list[float], unit: str, **facts) -> dict:
    """Peak (the best repeat) and median (the sustained repeat) of one measured rate, never one name."""
    return {"peak": max(per_s), "median": statistics.median(per_s), "unit": unit, "source": SOURCE,
            "repeats": len(per_s), **facts}


def llc_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The last-level cache of the CPU the capture runs on, bytes (Linux: the highest `level` of
    /sys/devices/system/cpu/cpu0/cache/index*, its `size`, e.g. 32768K); None where it cannot be read."""
    best = None
    for d in Path(root).glob("index*"):
        try:
            level, kind = int((d / "level").read_text()), (d / "type").read_text().strip()
            size = (d / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not size:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
        n = int(size.rstrip("KMG")) * mult
        if best is None or level > best[0]:
            best = (level, n)
    return best[1] if best else None


def stream_bytes_for(weight_bytes: int, llc: int | None = None) -> int:
    """The stream's buffer: the weights' size within the limits, and at least LLC_FACTOR times the
    last-level cache (a step reads its weights from memory, not from a cache they do not fit in)."""
    floor = max(STREAM_MIN_BYTES, LLC_FACTOR * (llc or 0))
    return int(min(max(STREAM_MAX_BYTES, floor), max(floor, weight_bytes))) // 4096 * 4096


def measure(device, dtype, shapes: list[dict], *, timer=uncontended_clock, stream_bytes: int = STREAM_MIN_BYTES,
            matmul_repeats: int = MATMUL_REPEATS, stream_repeats: int = STREAM_REPEATS,
            slice_s: float = SLICE_S) -> dict:
    """The measurements in the calling thread: {"memcpy_gbps", "stream_read_gbps", "copy_gbps",
    "matmul_tflops"}; `timer` is replaceable (tests)."""
    import torch

    on_cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    src = torch.full((stream_bytes // 4,), 1.0, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    read = [stream_bytes / t / 1e9 for t in _repeat(lambda: src.sum(), stream_repeats, timer, sync, slice_s)]
    copy = [2 * stream_bytes / t / 1e9 for t in _repeat(lambda: dst.copy_(src), stream_repeats, timer, sync, slice_s)]
    del src, dst
    buffer = {"buffer_bytes": stream_bytes}
    stream_read = _figure(read, "GB/s", what="read-only stream: sum of a float32 buffer", **buffer)
    copy_fig = _figure(copy, "GB/s", what="copy: bytes read plus bytes written", **buffer)
    best = max((stream_read, copy_fig), key=lambda f: f["peak"])
    memcpy = {"peak": best["peak"], "median": best["median"], "unit": "GB/s", "source": SOURCE,
              "from": "stream_read_gbps" if best is stream_read else "copy_gbps", "repeats": best["repeats"],
              "label": f"the better of a read-only stream and a copy of {stream_bytes >> 20} MiB at capture start"}
    from inferledger.engine import EngineConfig

    kind = EngineConfig().resolve_linear(torch.device(device).type, dtype)[0]  # the engine's own, as "auto" resolves
    per_shape, weights = [], {}
    for s in shapes:  # one weight per matrix, reused across batch sizes (a dense GEMM's time does not depend on values)
        if s["name"] not in weights:  # prepared as the engine prepares its own (engine/model.py `fuse`)
            w = torch.full((s["n"], s["k"]), 0.01, device=device, dtype=dtype)
            if kind == "onednn":
                cpu_linear.pack(w)
            how, (m,) = cpu_linear.as_taken(kind, w)
            weights[s["name"]] = (m, how)
        w, how = weights[s["name"]]
        x = torch.full((s["m"], s["k"]), 0.5, device=device, dtype=dtype)
        flops = 2 * s["m"] * s["k"] * s["n"]
        rates = [flops / t / 1e12 for t in _repeat(lambda: cpu_linear.linear(x, w, None, how), matmul_repeats,
                                                   timer, sync, slice_s)]
        per_shape.append({**s, "flop": flops, **_figure(rates, "TFLOP/s")})
    top = max(per_shape, key=lambda r: r["peak"])
    matmul = {"peak": top["peak"], "median": top["median"], "unit": "TFLOP/s", "source": SOURCE,
              "dtype": str(dtype).removeprefix("torch."), "at": top["name"], "m": top["m"], "repeats": top["repeats"],
              "label": f"the engine's fastest matmul, through its own linear, at capture start ({top['name']}, {top['m']} rows, "
                       f"{str(dtype).removeprefix('torch.')})", "shapes": per_shape}
    return {"memcpy_gbps": memcpy, "stream_read_gbps": stream_read, "copy_gbps": copy_fig, "matmul_tflops": matmul}


def device_params(bundle, *, max_batch: int, max_tokens: int | None = None, cpu_threads="auto",
                  timer=uncontended_clock, **sizes) -> dict:
    """The manifest's `device_params`: measured in a thread placed like the engine's step thread;
    `max_tokens`: the step's token budget (default: the engine's max_num_batched_tokens)."""
    from inferledger.engine import EngineConfig
    from inferledger.engine.cpu_host import cpu_flags, place_current_thread, plan_placement, run_in_own_thread

    max_tokens = EngineConfig().max_num_batched_tokens if max_tokens is None else max_tokens
    on_cpu = bundle.device.type == "cpu"
    plan = plan_placement(cpu_threads) if on_cpu else None
    def run() -> dict:
        import torch

        placed = place_current_thread(plan)
        got = {"threads": placed if placed is not None else (torch.get_num_threads() if on_cpu else None)}
        t0 = time.perf_counter()
        weight_bytes = sum(p.numel() * p.element_size() for p in bundle.model.parameters())
        sizes.setdefault("stream_bytes", stream_bytes_for(weight_bytes, llc_bytes() if on_cpu else None))
        got["figures"] = measure(bundle.device, bundle.dtype, linear_shapes(bundle.config, max_batch, max_tokens),
                                 timer=timer, **sizes)
        got["wall_s"] = time.perf_counter() - t0
        return got

    got = run_in_own_thread(run, "inferledger-microbench")
    flags = cpu_flags()
    return {"schema": SCHEMA, "source": SOURCE, "device": str(bundle.device), "device_name": _device_name(bundle.device),
            "dtype": str(bundle.dtype).removeprefix("torch."), "threads": got["threads"],
            "placement": plan, "cpu_flags": sorted(f for f in CPU_FLAGS if f in (flags or ())) if on_cpu else None,
            "wall_s": round(got["wall_s"], 3), "llc_bytes": llc_bytes() if on_cpu else None,
            "timed": TIMED[_wait_s(SCHEDSTAT_SELF) is not None] if timer is uncontended_clock else "the caller's timer",
            **got["figures"]}


def _device_name(device) -> str | None:
    """The CUDA device's name, or the CPU's model name (Linux), None where neither can be read."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def skipped(reason: str) -> dict:
    """`device_params` of a run whose capture did not measure: the bounds fall back to spec, else NULL."""
    return {"schema": SCHEMA, "source": None, "skipped": reason}


class Rebench:
    """Short repeats of the start's measurements over the run (`run`), each marked in the samples; their
    results for `with_repeats`. `sample(ts_ns, value)` writes one `microbench.running` sample."""

    def __init__(self, bundle, params: dict, sample, *, timer=uncontended_clock, now_ns=time.monotonic_ns):
        self.bundle, self.params, self.sample, self.timer, self.now_ns = bundle, params, sample, timer, now_ns
        self.repeats: list[dict] = []
        self.last_ns: int | None = None
        mm = params["matmul_tflops"]
        self.shape = next((s for s in mm.get("shapes", ()) if s["name"] == mm["at"] and s["m"] == mm["m"]),
                          {"name": mm["at"], "m": mm["m"], "k": 0, "n": 0})
        self.stream_bytes = params["memcpy_gbps"].get("buffer_bytes") or params["stream_read_gbps"]["buffer_bytes"]

    def due(self, next_arrival_ns: int | None) -> bool:
        """An idle gap worth a repeat: the next planned arrival far enough away, the last repeat long enough ago."""
        if next_arrival_ns is None:  # no arrival left: the end's repeat comes next
            return False
        now = self.now_ns()
        far = next_arrival_ns - now >= REPEAT_NEEDS_S * 1e9
        return far and (self.last_ns is None or now - self.last_ns >= REPEAT_EVERY_S * 1e9)

    def run(self, at: str) -> dict:
        """One short repeat (`at`: idle or end), in a thread placed like the step thread; marked in samples."""
        from inferledger.engine.cpu_host import place_current_thread, run_in_own_thread

        plan = self.params.get("placement")

        def measure_once() -> dict:
            place_current_thread(plan)
            return measure(self.bundle.device, self.bundle.dtype, [self.shape], timer=self.timer,
                           stream_bytes=self.stream_bytes, matmul_repeats=REPEAT_MATMUL,
                           stream_repeats=REPEAT_STREAM, slice_s=REPEAT_SLICE_S)

        t0 = self.now_ns()
        self.sample(t0, 1.0)
        try:
            got = run_in_own_thread(measure_once, "inferledger-microbench")
        finally:
            t1 = self.now_ns()
            self.sample(t1, 0.0)
        self.last_ns = t1
        rec = {"at": at, "start_ns": t0, "end_ns": t1, "memcpy_gbps": got["memcpy_gbps"]["peak"],
               "matmul_tflops": got["matmul_tflops"]["peak"]}
        self.repeats.append(rec)
        return rec


def with_repeats(params: dict, repeats: list[dict], clock: str | None = None) -> dict:
    """`device_params` with every repeat over the run (`repeats`, labelled start / idle / end) and the peaks
    the best of all of them but those a task arrived during (`overlapped`): the start's figure stays under
    `start_peak`."""
    if params.get("source") != SOURCE or not repeats:
        return params
    out = dict(params)
    every = [{"at": "start", "memcpy_gbps": params["memcpy_gbps"]["peak"],
              "matmul_tflops": params["matmul_tflops"]["peak"]}] + list(repeats)
    out["repeats"] = {"clock": clock, "runs": every}
    where = {"start": 0, "idle": 0, "end": 0}
    for r in every:
        where[r["at"]] = where.get(r["at"], 0) + 1
    told = ", ".join(f"{k} × {n}" for k, n in where.items() if n)
    clean = [r for r in every if not r.get("overlapped")]  # a repeat a task arrived during is listed, not used
    if len(clean) < len(every):
        told += f"; {len(every) - len(clean)} left out: a task arrived during it"
    for key in ("memcpy_gbps", "matmul_tflops"):
        best = max(clean, key=lambda r: r[key])
        out[key] = {**params[key], "peak": best[key], "start_peak": params[key]["peak"], "best_at": best["at"],
                    "label": f"the best of {len(every)} measurements over the run ({told}); best at {best['at']}"}
    return out
