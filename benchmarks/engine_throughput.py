"""Engine throughput against Hugging Face `generate` on the same weights, in the same run.

Same prompts (mixed lengths), same fixed output length (ignore_eos / min_new_tokens), greedy.
Concurrency c: our engine serves all requests with max_num_seqs=c (continuous batching); HF runs
them in static batches of c (left-padded). Prints output tokens/s and the ratio to HF, then the
engine's throughput with probes on (events + KV samples to memory) over probes off. Each figure is
the best of --repeats runs, ours and HF interleaved, so a noisy shared CPU hurts both alike.

    .venv/bin/python benchmarks/engine_throughput.py [--requests 16] [--max-tokens 32] [--concurrency 1 4 16]
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from inferledger.engine import LLM, EngineConfig, SamplingParams  # noqa: E402
from inferledger.engine.loader import default_model_path, load_model  # noqa: E402

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


def run_ours(bundle, prompts, max_tokens, concurrency, probes=True) -> tuple[float, int, int]:
    cfg = EngineConfig(max_num_seqs=concurrency, max_num_batched_tokens=512, probes=probes,
                       enable_prefix_caching=False)
    sink = _Sink() if probes else None
    llm = LLM(bundle=bundle, config=cfg, sink=sink)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    n_tokens = sum(len(o.token_ids) for o in outs)
    assert all(len(o.token_ids) == max_tokens for o in outs)
    return n_tokens / dt, llm.engine.step_id, len(sink.rows) if sink else 0


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
    args = ap.parse_args()

    import transformers

    bundle = load_model()
    path = default_model_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    prompts = make_prompts(bundle.tokenizer, args.requests)
    pad = bundle.config.eos_ids[0]
    print(f"model {path.name}, {args.requests} requests, prompt lengths {sorted({len(p) for p in prompts})}, "
          f"{args.max_tokens} output tokens each, torch threads {torch.get_num_threads()}")
    print(f"{'concurrency':>11} {'ours tok/s':>11} {'HF tok/s':>9} {'ours/HF':>8} {'steps':>6}")
    for c in args.concurrency:
        ours = theirs = 0.0
        for _ in range(args.repeats):
            tps, steps, _ = run_ours(bundle, prompts, args.max_tokens, c)
            ours = max(ours, tps)
            theirs = max(theirs, run_hf(hf, prompts, args.max_tokens, c, pad))
        print(f"{c:>11} {ours:>11.1f} {theirs:>9.1f} {ours / theirs:>8.2f} {steps:>6}")
    c = max(args.concurrency)
    on = off = 0.0
    for _ in range(args.repeats):
        tps, _, n_events = run_ours(bundle, prompts, args.max_tokens, c, probes=True)
        on = max(on, tps)
        off = max(off, run_ours(bundle, prompts, args.max_tokens, c, probes=False)[0])
    print(f"probes on/off at concurrency {c}: {on:.1f} / {off:.1f} tok/s = {on / off:.3f} "
          f"({n_events} events)")


if __name__ == "__main__":
    main()
