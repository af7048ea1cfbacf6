"""The model phases of benchmarks/cuda_check.py: correctness against the CPU path, CUDA graphs,
decode step times and MBU, throughput. Each takes loaded bundles and returns a JSON-able dict.

Correctness is measured two ways. Teacher-forced: every configuration decodes the CPU's own greedy
continuation, one token per step, so each position's logits compare with the CPU fp32 logits of
that very position (no divergence cascade); a top-1 disagreement is a near-tie when the CPU's margin
between its token and the device's is small. Free-running: the engine's greedy output against the
CPU's, as the matched prefix. Graphs against eager in the same configuration must give the same tokens.
"""
from __future__ import annotations

import statistics
import time

import torch

from cuda_probes import _timer, pinned, sdpa_ops_run, sdpa_priority
from engine_throughput import weight_bytes_per_step
from inferledger.engine import LLM, EngineConfig, SamplingParams
from inferledger.engine.runner import ModelRunner, RunnerOptions, SeqChunk

BLOCK = 16
# a top-1 disagreement is a near-tie when the CPU fp32 margin of its token over the device's is below this
TIE_LOGITS = {"float32": 1e-3, "bfloat16": 0.5}
BF16_MAX_DISAGREE = 0.05  # share of positions bf16 may pick another token at, each a near-tie


def runner_for(bundle, batch: int, max_len: int, graphs: tuple[int, ...] | None) -> ModelRunner:
    per = -(-max_len // BLOCK)
    return ModelRunner(bundle.model, bundle.config, num_blocks=batch * per, block_size=BLOCK,
                       device=bundle.device, dtype=bundle.dtype, options=RunnerOptions(graph_batch_sizes=graphs))


def forced_logits(bundle, prompts: list[list[int]], continuations: list[list[int]], graphs=None) -> torch.Tensor:
    """fp32 logits [T, B, vocab] on the CPU: position 0 from the prefill, then one decode step per
    token of the given continuations (all B sequences in one batch, through the runner's decode path)."""
    B, T = len(prompts), len(continuations[0])
    max_len = max(len(p) for p in prompts) + T
    runner = runner_for(bundle, B, max_len, graphs)
    per = runner.num_blocks // B
    tables = [list(range(i * per, (i + 1) * per)) for i in range(B)]
    try:
        if graphs:
            runner.capture_graphs(max_len)  # every bucket before the measured steps
        out = [torch.stack(runner.forward([SeqChunk(p, 0, t) for p, t in zip(prompts, tables)])).cpu()]
        for s in range(T - 1):
            chunks = [SeqChunk([c[s]], len(p) + s, t) for p, c, t in zip(prompts, continuations, tables)]
            out.append(torch.stack(runner.forward(chunks)).cpu())
    finally:
        runner.close()
    return torch.stack(out)


def compare_logits(ref: torch.Tensor, got: torch.Tensor, dtype: str) -> dict:
    """Top-1 agreement and logit error of `got` [T, B, V] against the CPU fp32 `ref`."""
    r1, g1 = ref.argmax(-1), got.argmax(-1)
    diff = (got - ref).abs()
    margins = []
    for t, b in (r1 != g1).nonzero().tolist():
        margins.append(round((ref[t, b, r1[t, b]] - ref[t, b, g1[t, b]]).item(), 4))
    tie = TIE_LOGITS[dtype]
    share = len(margins) / r1.numel()
    ok = all(m < tie for m in margins) and (dtype == "float32" or share <= BF16_MAX_DISAGREE)
    return {"positions": r1.numel(), "top1_agree": r1.numel() - len(margins),
            "disagreement_cpu_margins": margins[:20], "max_abs_logit_diff": round(diff.max().item(), 4),
            "p99_abs_logit_diff": round(diff.flatten()[::97].quantile(0.99).item(), 4),
            "pass": ok, "rule": f"every top-1 disagreement a near-tie (CPU margin < {tie} logits)"
            + ("" if dtype == "float32" else f", at most {BF16_MAX_DISAGREE:.0%} of positions")}


def greedy(bundle, prompts, tokens: int, graphs) -> list[list[int]]:
    cfg = EngineConfig(max_num_seqs=len(prompts), graph_batch_sizes=graphs, probes=False,
                       enable_prefix_caching=False)
    with LLM(bundle=bundle, config=cfg) as llm:
        if graphs:
            llm.engine.runner.capture_graphs(max(len(p) for p in prompts) + tokens)
        return [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))]


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict:
    prefix = []
    for a, b in zip(ref, got):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(n)
    return {"identical": sum(a == b for a, b in zip(ref, got)), "sequences": len(ref),
            "matched_prefix_tokens": prefix, "tokens_each": len(ref[0]) if ref else 0}


def buckets_up_to(n: int) -> tuple[int, ...]:
    return tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b < n) + (n,)


