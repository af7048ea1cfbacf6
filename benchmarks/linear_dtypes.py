"""fp32 against bf16 (and fp16) for the model's own matmul shapes on this CPU: what dtype "auto" rests on.

One "step" = the 4 linears of each of SmolLM2-135M's 30 layers (fused q/k/v 960x576, o 576x576, fused
gate/up 3072x576, down 576x1536) plus the 49152x576 LM head, at M rows (1 = a batch-1 decode step,
more = batched decode or prefill). Prints the best of 5 per dtype, the ISA torch uses and whether
oneDNN has a bf16 path; the load average, since the machine may be shared. Where bf16 is native, also
bf16 through the engine's own linears over weights prepacked for oneDNN (engine/cpu_linear.py), the
path the engine's bf16 step takes there.

    .venv/bin/python benchmarks/linear_dtypes.py [--threads 1] [--rows 1 4 16 64]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from inferledger.engine.cpu_host import native_bf16
from inferledger.engine.cpu_linear import linear, pack

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)
from engine_throughput import best_s  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


REPEATS = 5


def step_ms(dtype: torch.dtype, rows: int, layers: int = 30, repeats: int = REPEATS, packed: bool = False) -> float:
    weights = [[torch.randn(o, i).to(dtype) for o, i in SHAPES] for _ in range(layers)]
    head = torch.randn(49152, 576).to(dtype)
    x = {i: torch.randn(rows, i).to(dtype) for _, i in SHAPES}
    if packed and not all([pack(w) for w in [head, *(w for layer in weights for w in layer)]]):
        raise SystemExit("linear_dtypes: the weights could not be prepacked (bf16 is not native here)")

    def step():
        for layer in weights:
            for w in layer:
                linear(x[w.shape[1]], w, None, packed)
        linear(x[576], head, None, packed)

    return best_s(step, repeats) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    args = ap.parse_args()
    rec = results.start("linear_dtypes", vars(args))
    torch.set_num_threads(args.threads)
    isa, onednn_bf16 = torch.backends.cpu.get_cpu_capability(), bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    print(f"torch {torch.__version__}, ISA {isa}, oneDNN bf16 {onednn_bf16}, {args.threads} thread(s), "
          f"load {os.getloadavg()[0]:.2f}")
    can_pack = native_bf16()[0]
    rows = []
    for m in args.rows:
        f32, b16, f16 = (step_ms(d, m) for d in (torch.float32, torch.bfloat16, torch.float16))
        row = {"rows": m, "fp32_ms": round(f32, 2), "bf16_ms": round(b16, 2), "fp16_ms": round(f16, 2),
               "bf16_over_fp32_ratio": round(b16 / f32, 3), "fp16_over_fp32_ratio": round(f16 / f32, 3),
               "bf16_packed_ms": None, "bf16_packed_over_fp32_ratio": None}
        if can_pack:
            bp = step_ms(torch.bfloat16, m, packed=True)
            row.update(bf16_packed_ms=round(bp, 2), bf16_packed_over_fp32_ratio=round(bp / f32, 3))
        print(f"rows {m:>3}: fp32 {f32:7.1f} ms  bf16 {b16:7.1f} ms ({b16 / f32:4.2f}x)  fp16 {f16:7.1f} ms "
              f"({f16 / f32:4.2f}x)" + (f"  bf16 prepacked {bp:7.1f} ms ({bp / f32:4.2f}x)" if can_pack else
                                        "  bf16 prepacked: not used here (bf16 is not native)"), flush=True)
        rows.append(row)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    path = rec.write({"threads": args.threads, "repeats": REPEATS, "torch_isa": isa, "onednn_bf16": onednn_bf16,
                      "rows": rows})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
