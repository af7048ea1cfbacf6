"""The device's roofs measured at capture start: memory bandwidth and matmul speed (docs/MODEL.md
"Device parameters").

A few seconds before the load, in a thread placed as the run's step thread will be (the engine's
intra-op thread count, pinned where the engine pins): a read-only stream over and a copy of a buffer
far larger than any cache, and the engine's own matmuls (fused QKV, fused gate-up, down, LM head) in
its compute dtype at batch 1 and at the run's batch limit. Each is repeated; the best repeat (peak)
and the median repeat (sustained) are recorded under their own names, never as one figure, with the
source label `microbenchmark`, the thread count, dtype, shapes, repeats and the CPU flags they ran
with. The manifest keeps the result under `device_params`.
"""
from __future__ import annotations

import statistics
import time

from inferledger.engine import cpu_linear

SCHEMA = 1
SOURCE = "microbenchmark"
STREAM_MIN_BYTES, STREAM_MAX_BYTES = 64 << 20, 128 << 20  # the stream's buffer: the weights' size, within these
MATMUL_REPEATS = 10
STREAM_REPEATS = 8
SLICE_S = 0.1             # about this long per measured shape (repeats stop early past it, 3 at least)
# the flags the figures depend on: vector width, native bf16 / fp16, the matrix units
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
             "amx_tile", "amx_bf16", "amx_int8")


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


def stream_bytes_for(weight_bytes: int) -> int:
    """The stream's buffer: the weights' size within the limits. No larger than the weights, it never
    reads from a slower memory level than a step reads them from, so its rate can only overstate
    theirs: a bound from it stays a bound."""
    return int(min(STREAM_MAX_BYTES, max(STREAM_MIN_BYTES, weight_bytes))) // 4096 * 4096


def measure(device, dtype, shapes: list[dict], *, timer=time.perf_counter, stream_bytes: int = STREAM_MIN_BYTES,
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
                  timer=time.perf_counter, **sizes) -> dict:
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
        t0 = timer()
        weight_bytes = sum(p.numel() * p.element_size() for p in bundle.model.parameters())
        sizes.setdefault("stream_bytes", stream_bytes_for(weight_bytes))
        got["figures"] = measure(bundle.device, bundle.dtype, linear_shapes(bundle.config, max_batch, max_tokens),
                                 timer=timer, **sizes)
        got["wall_s"] = timer() - t0
        return got

    got = run_in_own_thread(run, "inferledger-microbench")
    flags = cpu_flags()
    return {"schema": SCHEMA, "source": SOURCE, "device": str(bundle.device), "device_name": _device_name(bundle.device),
            "dtype": str(bundle.dtype).removeprefix("torch."), "threads": got["threads"],
            "placement": plan, "cpu_flags": sorted(f for f in CPU_FLAGS if f in (flags or ())) if on_cpu else None,
            "wall_s": round(got["wall_s"], 3), **got["figures"]}


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