def correctness(bundle, name: str, sdpa: list[str] | None, cpu_ref: dict, prompts, tokens: int) -> dict:
    """One configuration (dtype x SDPA pin), eager and with graphs, against the CPU reference."""
    dtype = str(bundle.dtype).removeprefix("torch.")
    graphs = buckets_up_to(len(prompts))
    out = {"dtype": dtype, "sdpa_pinned": sdpa}
    with pinned(sdpa):
        out["sdpa_priority"] = sdpa_priority()
        holder = {}
        out["sdpa_ops_run"] = sdpa_ops_run(lambda: holder.update(
            eager=forced_logits(bundle, prompts, cpu_ref["tokens"])))
        holder["graphs"] = forced_logits(bundle, prompts, cpu_ref["tokens"], graphs)
        out["forced_eager_vs_cpu"] = compare_logits(cpu_ref["logits"], holder["eager"], dtype)
        out["forced_graphs_vs_cpu"] = compare_logits(cpu_ref["logits"], holder["graphs"], dtype)
        out["forced_graphs_vs_eager_max_abs_diff"] = round((holder["graphs"] - holder["eager"]).abs().max().item(), 4)
        eager, with_graphs = greedy(bundle, prompts, tokens, None), greedy(bundle, prompts, tokens, graphs)
    out["greedy_eager_vs_cpu"] = agreement(cpu_ref["tokens"], eager)
    out["greedy_graphs_vs_cpu"] = agreement(cpu_ref["tokens"], with_graphs)
    out["greedy_graphs_vs_eager"] = agreement(eager, with_graphs)
    out["pass"] = (out["forced_eager_vs_cpu"]["pass"] and out["forced_graphs_vs_cpu"]["pass"]
                   and out["greedy_graphs_vs_eager"]["identical"] == len(prompts))
    return out


def cpu_reference(cpu_bundle, prompts, tokens: int) -> dict:
    """CPU fp32 greedy tokens (the engine, eager) and the teacher-forced logits along them."""
    ids = greedy(cpu_bundle, prompts, tokens, None)
    logits = forced_logits(cpu_bundle, prompts, ids)
    self_check = (logits.argmax(-1).T.tolist() == [x[:tokens] for x in ids])
    return {"tokens": ids, "logits": logits, "forced_argmax_equals_greedy": self_check}


def decode_mbu(bundle, batch: int, ctx: int, graphs: bool, bandwidth_gb_s: float | None, steps: int = 20) -> dict:
    """Median device time of a pure decode step at `batch` sequences of `ctx` context tokens (CUDA
    events: start.elapsed_time(end); host timer on the CPU), the bytes it must read (every weight
    once + K and V of every context token) and MBU against the measured memory bandwidth."""
    runner = runner_for(bundle, batch, ctx + steps + 1, (batch,) if graphs else None)
    per = runner.num_blocks // batch
    tables = [list(range(i * per, (i + 1) * per)) for i in range(batch)]
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, bundle.config.shape.vocab, (batch, ctx), generator=g).tolist()
    timed, times = _timer(bundle.device), []
    try:
        if graphs:
            runner.capture_graphs(ctx + steps + 1)
        for i in range(0, batch, 8):  # prefill in slices: bounded activations
            runner.forward([SeqChunk(p, 0, t, "none") for p, t in zip(prompts[i:i + 8], tables[i:i + 8])])
        for s in range(steps):
            chunks = [SeqChunk([1], ctx + s, t) for t in tables]
            times.append(timed(lambda: runner.forward(chunks)))
        modes = runner.last_step["mode"]
    finally:
        runner.close()
    dt = statistics.median(times[2:] or times)  # the first steps may still allocate
    w = weight_bytes_per_step(bundle)
    kv = batch * (ctx + steps // 2) * bundle.config.shape.at(bundle.dtype).kv_bytes_per_token
    gb_s = (w + kv) / 1e9 / dt
    return {"batch": batch, "context_tokens": ctx, "mode": modes, "steps": len(times),
            "median_step_ms": round(dt * 1e3, 4),
            "weight_mb": round(w / 1e6, 1), "kv_mb": round(kv / 1e6, 1), "achieved_gb_s": round(gb_s, 1),
            "mbu": round(gb_s / bandwidth_gb_s, 3) if bandwidth_gb_s else None,
            "mbu_against": "memcpy best GB/s (read + write) measured in this run"}


def throughput(bundle, prompts, tokens: int, concurrency: int, graphs: bool) -> dict:
    """Output tokens/s of the engine at `concurrency`, graphs captured before the timed round."""
    gb = buckets_up_to(concurrency) if graphs else None
    cfg = EngineConfig(max_num_seqs=concurrency, graph_batch_sizes=gb, probes=False,
                       enable_prefix_caching=False, max_num_batched_tokens=max(512, concurrency))
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    with LLM(bundle=bundle, config=cfg) as llm:
        captured = llm.engine.runner.capture_graphs(max(len(p) for p in prompts) + tokens) if graphs else 0
        llm.generate(prompts, params)  # warm-up round
        _sync(bundle)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        _sync(bundle)
        dt = time.perf_counter() - t0
    return {"tok_s": round(sum(len(o.token_ids) for o in outs) / dt, 1), "graphs_captured_before": captured}


def _sync(bundle) -> None:
    if bundle.device.type == "cuda":
        torch.cuda.synchronize(bundle.device)
