"""Which sequences compute how many tokens in the next step.

Continuous batching: running decodes first (oldest first), then running prefills that were split
into chunks, then waiting sequences in arrival order, while the step has token budget
(`max_num_batched_tokens`) and room (`max_num_seqs`); a prefill chunk takes what budget is left, at
most `long_prefill_token_threshold` tokens when that is set. `batching="fixed"` admits a batch only when the
previous one has entirely finished; `chunked_prefill=False` never splits a prefill (a prompt longer
than the budget then runs alone). Admission `reserve` keeps the worst case (prompt + max_tokens
blocks of every running sequence) within the pool, so nothing is ever preempted; `on_demand`
allocates as tokens are written and, when the pool runs dry, preempts the newest running sequence
and later recomputes it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .block_manager import BlockManager
from .params import EngineConfig
from .sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    kind: str  # "prefill" | "decode" | "verify"
    start_pos: int
    num_tokens: int  # tokens whose KV this step writes (drafts included)
    draft_token_ids: list[int] = field(default_factory=list)
    new_blocks: list[int] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    prefix_hit_blocks: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    first_scheduled: bool = False  # enters the batch (first time, or on resume)

    @property
    def samples(self) -> bool:
        """The chunk reaches the sequence's last token, so its logits give the next token."""
        return self.start_pos + self.num_tokens - len(self.draft_token_ids) == self.seq.num_tokens


