"""The engine's events and KV occupancy samples, in one place (names from probes/events.py).

Request-level events carry request_id, attempt_id (default: the request id), task_id, session_id;
step-level ones carry step_id (the engine iteration; request events of a step carry it too).

  engine.enqueued         add_request accepted it; value = prompt tokens; attrs max_tokens, n
  engine.scheduled        it enters a batch, first time or on resume after a preemption (attrs.resume)
  engine.prefill          a prefill chunk computed; value = tokens computed; attrs.cached_tokens = prompt
                          tokens served from the prefix cache (on the admission's first chunk, else 0),
                          attrs.start_pos, attrs.recompute
  engine.token            tokens committed in one step (> 1 with speculation); attrs.choice = sample
  spec.round              one verify forward: attrs drafted, accepted, forward_passes (1); value = tokens
  engine.preempted        KV dropped to recompute later; value = attrs.recompute_tokens = tokens that
                          had KV (the prefix cache may spare part of the recompute)
  engine.cancel_received  abort() called (any thread)
  engine.cancel_effective the first iteration boundary after it: no work is scheduled for it any more
  engine.finished         it left the engine; attrs.reason stop | length | cancelled | error; value =
                          output tokens (all samples); attrs.reasons per sample
  kv.prefix_hit           cached blocks reused at admission; value = blocks; attrs blocks, tokens
  kv.alloc                blocks newly taken from the pool; value = count; attrs.blocks (physical ids),
                          attrs.copy_on_write [[src, dst]] when a shared partial block was copied
  kv.release              the request holds no block any more (finished, cancelled or preempted);
                          value = blocks it dropped; attrs blocks, reason
  kv.free                 right after: of those, the blocks back in the pool (free or cached, i.e.
                          reallocatable; the step that used them is over); attrs.shared = still held
                          by other requests. A request that never held a block gets an empty pair.
  step.start / step.end   one iteration, both with attrs.engine_id (this engine instance: host and
                          process; a partitioned run groups steps by it); start attrs: batch [[attempt_id, kind, tokens, context_before]]
                          with kind prefill | decode | verify and context_before = the tokens of that
                          sequence already in KV before this step's tokens, token_budget, num_seqs, num_running,
                          num_waiting; end: value = tokens processed, attrs mode (eager |
                          padded | graph | graph_capture: this step captured a new bucket's graph | simulated:
                          the simulated clock's runner),
                          padded_tokens (tokens run, padding rows included), num_seqs; where Linux
                          schedstat is readable (probes/schedstat.py): cpu_ns and wait_ns (the step
                          thread's on-CPU time and run-queue wait over the step), workers (its intra-op
                          workers read) and workers_wait_ns_max (their largest run-queue wait over the
                          step, capped at the step; absent without workers)
  device.step             (CUDA, probes/cuda_timer.py) the step's device time from CUDA events on the
                          cuda:<host>:<device> clock; value = device ms, attrs end_ns, mode, padded_tokens
Samples after each step (when the sink has `sample`): kv_blocks_used, kv_blocks_cached,
kv_blocks_free, unit "blocks". Every method returns at its first branch when the probe is off.
"""
from __future__ import annotations

import os

from .block_manager import BlockManager
from .sequence import Sequence


class EngineEvents:
    def __init__(self, probe, sink, block_manager: BlockManager) -> None:
        self.probe = probe
        self.bm = block_manager
        self._sample = getattr(sink, "sample", None) if probe.enabled else None
        self.engine_id = f"{probe.host}-{os.getpid()}"  # one engine per process; the same on a rerun in it

    def request(self, seq: Sequence, name: str, *, value=None, step_id=None, **attrs) -> None:
        if not self.probe.enabled:
            return
        self.probe.emit(name, seq.event_ids, step_id=step_id, value=value, **attrs)

    def step_start(self, step_id: int, out, token_budget: int, num_running: int, num_waiting: int) -> None:
        if not self.probe.enabled:
            return
        batch = [[i.seq.attempt_id, i.kind, i.num_tokens, i.start_pos] for i in out.scheduled]
        self.probe.emit("step.start", step_id=step_id, engine_id=self.engine_id, batch=batch, token_budget=token_budget,
                        num_seqs=len(out.scheduled), num_tokens=out.num_batched_tokens,
                        num_running=num_running, num_waiting=num_waiting, preempted=len(out.preempted))

    def step_end(self, step_id: int, out, error: str | None = None, mode: str = "eager",
                 padded_tokens: int | None = None, sched=None) -> None:
        if not self.probe.enabled:
            return
        extra = {"error": error} if error else {}
        if sched is not None:  # probes/schedstat.py StepSched: absent where schedstat is unreadable
            extra.update(sched.attrs())
        self.probe.emit("step.end", step_id=step_id, engine_id=self.engine_id, value=out.num_batched_tokens, mode=mode,
                        padded_tokens=out.num_batched_tokens if padded_tokens is None else padded_tokens,
                        num_seqs=len(out.scheduled), **extra)

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
