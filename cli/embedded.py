"""The embedded target: the reference engine in this process, seen through the load client's Transport.

Each engine delta becomes one stream event (`Chunk`) with the exact number of tokens it carries,
as the HTTP front end will write them. Closing the stream early aborts the request in the engine.
"""
from __future__ import annotations

from typing import AsyncIterator

from inferledger.collectors.loadgen import Chunk


class EmbeddedTarget:
    def __init__(self, async_engine, tokenizer) -> None:
        self.engine = async_engine
        self.tokenizer = tokenizer

    async def stream(self, messages: list[dict], params: dict, *, request_id: str, attempt_id: str,
                     task_id: str, on_first_byte=None) -> AsyncIterator[Chunk]:
        from inferledger.engine import SamplingParams

        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompt = self.tokenizer.encode(text, add_special=False)
        n_out = 0
        async for d in self.engine.generate(prompt, SamplingParams(**params), request_id=request_id,
                                            attempt_id=attempt_id, task_id=task_id):
            if n_out == 0 and on_first_byte is not None:
                on_first_byte()
                on_first_byte = None
            n_out += len(d.new_token_ids)
            kinds = (["content"] if d.new_token_ids else []) + (["finish", "usage"] if d.request_finished else [])
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n_out} if d.request_finished else None
            yield Chunk(kinds=kinds, text=d.text, tokens=len(d.new_token_ids),
                        finish_reason=d.finish_reason if d.request_finished else None, usage=usage)
