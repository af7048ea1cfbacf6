"""Engine throughput against Hugging Face `generate` on the same weights, in the same run.

Same prompts (mixed lengths), same fixed output length (ignore_eos / min_new_tokens), greedy, fp32,
HF with its default attention. Concurrency c: our engine serves all requests with max_num_seqs=c
(continuous batching); HF runs them in static batches of c (left-padded). Prints output tokens/s and
the ratio to HF; then, per full-batch decode step of our engine at the highest concurrency, the bytes
of weights and KV context it reads, the achieved bandwidth, and that over a memcpy bandwidth measured
in this run (MBU); then the probes' cost two ways: throughput with probes on (events + KV samples to
memory) over probes off in alternating pairs, and the share of the wall time spent inside the event
calls themselves (timed around each call: robust where the A/B ratio drowns in a shared machine's
noise). Each throughput figure is the best of --repeats runs, ours and HF interleaved, so a noisy
CPU hurts both alike; the load average is printed at the start and the end.

    .venv/bin/python benchmarks/engine_throughput.py [--requests 16] [--max-tokens 32] [--concurrency 1 4 16]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from inferledger.engine import LLM, EngineConfig, SamplingParams  # noqa: E402
from inferledger.engine.loader import default_model_path, load_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)

TEXT = ("The history of computing is a story of abstraction layers stacked on each other, from "
        "switches and vacuum tubes to transistors, integrated circuits, operating systems, compilers "
        "and networks, each hiding the complexity below it so that people can build more above. ")


class _Sink:
    def __init__(self) -> None:
        self.rows, self.samples = [], []

    def emit(self, row) -> None:
        self.rows.append(row)

    def sample(self, **row) -> None:
        self.samples.append(row)


def make_prompts(tokenizer, n: int, lengths=(16, 64, 160, 320)) -> list[list[int]]:
    ids = tokenizer.encode(TEXT * 8)
    return [ids[i: i + lengths[i % len(lengths)]] for i in range(n)]


class _DecodeTimer:
    """Wraps ModelRunner.forward: wall time and context lengths of each pure decode step."""

    def __init__(self, runner) -> None:
        self.forward, self.steps = runner.forward, []  # (seconds, [context tokens per sequence])

    def __call__(self, chunks):
        t0 = time.perf_counter()
        out = self.forward(chunks)
        if all(len(c.token_ids) == 1 and c.start_pos > 0 for c in chunks):
            self.steps.append((time.perf_counter() - t0, [c.start_pos + 1 for c in chunks]))
        return out


class _TimedEvents:
    """Stands in for the engine's EngineEvents: forwards every call and adds up the time spent in
    them (building, serialising and handing over events and KV samples): the probes' direct cost."""

    def __init__(self, events) -> None:
        self._events, self.seconds = events, 0.0

    def __getattr__(self, name):
        fn = getattr(self._events, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed


def run_ours(bundle, prompts, max_tokens, concurrency, probes=True, time_probes=False):
    """-> (output tokens/s, steps, events emitted, [(s, contexts)] of its pure decode steps,
    (share of the wall time, seconds) spent inside the probes (time_probes) or None)."""
    cfg = EngineConfig(max_num_seqs=concurrency, max_num_batched_tokens=512, probes=probes,
                       enable_prefix_caching=False)
    sink = _Sink() if probes else None
    llm = LLM(bundle=bundle, config=cfg, sink=sink)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2))  # warm-up
    timer = llm.engine.runner.forward = _DecodeTimer(llm.engine.runner)
    if time_probes:
        llm.engine.events = _TimedEvents(llm.engine.events)
    n_before = len(sink.rows) if sink else 0
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    n_tokens = sum(len(o.token_ids) for o in outs)
    assert all(len(o.token_ids) == max_tokens for o in outs)
    share = (llm.engine.events.seconds / dt, llm.engine.events.seconds) if time_probes else None
    return n_tokens / dt, llm.engine.step_id, (len(sink.rows) - n_before) if sink else 0, timer.steps, share


def memcpy_gib_s(mib: int = 256, repeats: int = 5) -> float:
    """Best of `repeats` dst.copy_(src) of `mib` MiB, counting bytes read plus bytes written."""
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    return 2 * mib / 1024 / best_s(lambda: dst.copy_(src), repeats)  # its warm-up call is the first touch


