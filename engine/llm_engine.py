"""LLMEngine: requests in, one step at a time, deltas out, every lifecycle event emitted.

`add_request` and `abort` may be called from any thread: they land in an inbox that `step()` (one
thread) drains at the next iteration boundary. A step: drain the inbox (admit, cancel), schedule,
copy-on-write, one runner forward over every scheduled chunk, then sample / verify, detokenize,
check stops, release the blocks of what finished. Cancelled requests get no further output; their
blocks are released at the first boundary after the abort, when no forward is using them.
"""
from __future__ import annotations

import threading
import time
from collections import deque

import torch

from inferledger.probes.probe import Probe
from inferledger.probes.schedstat import ComputeThreads

from .block_manager import BlockManager
from .cpu_host import place_current_thread, plan_placement
from .engine_events import EngineEvents
from .outputs import RequestDelta
from .params import EngineConfig, SamplingParams
from .request import Request, validate_request
from .output_processor import commit_tokens, flush_text, make_delta
from .sampler import Sampler
from .scheduler import Scheduler, ScheduledSeq
from .sequence import Sequence, SequenceStatus
from .spec_decode import PromptLookupProposer, verify


class EngineStepError(RuntimeError):
    """The forward pass failed; the requests in that batch were finished with reason 'error'."""

    def __init__(self, cause: BaseException, deltas: list[RequestDelta]) -> None:
        super().__init__(f"engine step failed: {cause!r}")
        self.deltas = deltas


