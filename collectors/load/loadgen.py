"""The load client: open- or closed-loop arrivals, tasks of one call, session turns or parallel branches,
simulated tool calls, client timeouts, retries with backoff and jitter, injected cancellations, a checker.

It records the client's side of every task and attempt on its own monotonic clock through a `Probe`
(`arrival.planned`, `task.*`, `attempt.*`, `tool.*`, `verdict`; docs/CAPTURE.md), whatever carries the
requests: a `Transport` turns one attempt into a stream of `Chunk`s (HTTP in `http_transport`, the
in-process engine in `collectors/load/in_process.py`). A timeout or cancellation closes the stream (or, with
`on_timeout = "abandon"`, stops listening while the connection drains); what the server does then is
the server's own evidence, never inferred here. The workload format and task plans live in
the `collectors/workload` package.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Protocol

from inferledger.collectors.workload import Question, RequestPlan, TaskPlan, Workload
from inferledger.probes.probe import EventIds, Probe
from inferledger.probes.quantile import quantile
from inferledger.probes.schedstat import ThreadUsage

RETRYABLE_STATUS = (429, 500, 502, 503, 504)  # and transport failures (no status)
OUTPUT_KINDS = ("content", "reasoning", "tool_call")


@dataclass
class Chunk:
    kinds: list[str]
    text: str = ""
    tokens: int | None = None  # what the server says the chunk carries; None when it does not say
    finish_reason: str | None = None
    usage: dict | None = None
    choice: int | None = None  # the choice index when the event carries one choice (n > 1 accounting)
    metrics: dict | None = None  # the server's own per-request metrics (vLLM --enable-per-request-metrics)
    # llama.cpp's per-response durations: {"timings": {...}, "system_fingerprint": "<build>"} as received
    timings: dict | None = None


class TransportError(Exception):
    """A failure below HTTP (connect, reset, truncated stream): retryable, no status."""

    status = None
    retryable = True


class Transport(Protocol):
    def stream(self, messages: list[dict], params: dict, *, ids: dict, on_sent: Callable[[], None] | None = None,
               on_first_byte: Callable[[], None] | None = None) -> AsyncIterator[Chunk]:
        """One attempt's stream events. `ids` holds task_id, session_id, request_id, attempt_id; the
        transport calls on_sent() when the request is handed to the socket and on_first_byte() when the
        response starts arriving."""


def check_answer(q: Question, text: str) -> bool:
    if q.match == "exact":
        norm = lambda s: s.strip().rstrip(".!").strip().casefold()
        return norm(text) == norm(q.answer)
    return re.search(q.answer, text, re.IGNORECASE) is not None


def _summary(values: list[float]) -> dict:
    """n, mean, p50, p99 (the project's one quantile rule) and max, in ms to the µs; only n when empty."""
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": round(statistics.fmean(values), 3), "p50": round(quantile(values, 0.5), 3),
            "p99": round(quantile(values, 0.99), 3), "max": round(max(values), 3)}


@dataclass
class LoadResult:
    tasks: int = 0
    attempts: int = 0
    completed: int = 0
    timeouts: int = 0
    cancelled: int = 0
    errors: int = 0
    correct: int = 0
    retries: int = 0
    abandoned: int = 0  # timed-out attempts left draining (ghost load on the server unless it notices)
    late_chunks: int = 0  # stream events that arrived on abandoned attempts after their timeout (discarded)
    tool_calls: int = 0
    max_in_flight: int = 0  # tasks in flight at once
    pacing: dict = field(default_factory=lambda: {"arrival": [], "retry": [], "turn": []})
    # the event loop's thread over the run: on-CPU and run-queue wait (probes/schedstat.py ThreadUsage.summary)
    thread: dict = field(default_factory=dict)

    def counts(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("pacing", "thread")}

    def pacing_summary(self) -> dict:
        """Send time minus planned time (ms) per kind of plan: the client's own scheduling error."""
        return {k: _summary(v) for k, v in self.pacing.items()}


