"""Warm-up requests (`capture --num-warmups N`): sent before the run is opened, so they are no
attempts and leave no event in the run.

Each is the first request of one of the workload's first N tasks (its prompt and sampling parameters),
sent one after another. The embedded target runs them on an engine of the run's configuration
without probes, before the recorded server exists (what they warm is the process: the model's
weights in cache, the kernels built, the allocator); a URL target gets them over HTTP before the
clocks, receivers and scrapers start. vLLM may export a warm-up's OTLP span after the receiver has
started (it batches every ~5 s): such a span joins no attempt and is counted as one (docs/CAPTURE.md).
"""
from __future__ import annotations

import asyncio
import time

from inferledger.collectors.load.loadgen import first_messages, request_params

WARMUP_ID = "warmup-{i}"


def warm_up(n: int, plans: list, wl, options, bundle=None) -> dict:
    """Send `n` warm-up requests (the first requests of the first `n` plans, cycling when there are
    fewer); returns the manifest's account of them: how many, their output tokens where known, seconds."""
    if n <= 0:
        return {"n": 0}
    chosen = [plans[i % len(plans)] for i in range(n)]
    t0 = time.perf_counter()
    if options.embedded:
        tokens = _embedded(chosen, wl, options, bundle)
    else:
        tokens = asyncio.run(_over_http(chosen, wl, options))
    return {"n": n, "output_tokens": tokens, "wall_s": round(time.perf_counter() - t0, 3),
            "recorded": False}


def _embedded(plans: list, wl, options, bundle) -> int:
    from inferledger.engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine(bundle, EngineConfig(**{**options.engine_settings, "probes": False}))
    tok = bundle.tokenizer
    out = 0
    for i, plan in enumerate(plans):
        params = request_params(plan, wl)
        ids = tok.encode(tok.apply_chat_template(first_messages(plan.requests[0]), add_generation_prompt=True),
                         add_special=False)
        engine.add_request(ids, SamplingParams(max_tokens=params["max_tokens"], temperature=params["temperature"],
                                               ignore_eos=params.get("ignore_eos", False)),
                           request_id=WARMUP_ID.format(i=i))
        while engine.has_unfinished():
            out += sum(len(d.new_token_ids) for d in engine.step())
    return out


async def _over_http(plans: list, wl, options) -> int | None:
    from inferledger.collectors.load.http_transport import HTTPTarget

    tokens: int | None = 0
    async with HTTPTarget(options.target, model=options.served_model, api_key=options.api_key) as target:
        for i, plan in enumerate(plans):
            req = plan.requests[0]
            ids = {"attempt_id": WARMUP_ID.format(i=i), "request_id": WARMUP_ID.format(i=i),
                   "task_id": WARMUP_ID.format(i=i)}
            usage = None
            async for chunk in target.stream(first_messages(req), request_params(plan, wl), ids=ids):
                usage = chunk.usage or usage
            tokens = tokens + usage["completion_tokens"] if tokens is not None and usage else None
    return tokens
