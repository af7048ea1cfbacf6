"""The engine's speed on this machine now, which `[arrivals] calibrate_tok_s` is compared with."""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Throughput:
    tok_s: float
    threads: int | None  # the probe thread's intra-op threads, as the run's step thread will have them


def probe_throughput(bundle, max_num_seqs: int = 8, tokens: int = 10, engine_config: dict | None = None) -> Throughput:
    """Output tokens per second of the engine on this machine now, at a full batch of short chats (a
    first round computes and caches the prompts, the timed round decodes): the speed
    `[arrivals] calibrate_tok_s` is compared with. It runs in a thread of its own, placed as the
    run's step thread will be (EngineConfig.cpu_threads), so it measures the speed the run will have,
    not that of the main thread's default thread count."""
    from inferledger.engine import EngineConfig, LLMEngine, SamplingParams
    from inferledger.engine.cpu_host import run_in_own_thread

    placement = {k: v for k, v in (engine_config or {}).items() if k == "cpu_threads"}
    engine = LLMEngine(bundle, EngineConfig(max_num_seqs=max_num_seqs, probes=False, **placement))
    tok = bundle.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Describe place number {i}."}],
                                                  add_generation_prompt=True), add_special=False)
               for i in range(max_num_seqs)]

    def run() -> Throughput:
        threads = engine.place_step_thread()
        for round_, n in enumerate((1, tokens)):
            for i, ids in enumerate(prompts):
                engine.add_request(ids, SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0),
                                   request_id=f"probe-{round_}-{i}")
            t0, out = time.perf_counter(), 0
            while engine.has_unfinished():
                out += sum(len(d.new_token_ids) for d in engine.step())
        return Throughput(out / (time.perf_counter() - t0), threads)

    return run_in_own_thread(run, "inferledger-calibration")
