"""The in-process target: the reference engine in this process, seen through the load client's Transport.

No HTTP in between (notebooks, tests of the client alone): each engine delta becomes one stream event
(`Chunk`) with the exact number of tokens it carries, as the HTTP front end writes them. `attempt.sent`
is the moment the request is handed to the engine; closing the stream early aborts the request in the
engine. `inferledger capture` uses the real HTTP server instead (collectors/capture/run.py).
"""
from __future__ import annotations

from typing import AsyncIterator

from inferledger.collectors.load.loadgen import Chunk


class EmbeddedTarget:
    def __init__(self, async_engine, tokenizer) -> None:
        self.engine = async_engine
        self.tokenizer = tokenizer

    async def stream(self, messages: list[dict], params: dict, *, ids: dict, on_sent=None,
                     on_first_byte=None) -> AsyncIterator[Chunk]:
        from inferledger.engine import SamplingParams

        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompt = self.tokenizer.encode(text, add_special=False)
        n_out = 0
        if on_sent is not None:
            on_sent()
        columns = {k: ids.get(k) for k in ("request_id", "attempt_id", "task_id")}
        if ids.get("session_id"):
            columns["session_id"] = ids["session_id"]
        async for d in self.engine.generate(prompt, SamplingParams(**params), **columns):
            if n_out == 0 and on_first_byte is not None:
                on_first_byte()
                on_first_byte = None
            n_out += len(d.new_token_ids)
            kinds = (["content"] if d.new_token_ids else []) + (["finish", "usage"] if d.request_finished else [])
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n_out} if d.request_finished else None
            yield Chunk(kinds=kinds, text=d.text, tokens=len(d.new_token_ids),
                        finish_reason=d.finish_reason if d.request_finished else None, usage=usage)
