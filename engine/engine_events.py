"""The engine's events and KV occupancy samples, in one place (names from probes/events.py).

Every method returns at its first branch when the probe is off, so an engine without a sink pays
one attribute test per call.
"""
from __future__ import annotations

from .block_manager import BlockManager
from .sequence import Sequence


class EngineEvents:
    def __init__(self, probe, sink, block_manager: BlockManager) -> None:
        self.probe = probe
        self.bm = block_manager
        self._sample = getattr(sink, "sample", None) if probe.enabled else None

    def request(self, seq: Sequence, name: str, *, value=None, step_id=None, **attrs) -> None:
        if not self.probe.enabled:
            return
        self.probe.emit(name, request_id=seq.request_id, attempt_id=seq.attempt_id, task_id=seq.task_id,
                        session_id=seq.session_id, step_id=step_id, value=value, **attrs)

    def step_start(self, step_id: int, out, token_budget: int, num_running: int, num_waiting: int) -> None:
        if not self.probe.enabled:
            return
        batch = [[i.seq.attempt_id, i.kind, i.num_tokens] for i in out.scheduled]
        self.probe.emit("step.start", step_id=step_id, batch=batch, token_budget=token_budget,
                        num_seqs=len(out.scheduled), num_tokens=out.num_batched_tokens,
                        num_running=num_running, num_waiting=num_waiting, preempted=len(out.preempted))

    def step_end(self, step_id: int, out, error: str | None = None) -> None:
        if not self.probe.enabled:
            return
        extra = {"error": error} if error else {}
        self.probe.emit("step.end", step_id=step_id, value=out.num_batched_tokens, mode="eager",
                        padded_tokens=out.num_batched_tokens, num_seqs=len(out.scheduled), **extra)

    def scheduled(self, item, step_id: int) -> None:
        """A scheduled chunk's entry into the batch, cache hits and fresh blocks."""
        if not self.probe.enabled:
            return
        seq = item.seq
        if item.first_scheduled:
            self.request(seq, "engine.scheduled", step_id=step_id, resume=seq.preemptions > 0,
                         index=seq.sample_index)
        if item.prefix_hit_blocks:
            self.request(seq, "kv.prefix_hit", value=len(item.prefix_hit_blocks), step_id=step_id,
                         blocks=item.prefix_hit_blocks, tokens=item.cached_tokens)
        if item.new_blocks:
            copied = [[s, d] for s, d in item.copies]
            self.request(seq, "kv.alloc", value=len(item.new_blocks), step_id=step_id,
                         blocks=item.new_blocks, **({"copy_on_write": copied} if copied else {}))

    def release(self, seq: Sequence, blocks: list[int], reason: str, step_id: int) -> None:
        """kv.release (no references left) then kv.free: which of those blocks are back in the pool
        (free or cached-unreferenced, i.e. reallocatable) and how many other requests still share."""
        if not self.probe.enabled:
            return
        self.request(seq, "kv.release", value=len(blocks), step_id=step_id, blocks=blocks, reason=reason)
        in_pool = [b for b in blocks if self.bm.is_unreferenced(b)]
        self.request(seq, "kv.free", value=len(in_pool), step_id=step_id, blocks=in_pool,
                     shared=len(blocks) - len(in_pool), reason=reason)

    def kv_samples(self) -> None:
        if self._sample is None:
            return
        p, bm = self.probe, self.bm
        ts = p.now_ns()
        for metric, value in (("kv_blocks_used", bm.num_used_blocks), ("kv_blocks_cached", bm.num_cached_blocks),
                              ("kv_blocks_free", bm.num_free_blocks)):
            self._sample(ts_ns=ts, clock=p.clock, source="engine", host=p.host, metric=metric,
                         value=float(value), unit="blocks")