@dataclass
class _Att:
    planned_ns: int
    plan_kind: str
    sent_ns: int | None = None
    first_byte: bool = False
    text: list = field(default_factory=list)
    tokens: int = 0
    tokens_known: bool = False
    output_chunks: int = 0
    finish: str | None = None
    usage: dict | None = None
    server_metrics: dict | None = None
    server_timings: dict | None = None
    cancelled: bool = False
    abandoned: bool = False
    late_chunks: int = 0


@dataclass(frozen=True)
class _Try:
    """One attempt of a request as `_request` plans it."""
    index: int  # 1 for the first attempt
    timeout_ms: float
    cancel_after_tokens: int | None  # an injected cancellation (first attempt of the task's last request)
    cancel_after_ms: float | None
    planned_ns: int  # when it should be sent
    kind: str  # arrival | turn | retry


@dataclass
class _Req:
    status: str  # completed, timeout, cancelled, error, gave_up
    text: str | None = None
    retry_after_s: float | None = None  # the server asked to wait this long before a retry


def request_params(plan: TaskPlan, w: Workload) -> dict:
    """The sampling parameters a task's requests are sent with (its class's, else the workload's)."""
    c = plan.cls
    params = {"max_tokens": c.max_tokens or w.max_tokens, "temperature": w.temperature}
    if c.ignore_eos if c.ignore_eos is not None else w.ignore_eos:
        params["ignore_eos"] = True
    return params


def _timings_attrs(received: dict) -> dict:
    """`attempt.done` attributes of a server's per-response timings (llama.cpp), kept as received."""
    out = {"server_timings": received["timings"], "server_timings_evidence": "reported"}
    if received.get("system_fingerprint") is not None:
        out["server_fingerprint"] = received["system_fingerprint"]
    return out


def first_messages(req: RequestPlan) -> list[dict]:
    """A task's first request's messages (the system message, when the plan has one, and the user's)."""
    return ([{"role": "system", "content": req.system}] if req.system is not None else []) + \
        [{"role": "user", "content": req.user}]


