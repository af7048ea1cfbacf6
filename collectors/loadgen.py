"""The load client: open-loop arrivals, client timeouts, retries, injected cancellations, a checker.

It records the client's side of every attempt on its own monotonic clock (`attempt.*`,
`arrival.planned`, `task.*`, `verdict`) through a `Probe`, whatever carries the requests: a
`Transport` turns one attempt into a stream of `Chunk`s (the in-process engine today, HTTP in the
serving issue). A client timeout or cancellation closes the stream; what the server does then is the
server's own evidence, never inferred here.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Protocol

from inferledger.probes.probe import Probe


@dataclass
class Chunk:
    kinds: list[str]
    text: str = ""
    tokens: int | None = None  # what the server says the chunk carries; None when it does not say
    finish_reason: str | None = None
    usage: dict | None = None


class Transport(Protocol):
    def stream(self, prompt: list[dict], params: dict, *, request_id: str, attempt_id: str,
               task_id: str, on_first_byte=None) -> AsyncIterator[Chunk]:
        """One attempt's stream events; calls on_first_byte() when the response starts arriving."""


RETRYABLE_STATUS = (429, 502, 503, 504)  # and connection failures (no status)


@dataclass
class TaskSpec:
    task_id: str
    messages: list[dict]
    answer: str  # a regular expression the answer must match (case-insensitive)
    kind: str = "qa"
    cancel_after_tokens: int | None = None


@dataclass
class Workload:
    name: str
    seed: int
    rate_rps: float
    n_tasks: int
    deadline_ms: float
    timeout_ms: float
    max_attempts: int
    backoff_ms: float
    max_tokens: int
    tasks: list[TaskSpec]
    spec: dict = field(default_factory=dict)
    sha256: str = ""  # of the workload file and its task set: the run's input identity

    @classmethod
    def load(cls, path: str | Path) -> "Workload":
        path = Path(path)
        try:
            spec = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: cannot read workload ({exc})") from exc

        def get(section: str, key: str, default=None):
            value = spec.get(section, {}).get(key, default)
            if value is None:
                raise ValueError(f"{path}: [{section}] {key} is required")
            return value

        taskset = path.parent / get("taskset", "file")
        try:
            lines = taskset.read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"{path}: [taskset] file {taskset} cannot be read ({exc})") from exc
        rows = []
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                    rows.append({"prompt": str(row["prompt"]), "answer": str(row["answer"]), **row})
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{taskset}:{n}: a task needs JSON with prompt and answer ({exc})") from exc
        digest = hashlib.sha256(path.read_bytes() + taskset.read_bytes()).hexdigest()
        n_tasks = int(get("arrivals", "n_tasks"))
        cancel_every = int(spec.get("inject", {}).get("cancel_every", 0))
        cancel_after = int(spec.get("inject", {}).get("cancel_after_tokens", 4))
        tasks = []
        for i in range(n_tasks):
            row = rows[i % len(rows)]
            cancel = cancel_after if cancel_every and (i + 1) % cancel_every == 0 else None
            tasks.append(TaskSpec(f"T{i:04d}", [{"role": "user", "content": row["prompt"]}], row["answer"],
                                  row.get("kind", "qa"), cancel))
        return cls(name=spec.get("name", path.stem), seed=int(spec.get("seed", 0)),
                   rate_rps=float(get("arrivals", "rate_rps")), n_tasks=n_tasks,
                   deadline_ms=float(get("contract", "deadline_ms")),
                   timeout_ms=float(get("client", "timeout_ms")),
                   max_attempts=int(get("client", "max_attempts", 1)),
                   backoff_ms=float(get("client", "backoff_ms", 100)),
                   max_tokens=int(get("generation", "max_tokens")), tasks=tasks, spec=spec, sha256=digest)


@dataclass
class LoadResult:
    tasks: int = 0
    attempts: int = 0
    completed: int = 0
    timeouts: int = 0
    cancelled: int = 0
    errors: int = 0
    correct: int = 0


