"""Prompts of exact token counts: deterministic filler fitted, one token at a time, to the caller's
tokenizer and chat template (the tokenizer is the caller's: this module loads none)."""
from __future__ import annotations

import random

from .schema import TaskClass

_WORDS = ("the river market opened early and traders carried baskets of grain fruit salt cloth along "
          "narrow roads while clerks counted coins recorded every sale in long books kept the accounts "
          "of each family farm mill bridge harbor ship storm winter summer rain light stone wall tower "
          "garden field village town city north south east west morning evening night day week month year "
          "old new small large quiet busy simple careful clear bright dark warm cold green blue red white "
          "black brown golden silver copper iron wood paper glass water fire wind cloud hill valley lake "
          "forest path door window table chair letter number name story song voice hand head heart mind "
          "friend teacher student worker farmer baker driver sailor doctor writer reader builder").split()
SENTINEL = "\u0001USER\u0001"


def one_token_words(tokenizer) -> list[str]:
    """The filler words that are one token each, with their leading space, for this tokenizer."""
    words = [w for w in _WORDS if len(tokenizer.encode(" " + w)) == 1]
    if len(words) < 20:
        raise ValueError("this tokenizer splits most filler words; cannot build exact prompts")
    return words


class PromptBuilder:
    """Prompts whose templated token count is exact for one tokenizer, made of deterministic filler.

    All filler goes into the system message and the user message is the task's question alone (the
    small model answers as it would without the filler). The class's shared prefix is the start of
    that system message: identical text, hence identical leading tokens, in every request of the
    class, so a prefix cache can reuse its full blocks. Each request's own filler follows it and is
    padded or trimmed one token at a time until the whole templated prompt has exactly
    `prompt_tokens` tokens.
    """

    LEAD = "Reference notes:"

    def __init__(self, tokenizer, seed: int, cls: TaskClass) -> None:
        self.tok, self.seed, self.cls = tokenizer, seed, cls
        self.words = one_token_words(tokenizer)
        self._last: tuple[tuple[str | None, str], list[int]] | None = None  # the last prompt tokenized
        self.shared, self.head = None, []
        if cls.shared_prefix_tokens:
            make = lambda n: self.LEAD + self._filler("prefix", n)
            n = self._fit(lambda n: len(self._head(make(n))), cls.shared_prefix_tokens, "shared prefix")
            self.shared = make(n)
            self.head = self._head(self.shared)

    def _filler(self, key: str, n: int) -> str:
        """n filler items (a word with its leading space, or a full stop), one token each."""
        rng = random.Random(f"{self.seed}:{self.cls.name}:{key}")
        items: list[str] = []
        while len(items) < n:
            items.extend([" " + rng.choice(self.words) for _ in range(rng.randint(6, 14))] + ["."])
        return "".join(items[:n])

    def _render(self, system: str | None, user: str) -> list[int]:
        if self._last is not None and self._last[0] == (system, user):  # the fit's last count, asked again
            return self._last[1]
        msgs = ([{"role": "system", "content": system}] if system is not None else []) + \
               [{"role": "user", "content": user}]
        tokens = self.tok.encode(self.tok.apply_chat_template(msgs, add_generation_prompt=True), add_special=False)
        self._last = ((system, user), tokens)
        return tokens

    def _head(self, system: str) -> list[int]:
        """Tokens of the templated prompt up to the end of `system` (the part every request shares)."""
        text = self.tok.apply_chat_template([{"role": "system", "content": system},
                                             {"role": "user", "content": SENTINEL}], add_generation_prompt=True)
        return self.tok.encode(text[: text.index(system) + len(system)], add_special=False)

    def _fit(self, count, target: int, what: str) -> int:
        n, seen = max(0, target - count(0)), set()
        for _ in range(64):
            got = count(n)
            if got == target:
                return n
            seen.add(n)
            n = max(0, n + target - got)
            if n in seen:  # oscillating around an item that is not one token here: try neighbours
                for m in (n - 1, n + 1, n - 2, n + 2):
                    if m >= 0 and m not in seen and count(m) == target:
                        return m
                break
        raise ValueError(f"class {self.cls.name}: cannot build a {what} of exactly {target} tokens "
                         f"(closest: {got})")

    def request(self, question: str, key: str) -> tuple[str | None, int | None]:
        """(system message, the prompt's exact token count) for one request whose user message is `question`."""
        target = self.cls.prompt_tokens
        if not target:
            return self.shared, None
        base = self.shared or self.LEAD
        if len(self._render(base, question)) > target:
            raise ValueError(f"class {self.cls.name}: prompt_tokens = {target} is shorter than the template, "
                             f"shared prefix and question ({len(self._render(base, question))} tokens)")
        make = lambda m: base + self._filler(key, m)
        system = make(self._fit(lambda m: len(self._render(make(m), question)), target, "prompt"))
        tokens = self._render(system, question)
        if self.head and tokens[: len(self.head)] != self.head:
            raise ValueError(f"class {self.cls.name}: the shared prefix does not tokenize the same in every prompt")
        return system, len(tokens)