@dataclass
class Preemption:
    seq: Sequence
    recompute_tokens: int
    freed_blocks: list[int]


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Preemption] = field(default_factory=list)
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager,
                 propose: Callable[[Sequence, int], list[int]] | None = None) -> None:
        self.config = config
        self.bm = block_manager
        self.propose = propose  # speculative drafts for a decoding sequence, at most k tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last is the newest
        # vLLM's prefix-cache counters (vllm:prefix_cache_queries / _hits), in tokens: per sequence that
        # enters the batch for the first time, its prompt tokens looked up and those its cache served
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # -- queue ------------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def fork(self, parent: Sequence) -> list[Sequence]:
        """n > 1: once the prompt is computed, its siblings join, sharing its blocks."""
        children = [parent.fork(i) for i in range(1, parent.params.n)]
        for child in children:
            self.bm.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            self.running.append(child)
        parent.pending_forks = 0
        return children

    def remove(self, seq: Sequence) -> list[int]:
        """Take seq out (finished or aborted) and drop its block references."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        return self.bm.free(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _num_seqs(self, seqs) -> int:
        return sum(1 + s.pending_forks for s in seqs)

    def _outstanding_blocks(self) -> int:
        return sum(s.reserved_blocks(self.bm.block_size) for s in self.running)

    # -- one step ---------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._budget = self.config.max_num_batched_tokens
        if self.config.batching == "fixed" and not self.running:
            self._admit_fixed_batch()
        decodes = [s for s in self.running if s.in_decode]
        prefills = [s for s in self.running if not s.in_decode]
        for i, seq in enumerate(decodes + prefills):
            if seq.status != SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if self._budget <= 0:
                break
            self._decodes_left = max(0, len(decodes) - i - 1)  # drafts never starve later decodes
            self._schedule_running(seq, out)
        if self.config.batching == "continuous" and not out.preempted:
            self._admit_waiting(out)  # not after a preemption: the pool is short, admitting would thrash
        self._count_lookups(out)
        return out

    def _count_lookups(self, out: SchedulerOutput) -> None:
        """The prefix-cache lookups this step's schedule keeps, as vLLM counts them: each sequence entering
        the batch (its first chunk) adds its tokens to the queries and its cached tokens to the hits. Like
        vLLM's, a sequence preempted before (its recompute) is not counted, nor is anything with prefix caching
        off. Unlike vLLM's, a lookup that did not admit its sequence (pool or budget short) is not counted
        again when the sequence is looked up at a later step: only the lookup whose hits were taken, so the
        counters equal the engine.prefill events' attrs.cached_tokens of first admissions."""
        if not self.bm.enable_prefix_caching:
            return
        for item in out.scheduled:
            if item.first_scheduled and item.seq.preemptions == 0:
                self.prefix_cache_queries += item.seq.num_tokens  # before the hits: a scrape never sees hits > queries
                self.prefix_cache_hits += item.cached_tokens

    def _chunk(self, remaining: int, out: SchedulerOutput) -> int:
        """Tokens of a prefill of `remaining` tokens that fit this step (0: wait)."""
        if self.config.chunked_prefill:
            cap = self.config.long_prefill_token_threshold or remaining
            return min(remaining, self._budget, cap)
        if remaining <= self._budget or out.num_batched_tokens == 0:
            return remaining  # unchunked: whole, or alone when longer than the budget
        return 0

    def _drafts(self, seq: Sequence) -> list[int]:
        if self.propose is None or not seq.in_decode:
            return []
        k = min(self.config.speculative.k, seq.params.max_tokens - seq.num_output_tokens - 1,
                self._budget - 1 - self._decodes_left)
        return self.propose(seq, k)[:k] if k > 0 else []

    def _schedule_running(self, seq: Sequence, out: SchedulerOutput) -> None:
        fresh = seq.num_computed_tokens == 0 and not seq.block_table  # fixed batch, first prefill
        hits = self.bm.find_cached_prefix(seq) if fresh else []
        if fresh:
            self._take_hits(seq, hits)
        drafts = self._drafts(seq)
        n = 1 if seq.in_decode else self._chunk(seq.num_uncomputed_tokens, out)
        while n:
            res = self.bm.allocate_slots(seq, n + len(drafts))
            if res is not None:
                kind = "verify" if drafts else ("decode" if seq.in_decode else "prefill")
                return self._add(out, seq, kind, n, drafts, res, hits)
            if fresh:
                break  # a batch member that never ran waits rather than preempting the others
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return
        if fresh:
            self._untake_hits(seq)

    def _admit_fixed_batch(self) -> None:
        while self.waiting and self._num_seqs(self.running) + self._num_seqs([self.waiting[0]]) \
                <= self.config.max_num_seqs:
            seq = self.waiting[0]
            if self.config.admission == "reserve":
                free = self.bm.num_available_blocks - self._outstanding_blocks()
                if seq.reserved_blocks(self.bm.block_size) > free:
                    break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)

    def _admit_waiting(self, out: SchedulerOutput) -> None:
        bm = self.bm
        while self.waiting and self._budget > 0:
            seq = self.waiting[0]
            if self._num_seqs(self.running) + self._num_seqs([seq]) > self.config.max_num_seqs:
                break
            hits = bm.find_cached_prefix(seq)
            cached = len(hits) * bm.block_size
            n = self._chunk(seq.num_tokens - cached, out)
            if n == 0:
                break
            available = bm.num_available_blocks - bm.num_evictable_among(hits)
            if self.config.admission == "reserve":
                need = seq.reserved_blocks(bm.block_size) - len(hits)
                available -= self._outstanding_blocks()
            else:
                need = bm.blocks_for(cached + n) - len(hits)
            if need > available:
                break
            self.waiting.popleft()
            self._take_hits(seq, hits)
            res = bm.allocate_slots(seq, n)
            assert res is not None, "admission checked the pool"
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._add(out, seq, "prefill", n, [], res, hits)

    def _take_hits(self, seq: Sequence, hits: list[int]) -> None:
        if hits:
            self.bm.acquire_cached(seq, hits)
        seq.num_computed_tokens = len(hits) * self.bm.block_size
        seq.max_computed_tokens = max(seq.max_computed_tokens, seq.num_computed_tokens)
        seq.num_cached_tokens += seq.num_computed_tokens
        seq.cached_tokens_unreported = seq.num_computed_tokens

    def _untake_hits(self, seq: Sequence) -> None:
        self.bm.free(seq)
        seq.num_cached_tokens -= seq.num_computed_tokens
        seq.num_computed_tokens = 0
        seq.cached_tokens_unreported = 0

    def _add(self, out, seq, kind, n, drafts, res, hits) -> None:
        new_blocks, copies = res
        first = not seq.scheduled_since_admit
        seq.scheduled_since_admit = True
        cached = seq.cached_tokens_unreported
        seq.cached_tokens_unreported = 0
        out.scheduled.append(ScheduledSeq(seq, kind, seq.num_computed_tokens, n + len(drafts),
                                          list(drafts), new_blocks, copies, hits, cached, first))
        out.num_batched_tokens += n + len(drafts)
        self._budget -= n + len(drafts)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Drop seq's KV; it waits at the head of the queue to be recomputed. If it was already
        given work in this step, that work is taken back."""
        for i, item in enumerate(out.scheduled):
            if item.seq is seq:
                del out.scheduled[i]
                seq.num_cached_tokens -= item.cached_tokens
                out.num_batched_tokens -= item.num_tokens
                self._budget += item.num_tokens
                break
        self.running.remove(seq)
        tokens = seq.num_computed_tokens
        freed = self.bm.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        out.preempted.append(Preemption(seq, tokens, freed))
