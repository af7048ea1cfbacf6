"""The reference engine behind its real HTTP front end, in this process, for `inferledger capture`
(and the engine's speed on this machine now, which `[arrivals] calibrate_tok_s` is compared with)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from inferledger.collectors.writer import RunWriter


class EmbeddedServer:
    """The engine plus its HTTP front end on 127.0.0.1:<ephemeral>, in a thread of its own."""

    def __init__(self, writer: RunWriter, host: str, *, max_num_seqs: int = 8, model: str | None = None,
                 bundle=None, engine_config: dict | None = None) -> None:
        """`bundle`: an already loaded model (else `model`, a path, or the bundled default, is loaded)."""
        from inferledger.engine import AsyncEngine, EngineConfig, LLMEngine
        from inferledger.serve.app import build_app
        from inferledger.serve.thread import ServerThread

        if bundle is None:
            from inferledger.engine.loader import load_model

            bundle = load_model(model)
        self.bundle = bundle
        self.config = EngineConfig(**{"max_num_seqs": max_num_seqs, **(engine_config or {})})
        self.engine = LLMEngine(self.bundle, self.config, sink=writer, run_id=writer.run_id, host=host)
        self.async_engine = AsyncEngine(self.engine)
        self.model_name = Path(self.bundle.identity["path"]).stem
        app = build_app(self.async_engine, self.bundle.tokenizer, model_name=self.model_name,
                        sink=writer, run_id=writer.run_id, host=host)
        self.thread = ServerThread(app)  # binds 127.0.0.1 only

    def start(self) -> str:
        self.async_engine.start()
        return self.thread.start().url

    def stop(self, drain_s: float = 60.0) -> None:
        # Attempts the client gave up on are the server's to finish or cancel: let the engine reach
        # its own terminal states before stopping, so the ledger sees no unterminated work.
        deadline = time.monotonic() + drain_s
        while self.engine.has_unfinished() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # the front end's last writes and server.done after the engine's finish
        self.thread.stop()
        self.async_engine.close()


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

    placement = {k: v for k, v in (engine_config or {}).items() if k == "cpu_threads"}
    engine = LLMEngine(bundle, EngineConfig(max_num_seqs=max_num_seqs, probes=False, **placement))
    tok = bundle.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Describe place number {i}."}],
                                                  add_generation_prompt=True), add_special=False)
               for i in range(max_num_seqs)]
    got: dict = {}

    def run() -> None:
        try:
            got["threads"] = engine.place_step_thread()
            for round_, n in enumerate((1, tokens)):
                for i, ids in enumerate(prompts):
                    engine.add_request(ids, SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0),
                                       request_id=f"probe-{round_}-{i}")
                t0, out = time.perf_counter(), 0
                while engine.has_unfinished():
                    out += sum(len(d.new_token_ids) for d in engine.step())
                got["rate"] = out / (time.perf_counter() - t0)
        except BaseException as exc:  # raised again in the caller's thread
            got["error"] = exc

    thread = threading.Thread(target=run, name="inferledger-calibration", daemon=True)
    thread.start()
    thread.join()
    if "error" in got:
        raise got["error"]
    return Throughput(got["rate"], got.get("threads"))
