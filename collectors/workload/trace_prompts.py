"""Prompts for the rows of a trace: exact token counts in the served model's tokenizer, built block by
block so that rows sharing a block id (Mooncake's hash ids) share those tokens, and a prefix cache
sees the trace's own sharing."""
from __future__ import annotations

import random
from functools import lru_cache

from .prompts import SENTINEL, one_token_words


class BlockPrompts:
    """A row's templated prompt is the chat template's head, filler words (one token each, in the
    system message), then the template's tail around the task's question (the user message).

    The filler token at prompt position p is word p % block_tokens of the block keyed by the row's id
    for block p // block_tokens: its hash id there, or a key of the row's own past its last id (and in
    traces without ids). Two rows with the same id at block j therefore have identical tokens at every
    position of block j that is filler in both; the template's head is the same in every row, and the
    tail, which ends each prompt, is the row's own.
    """

    def __init__(self, tokenizer, seed: int, block_tokens: int) -> None:
        self.tok, self.seed, self.block_tokens = tokenizer, seed, block_tokens
        self.words = one_token_words(tokenizer)
        text = self._text(SENTINEL, "?")
        self.head = len(self.tok.encode(text[: text.index(SENTINEL)], add_special=False))
        self._floor: dict[str, int] = {}
        self._block = lru_cache(maxsize=4096)(self._make_block)  # real traces reuse a few ids a lot

    def _text(self, system: str, question: str) -> str:
        return self.tok.apply_chat_template([{"role": "system", "content": system},
                                             {"role": "user", "content": question}], add_generation_prompt=True)

    def count(self, system: str, question: str) -> int:
        return len(self.tok.encode(self._text(system, question), add_special=False))

    def min_tokens(self, question: str) -> int:
        """The shortest prompt around `question`: the template, one filler word (a system message is
        never empty: some templates drop an empty one) and the question."""
        if question not in self._floor:
            self._floor[question] = self.count(" " + self.words[0], question)
        return self._floor[question]

    def _make_block(self, key: str) -> tuple[str, ...]:
        rng = random.Random(f"{self.seed}:trace-block:{key}")
        return tuple(rng.choice(self.words) for _ in range(self.block_tokens))

    def build(self, question: str, n_tokens: int, hash_ids: tuple[int, ...] | None, row_key: str) -> str:
        """The system message that makes the prompt around `question` exactly `n_tokens` long."""
        bt = self.block_tokens

        def key(j: int) -> str:
            return f"id:{hash_ids[j]}" if hash_ids is not None and j < len(hash_ids) else f"row:{row_key}:{j}"

        n = n_tokens - self.min_tokens(question) + 1  # filler words
        if n < 1:
            raise ValueError(f"a prompt of {n_tokens} tokens is shorter than the template and question "
                             f"({self.min_tokens(question)})")
        for _ in range(8):  # one pass when filler words stay one token each (tokenizers that split on spaces)
            words = [self._block(key(p // bt))[p % bt] for p in range(self.head, self.head + n)]
            system = "".join(" " + w for w in words)
            got = self.count(system, question)
            if got == n_tokens:
                return system
            n = max(1, n + n_tokens - got)
        raise ValueError(f"cannot build a prompt of exactly {n_tokens} tokens with this tokenizer (closest: {got})")
