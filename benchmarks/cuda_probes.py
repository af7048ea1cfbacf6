"""The model-free phases of benchmarks/cuda_check.py: what the device is, its measured memory
bandwidth, the accumulation its matmuls really use, and which attention kernel runs each of the
engine's attention shapes.

Each function takes a `torch.device` and returns a JSON-able dict; on the CPU the same code runs
(host timers instead of CUDA events) so the test suite keeps it working.
"""
from __future__ import annotations

import platform
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

# what each SDPA backend is called in the profiler's op names (the op that actually ran)
SDPA_OPS = {"_scaled_dot_product_flash_attention": "flash", "_scaled_dot_product_efficient_attention": "efficient",
            "_scaled_dot_product_cudnn_attention": "cudnn", "_scaled_dot_product_attention_math": "math",
            "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)"}


def sdpa_backends() -> dict:
    """name -> SDPBackend member, for the backends this torch build knows."""
    from torch.nn.attention import SDPBackend

    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
             "math": "MATH"}
    return {k: getattr(SDPBackend, v) for k, v in names.items() if hasattr(SDPBackend, v)}


def pinned(names: list[str] | None):
    """A context that allows only these SDPA backends, tried in this order (None: the dispatcher's
    own choice). The order matters: PyTorch's default priority puts math before cuDNN, so
    ["cudnn", "math"] without set_priority would always run math."""
    import contextlib

    from torch.nn.attention import sdpa_kernel

    if names is None:
        return contextlib.nullcontext()
    table = sdpa_backends()
    return sdpa_kernel([table[n] for n in names], set_priority=True)


def sdpa_priority() -> list[str] | None:
    """The dispatcher's backend order as set now (first that takes the inputs runs)."""
    order = getattr(torch._C, "_get_sdp_priority_order", None)
    if order is None:
        return None
    by_value = {int(v): k for k, v in sdpa_backends().items()}
    return [by_value.get(int(i), str(i)) for i in order()]


def sdpa_ops_run(fn) -> dict[str, int]:
    """Run fn under the profiler (CPU-side op names only) -> {backend: calls} of the SDPA ops seen."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    seen: dict[str, int] = {}
    for ev in prof.events():
        name = ev.name.removeprefix("aten::")
        if name in SDPA_OPS:
            seen[SDPA_OPS[name]] = seen.get(SDPA_OPS[name], 0) + 1
    return seen


def environment(device: torch.device) -> dict:
    """Versions, the device and its UUID, the NVML reader matched to it by UUID, the numeric flags."""
    on_cuda = device.type == "cuda"
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device),
           "cuda_runtime": torch.version.cuda, "cudnn_version": torch.backends.cudnn.version()
           if torch.backends.cudnn.is_available() else None, "flags": numeric_flags(),
           "sdpa_priority": sdpa_priority()}
    if on_cuda:
        props = torch.cuda.get_device_properties(device)
        uuid = "GPU-" + str(props.uuid).removeprefix("GPU-")
        env.update(gpu=props.name, capability=f"sm{props.major}{props.minor}", sms=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1), uuid=uuid)
        env["nvml"] = nvml_for(uuid)
    return env


def nvml_for(uuid: str | None) -> dict:
    """The NVML reader of the GPU with this UUID: its index on NVML's side, driver, energy counter."""
    from inferledger.probes.nvml import NvmlReader

    readers = NvmlReader.open_all()
    try:
        match = NvmlReader.for_uuid(readers, uuid)
        return {"matched": match is not None, "nvml_devices": [r.device for r in readers],
                **({"index": match.index, "device": match.device, "driver": match.driver_version,
                    "energy_counter": match.metric_available("gpu_energy_mj"),
                    "unavailable": dict(match.metric_reason)} if match else
                   {"reason": readers[0].reason if readers and not readers[0].available else "no NVML UUID matched"})}
    finally:
        for r in readers:
            r.close()


def numeric_flags() -> dict:
    """The switches that decide matmul and attention precision, as set now."""
    m = torch.backends.cuda.matmul
    flags = {"matmul_allow_tf32": m.allow_tf32,
             "matmul_bf16_reduced_precision_reduction": m.allow_bf16_reduced_precision_reduction,
             "float32_matmul_precision": torch.get_float32_matmul_precision(),
             "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}
    for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled",
                 "fp16_bf16_reduction_math_sdp_allowed"):
        fn = getattr(torch.backends.cuda, name, None)
        if fn is not None:
            flags[name] = fn()
    return flags