def best_s(fn, repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls of fn, after one untimed warm-up call."""
    fn()
    return min(_timed(fn) for _ in range(repeats))


def best_pair(a, b, repeats: int) -> tuple[float, float]:
    """Best seconds of each of two callables over `repeats` calls each, in two alternating halves
    (a, b, a, b), so a slow minute of the host does not fall on one side only."""
    ta, tb = float("inf"), float("inf")
    for _ in range(2):
        ta = min(ta, best_s(a, repeats // 2 or 1))
        tb = min(tb, best_s(b, repeats // 2 or 1))
    return ta, tb


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def weight_bytes_per_step(bundle) -> int:
    """Parameter bytes a decode step reads: all of them, once (a tied embedding is read whole as
    the lm_head), except an untied embedding table, of which only the batch's rows are read."""
    model = bundle.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # tied weights counted once
    if not bundle.config.shape.tied_embeddings:
        total -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    return total


def decode_bandwidth(bundle, steps, batch: int, memcpy: float) -> dict | None:
    """The median pure decode step of a full batch: time, bytes read, GiB/s, MBU; and the fastest step
    beside it (memcpy is a best-of too, so on a shared machine the two least disturbed readings are the
    pair to compare). None when no step ran at a full batch."""
    full = sorted((dt, ctx) for dt, ctx in steps if len(ctx) == batch)
    if not full:
        return None
    dt, ctx = full[len(full) // 2]
    w = weight_bytes_per_step(bundle)
    per_token = bundle.config.shape.at(bundle.dtype).kv_bytes_per_token  # K and V of every context token, all layers
    kv = sum(ctx) * per_token
    gib_s = (w + kv) / 2**30 / dt
    best_dt, best_ctx = full[0]
    best = (w + sum(best_ctx) * per_token) / 2**30 / best_dt
    return {"batch": batch, "steps": len(full), "median_step_ms": round(dt * 1e3, 2), "weights_mib": round(w / 2**20, 1),
            "kv_mib": round(kv / 2**20, 1), "achieved_gib_s": round(gib_s, 2), "mbu_ratio": round(gib_s / memcpy, 3),
            "fastest_step_ms": round(best_dt * 1e3, 2), "fastest_gib_s": round(best, 2),
            "fastest_mbu_ratio": round(best / memcpy, 3)}


def bandwidth_line(d: dict | None, batch: int, memcpy: float) -> str:
    if d is None:
        return f"no pure decode step at batch {batch}"
    return (f"decode step at batch {batch:>2} (median of {d['steps']}): {d['median_step_ms']:5.1f} ms, reads weights "
            f"{d['weights_mib']:.0f} MiB + KV {d['kv_mib']:3.0f} MiB -> {d['achieved_gib_s']:4.1f} GiB/s; "
            f"memcpy {memcpy:.1f} GiB/s (read + write, {torch.get_num_threads()} threads) -> MBU {d['mbu_ratio']:.2f}; "
            f"fastest step {d['fastest_step_ms']:.1f} ms -> {d['fastest_gib_s']:.1f} GiB/s, MBU {d['fastest_mbu_ratio']:.2f}")


def run_hf(model, prompts, max_tokens, concurrency, pad_id) -> float:
    n_tokens, t0 = 0, None
    for warm in (True, False):
        batches = [prompts[:1]] if warm else [prompts[i:i + concurrency] for i in range(0, len(prompts), concurrency)]
        t0 = time.perf_counter()
        for batch in batches:
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                                     min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad_id)
            n_tokens = (n_tokens if not warm else 0) + (out.shape[1] - width) * len(batch)
    return n_tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--probe-repeats", type=int, default=6, help="pairs of runs with probes on / off (0: skip)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads for both engines and the "
                    "memcpy (default: torch's, = the CPUs)")
    ap.add_argument("--dtype", default="float32", help="our engine's dtype (float32, bfloat16 or auto); HF stays fp32")
    args = ap.parse_args()
    rec = results.start("engine_throughput", vars(args))
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    bundle = load_model(dtype=args.dtype)
    path = default_model_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    prompts = make_prompts(bundle.tokenizer, args.requests)
    pad = bundle.config.eos_ids[0]
    dtype = str(bundle.dtype).removeprefix("torch.")
    print(f"model {path.name}, {args.requests} requests, prompt lengths {sorted({len(p) for p in prompts})}, "
          f"{args.max_tokens} output tokens each, torch threads {torch.get_num_threads()}, ours in "
          f"{dtype} ({bundle.identity['dtype']['resolved_by']}), load average {_load()}")
    figures = {"model": path.name, "requests": args.requests, "prompt_tokens": sorted({len(p) for p in prompts}),
               "output_tokens": args.max_tokens, "torch_threads": torch.get_num_threads(), "dtype": dtype,
               "dtype_resolved_by": bundle.identity["dtype"]["resolved_by"], "throughput": []}
    memcpy = memcpy_gib_s()
    print(f"{'concurrency':>11} {'ours tok/s':>11} {'HF tok/s':>9} {'ours/HF':>8} {'steps':>6}")
    decode_steps = {}
    for c in args.concurrency:
        ours = theirs = 0.0
        for _ in range(args.repeats):
            tps, steps, _, decodes, _ = run_ours(bundle, prompts, args.max_tokens, c)
            if tps > ours:
                ours, decode_steps[c] = tps, decodes
            theirs = max(theirs, run_hf(hf, prompts, args.max_tokens, c, pad))
        print(f"{c:>11} {ours:>11.1f} {theirs:>9.1f} {ours / theirs:>8.2f} {steps:>6}")
        figures["throughput"].append({"concurrency": c, "ours_tok_s": round(ours, 2), "hf_tok_s": round(theirs, 2),
                                      "ours_over_hf_ratio": round(ours / theirs, 3), "steps": steps})
    memcpy = max(memcpy, memcpy_gib_s())  # the better of two, before and after: the less disturbed
    figures["memcpy_gib_s"] = round(memcpy, 2)
    figures["decode"] = []
    for c in args.concurrency:
        d = decode_bandwidth(bundle, decode_steps[c], min(c, args.requests), memcpy)
        print(bandwidth_line(d, min(c, args.requests), memcpy))
        if d is not None:
            figures["decode"].append(d)
    figures["probes"] = probe_cost(bundle, prompts, args) if args.probe_repeats >= 1 else None
    print(f"load average at the end {_load()}")
    print(f"results: {rec.write(figures)}")