class LoadClient:
    def __init__(self, workload: Workload, transport: Transport, probe: Probe, *, on_task_done=None) -> None:
        self.w = workload
        self.transport = transport
        self.probe = probe
        self.checker = Probe(probe.sink, "checker", run_id=probe.run_id, host=probe.host, clock=probe.clock,
                             enabled=probe.enabled)
        self.rng = random.Random(workload.seed)
        self.result = LoadResult()
        self.on_task_done = on_task_done

    async def run(self) -> LoadResult:
        start = time.monotonic_ns()
        offsets, t = [], 0.0
        for _ in self.w.tasks:  # Poisson arrivals: exponential gaps, fixed by the seed
            offsets.append(t)
            t += self.rng.expovariate(self.w.rate_rps)
        jobs = [asyncio.create_task(self._task(spec, start + int(off * 1e9)))
                for spec, off in zip(self.w.tasks, offsets)]
        await asyncio.gather(*jobs)
        return self.result

    async def _task(self, spec: TaskSpec, planned_ns: int) -> None:
        p = self.probe
        delay = (planned_ns - time.monotonic_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)
        p.emit("arrival.planned", ts_ns=planned_ns, task_id=spec.task_id)
        p.emit("task.start", task_id=spec.task_id, deadline_ms=self.w.deadline_ms,
               required=[spec.task_id + ":R1"], on_missing="failure", max_attempts=self.w.max_attempts,
               expected=spec.answer)
        self.result.tasks += 1
        rid = spec.task_id + ":R1"
        for attempt in range(1, self.w.max_attempts + 1):
            status = await self._attempt(spec, rid, f"{rid}:A{attempt}")
            if status not in ("timeout", "retryable") or attempt == self.w.max_attempts:
                break
            backoff = self.w.backoff_ms * 2 ** (attempt - 1) * (0.5 + self.rng.random())  # jittered
            await asyncio.sleep(backoff / 1000)
        p.emit("task.end", task_id=spec.task_id)
        if self.on_task_done:
            self.on_task_done()

    async def _attempt(self, spec: TaskSpec, rid: str, aid: str) -> str:
        p, ids = self.probe, {"task_id": spec.task_id, "request_id": rid, "attempt_id": aid}
        self.result.attempts += 1
        p.emit("attempt.created", **ids)
        params = {"max_tokens": self.w.max_tokens, "temperature": 0.0}
        stream = self.transport.stream(spec.messages, params, request_id=rid, attempt_id=aid, task_id=spec.task_id,
                                       on_first_byte=lambda: p.emit("attempt.first_byte", **ids))
        p.emit("attempt.sent", **ids)
        text, tokens, finish, usage = [], 0, None, None
        try:
            async with asyncio.timeout(self.w.timeout_ms / 1000):
                async for chunk in stream:
                    p.emit("attempt.chunk", value=chunk.tokens, kinds=chunk.kinds, **ids)
                    text.append(chunk.text)
                    tokens += chunk.tokens or 0
                    finish, usage = chunk.finish_reason or finish, chunk.usage or usage
                    if spec.cancel_after_tokens is not None and tokens >= spec.cancel_after_tokens:
                        p.emit("attempt.cancel", after_tokens=tokens, **ids)
                        self.result.cancelled += 1
                        return "cancelled"
        except TimeoutError:
            p.emit("attempt.timeout", timeout_ms=self.w.timeout_ms, **ids)
            self.result.timeouts += 1
            return "timeout"
        except Exception as exc:  # transport or HTTP failure: the client's own account, nothing more
            status = getattr(exc, "status", None)
            p.emit("attempt.error", error=repr(exc)[:200], status=status, **ids)
            self.result.errors += 1
            return "retryable" if status in RETRYABLE_STATUS or status is None else "error"
        finally:
            await stream.aclose()  # a disconnect: the server learns of it its own way
        p.emit("attempt.done", finish_reason=finish, usage=usage, **ids)
        self.result.completed += 1
        correct = re.search(spec.answer, "".join(text), re.IGNORECASE) is not None
        self.result.correct += correct
        self.checker.emit("verdict", attempt_id=aid, task_id=spec.task_id, request_id=rid, correct=correct,
               checker="regex", source_text="".join(text)[:200])
        return "completed"
