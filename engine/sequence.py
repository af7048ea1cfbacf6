"""A `Sequence`: one stream of tokens the engine generates, with everything it owns.

It owns its prompt and output tokens, how many of them have KV computed (`num_computed_tokens`), its
block table, its counters (cache hits, preemptions, recomputed tokens, forward passes, speculative
drafts) and its per-request random generator. A request with n > 1 parallel samples is n sequences
that share `request_id`/`attempt_id` and differ in `sample_index`.
"""
from __future__ import annotations

import itertools
import random
from enum import Enum

import torch

from inferledger.probes.probe import EventIds

from .params import SamplingParams

_seq_ids = itertools.count()


class SequenceStatus(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, prompt_token_ids: list[int], params: SamplingParams, *, request_id: str,
                 attempt_id: str | None = None, task_id: str | None = None,
                 session_id: str | None = None, sample_index: int = 0) -> None:
        self.seq_id = next(_seq_ids)
        self.request_id = request_id
        self.attempt_id = attempt_id or request_id
        self.task_id = task_id
        self.session_id = session_id
        self.event_ids = EventIds(task_id, session_id, request_id, self.attempt_id)  # every event about it carries them
        self.params = params
        self.sample_index = sample_index
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        # KV state
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the leading full, computed blocks
        self.num_cow_copies = 0
        # n > 1: the parent waits to fork until its prompt is computed
        self.pending_forks = params.n - 1 if sample_index == 0 else 0
        # counters
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache, all admissions
        self.num_computed_prompt_tokens = 0  # tokens computed by prefill chunks, recompute included
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.max_computed_tokens = 0  # high-water mark: tokens below it computed again are recomputed
        self.forward_passes = 0  # steps in which this sequence was in the batch
        self.decode_steps = 0  # steps that committed output tokens
        self.spec_rounds = 0
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.scheduled_since_admit = False  # engine.scheduled emitted for the current admission
        self.cached_tokens_unreported = 0
        # text state (detokenized output; the engine fills it)
        self.output_text = ""
        self.sent_text_len = 0
        self.stop_string: str | None = None  # the stop string that ended it, if one did
        self.checked_text_len = 0  # output_text already searched for stop strings
        self.detok_state = None  # the tokenizer's incremental detokenizer, if it has one
        self.generator = self._make_generator(params.seed, sample_index)

    @staticmethod
    def _make_generator(seed: int | None, sample_index: int) -> torch.Generator | None:
        if seed is None and sample_index == 0:
            return None  # unseeded: the sampler makes one lazily from fresh entropy
        g = torch.Generator(device="cpu")
        base = seed if seed is not None else random.getrandbits(62)
        g.manual_seed((base + sample_index) % 2**63)
        return g

    def get_generator(self) -> torch.Generator:
        if self.generator is None:
            self.generator = torch.Generator(device="cpu")
            self.generator.manual_seed(random.getrandbits(62))
        return self.generator

    # -- tokens -----------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def in_decode(self) -> bool:
        """Only the last sampled token lacks KV: the next step is a decode (or a verify)."""
        return self.num_output_tokens > 0 and self.num_uncomputed_tokens == 1

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(int(token_id))

    # -- KV accounting ----------------------------------------------------------------------------
    def max_blocks(self, block_size: int) -> int:
        """Blocks this sequence can ever hold: prompt + max_tokens positions."""
        return -(-(self.num_prompt_tokens + self.params.max_tokens) // block_size)

    def reserved_blocks(self, block_size: int) -> int:
        """Worst-case blocks still to allocate for it (and its unforked siblings): admission 'reserve'
        keeps the sum of these within the free pool, so no allocation can fail."""
        group = self.params.n > 1
        per_seq = self.max_blocks(block_size) + (1 if group else 0)  # +1: one copy-on-write
        total = per_seq * (1 + self.pending_forks) - len(self.block_table) - self.num_cow_copies
        return max(0, total)

    def mark_computed(self, start_pos: int, num_tokens: int) -> None:
        """KV for positions [start_pos, start_pos + num_tokens) is now in the cache."""
        end = start_pos + num_tokens
        self.recomputed_tokens += max(0, min(end, self.max_computed_tokens) - start_pos)
        self.num_computed_tokens = end
        self.max_computed_tokens = max(self.max_computed_tokens, end)

    def reset_for_recompute(self) -> None:
        """Preempted: all KV dropped; it waits to be prefilled again (prompt + output so far)."""
        self.num_computed_tokens = 0
        self.block_table = []
        self.block_hashes = []
        self.num_cow_copies = 0
        self.preemptions += 1
        self.status = SequenceStatus.WAITING
        self.scheduled_since_admit = False

    def fork(self, sample_index: int) -> "Sequence":
        """A sibling sample sharing the prompt (its blocks are shared by the block manager)."""
        child = Sequence(self.prompt_token_ids, self.params, request_id=self.request_id,
                         attempt_id=self.attempt_id, task_id=self.task_id,
                         session_id=self.session_id, sample_index=sample_index)
        child.token_ids = list(self.token_ids)
        child.num_computed_tokens = self.num_computed_tokens
        child.max_computed_tokens = self.num_computed_tokens
        child.status = self.status
        child.scheduled_since_admit = True
        return child

    def ids(self) -> dict:
        return {"request_id": self.request_id, "attempt_id": self.attempt_id,
                "task_id": self.task_id, "session_id": self.session_id}

    def __repr__(self) -> str:
        return (f"Sequence({self.attempt_id}#{self.sample_index}, {self.status.value}, "
                f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, blocks={self.block_table})")
