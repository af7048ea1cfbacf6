"""The paged-attention kernel against gather + SDPA, per layer, at decode and prefill-chunk shapes.

One layer's attention over a paged KV cache of the bundled model's shape (9 query heads over 3 KV
heads of 64, blocks of 16, block tables scattered over the cache), for fp32 and bf16, one intra-op
thread by default:

- decode: B rows, each over its own context: the paged kernel (engine/cpu_kernels.py, what the
  engine's CPU step calls) against `BatchedDecode`'s gather into a kept workspace + SDPA (or its two
  batched matmuls in bf16): the engine's path without the kernel;
- chunk: n new tokens of one sequence over `start` cached ones (causal within the chunk): the kernel's
  tiles against the gather of the cached blocks + SDPA with a mask, as `PagedAttention` does for a
  chunk past `PAGED_MAX_CHUNK`.

Each figure is the best of --repeats timed calls after a warm-up; the two kinds alternate, and each
case's ratio (gather over paged: > 1 = the kernel faster) comes from the same minutes.

    .venv/bin/python benchmarks/paged_attention.py [--threads 1] [--repeats 30]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402
from engine_throughput import best_pair as pair  # noqa: E402

from inferledger.engine import cpu_kernels  # noqa: E402
from inferledger.engine.attention import PAGED_MAX_CHUNK, BatchedDecode, _gather, _gather_rows  # noqa: E402

KV, H, D, BS, BLOCKS = 3, 9, 64, 16, 2048
DECODE = [(1, 100), (1, 1000), (16, 100), (16, 300), (16, 500), (64, 300)]  # (rows, context each)
CHUNKS = [(4, 100), (16, 100), (64, 200), (256, 256), (512, 512)]  # (new tokens, cached before them)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--repeats", type=int, default=30, help="timed calls per kind and case")
    args = ap.parse_args()
    rec = results.start("paged_attention", vars(args))
    ok, why = cpu_kernels.load()
    if not ok:
        sys.exit(f"paged_attention: the kernel is not available here: {why}")
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        k_cache = torch.randn(BLOCKS, KV, BS, D, generator=gen).to(dtype)
        v_cache = torch.randn(BLOCKS, KV, BS, D, generator=gen).to(dtype)
        name = str(dtype).removeprefix("torch.")
        for b, ctx in DECODE:
            width = -(-ctx // BS)
            table = torch.randperm(BLOCKS, generator=gen)[:b * width].view(b, width)
            lens = torch.full((b,), ctx)
            q = torch.randn(b, H, D, generator=gen).to(dtype)
            bufs = torch.empty(2, b * width * KV, BS * D, dtype=dtype)  # the runner's kept workspace
            gathered = BatchedDecode(k_cache.shape, table, lens, dtype, bufs[0], bufs[1])
            seq = torch.arange(b)
            g, p = pair(lambda: gathered.attend(k_cache, v_cache, q),
                        lambda: cpu_kernels.paged_attention(q, k_cache, v_cache, table, seq, lens, D ** -0.5),
                        args.repeats)
            rows.append({"dtype": name, "kind": "decode", "rows": b, "new_tokens": 1, "context_tokens": ctx,
                         "gather_ms": round(g * 1e3, 4), "paged_ms": round(p * 1e3, 4),
                         "gather_over_paged_ratio": round(g / p, 3)})
        for n, start in CHUNKS:
            ctx = start + n
            width = -(-ctx // BS)
            table = torch.randperm(BLOCKS, generator=gen)[:width]
            q = torch.randn(n, H, D, generator=gen).to(dtype)
            gather_rows = _gather_rows(table, KV)
            mask = torch.arange(ctx)[None, :] <= torch.arange(start, ctx)[:, None]

            def gathered():
                ks = _gather(k_cache, gather_rows).view(1, KV, -1, D)[:, :, :ctx]
                vs = _gather(v_cache, gather_rows).view(1, KV, -1, D)[:, :, :ctx]
                return F.scaled_dot_product_attention(q.transpose(0, 1)[None], ks, vs, attn_mask=mask, enable_gqa=True)

            tables, seq, lens = table[None].contiguous(), torch.zeros(n, dtype=torch.long), torch.arange(start + 1, ctx + 1)
            g, p = pair(gathered, lambda: cpu_kernels.paged_attention(q, k_cache, v_cache, tables, seq, lens, D ** -0.5),
                        args.repeats)
            rows.append({"dtype": name, "kind": "chunk", "rows": n, "new_tokens": n, "context_tokens": ctx,
                         "gather_ms": round(g * 1e3, 4), "paged_ms": round(p * 1e3, 4),
                         "gather_over_paged_ratio": round(g / p, 3)})
        for r in rows[-len(DECODE) - len(CHUNKS):]:
            print(f"{r['dtype']:>8} {r['kind']:>6} rows {r['rows']:>3} context {r['context_tokens']:>5}: gather "
                  f"{r['gather_ms']:8.3f} ms  paged {r['paged_ms']:8.3f} ms  gather / paged "
                  f"{r['gather_over_paged_ratio']:.2f}", flush=True)
    figures = {"rows": rows, "torch_threads": torch.get_num_threads(), "paged_max_chunk_tokens": PAGED_MAX_CHUNK,
               "kernel": why, "shape": f"{H} query heads over {KV} KV heads of {D}, blocks of {BS}"}
    print(f"results: {rec.write(figures)}")


if __name__ == "__main__":
    main()