def _timer(device: torch.device):
    """fn -> seconds of one call: CUDA events (start.elapsed_time(end)) on CUDA, perf_counter elsewhere."""
    if device.type == "cuda":
        def timed(fn) -> float:
            with torch.cuda.device(device):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                return start.elapsed_time(end) / 1e3
        return timed

    def timed_host(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return timed_host


def memory_bandwidth(device: torch.device, mib: int = 1024, repeats: int = 20) -> dict:
    """dst.copy_(src) of `mib` MiB, bytes read + written per second: best and median of `repeats`.
    The best is the ceiling MBU is measured against (a copy is the fastest plain stream of bytes)."""
    src = torch.ones(mib * 2**20 // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    timed = _timer(device)
    dst.copy_(src)  # first touch
    times = [timed(lambda: dst.copy_(src)) for _ in range(repeats)]
    gb = 2 * mib * 2**20 / 1e9
    return {"buffer_mib": mib, "repeats": repeats, "best_gb_s": round(gb / min(times), 1),
            "median_gb_s": round(gb / statistics.median(times), 1), "counted": "bytes read + bytes written"}


def accumulation(device: torch.device, ks=(576, 1536), seed: int = 0) -> dict:
    """What a bf16 matmul accumulates in, measured: the share of outputs equal to the exact result
    (fp64 over the same bf16 inputs) rounded once to bf16. fp32 accumulation rounds only at the end,
    so nearly all match; bf16 accumulation rounds at every partial sum and most do not. Also fp32
    matmul against fp64 (TF32 would show ~1e-3 relative error instead of ~1e-6)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k in ks:
        a = torch.randn(64, k, generator=g).to(torch.bfloat16)
        b = torch.randn(k, 64, generator=g).to(torch.bfloat16)
        exact = a.double() @ b.double()
        got = (a.to(device) @ b.to(device)).cpu()
        correctly_rounded = (got == exact.to(torch.bfloat16)).double().mean().item()
        a32, b32 = a.float(), b.float()
        rel32 = ((a32.to(device) @ b32.to(device)).cpu().double() - exact).abs().max().item() / exact.abs().max().item()
        out[f"k{k}"] = {"bf16_correctly_rounded_share": round(correctly_rounded, 4),
                        "fp32_matmul_max_rel_err": float(f"{rel32:.3g}")}
    share = min(v["bf16_correctly_rounded_share"] for v in out.values())
    rel32 = max(v["fp32_matmul_max_rel_err"] for v in out.values())
    out["bf16_accumulation"] = "fp32 (rounded once)" if share >= 0.95 else f"narrower than fp32 ({share:.0%} exact)"
    out["fp32_matmul"] = "fp32" if rel32 < 1e-4 else "reduced (TF32?)"
    return out


def attention_shapes(n_heads: int, n_kv: int, head_dim: int, batches=(1, 64), ctx: int = 256, prompt: int = 128):
    """name -> (q shape, k/v shape, how it is called) of the engine's SDPA calls (engine/runner.py):
    the batched decode (query heads grouped per KV head, additive mask), a fresh prefill (causal,
    enable_gqa) and a chunk over cached context (boolean mask, enable_gqa)."""
    G = n_heads // n_kv
    shapes = {f"decode_b{b}_ctx{ctx}": ((b, n_kv, G, head_dim), (b, n_kv, ctx, head_dim), {"bias": (b, 1, 1, ctx)})
              for b in batches}
    shapes[f"prefill_{prompt}"] = ((1, n_heads, prompt, head_dim), (1, n_kv, prompt, head_dim), {"causal": True})
    shapes[f"chunk_16_ctx{ctx}"] = ((1, n_heads, 16, head_dim), (1, n_kv, ctx, head_dim), {"chunk": 16})
    return shapes


def _call(q, k, v, spec, dtype):
    if "bias" in spec:
        bias = torch.zeros(spec["bias"], dtype=dtype, device=q.device)
        bias[..., -7:] = float("-inf")  # the padded keys of a shorter row
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    if spec.get("causal"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    n, ctx = spec["chunk"], k.shape[2]
    mask = torch.arange(ctx, device=q.device)[None, :] <= torch.arange(ctx - n, ctx, device=q.device)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def attention_backends(device: torch.device, n_heads: int = 9, n_kv: int = 3, head_dim: int = 64,
                       dtype=torch.bfloat16, batches=(1, 64), backends=None, default: bool = True) -> dict:
    """Per engine attention shape: the backend the dispatcher picks (the op that ran), and each
    backend pinned alone (`backends`, all by default): whether it takes the shape, its max abs
    error against fp64 math."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, (qs, ks, spec) in attention_shapes(n_heads, n_kv, head_dim, batches).items():
        q, k, v = (torch.randn(s, generator=g) for s in (qs, ks, ks))
        ref = _call(*(t.double() for t in (q, k, v)), spec, torch.double)
        qd, kd, vd = (t.to(device, dtype) for t in (q, k, v))
        row = {"default": sdpa_ops_run(lambda: _call(qd, kd, vd, spec, dtype))} if default else {}
        for backend in backends or sdpa_backends():
            with warnings.catch_warnings(record=True) as said:  # a refusing backend warns why, then raises
                warnings.simplefilter("always")
                try:
                    with pinned([backend]):
                        got = _call(qd, kd, vd, spec, dtype)
                    row[backend] = {"ok": True,
                                    "max_abs_err": float(f"{(got.cpu().double() - ref).abs().max().item():.3g}")}
                except Exception as exc:  # "No available kernel": this backend does not take the shape
                    why = [str(w.message).strip().splitlines()[0][:160] for w in said[:3]]
                    row[backend] = {"ok": False, "why": why or [str(exc).strip().splitlines()[0][:200]]}
        out[name] = row
    return out