class LoadClient:
    def __init__(self, workload: Workload, transport: Transport, probe: Probe, *, plans: list[TaskPlan] | None = None,
                 tokenizer=None, on_task_done=None) -> None:
        self.w = workload
        self.plans = plans if plans is not None else workload.plan(tokenizer)
        self.transport = transport
        self.probe = probe
        kw = dict(run_id=probe.run_id, host=probe.host, clock=probe.clock, enabled=probe.enabled, now_ns=probe.now_ns)
        self.checker = Probe(probe.sink, "checker", **kw)
        self.tool = Probe(probe.sink, "tool", **kw)
        self.now = probe.now_ns
        self.rng = random.Random(f"{workload.seed}:client")
        self.result = LoadResult()
        self.on_task_done = on_task_done
        self._in_flight = 0
        self._draining: set[asyncio.Task] = set()
        # on_idle(next planned arrival ns or None): awaited when no task is in flight (open loop only)
        self.on_idle = None
        self._planned: list[int] = []
        self._idle: asyncio.Task | None = None

    @property
    def in_flight(self) -> int:
        """Tasks started and not yet ended."""
        return self._in_flight

    # ---- arrivals ----------------------------------------------------------------------------------
    async def _sleep_until(self, t_ns: int) -> None:
        delay = (t_ns - self.now()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)

    async def run(self) -> LoadResult:
        usage = ThreadUsage().start()  # this loop's thread: held back by others (run-queue wait) or busy itself
        try:
            await self._run()
        finally:
            usage.stop()
            self.result.thread = usage.summary()
        return self.result

    async def _run(self) -> None:
        start = self.now()
        offsets = self.w.arrival_offsets()
        if offsets is None:  # closed loop: N workers, each starts its next task when its last one ends
            todo = iter(self.plans)

            async def worker() -> None:
                planned = start
                for plan in todo:
                    await self._sleep_until(planned)
                    await self._task(plan, planned)
                    planned = self.now() + int(self.w.think_ms * 1e6)

            await asyncio.gather(*(worker() for _ in range(self.w.concurrency)))
        else:
            cap = asyncio.Semaphore(self.w.max_concurrency) if self.w.max_concurrency else None

            async def arrive(plan: TaskPlan, planned: int) -> None:
                await self._sleep_until(planned)
                if cap is None:
                    await self._task(plan, planned)
                    return
                async with cap:  # a task past the cap starts late; its pacing error shows by how much
                    await self._task(plan, planned)

            self._planned = sorted(start + round(off * 1e9) for off in offsets[:len(self.plans)])
            await asyncio.gather(*(arrive(p, start + round(off * 1e9)) for p, off in zip(self.plans, offsets)))
        if self._idle is not None:
            await self._idle
        await self._drain()

    async def _drain(self) -> None:
        """Abandoned streams read to their end (bounded by drain_s), so the server finishes its work."""
        if self._draining:
            _, pending = await asyncio.wait(set(self._draining), timeout=self.w.drain_s)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # ---- tasks ---------------------------------------------------------------------------------
    async def _task(self, plan: TaskPlan, planned_ns: int) -> None:
        p, c = self.probe, plan.cls
        tids = EventIds(plan.task_id, plan.session_id)
        self._in_flight += 1
        self.result.max_in_flight = max(self.result.max_in_flight, self._in_flight)
        self.result.tasks += 1
        p.emit("arrival.planned", tids, ts_ns=planned_ns, process=self.w.process)
        expected = plan.requests[0].question.answer if len(plan.requests) == 1 else \
            json.dumps({r.request_id: r.question.answer for r in plan.requests})
        p.emit("task.start", tids, **plan.contract(), expected=expected, shape=c.shape, task_class=c.name)
        if hasattr(p.sink, "task"):
            p.sink.task(plan.task_id, expected=expected, contract={**plan.contract(), "shape": c.shape,
                                                                   "task_class": c.name}, **plan.contract())
        deadline_ns = planned_ns + int(plan.deadline_ms * 1e6)
        system = lambda r: [{"role": "system", "content": r.system}] if r.system is not None else []
        results: list[_Req] = []
        try:
            if c.shape == "parallel":
                results = list(await asyncio.gather(*(
                    self._request(plan, r, system(r) + [{"role": "user", "content": r.user}], planned_ns, "arrival",
                                  deadline_ns) for r in plan.requests)))
            else:
                history, planned, kind = system(plan.requests[0]), planned_ns, "arrival"
                for k, r in enumerate(plan.requests, 1):
                    if k > 1 and c.tool_ms and k in c.tool_before:
                        await self._tool(plan, k, after=plan.requests[k - 2].request_id, before=r.request_id)
                        planned = self.now()
                    messages = history + [{"role": "user", "content": r.user}]
                    res = await self._request(plan, r, messages, planned, kind, deadline_ns)
                    results.append(res)
                    if res.status != "completed":
                        break  # no answer to carry into the next turn: the session stops here
                    history = messages + [{"role": "assistant", "content": res.text}]
                    planned, kind = self.now(), "turn"
        finally:
            p.emit("task.end", tids, requests_planned=len(plan.requests),
                   requests_completed=sum(r.status == "completed" for r in results),
                   gave_up=[r.request_id for r, s in zip(plan.requests, results) if s.status == "gave_up"])
            self._in_flight -= 1
            if self.on_task_done:
                self.on_task_done()
            if self._in_flight == 0 and not self._draining and self.on_idle and self._planned \
                    and (self._idle is None or self._idle.done()):
                now = self.now()
                self._idle = asyncio.create_task(self.on_idle(next((t for t in self._planned if t > now), None)))

    async def _tool(self, plan: TaskPlan, turn: int, *, after: str, before: str) -> None:
        """A simulated external tool call: the task waits, no model works, the interval is the tool's."""
        ids = EventIds(plan.task_id, plan.session_id)
        call = f"{plan.task_id}:tool{turn}"
        self.tool.emit("tool.start", ids, tool="lookup", call_id=call, planned_ms=plan.cls.tool_ms,
                       after_request=after, before_request=before)
        await asyncio.sleep(plan.cls.tool_ms / 1000)
        self.tool.emit("tool.end", ids, tool="lookup", call_id=call, status="ok")
        self.result.tool_calls += 1

    async def _request(self, plan: TaskPlan, req: RequestPlan, messages: list[dict], planned_ns: int, kind: str,
                       deadline_ns: int) -> _Req:
        c, w = plan.cls, self.w
        params = request_params(plan, w)
        out = _Req("error")
        for k in range(1, plan.max_attempts + 1):
            # injected faults hit first attempts: a timeout the task's first request, a cancellation its
            # last one (the last turn of a session, the last branch), so the other requests still run
            first = k == 1 and req is plan.requests[0]
            timeout = plan.first_timeout_ms if first and plan.first_timeout_ms else (c.timeout_ms or w.timeout_ms)
            cancel = (plan.cancel_after_tokens, plan.cancel_after_ms) if k == 1 and req is plan.requests[-1] \
                else (None, None)
            out = await self._attempt(plan, req, messages, params, _Try(k, timeout, *cancel, planned_ns, kind))
            if out.status not in ("timeout", "retryable") or k == plan.max_attempts:
                break
            backoff_ms = min(w.backoff_max_ms, w.backoff_ms * 2 ** (k - 1)) * (1 + w.jitter * (2 * self.rng.random() - 1))
            if out.retry_after_s is not None:  # never sooner than the server asked (429 / 503 Retry-After)
                backoff_ms = max(backoff_ms, out.retry_after_s * 1000)
            planned_ns, kind = self.now() + int(backoff_ms * 1e6), "retry"
            if w.give_up_after_deadline and planned_ns >= deadline_ns:
                return _Req("gave_up")  # a retry could only finish late: the task's contract is lost already
            self.result.retries += 1
            await self._sleep_until(planned_ns)
        return _Req("error") if out.status == "retryable" else out

    # ---- attempts ------------------------------------------------------------------------------
    async def _attempt(self, plan: TaskPlan, req: RequestPlan, messages, params, attempt: _Try) -> _Req:
        p, k, timeout_ms, kind = self.probe, attempt.index, attempt.timeout_ms, attempt.kind
        ids = EventIds(plan.task_id, plan.session_id, req.request_id, f"{req.request_id}:A{k}")
        cancel_tokens, cancel_ms = attempt.cancel_after_tokens, attempt.cancel_after_ms
        self.result.attempts += 1
        p.emit("attempt.created", ids, attempt_index=k, timeout_ms=timeout_ms, max_tokens=params["max_tokens"],
               prompt_tokens=req.prompt_tokens if len(messages) <= 2 else None, n_messages=len(messages),
               on_timeout="abandon" if plan.abandon else "disconnect",
               **({"cancel_after_tokens": cancel_tokens} if cancel_tokens else {}),
               **({"cancel_after_ms": cancel_ms} if cancel_ms else {}))
        st = _Att(attempt.planned_ns, kind)
        t_created = self.now()

        def on_sent() -> None:
            if st.sent_ns is None:
                st.sent_ns = self.now()
                err = (st.sent_ns - st.planned_ns) / 1e6
                self.result.pacing[st.plan_kind].append(err)
                p.emit("attempt.sent", ids, ts_ns=st.sent_ns, planned=kind, pacing_error_ms=round(err, 4))

        def on_first_byte() -> None:
            if not st.first_byte:
                on_sent()
                st.first_byte = True
                p.emit("attempt.first_byte", ids)

        stream = self.transport.stream(messages, params, ids=ids._asdict(), on_sent=on_sent, on_first_byte=on_first_byte)
        consumer = asyncio.create_task(self._consume(stream, st, ids, cancel_tokens, on_first_byte))
        limit_s = timeout_ms / 1000
        wait_s = min(limit_s, cancel_ms / 1000) if cancel_ms else limit_s
        try:
            await asyncio.wait({consumer}, timeout=wait_s)
        except asyncio.CancelledError:  # the run is stopping (Ctrl-C, SIGTERM): its reader stops with it
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            raise
        if not consumer.done():
            elapsed = (self.now() - t_created) / 1e6
            if cancel_ms and cancel_ms / 1000 <= limit_s:
                p.emit("attempt.cancel", ids, trigger="after_ms", after_ms=round(elapsed, 3),
                       after_chunks=st.output_chunks)
                st.cancelled = True
            else:
                p.emit("attempt.timeout", ids, timeout_ms=timeout_ms, after_chunks=st.output_chunks,
                       on_timeout="abandon" if plan.abandon else "disconnect")
                self.result.timeouts += 1
                if plan.abandon:  # stop listening, leave the connection open: the server may finish
                    st.abandoned = True
                    self.result.abandoned += 1
                    self._draining.add(consumer)
                    consumer.add_done_callback(self._draining.discard)
                    consumer.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, not raised
                    return _Req("timeout")
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            if st.cancelled:
                self.result.cancelled += 1
                return _Req("cancelled")
            return _Req("timeout")
        exc = consumer.exception()
        if exc is not None:
            status = getattr(exc, "status", None)
            retryable = status in RETRYABLE_STATUS or (status is None and getattr(exc, "retryable", False))
            retry_after = getattr(exc, "retry_after_s", None)
            p.emit("attempt.error", ids, error=repr(exc)[:300], status=status, retryable=retryable,
                   **({"retry_after_s": retry_after} if retry_after is not None else {}))
            self.result.errors += 1
            return _Req("retryable" if retryable else "error", retry_after_s=retry_after)
        if st.cancelled:
            self.result.cancelled += 1
            return _Req("cancelled")
        text = "".join(st.text)
        p.emit("attempt.done", ids, finish_reason=st.finish, usage=st.usage, output_chunks=st.output_chunks,
               **({"server_metrics": st.server_metrics, "server_metrics_evidence": "reported"}
                  if st.server_metrics else {}),
               **(_timings_attrs(st.server_timings) if st.server_timings else {}))
        self.result.completed += 1
        correct = check_answer(req.question, text)
        self.result.correct += correct
        self.checker.emit("verdict", ids, correct=correct, checker=req.question.match, kind=req.question.kind,
                          expected=req.question.answer, answer=text[:300])
        return _Req("completed", text)

    async def _consume(self, stream, st: _Att, ids: EventIds, cancel_tokens: int | None, on_first_byte) -> None:
        """Read one attempt's stream; every event is recorded until the client stops listening."""
        p = self.probe
        try:
            async for chunk in stream:
                if st.abandoned:
                    st.late_chunks += 1
                    continue
                on_first_byte()
                extra = {} if chunk.choice is None else {"choice": chunk.choice}
                p.emit("attempt.chunk", ids, value=chunk.tokens, kinds=chunk.kinds, **extra)
                st.text.append(chunk.text)
                if chunk.tokens is not None:
                    st.tokens += chunk.tokens
                    st.tokens_known = True
                if any(k in OUTPUT_KINDS for k in chunk.kinds):
                    st.output_chunks += 1
                st.finish, st.usage = chunk.finish_reason or st.finish, chunk.usage or st.usage
                st.server_metrics = chunk.metrics or st.server_metrics
                st.server_timings = chunk.timings or st.server_timings
                # tokens when the server says how many a chunk holds, else output-bearing chunks (each >= 1 token)
                seen = st.tokens if st.tokens_known else st.output_chunks
                if cancel_tokens is not None and seen >= cancel_tokens and st.finish is None:
                    st.cancelled = True
                    p.emit("attempt.cancel", ids, trigger="after_tokens", after_tokens=seen,
                           counted="tokens" if st.tokens_known else "output chunks", after_chunks=st.output_chunks)
                    return
            if st.finish is None and not st.abandoned:
                raise TransportError("the stream ended without a finish reason")
        finally:
            self.result.late_chunks += st.late_chunks
            await stream.aclose()  # closes the connection when the stream did not finish
