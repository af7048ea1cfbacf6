"""`LLM`: offline generation over the engine, for scripts, notebooks and tests.

    llm = LLM()                                       # the bundled SmolLM2-135M-Instruct
    outs = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8))
    outs = llm.chat([[{"role": "user", "content": "Hi"}]])
"""
from __future__ import annotations

import itertools

from .llm_engine import LLMEngine
from .outputs import RequestOutput
from .params import EngineConfig, SamplingParams

Prompt = str | list[int] | list[dict]  # text, token ids, or chat messages


class LLM:
    def __init__(self, model=None, config: EngineConfig | None = None, sink=None, bundle=None, *,
                 run_id: str = "run", host: str | None = None, clock: str | None = None) -> None:
        if bundle is None:
            from .loader import load_model

            bundle = load_model(model, device=(config.device if config and config.device else "cpu"))
        self.bundle = bundle
        self.tokenizer = bundle.tokenizer
        self.engine = LLMEngine(bundle, config, sink=sink, run_id=run_id, host=host, clock=clock)
        self._ids = itertools.count()

    def close(self) -> None:
        """Flush what the engine holds back (on CUDA: the last device.step events and the clock
        mapping of its device timer). Also `with LLM(...) as llm:`."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: ids as given, text with the checkpoint's special tokens, chat
        messages through its chat template."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special=True)
        if prompt and isinstance(prompt[0], dict):
            return self.chat_prompt(prompt)
        return [int(t) for t in prompt]

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special=False)

    def generate(self, prompts: Prompt | list[Prompt],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion (batched by the engine); outputs in prompt order."""
        if isinstance(prompts, str) or (prompts and not isinstance(prompts[0], (str, list))):
            prompts = [prompts]  # one prompt: text, token ids or chat messages
        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} SamplingParams for {len(prompts)} prompts")
        ids, outputs = [], {}
        try:
            for prompt, p in zip(prompts, plist):
                rid = f"llm-{next(self._ids)}"
                ids.append(self.engine.add_request(self.encode(prompt), p, request_id=rid))
            while len(outputs) < len(ids):
                for delta in self.engine.step():
                    if delta.request_finished:
                        outputs[delta.attempt_id] = delta.output
        except BaseException:
            for rid in ids:
                if rid not in outputs:
                    self.engine.abort(rid)
            try:
                while self.engine.has_unfinished():  # let the aborts release their blocks
                    self.engine.step()
            except Exception:
                pass  # the original error is the one to report
            raise
        return [outputs[i] for i in ids]

    def chat(self, conversations: list[list[dict]] | list[dict],
             params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        return self.generate([self.chat_prompt(c) for c in conversations], params)