def probe_cost(bundle, prompts, args) -> dict:
    """Probes on over off in alternating pairs, and the share of the wall time inside the event calls."""
    c = max(args.concurrency)
    on, off = [], []
    for i in range(args.probe_repeats):  # ABBA: neither setting always runs first
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {p: run_ours(bundle, prompts, args.max_tokens, c, probes=p)[0] for p in order}
        on.append(got[True])
        off.append(got[False])
    paired = sorted(a / b for a, b in zip(on, off))
    print(f"probes on/off at concurrency {c}, {args.probe_repeats} pairs (order alternating): best "
          f"{max(on):.1f} / {max(off):.1f} tok/s = {max(on) / max(off):.3f}; median of the paired ratios "
          f"{statistics.median(paired):.3f} (range {paired[0]:.3f}-{paired[-1]:.3f}: on a shared machine the "
          f"A/B ratio is only as good as the machine is quiet)")
    _, _, n_events, _, (share, probe_s) = run_ours(bundle, prompts, args.max_tokens, c, probes=True, time_probes=True)
    print(f"probes' direct cost: {share * 100:.2f} % of the wall time inside the event calls "
          f"({n_events} events and their KV samples, {probe_s * 1e6 / max(n_events, 1):.1f} "
          f"us per event)")
    return {"concurrency": c, "pairs": args.probe_repeats, "on_best_tok_s": round(max(on), 2),
            "off_best_tok_s": round(max(off), 2), "paired_median_ratio": round(statistics.median(paired), 4),
            "paired_min_ratio": round(paired[0], 4), "paired_max_ratio": round(paired[-1], 4),
            "direct_share_pct": round(share * 100, 3), "events": n_events,
            "per_event_us": round(probe_s * 1e6 / max(n_events, 1), 2)}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
