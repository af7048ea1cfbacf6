"""A simulated run: planned arrivals injected into the real engine at simulated time, written as a run directory.

The driver plans each attempt's arrival (and cancellation, if any) on the `SimClock`; the real
`LLMEngine` (scheduler, block manager, cancellation, event emission unchanged) steps whenever it has
work, its probe reading the simulated clock, its runner a `SimRunner` whose steps last what the step
model says. Actions that fall inside a step run at their own simulated time, as a request reaching a
real engine mid-step lands in its inbox. When the engine is idle the clock jumps to the next action.

The run directory is a normal one: events on the clock `sim:<name>` with `attrs.evidence =
"simulated"`, the engine's KV samples, a declared clock domain of kind `simulated`, a gap row saying
there is no client (so client figures are absent), and a manifest recording the plan, the declared
model shape, the engine configuration and the step model with its parameters. The run is built in a
hidden sibling folder and renamed into place when complete, so a refused plan leaves nothing behind.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from inferledger.collectors.rundir.out_dir import building_run_dir
from inferledger.collectors.rundir.writer import RunWriter, write_table_atomic
from inferledger.engine.llm_engine import LLMEngine
from inferledger.engine.params import EngineConfig, SamplingParams
from inferledger.probes.events import GAP_SCHEMA

from .clock import SimClock
from .declared import QWEN3_8B_BF16, DeclaredModel
from .runner import SimRunner
from .step_time import StepModel

SIM_HOST = "sim"  # the events' host: no machine stamped them
IDLE_LIMIT = 3  # iterations in a row with no step and nothing planned: the engine is stuck, not waiting
MAX_SHARE = 0.9  # a step waits at most this share of its time for a CPU (a longer wait is a stalled host)


class Follows(NamedTuple):
    """An arrival caused by another attempt: `delay_ms` after that attempt's simulated end (`on` = "end": a
    closed loop's next request, a session's next turn) or its simulated arrival (`on` = "arrival": a retry,
    whose timeout counts from its first attempt's send). Its cancellation, if any, moves with it."""
    attempt: str
    delay_ms: float
    on: str = "end"


@dataclass(frozen=True)
class SimRequest:
    """One attempt reaching the engine: a retry is its own SimRequest (the same `request_id`, its own
    `attempt_id` and arrival); `cancel_at_ms` aborts this attempt alone (None: it runs to max_tokens).
    `follows`: the attempt whose simulated end (or arrival) sets this one's arrival instead of `arrival_ms`
    (where that attempt is in the plan)."""
    request_id: str
    arrival_ms: float
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    cancel_at_ms: float | None = None
    attempt_id: str | None = None  # None: the request's only attempt, named by its request_id
    follows: Follows | None = None

    def params(self) -> SamplingParams:
        """What the engine is asked: max_tokens, EOS ignored (the real run's output length is replayed)."""
        return SamplingParams(max_tokens=self.max_tokens, ignore_eos=True)

    @property
    def attempt(self) -> str:
        return self.attempt_id or self.request_id

    def plan_entry(self) -> dict:
        return {"request_id": self.request_id, "attempt_id": self.attempt, "arrival_ms": self.arrival_ms,
                "prompt_tokens": len(self.prompt_token_ids), "max_tokens": self.max_tokens,
                "cancel_at_ms": self.cancel_at_ms,
                "follows": None if self.follows is None else self.follows._asdict(),
                "prompt_sha256": hashlib.sha256(json.dumps(list(self.prompt_token_ids)).encode()).hexdigest()}


@dataclass(frozen=True)
class HostReplay:
    """What a real host added around the engine's steps, replayed from a real run's evidence.

    `first_wake_ms`, `wake_ms`: from the arrival that wakes an idle engine to its next step's start, the
    engine's first wake-up of the run (its loop thread starting) and any later one (the thread's wake-up); the
    arrivals inside that window meet one step, as on the real engine. `contention`: (from_ms, to_ms, share) periods, the share of the real
    steps' wall time spent waiting for a CPU then, each holding until the next starts (the first's before
    it); a simulated step lasts its modelled (uncontended) time / (1 − share), the share averaged over the
    time that modelled step spans. `gap_ms`: the
    real host's time between two steps the engine worked across (None: the step model's own); with a step
    model that tells its work from its gap (`work_ms` / `gap_ms`, as FittedStepModel does), only the work
    waits for a CPU (a measured gap already holds its host's waits)."""
    first_wake_ms: float = 0.0
    wake_ms: float = 0.0
    contention: tuple[tuple[float, float, float], ...] = ()
    gap_ms: float | None = None
    source: str = "none: no host time added"

    def share_at(self, t_ms: float) -> float:
        """The share of the last real step that started at or before t_ms (the first's before it): the host's
        contention as the engine last measured it, held across the real engine's idle gaps."""
        if not self.contention:
            return 0.0
        return self.contention[max(0, bisect.bisect_right(self._starts, t_ms) - 1)][2]

    def share_over(self, t0_ms: float, t1_ms: float) -> float:
        """share_at averaged over [t0_ms, t1_ms] (the time a step takes): each real step's share weighted by
        how much of the window it holds, so a step is not priced by the one real step its start fell in."""
        if not self.contention or t1_ms <= t0_ms:
            return self.share_at(t0_ms)
        starts = self._starts
        i = max(0, bisect.bisect_right(starts, t0_ms) - 1)
        total, t = 0.0, t0_ms
        while t < t1_ms:
            end = min(t1_ms, starts[i + 1]) if i + 1 < len(starts) else t1_ms
            total += (end - t) * self.contention[i][2]
            t, i = end, i + 1
        return total / (t1_ms - t0_ms)

    @functools.cached_property
    def _starts(self) -> list[float]:  # read on every simulated step: built once
        return [c[0] for c in self.contention]

    def describe(self) -> dict:
        busy = sum(c[1] - c[0] for c in self.contention)
        waited = sum((c[1] - c[0]) * c[2] for c in self.contention)
        return {"first_wake_ms": self.first_wake_ms, "wake_ms": self.wake_ms, "gap_ms": self.gap_ms,
                "contention_periods": len(self.contention),
                "contention_share": waited / busy if busy else None, "source": self.source}


class HostStepModel:
    """A step model whose steps also wait for a CPU as the real host's did at the same time, and are as far
    apart as the real host's (HostReplay)."""

    def __init__(self, inner: StepModel, host: HostReplay, now_ns) -> None:
        self.inner, self.host, self.now_ns = inner, host, now_ns
        self.name = inner.name

    def step_ns(self, rows) -> int:
        now = self.now_ns() / 1e6
        if hasattr(self.inner, "work_ms"):  # its work waits, its gap (the real host's where measured) does not
            work = self.inner.work_ms(rows)
            gap = self.inner.gap_ms(rows) if self.host.gap_ms is None else self.host.gap_ms
        else:  # one time for the step: all of it waits
            work, gap = self.inner.step_ns(rows) / 1e6, 0.0
        share = min(self.host.share_over(now, now + work), MAX_SHARE)
        return round((work / (1.0 - share) + gap) * 1e6)

    def describe(self) -> dict:
        return {**self.inner.describe(), "host": self.host.describe()}


def distinct_prompt(index: int, n_tokens: int, vocab_size: int) -> tuple[int, ...]:
    """A prompt of n_tokens ids that shares no leading block with another index's (no prefix-cache hit)."""
    return tuple(1 + (index * 1_000_003 + p * 31) % (vocab_size - 1) for p in range(n_tokens))


@dataclass
class SimResult:
    run_dir: Path
    run_id: str
    clock: str
    end_ms: float
    steps: int
    manifest: dict


class SimulatedSink:
    """The run writer, with every event marked as simulated evidence."""

    def __init__(self, writer: RunWriter) -> None:
        self.writer = writer

    def emit(self, row: dict) -> None:
        attrs = json.loads(row["attrs"])
        attrs["evidence"] = "simulated"
        self.writer.emit({**row, "attrs": json.dumps(attrs, separators=(",", ":"), sort_keys=True)})

    def sample(self, **kw) -> None:
        self.writer.sample(**kw)


def _ns(ms: float) -> int:
    return round(ms * 1e6)


class _Driver:
    """Plans the arrivals and cancellations on the clock (an arrival that follows another attempt when that
    one arrives or ends) and wakes an idle engine as the real host did (HostReplay)."""

    def __init__(self, engine: LLMEngine, clock: SimClock, requests: list[SimRequest], host: HostReplay) -> None:
        self.engine, self.clock, self.host = engine, clock, host
        self.by_id = {r.attempt: r for r in requests}
        self.after: dict[tuple[str, str], list[SimRequest]] = {}
        for r in requests:
            if r.follows is not None and r.follows.attempt in self.by_id:
                self.after.setdefault((r.follows.attempt, r.follows.on), []).append(r)
        self.ended: set[str] = set()
        self.woken = 0

    def plan(self, r: SimRequest, at_ns: int) -> None:
        at_ns = max(at_ns, self.clock.now_ns())
        params = r.params()
        self.clock.at(at_ns, lambda: self._arrive(r, params))
        if r.cancel_at_ms is not None:
            self.clock.at(at_ns + _ns(r.cancel_at_ms - r.arrival_ms), lambda: self.engine.abort(r.attempt))

    def _arrive(self, r: SimRequest, params: SamplingParams) -> None:
        self.engine.add_request(list(r.prompt_token_ids), params, request_id=r.request_id, attempt_id=r.attempt)
        self._release(r.attempt, "arrival")

    def _release(self, attempt: str, on: str) -> None:
        for d in self.after.pop((attempt, on), []):
            self.plan(d, self.clock.now_ns() + _ns(d.follows.delay_ms))

    def finished(self, attempts) -> None:
        for a in attempts:
            if a not in self.ended:
                self.ended.add(a)
                self._release(a, "end")

    def orphans(self) -> None:
        """Arrivals whose cause will never end here (cancelled or refused): planned at their own time."""
        for key in list(self.after):
            for d in self.after.pop(key):
                self.plan(d, _ns(d.arrival_ms))

    def wake(self) -> None:
        """An idle engine that an arrival woke: its next step starts the wake-up later (arrivals meanwhile join)."""
        lag = _ns(self.host.first_wake_ms if self.woken == 0 else self.host.wake_ms)
        self.woken += 1
        if lag > 0:
            self.clock.advance(lag)


def drive(engine: LLMEngine, clock: SimClock, requests: list[SimRequest], host: HostReplay | None = None) -> None:
    """Plan every arrival and cancellation, then step the engine until nothing is left to do."""
    for r in requests:
        try:  # a request the engine would refuse is refused before anything runs, by its id
            engine.validate(list(r.prompt_token_ids), r.params())
        except ValueError as exc:
            raise ValueError(f"request {r.request_id}: {exc}" if r.attempt == r.request_id else
                             f"request {r.request_id} attempt {r.attempt}: {exc}") from None
    driver = _Driver(engine, clock, requests, host or HostReplay())
    for r in requests:
        if r.follows is None or r.follows.attempt not in driver.by_id:
            driver.plan(r, _ns(r.arrival_ms))
    idle = 0
    while engine.has_unfinished() or clock.has_due() or driver.after:
        if not engine.has_unfinished():
            if not clock.has_due():
                driver.orphans()
                continue
            clock.run_next()
            if engine.has_unfinished():
                driver.wake()
            continue
        before = engine.step_id
        deltas = engine.step()
        driver.finished(d.attempt_id for d in deltas if d.request_finished)
        if engine.step_id != before:
            idle = 0
        elif clock.has_due():
            clock.run_next()  # nothing could run now: wait for the next arrival
        else:
            idle += 1
            if idle >= IDLE_LIMIT:
                raise RuntimeError(f"the engine made no progress at simulated {clock.now_ns() / 1e6:.3f} ms with "
                                   "work left and nothing planned (a scheduler that cannot admit its queue)")


def simulate(run_dir: str | Path, requests: list[SimRequest], *, engine_config: EngineConfig,
             step_model: StepModel, model: DeclaredModel = QWEN3_8B_BF16, run_id: str | None = None,
             workload: str = "plan", host: HostReplay | None = None) -> SimResult:
    """Simulate `requests` on the real engine, standing for `model`, into the new run directory `run_dir`;
    `host`: the real host's wake-up, front end and contention to replay around the steps (None: none)."""
    model_config, kv_dtype = model.config, model.kv_dtype
    run_dir = Path(run_dir)
    ids = [r.attempt for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError(f"attempt ids must be distinct (a retry is its own attempt), got {ids}")
    # nothing runs on the host: no thread placement to plan, no device timer to start
    cfg = dataclasses.replace(engine_config, cpu_threads=None, device_timing=False, graph_batch_sizes=None)
    num_blocks = cfg.resolve_num_blocks(model_config.shape.at(kv_dtype).kv_bytes_per_token)
    run_id = run_id or run_dir.name
    clock_id = f"sim:{run_id}"
    clock = SimClock()
    if host is not None and (host.contention or host.gap_ms is not None):
        step_model = HostStepModel(step_model, host, clock.now_ns)
    runner = SimRunner(model_config, num_blocks=num_blocks, block_size=cfg.block_size, clock=clock,
                       step_model=step_model, kv_dtype=kv_dtype)
    with building_run_dir(run_dir) as staging, RunWriter(staging, run_id) as writer:
        engine = LLMEngine(runner, cfg, sink=SimulatedSink(writer), run_id=run_id, host=SIM_HOST, clock=clock_id,
                           now_ns=clock.now_ns)
        drive(engine, clock, requests, host)
        engine.check_integrity()
        writer.clock_domain(clock_id, host=None, kind="simulated")
        plan = [r.plan_entry() for r in requests]
        manifest = {
            "source": "inferledger simulated clock", "state": "complete",
            "simulation": {"clock": clock_id, "step_model": step_model.describe(), "steps": runner.steps,
                           "end_ms": clock.now_ns() / 1e6, "host_replay": (host or HostReplay()).describe(),
                           "host_time": "never read: each step lasts what the step model says"},
            "workload": {"name": workload, "requests": len(plan), "plan": plan,
                         "sha256": hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()},
            "model": model.identity(),
            "system_under_test": {
                "inside": ["the reference engine's scheduler, block manager, cancellation and event emission"],
                "outside": ["model compute (replaced by the step model)", "HTTP front end", "load client"]},
            "host": {"name": SIM_HOST, "simulated_on": platform.node(), "python": platform.python_version()},
            "evidence": {"events": "simulated", "engine_config": "declared", "model": "declared",
                         "step_time": f"simulated ({step_model.name} step model)"},
            **engine.manifest()}
        manifest["model"] = model.identity()
        gap = {"run_id": run_id, "gap_id": "collector:simulated", "scope": "run", "subject_id": None,
               "affects": "ttft_client_ms, e2e_client_ms, tpot_ms, itl_client_max_ms, client_status, good",
               "needs": "a capture on the real engine with the load client (inferledger capture)",
               "detail": "a simulated run injects its arrivals straight into the engine: there is no client "
                         "and no HTTP front end, so no client or server figure exists"}
        write_table_atomic(pa.Table.from_pylist([gap], schema=GAP_SCHEMA), staging / "gaps.parquet")
        writer.flush()  # every part on disk before the manifest says complete
        writer.write_manifest(manifest)
    return SimResult(run_dir, run_id, clock_id, clock.now_ns() / 1e6, runner.steps, manifest)
