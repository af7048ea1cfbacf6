"""Where a decode step's time goes, eager against compiled, and the batch-1 decode step's MBU.

For each batch size (1 and 16 by default) and each step kind (eager; compiled, engine/compiled_step.py;
both with attention and linears as the engine resolves them, the paged kernel and the gemv / panel
kernels where they build; then two baselines, eager with attention gathering the paged rows and eager
with the linears the engine ran before its own kernels: oneDNN's where bf16 is native, torch's
otherwise), the same prompts (--prompt-tokens, 64) are decoded for --tokens steps at --temperature (1.0,
what `vllm bench serve` asks by sending none; 0 = greedy), rounds alternating the kinds in one process.
Per kind and batch:

- the median pure decode step (wall time around `ModelRunner.forward`), unprofiled;
- the whole engine step around it (`LLMEngine.step`, as a served step's interval holds it), its wall
  time and the step thread's CPU time in it (the figure a served run's ledger holds as `steps.cpu_ms`:
  the step without its wait for a CPU, comparable on a busy host), split into the forward, sampling (the sampler's batch argmax, its kernel's draws, each row's token) and output processing (the
  rest: scheduling, committing and detokenizing the tokens, the deltas); medians per step, unprofiled;
- an account of --profiled further steps under torch.profiler: self CPU time of each operator,
  summed by category: matmuls (oneDNN / BLAS linears, the gemv kernel), attention (the paged kernel, the SDPA kernels
  and batched matmuls, the K/V gather and the cache writes: the same eager kernels in both kinds, the compiled
  stack calls them through an opaque operator), elementwise (RMSNorm, RoPE, SiLU, residual adds, casts,
  the logits' argmax, attention's softmax and casts), compiled kernels (inductor's fused C++ kernels:
  norms, RoPE, SiLU and residual adds between the linears), and host
  (the rest of the profiled steps' wall time: Python, dispatch, tensor bookkeeping, the compiled
  code's guards and wrappers). The profiler adds its own overhead to host time, so the shares are
  read beside the unprofiled median;
- at batch 1, MBU: the median step's bytes as the workload model counts them (docs/MODEL.md
  "Counting": weights once, the KV read for the context and written for the new token, the GEMMs'
  activations; `costmodel.step_work` for one decode row at the median step's context) per median step,
  over a 256 MiB memcpy's rate (read + write) measured in the same run; and how many steps ran compiled.

    .venv/bin/python benchmarks/decode_step_account.py [--batch 1 16] [--tokens 48] [--rounds 2]
    .venv/bin/python benchmarks/decode_step_account.py --batch 16 --prompt-tokens 480 --no-baselines
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from inferledger.engine import LLM, EngineConfig, SamplingParams  # noqa: E402
from inferledger.engine.compiled_step import cache_dir  # noqa: E402
from inferledger.engine.cpu_host import native_bf16  # noqa: E402
from inferledger.engine.loader import load_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402
from engine_throughput import TEXT, memcpy_gib_s  # noqa: E402

from inferledger.probes.run_folder import Manifest  # noqa: E402
from inferledger.costmodel.work import StepRow, step_work  # noqa: E402

# the linears (and the LM head); the batched matmuls of a step are decode attention's (engine/attention.py
# attends a decode group through two of them), so they count as attention, not here
MATMUL = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "inferledger_cpu::small_linear",
          "inferledger_cpu::panel_linear")
ATTENTION = ("inferledger_cpu::paged_attention", "inferledger_cpu::paged_attention_write", "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
             "aten::index_select", "aten::index_copy_", "aten::index_put_", "aten::index", "aten::_softmax",
             "aten::masked_fill", "aten::masked_fill_")
ELEMENTWISE = ("aten::rms_norm", "aten::_fused_rms_norm", "aten::pow", "aten::mean", "aten::rsqrt", "aten::mul",
               "aten::mul_", "aten::add", "aten::add_", "aten::sub", "aten::div", "aten::div_", "aten::neg",
               "aten::roll", "aten::cat", "aten::cos", "aten::sin", "aten::silu", "aten::silu_", "aten::copy_",
               "aten::argmax", "aten::embedding", "aten::sum", "aten::clone", "aten::arange", "aten::fill_",
               "aten::where", "aten::exp", "aten::max", "aten::amax")
COMPILED = ("## Call CompiledFxGraph",)
DECODE = "decode_step"  # the profiler region around each measured step
SAMPLER_CALLS = ("prepare", "prepare_draws", "sample")  # the sampler's work in a step: its argmax, its kernel draws, each row


def category(name: str) -> str:
    if name in MATMUL:
        return "matmul"
    if name in ATTENTION:
        return "attention"
    if name in ELEMENTWISE:
        return "elementwise"
    if name.startswith(COMPILED):
        return "compiled_kernels"
    return "host"


class Steps:
    """Wraps runner.forward, the engine's step and its sampler: per pure decode step of the full batch, the
    wall time of the forward, of the whole engine step, and of the sampler's calls inside it (its batch
    argmax, its kernel's draws and each row's token); the rest of the step (scheduling, committing and detokenizing the tokens,
    the deltas) is output processing."""

    def __init__(self, engine, batch: int) -> None:
        self.runner, self.batch, self.s, self.modes = engine.runner, batch, [], []
        self.forward, self.engine_step = engine.runner.forward, engine.step
        self.whole, self.sampling, self._in_decode, self._sampling_s = [], [], False, 0.0
        self.on_cpu = []  # the step thread's CPU time over each whole engine step (a served step's steps.cpu_ms)
        engine.runner.forward, engine.step = self, self.step
        sampler = engine.sampler
        self.sampler_calls = {name: getattr(sampler, name) for name in SAMPLER_CALLS}
        for name, call in self.sampler_calls.items():
            setattr(sampler, name, self._timed(call))

    def unwrap(self, engine) -> None:
        engine.runner.forward, engine.step = self.forward, self.engine_step
        for name, call in self.sampler_calls.items():
            setattr(engine.sampler, name, call)

    def _timed(self, call):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return call(*a, **kw)
            finally:
                self._sampling_s += time.perf_counter() - t0
        return timed

    def step(self):
        self._in_decode, self._sampling_s = False, 0.0
        t0, c0 = time.perf_counter(), time.thread_time()
        out = self.engine_step()
        if self._in_decode:
            self.whole.append(time.perf_counter() - t0)
            self.on_cpu.append(time.thread_time() - c0)
            self.sampling.append(self._sampling_s)
        return out

    def __call__(self, chunks):
        if not (len(chunks) == self.batch and all(len(c.token_ids) == 1 for c in chunks)):
            return self.forward(chunks)
        t0 = time.perf_counter()
        with record_function(DECODE):
            out = self.forward(chunks)
        self.s.append(time.perf_counter() - t0)
        self.modes.append(self.runner.last_step["mode"])
        self._in_decode = True
        return out

    def clear(self) -> None:
        for xs in (self.s, self.modes, self.whole, self.sampling, self.on_cpu):
            xs.clear()

    def split_ms(self) -> dict:
        """Medians per decode step: the whole engine step, its sampling, and its output processing
        (the step less the forward and the sampling, step by step)."""
        rest = [w - f - smp for w, f, smp in zip(self.whole, self.s, self.sampling)]
        return {"engine_step_ms": round(statistics.median(self.whole) * 1e3, 3),
                "engine_step_on_cpu_ms": round(statistics.median(self.on_cpu) * 1e3, 3),
                "sampling_ms": round(statistics.median(self.sampling) * 1e3, 3),
                "output_processing_ms": round(statistics.median(rest) * 1e3, 3)}


def account(llm, prompts, profiled: int, temperature: float) -> dict:
    """Profile `profiled` decode steps of the batch: ms per step by category (operators' self CPU
    time inside the steps' DECODE regions; the prefill step is left out)."""
    steps = llm.engine.runner.forward
    first = len(steps.s)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate(prompts, SamplingParams(max_tokens=profiled + 1, ignore_eos=True, temperature=temperature))
    events = prof.events()
    regions = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == DECODE)
    by = {"matmul": 0.0, "attention": 0.0, "elementwise": 0.0, "compiled_kernels": 0.0}
    for e in events:
        c = category(e.name)
        if c != "host" and any(a <= e.time_range.start <= b for a, b in regions):
            by[c] += e.self_cpu_time_total / 1e3
    n = len(regions)
    wall_ms = sum(b - a for a, b in regions) / 1e3  # the regions' own span, as the profiler timed it
    per = {f"{k}_ms": round(v / max(n, 1), 3) for k, v in by.items()}
    per["host_ms"] = round(wall_ms / max(n, 1) - sum(per.values()), 3)
    per["profiled_step_ms"] = round(wall_ms / max(n, 1), 3)
    per["profiled_steps"] = n
    for xs in (steps.s, steps.modes, steps.whole, steps.sampling, steps.on_cpu):
        del xs[first:]  # the unprofiled medians stay unprofiled
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--tokens", type=int, default=48, help="decode steps per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds alternating eager and compiled")
    ap.add_argument("--profiled", type=int, default=8, help="decode steps under the profiler per kind and batch")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="each sequence's prompt (the decode contexts run "
                    "from it to it + --tokens)")
    ap.add_argument("--temperature", type=float, default=1.0, help="the requests' temperature (1.0: what `vllm bench "
                    "serve` asks, sending none; 0: greedy, one argmax over the batch)")
    ap.add_argument("--no-baselines", action="store_true", help="leave out the two baselines: eager with attention "
                    "gathering the paged rows, eager with torch's linears (engine/cpu_kernels.py's kernels off)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the serving engine's count here)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="inductor's cache for this run (an empty folder: "
                    "the compile time recorded is a first start's); default: the engine's own")
    args = ap.parse_args()
    if args.cache_dir is not None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(args.cache_dir.resolve())
    rec = results.start("decode_step_account", vars(args))
    torch.set_num_threads(args.threads)
    bundle = load_model(dtype=args.dtype)
    ids = bundle.tokenizer.encode(TEXT * 4)
    ids = ids * (1 + (args.prompt_tokens + max(args.batch)) // len(ids))  # prompts of any length, each its own
    dtype = str(bundle.dtype).removeprefix("torch.")
    memcpy = memcpy_gib_s()
    kinds, attention, attention_why, linear = {}, {}, {}, {}
    plan = [("eager", "off", "auto", "auto"), ("compiled", "on", "auto", "auto")]
    if not args.no_baselines:
        # the linears' baseline: what ran before the engine's own kernels (oneDNN where bf16 is native)
        base = "onednn" if bundle.dtype == torch.bfloat16 and native_bf16()[0] else "torch"
        plan += [("eager, gather", "off", "gather", "auto"), (f"eager, {base} linear", "off", "auto", base)]
    for kind, flag, attn, lin in plan:
        t0 = time.perf_counter()
        kinds[kind] = LLM(bundle=bundle, config=EngineConfig(
            max_num_seqs=max(args.batch), compile=flag, probes=False, enable_prefix_caching=False, attention=attn,
            linear=lin, max_num_batched_tokens=max(512, max(args.batch) * args.prompt_tokens)))  # all prompts in one step
        resolved = kinds[kind].engine.manifest()["engine_config"]["resolved"]
        attention[kind], attention_why[kind] = resolved["attention"]["kernel"], resolved["attention"]["resolved_by"]
        linear[kind] = resolved["linear"]["kernel"]
        print(f"{kind}: engine ready in {time.perf_counter() - t0:.1f} s ({resolved['compile']}; attention "
              f"{resolved['attention']}; linear {resolved['linear']})", flush=True)
    shape = Manifest(kinds["eager"].engine.manifest()).model_shape()
    compiled = kinds["compiled"].engine.runner.compiled
    figures = {"dtype": dtype, "torch_threads": torch.get_num_threads(), "prompt_tokens": args.prompt_tokens,
               "sampling": "greedy" if args.temperature == 0 else f"temperature {args.temperature}", "rows": [],
               "compile_cache_dir": str(cache_dir()),
               "compile_warm_up_s": round(compiled.warm_up_s, 2), "compile_disabled_reason": compiled.disabled_reason,
               "attention_resolved_by": attention_why["eager"], "linear_resolved_by":
               kinds["eager"].engine.manifest()["engine_config"]["resolved"]["linear"]["resolved_by"]}
    for b in args.batch:
        prompts = [ids[i:i + args.prompt_tokens] for i in range(b)]
        params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=args.temperature)
        timers = {}
        for kind, llm in kinds.items():
            if isinstance(llm.engine.runner.forward, Steps):  # the previous batch's wrappers
                llm.engine.runner.forward.unwrap(llm.engine)
            timers[kind] = Steps(llm.engine, b)
            llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
            timers[kind].clear()
        for _ in range(args.rounds):
            for kind, llm in kinds.items():
                llm.generate(prompts, params)
        for kind, llm in kinds.items():
            t = timers[kind]
            median_s = statistics.median(t.s)
            compiled_steps = sum(m in ("compiled", "compiling") for m in t.modes)  # both ran the compiled graph
            row = {"kind": kind.split(",")[0], "attention": attention[kind], "linear": linear[kind], "batch": b,
                   "steps": len(t.s),
                   "compiled_steps": compiled_steps,
                   "median_step_ms": round(median_s * 1e3, 3), "tok_s": round(b / median_s, 2), **t.split_ms()}
            row.update(account(llm, prompts, args.profiled, args.temperature))
            if b == 1:  # the median step's context
                work = step_work(shape, [StepRow("decode", 1, args.prompt_tokens + args.tokens // 2)])
                gib_s = work.bytes / 2**30 / median_s
                row.update({"step_mib": round(work.bytes / 2**20, 1), "weights_mib": round(work.weight_bytes / 2**20, 1),
                            "kv_mib": round((work.kv_read_bytes + work.kv_write_bytes) / 2**20, 2),
                            "achieved_gib_s": round(gib_s, 2), "mbu_ratio": round(gib_s / memcpy, 3)})
            figures["rows"].append(row)
            print(f"batch {b:>2} {kind:>19}: median step {row['median_step_ms']:7.2f} ms over {row['steps']} steps "
                  f"({compiled_steps} compiled); profiled: matmul {row['matmul_ms']:.2f}, attention "
                  f"{row['attention_ms']:.2f}, elementwise {row['elementwise_ms']:.2f}, compiled kernels "
                  f"{row['compiled_kernels_ms']:.2f}, host {row['host_ms']:.2f} ms of {row['profiled_step_ms']:.2f}; "
                  f"engine step {row['engine_step_ms']:.2f} ms, {row['engine_step_on_cpu_ms']:.2f} on a CPU (sampling {row['sampling_ms']:.2f}, output processing "
                  f"{row['output_processing_ms']:.2f}); load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
                  + (f"; MBU {row['mbu_ratio']:.2f} ({row['achieved_gib_s']:.1f} GiB/s)" if b == 1 else ""), flush=True)
    figures["memcpy_gib_s"] = round(max(memcpy, memcpy_gib_s()), 2)
    for row in figures["rows"]:  # against the better of the two memcpy readings
        if "achieved_gib_s" in row:
            row["mbu_ratio"] = round(row["achieved_gib_s"] / figures["memcpy_gib_s"], 3)
    print(f"memcpy {figures['memcpy_gib_s']} GiB/s (read + write); results: {rec.write(figures)}")


if __name__ == "__main__":
    main()