class LLMEngine:
    def __init__(self, bundle_or_runner, config: EngineConfig | None = None, *, sink=None,
                 run_id: str = "run", host: str | None = None, clock: str | None = None,
                 tokenizer=None, now_ns=time.monotonic_ns) -> None:
        self.config = cfg = config or EngineConfig()
        self.model_identity = getattr(bundle_or_runner, "identity", None)  # a bundle's; a bare runner has none
        self._owns_runner = not (hasattr(bundle_or_runner, "forward") and hasattr(bundle_or_runner, "copy_block"))
        if not self._owns_runner:
            self.runner = bundle_or_runner
        else:
            self.runner = self._make_runner(bundle_or_runner, cfg)
            tokenizer = tokenizer or bundle_or_runner.tokenizer
        if self.runner.block_size != cfg.block_size:
            raise ValueError(f"runner block_size {self.runner.block_size} != config block_size {cfg.block_size}")
        self.model_config = self.runner.config
        self.tokenizer = tokenizer
        self.max_model_len = min(cfg.max_model_len or 1 << 62, self.model_config.max_position)
        self.eos_ids = list(self.model_config.eos_ids or getattr(tokenizer, "eos_ids", []) or [])
        self.block_manager = BlockManager(self.runner.num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        proposer = PromptLookupProposer(cfg.speculative) if cfg.speculative else None
        self.scheduler = Scheduler(cfg, self.block_manager, proposer)
        self.sampler = Sampler(self.eos_ids)
        self.probe = Probe(sink, "engine", run_id=run_id, host=host, clock=clock, enabled=cfg.probes,
                           now_ns=now_ns)
        self.events = EngineEvents(self.probe, sink, self.block_manager)
        # what the step thread and its intra-op workers got from the scheduler over each step (step.end):
        # host time, so only where the steps are stamped on the host's clock (not the simulated clock's)
        self.compute_threads = ComputeThreads() if self.probe.enabled and now_ns is time.monotonic_ns else None
        self.device_timer = None
        on_cuda = getattr(self.runner, "device", None) is not None and self.runner.device.type == "cuda"
        if self.probe.enabled and on_cuda and cfg.device_timing in (True, "auto"):
            from inferledger.probes.cuda_timer import CudaStepTimer

            self.device_timer = CudaStepTimer(self.probe, sink, device_index=self.runner.device.index or 0,
                                              now_ns=self.probe.now_ns)  # mapped to the engine's own clock
        # where a background step loop (AsyncEngine) runs; applied by place_step_thread() in that thread
        self.cpu_placement = plan_placement(cfg.cpu_threads) if not on_cuda else None
        self.cpu_threads_read_back: int | None = None  # by the step thread, once placed
        compiled = getattr(self.runner, "compiled", None)
        if compiled is not None and self._owns_runner:
            # compiled now, for the step thread's intra-op thread count (inductor builds its kernels for it)
            before = torch.get_num_threads()
            torch.set_num_threads((self.cpu_placement or {}).get("threads") or before)
            try:
                compiled.warm_up()
            finally:
                torch.set_num_threads(before)
        self.requests: dict[str, Request] = {}  # unfinished, by attempt id
        self._inbox: deque = deque()
        self._lock = threading.Lock()
        self.step_id = 0

    @staticmethod
    def _make_runner(bundle, cfg: EngineConfig):
        from .runner import ModelRunner, RunnerOptions

        param = next(bundle.model.parameters())
        device = torch.device(cfg.device) if cfg.device else param.device
        if device.type != param.device.type:
            raise ValueError(f"EngineConfig.device={cfg.device!r} but the model is on {param.device}; "
                             f"load it with load_model(device={cfg.device!r})")
        if device.type == "cuda" and device.index is None:
            device = param.device  # "cuda" is the model's own cuda:N, not whichever device is current later
        dtype = getattr(torch, cfg.dtype) if cfg.dtype else param.dtype
        kv_bytes_per_token = bundle.config.shape.at(dtype).kv_bytes_per_token
        num_blocks = cfg.resolve_num_blocks(kv_bytes_per_token)
        _check_kv_fits(num_blocks * cfg.block_size * kv_bytes_per_token, num_blocks, device)
        compile_, _ = cfg.resolve_compile(device.type, dtype)
        paged, _ = cfg.resolve_attention(device.type, dtype)
        linear, _ = cfg.resolve_linear(device.type, dtype)
        options = RunnerOptions(graph_batch_sizes=cfg.resolve_graph_batch_sizes(device.type), compile=compile_,
                                paged=paged, linear=linear)
        return ModelRunner(bundle.model, bundle.config, num_blocks=num_blocks, block_size=cfg.block_size,
                           device=device, dtype=dtype, options=options)

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams | None = None, *,
                    request_id: str, attempt_id: str | None = None, task_id: str | None = None,
                    session_id: str | None = None) -> str:
        """Queue a request; returns its attempt id. Raises ValueError for a request the engine
        can never serve (empty prompt, unknown token ids, too long for the model or the KV cache)."""
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_token_ids]
        self.validate(prompt, params)
        seq = Sequence(prompt, params, request_id=str(request_id), attempt_id=attempt_id,
                       task_id=task_id, session_id=session_id)
        req = Request(seq)
        with self._lock:  # emitting under the lock: the step thread cannot schedule it first
            if seq.attempt_id in self.requests:
                raise ValueError(f"attempt_id {seq.attempt_id!r} is already running; give each attempt its own id")
            self.requests[seq.attempt_id] = req
            self.events.request(seq, "engine.enqueued", value=len(prompt), max_tokens=params.max_tokens, n=params.n)
            self._inbox.append(("add", req))
        return seq.attempt_id

    def validate(self, prompt_token_ids: list[int], params: SamplingParams | None = None) -> None:
        """Raise the ValueError add_request would raise (a front end answers 400 before streaming)."""
        validate_request(list(prompt_token_ids), params or SamplingParams(), vocab_size=self.model_config.shape.vocab,
                         max_model_len=self.max_model_len, config=self.config, block_manager=self.block_manager)

    def abort(self, attempt_or_request_id: str) -> bool:
        """Cancel by attempt id (or every unfinished attempt of a request id). Output stops at once;
        the request leaves and its blocks are released at the next iteration boundary."""
        with self._lock:
            req = self.requests.get(attempt_or_request_id)
            reqs = [req] if req else [r for r in self.requests.values() if r.seq.request_id == attempt_or_request_id]
            reqs = [r for r in reqs if not r.finished and not r.abort_requested]
            for r in reqs:
                r.abort_requested = True
                self.events.request(r.seq, "engine.cancel_received")
                self._inbox.append(("abort", r))
        return bool(reqs)

    def has_unfinished(self) -> bool:
        return bool(self._inbox or self.requests or self.scheduler.has_unfinished())

    def check_integrity(self) -> bool:
        return self.block_manager.check_integrity()

    # -- one iteration ----------------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        deltas: list[RequestDelta] = []
        self._drain_inbox(deltas)
        out = self.scheduler.schedule()
        for p in out.preempted:
            req = self.requests[p.seq.attempt_id]
            self.events.request(p.seq, "engine.preempted", value=p.recompute_tokens, step_id=self.step_id + 1,
                                recompute_tokens=p.recompute_tokens, blocks=len(p.freed_blocks))
            req.dropped_blocks.update(p.freed_blocks)
            self._maybe_release(req, "preempted")
        if out.is_empty and self.scheduler.waiting and not self.scheduler.running:
            # nothing runs and the head cannot be admitted: a scheduler bug, not a state to wait in
            self._finish_request(self.requests[self.scheduler.waiting[0].attempt_id], "error", deltas)
        if out.is_empty:
            if out.preempted or deltas:
                self.events.kv_samples()
            return deltas
        self.step_id += 1
        step_id = self.step_id
        self.events.step_start(step_id, out, self.config.max_num_batched_tokens,
                               len(self.scheduler.running), len(self.scheduler.waiting))
        threads = self.compute_threads
        if threads is not None:  # after step.start's stamp: the window lies inside the step
            threads.begin(torch.get_num_threads())
        chunks = []
        for item in out.scheduled:
            self.events.scheduled(item, step_id)
            for src, dst in item.copies:
                self.runner.copy_block(src, dst)
            chunks.append(self._chunk(item))
        timer = self.device_timer
        try:
            if timer is not None:
                timer.start(step_id)
            logits = self.runner.forward(chunks)
            mode = self._step_mode(out)
            if timer is not None:
                timer.end(step_id, **mode)
            # one argmax for the whole batch's greedy rows (after the step's end event); sampled rows take none
            self.sampler.prepare([lg if item.seq.params.greedy else None for item, lg in zip(out.scheduled, logits)])
            # and one kernel call for the sampled rows that need nothing but their temperature
            self.sampler.prepare_draws([None if item.seq.params.greedy else lg for item, lg in zip(out.scheduled, logits)],
                                       [item.seq for item in out.scheduled])
            for item, lg in zip(out.scheduled, logits):
                self._postprocess(item, lg, step_id, deltas)
        except Exception as exc:  # the batch cannot be trusted: finish its requests as errors
            for item in out.scheduled:
                req = self.requests.get(item.seq.attempt_id)
                if req is not None and not req.finished:
                    self._finish_request(req, "error", deltas)
            self.events.step_end(step_id, out, error=repr(exc), sched=threads and threads.end())
            self.events.kv_samples()
            raise EngineStepError(exc, deltas) from exc
        self.events.step_end(step_id, out, sched=threads and threads.end(), **mode)
        self.events.kv_samples()
        if timer is not None:
            timer.poll()
        return deltas

    def _step_mode(self, out) -> dict:
        """How the runner ran the step: eager, padded (CPU) or graph (CUDA), and the tokens it ran
        including padding rows."""
        last = getattr(self.runner, "last_step", None) or {}
        padded = max(out.num_batched_tokens, last.get("padded_batch") or 0)
        return {"mode": last.get("mode", "eager"), "padded_tokens": padded}

    def _compile_manifest(self) -> dict:
        """Whether the CPU step is compiled, why, what it cost and where its cache lives."""
        device = getattr(self.runner, "device", None)
        on, why = self.config.resolve_compile(device.type if device is not None else "cpu",
                                              getattr(self.runner, "dtype", None))
        compiled = getattr(self.runner, "compiled", None)
        if compiled is None:
            return {"on": False, "resolved_by": why}
        from .compiled_step import cache_dir

        return {"on": compiled.enabled, "resolved_by": why,
                "warm_up_s": None if compiled.warm_up_s is None else round(compiled.warm_up_s, 3),
                "steps_compiled": compiled.steps, "disabled_reason": compiled.disabled_reason,
                "cache_dir": str(cache_dir())}

    def _attention_manifest(self) -> dict:
        """How attention reads the paged KV cache (the paged kernel or a gather), and why."""
        from .cpu_kernels import build_seconds

        device = getattr(self.runner, "device", None)
        _, why = self.config.resolve_attention(device.type if device is not None else "cpu",
                                               getattr(self.runner, "dtype", None))  # the kernel loads once per process
        paged = bool(getattr(self.runner, "paged", False))
        return {"kernel": "paged" if paged else "gather", "resolved_by": why,
                "build_s": build_seconds() if paged else None}

    def _linear_manifest(self) -> dict:
        """How the step's linears run ("onednn", "kernels" or "torch", engine/cpu_linear.py), and why."""
        device = getattr(self.runner, "device", None)
        _, why = self.config.resolve_linear(device.type if device is not None else "cpu", getattr(self.runner, "dtype", None))
        return {"kernel": getattr(self.runner, "linear", None), "resolved_by": why}

    def manifest(self) -> dict:
        """What a run manifest needs from the engine (docs/ARCHITECTURE.md "The run directory"): the model's identity (file, sha256,
        architecture, dtypes, tokenizer, KV bytes per token) and the engine configuration as declared
        and as resolved on this device (blocks, graph buckets, device timing)."""
        runner = self.runner
        graphs = tuple(getattr(runner, "graph_batch_sizes", ()) or ())
        device = getattr(runner, "device", None)
        resolved = {"device": str(device) if device is not None else None,
                    "dtype": str(getattr(runner, "dtype", "")).removeprefix("torch.") or None,
                    "num_blocks": runner.num_blocks, "max_model_len": self.max_model_len,
                    "graph_batch_sizes": list(graphs),
                    "graph_mode": ("cuda graphs" if device is not None and device.type == "cuda" else "padded, eager")
                    if graphs else "eager",
                    "device_timing": self.device_timer is not None,
                    "compile": self._compile_manifest(),
                    "attention": self._attention_manifest(),
                    "linear": self._linear_manifest(),
                    "sampler": self.sampler.manifest(),
                    "cpu_placement": self.cpu_placement and {
                        **self.cpu_placement, "applies_to": "the background step thread (AsyncEngine)",
                        "threads_read_back": self.cpu_threads_read_back}}
        out = {"engine_config": {**self.config.to_dict(), "resolved": resolved}}
        if self.model_identity is not None:
            out["model"] = self.model_identity
        if self.device_timer is not None:  # the device's UUID, and the clock drift once closed
            out["device_clock"] = self.device_timer.summary()
        return out

    def place_step_thread(self) -> int | None:
        """Called by the thread that will run step() behind a front end: takes the intra-op threads
        (and CPUs, when pinned) planned for it by EngineConfig.cpu_threads, leaving the rest to the
        front end and the client. Returns the thread count it reads back (None: nothing planned)."""
        got = place_current_thread(self.cpu_placement)
        self.cpu_threads_read_back = got if got is not None else self.cpu_threads_read_back
        return got

    def close(self) -> None:
        """Finish the device timer (its last device.step events, the cuda-to-host clock mapping),
        then free the runner this engine made (graphs, KV cache) now rather than at a later GC."""
        if self.device_timer is not None:
            self.device_timer.close()
        if self.compute_threads is not None:
            self.compute_threads.close()
        if self._owns_runner and hasattr(self.runner, "close"):
            self.runner.close()

    def _drain_inbox(self, deltas: list[RequestDelta]) -> None:
        with self._lock:
            items, self._inbox = list(self._inbox), deque()
        for kind, req in items:
            if kind == "add":
                if not req.finished:
                    self.scheduler.add(req.seq)
            elif not req.finished:
                self.events.request(req.seq, "engine.cancel_effective", step_id=self.step_id)
                self._finish_request(req, "cancelled", deltas)

    @staticmethod
    def _chunk(item: ScheduledSeq):
        from .runner import SeqChunk

        seq, drafts = item.seq, item.draft_token_ids
        real = item.num_tokens - len(drafts)
        ids = seq.token_ids[item.start_pos:item.start_pos + real] + drafts
        logits = "all" if drafts else ("last" if item.samples else "none")
        return SeqChunk(ids, item.start_pos, list(seq.block_table), logits)

    def _postprocess(self, item: ScheduledSeq, logits, step_id: int, deltas) -> None:
        seq = item.seq
        req = self.requests[seq.attempt_id]
        if req.last_step != step_id:
            req.forward_passes, req.last_step = req.forward_passes + 1, step_id
        seq.forward_passes += 1
        if item.kind == "prefill":
            real = item.num_tokens
            seq.mark_computed(item.start_pos, real)
            seq.num_computed_prompt_tokens += real
            self.events.request(seq, "engine.prefill", value=real, step_id=step_id, start_pos=item.start_pos,
                                cached_tokens=item.cached_tokens, recompute=seq.preemptions > 0)
        if req.abort_requested or not item.samples:
            self.block_manager.cache_full_blocks(seq)
            return  # cancelled: the in-flight result is suppressed
        children = self.scheduler.fork(seq) if seq.pending_forks else []
        req.seqs += children
        self._commit(seq, req, item, logits, step_id, deltas)
        for child in children:
            self._commit(child, req, item, logits, step_id, deltas)

    def _commit(self, seq: Sequence, req: Request, item: ScheduledSeq, logits, step_id, deltas) -> None:
        drafts = item.draft_token_ids
        if drafts:
            tokens, accepted = verify(self.sampler, seq, logits, drafts)
            seq.mark_computed(item.start_pos, 1 + accepted)
        else:
            tokens, accepted = [self.sampler.sample(logits, seq)], 0
            if item.kind != "prefill":
                seq.mark_computed(item.start_pos, 1)
        committed, reason = commit_tokens(seq, tokens, self.tokenizer, self.eos_ids)
        self.block_manager.cache_full_blocks(seq)
        seq.decode_steps += 1
        self.events.request(seq, "engine.token", value=len(committed), step_id=step_id, choice=seq.sample_index)
        if drafts:
            seq.spec_rounds += 1
            seq.drafted_tokens += len(drafts)
            seq.accepted_tokens += accepted
            self.events.request(seq, "spec.round", value=len(committed), step_id=step_id, drafted=len(drafts),
                                accepted=accepted, forward_passes=1, index=seq.sample_index)
            if not reason:
                req.dropped_blocks.update(self.block_manager.trim(seq, seq.num_tokens))
        if reason:
            self._finish_seq(seq, req, reason)
        deltas.append(make_delta(seq, committed))
        if reason and all(s.is_finished for s in req.seqs):
            self._finish_request(req, reason, deltas)

    # -- leaving ----------------------------------------------------------------------------------
    def _finish_seq(self, seq: Sequence, req: Request, reason: str) -> None:
        flush_text(seq, reason)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        req.dropped_blocks.update(self.scheduler.remove(seq))
        self._maybe_release(req, reason)

    def _maybe_release(self, req: Request, reason: str, final: bool = False) -> None:
        """kv.release once no sequence of the request holds a block; kv.free right after: the
        step that used them is over (CPU execution is synchronous). A request that never held a
        block gets an empty pair when it finishes, as evidence that it holds nothing."""
        if req.holds_blocks or not (req.dropped_blocks or (final and not req.ever_released)):
            return
        blocks, req.dropped_blocks = sorted(req.dropped_blocks), set()
        req.ever_released = True
        self.events.release(req.seq, blocks, reason, self.step_id)

    def _finish_request(self, req: Request, reason: str, deltas: list[RequestDelta]) -> None:
        """Finish every unfinished sample (cancel / error), then the request itself."""
        for seq in req.seqs:
            if not seq.is_finished:
                self._finish_seq(seq, req, reason)
                deltas.append(make_delta(seq, []))
        self._maybe_release(req, reason, final=True)
        req.finished = True
        with self._lock:
            self.requests.pop(req.seq.attempt_id, None)
        n_out = sum(s.num_output_tokens for s in req.seqs)
        reason = "cancelled" if req.abort_requested else reason
        self.events.request(req.seq, "engine.finished", value=n_out, step_id=self.step_id, reason=reason,
                            reasons=[s.finish_reason for s in req.seqs])
        if deltas and deltas[-1].attempt_id == req.seq.attempt_id:
            deltas[-1].request_finished = True
            deltas[-1].output = req.to_output()


def _available_bytes(device: torch.device) -> int | None:
    """Memory the KV cache could take on `device` now: the GPU's free memory, or the host's available
    memory (/proc/meminfo MemAvailable); None where neither can be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_kv_fits(kv_bytes: int, num_blocks: int, device: torch.device, available: int | None = None) -> None:
    """A KV pool larger than the memory there is to hold it is refused before it is allocated (an
    allocation that fails, or one the kernel grants and then kills the process for, loses the run)."""
    available = _available_bytes(device) if available is None else available
    if available is not None and kv_bytes > available:
        raise ValueError(f"num_blocks={num_blocks}: the KV cache would take {kv_bytes / 2**30:.3g} GiB but "
                         f"{available / 2**30:.3g} GiB is available on {device}; give fewer blocks "
                         f"(--num-gpu-blocks-override) or a smaller kv_cache_bytes")

