"""The fp32 gemv kernel against torch's linear (the BLAS), at the bundled model's decode shapes.

Each of SmolLM2-135M's matrices (fused q/k/v, o, fused gate/up, down, the tied lm_head) times 1, 2,
4, 8 and 16 token rows (the kernel's limit, `GEMV_MAX_ROWS`): the kernel (engine/cpu_kernels.py
`small_linear`, what the engine's CPU step calls for fp32 with `linear="gemv"`) against `F.linear`,
one intra-op thread by default. A decode step
reads its weights from memory, not cache, so each case cycles through enough copies of the matrix
(--mib in all) that none is still cached when it comes round again; a figure is the best of
--repeats passes over all copies, in two halves alternating the kinds. Rates are weight bytes read per
second; the ratio is torch's time over the kernel's (> 1: the kernel faster). A read-only sum and a
copy of the same size give the memory's own rates in the same run.

    .venv/bin/python benchmarks/linear_kernel.py [--threads 1] [--repeats 10] [--mib 256]
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

from inferledger.engine import cpu_kernels  # noqa: E402

# SmolLM2-135M: d_model 576, 9 query heads and 3 KV heads of 64, ffn 1536, vocab 49152
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
ROWS = (1, 2, 4, 8, 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--repeats", type=int, default=10, help="timed passes per kind and case (two alternating halves)")
    ap.add_argument("--mib", type=int, default=256, help="MiB of weight copies each case cycles through")
    args = ap.parse_args()
    rec = results.start("linear_kernel", vars(args))
    ok, why = cpu_kernels.load()
    if not ok:
        sys.exit(f"linear_kernel: the kernels are not available here: {why}")
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = [torch.randn(n, k, generator=gen) for _ in range(max(2, args.mib * 2**20 // (n * k * 4)))]
        gib = len(copies) * n * k * 4 / 2**30
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            torch_s, kernel_s = best_pair(lambda: [F.linear(x, w) for w in copies],
                                          lambda: [cpu_kernels.small_linear(x, w, None) for w in copies], args.repeats)
            rows.append({"matrix": name, "out_features": n, "in_features": k, "rows": m,
                         "torch_gib_s": round(gib / torch_s, 2), "kernel_gib_s": round(gib / kernel_s, 2),
                         "torch_over_kernel_ratio": round(torch_s / kernel_s, 3)})
            r = rows[-1]
            print(f"{name:>8} [{n:>5} x {k:>4}] rows {m}: torch {r['torch_gib_s']:6.2f} GiB/s  kernel "
                  f"{r['kernel_gib_s']:6.2f} GiB/s  torch / kernel {r['torch_over_kernel_ratio']:.2f}", flush=True)
        del copies
    src = torch.ones(args.mib * 2**20 // 4)
    sum_gib_s = args.mib / 1024 / best_s(lambda: src.sum(), args.repeats)
    del src
    figures = {"rows": rows, "torch_threads": torch.get_num_threads(), "kernels": why,
               "read_sum_gib_s": round(sum_gib_s, 2), "memcpy_gib_s": round(memcpy_gib_s(args.mib), 2)}
    print(f"memory: read-only sum {figures['read_sum_gib_s']} GiB/s, copy {figures['memcpy_gib_s']} GiB/s "
          f"(read + write); results: {rec.write(figures)}")


if __name__ == "__main__":
    main()
