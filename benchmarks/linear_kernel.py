"""The engine's linear kernels against torch's, at the bundled model's decode shapes.

fp32 (default): each of SmolLM2-135M's matrices (fused q/k/v, o, fused gate/up, down, the tied
lm_head) times 1, 2, 4, 8 and 16 token rows (the kernel's limit, `GEMV_MAX_ROWS`): the gemv kernel
(engine/cpu_kernels.py `small_linear`, what the engine's CPU step calls for fp32 with
`linear="kernels"`) against `F.linear`. bf16 (`--dtype bfloat16`, a CPU with AVX-512 BF16 only): the
panel kernel (`panel_linear` over the panel copy, what the step calls for bf16 with `linear="kernels"`)
against oneDNN's linear over its own reordered copy (what `linear="onednn"` runs), at the same rows
and at 64 and 512 (prefill chunks). One intra-op thread by default. A decode step
reads its weights from memory, not cache, so each case cycles through enough copies of the matrix
(--mib in all) that none is still cached when it comes round again; a figure is the best of
--repeats passes over all copies, in two halves alternating the kinds. Rates are weight bytes read per
second; the ratio is torch's time over the kernel's (> 1: the kernel faster). A read-only sum and a
copy of the same size give the memory's own rates in the same run.

    .venv/bin/python benchmarks/linear_kernel.py [--dtype float32] [--threads 1] [--repeats 10] [--mib 256]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402
from engine_throughput import best_pair, best_s, memcpy_gib_s  # noqa: E402

from inferledger.engine import cpu_kernels, cpu_linear  # noqa: E402
from inferledger.engine.cpu_host import native_bf16  # noqa: E402

# SmolLM2-135M: d_model 576, 9 query heads and 3 KV heads of 64, ffn 1536, vocab 49152
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
ROWS = (1, 2, 4, 8, 16)
PREFILL_ROWS = (64, 512)  # bf16 only: the panel kernel takes any number of rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="float32: the gemv kernel against F.linear; bfloat16: the panel kernel against oneDNN")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--repeats", type=int, default=10, help="timed passes per kind and case (two alternating halves)")
    ap.add_argument("--mib", type=int, default=256, help="MiB of weight copies each case cycles through")
    args = ap.parse_args()
    rec = results.start("linear_kernel", vars(args))
    ok, why = cpu_kernels.load()
    if not ok:
        sys.exit(f"linear_kernel: the kernels are not available here: {why}")
    bf16 = args.dtype == "bfloat16"
    if bf16 and not (native_bf16()[0] and cpu_kernels.panel_kernel()):
        sys.exit(f"linear_kernel: --dtype bfloat16 needs a CPU with AVX-512 BF16 ({native_bf16()[1]})")
    torch.set_num_threads(args.threads)
    dtype, size = (torch.bfloat16, 2) if bf16 else (torch.float32, 4)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = [torch.randn(n, k, generator=gen).to(dtype) for _ in range(max(2, args.mib * 2**20 // (n * k * size)))]
        if bf16:
            kernel_w = [cpu_linear.panel(w) for w in copies]
            if not all([cpu_linear.pack(w) for w in copies]):
                sys.exit("linear_kernel: oneDNN would not reorder the bf16 weights here")
        for m in ROWS + (PREFILL_ROWS if bf16 else ()):
            x = torch.randn(m, k, generator=gen).to(dtype)
            use = copies if m <= cpu_kernels.GEMV_MAX_ROWS else copies[:2]  # more rows: compute-bound, cached is fine
            gib = len(use) * n * k * size / 2**30
            if bf16:
                base, kern = (lambda: [cpu_linear.linear(x, w, None, "onednn") for w in use],
                              lambda: [cpu_linear.linear(x, p, None, "kernels") for p in kernel_w[:len(use)]])
            else:
                base, kern = (lambda: [F.linear(x, w) for w in use],
                              lambda: [cpu_kernels.small_linear(x, w, None) for w in use])
            torch_s, kernel_s = best_pair(base, kern, args.repeats)
            rows.append({"matrix": name, "out_features": n, "in_features": k, "rows": m,
                         "torch_gib_s": round(gib / torch_s, 2), "kernel_gib_s": round(gib / kernel_s, 2),
                         "torch_over_kernel_ratio": round(torch_s / kernel_s, 3)})
            r = rows[-1]
            print(f"{name:>8} [{n:>5} x {k:>4}] rows {m:>3}: torch {r['torch_gib_s']:6.2f} GiB/s  kernel "
                  f"{r['kernel_gib_s']:6.2f} GiB/s  torch / kernel {r['torch_over_kernel_ratio']:.2f}", flush=True)
        del copies
    src = torch.ones(args.mib * 2**20 // 4)
    sum_gib_s = args.mib / 1024 / best_s(lambda: src.sum(), args.repeats)
    del src
    figures = {"rows": rows, "dtype": args.dtype, "kernel": "panel_linear" if bf16 else "small_linear",
               "baseline": "oneDNN over its reordered weight" if bf16 else "F.linear",
               "torch_threads": torch.get_num_threads(), "kernels": why,
               "read_sum_gib_s": round(sum_gib_s, 2), "memcpy_gib_s": round(memcpy_gib_s(args.mib), 2)}
    print(f"memory: read-only sum {figures['read_sum_gib_s']} GiB/s, copy {figures['memcpy_gib_s']} GiB/s "
          f"(read + write); results: {rec.write(figures)}")


if __name__ == "__main__":
    main()
