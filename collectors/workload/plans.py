"""Task plans: what the load client runs for each task (ids, the class dealt to it, its requests and
prompts, its contract and the faults injected into it), deterministic from the workload."""
from __future__ import annotations

from dataclasses import dataclass

from .prompts import PromptBuilder
from .schema import TaskClass
from .tasks import Question
from .trace_plans import trace_tasks


@dataclass
class RequestPlan:
    request_id: str
    question: Question
    user: str  # the user message of this request (turn)
    system: str | None = None  # the system message (filler and shared prefix), None: the template's default
    prompt_tokens: int | None = None  # exact for the first request (each branch) when built with a tokenizer


@dataclass
class TaskPlan:
    index: int
    task_id: str
    cls: TaskClass
    session_id: str | None
    requests: list[RequestPlan]
    deadline_ms: float
    on_missing: str
    max_attempts: int
    cancel_after_tokens: int | None = None
    cancel_after_ms: float | None = None
    first_timeout_ms: float | None = None  # injected: the first attempt of R1 times out sooner
    abandon: bool = False  # timeouts leave the connection open (ghost load) instead of closing it

    @property
    def required(self) -> list[str]:
        return [r.request_id for r in self.requests]

    def contract(self) -> dict:
        return {"deadline_ms": self.deadline_ms, "required": self.required, "on_missing": self.on_missing,
                "max_attempts": self.max_attempts}


def class_sequence(classes: list[TaskClass], n_tasks: int) -> list[TaskClass]:
    """Classes in task order by smooth weighted round robin: exact proportions, evenly spread."""
    current = [0.0] * len(classes)
    total = sum(c.weight for c in classes)
    out = []
    for _ in range(n_tasks):
        for i, c in enumerate(classes):
            current[i] += c.weight
        best = max(range(len(classes)), key=lambda i: current[i])
        current[best] -= total
        out.append(classes[best])
    return out


def build_plans(wl, tokenizer=None, context_tokens: int | None = None) -> list[TaskPlan]:  # wl: a load.Workload
    """Every task's plan: ids, contract, prompts (built to exact token counts with `tokenizer`); a
    trace's rows are fitted to `context_tokens`, the served model's context, when it is known.
    (`wl` is not annotated with its class: load.py imports this module.)"""
    if wl.needs_tokenizer and tokenizer is None:
        raise ValueError(f"workload {wl.name}: prompt_tokens / shared_prefix_tokens / a trace need the model's "
                         f"tokenizer")
    inject = wl.inject

    def chosen(what: str, i: int) -> bool:  # [inject] <what>_every = N (i % N == 0) or <what>_tasks = [i, ...]
        every = getattr(inject, f"{what}_every")
        return bool(every) and i % every == 0 or i in getattr(inject, f"{what}_tasks")

    cancel_after_tokens = inject.cancel_after_tokens
    if cancel_after_tokens is None and inject.cancel_after_ms is None:
        cancel_after_tokens = 4  # the documented default of a cancellation without a trigger
    if wl.trace is not None:
        tasks = [(c, [(q, system, n)]) for c, q, system, n in trace_tasks(wl, tokenizer, context_tokens)]
    else:
        tasks = _class_tasks(wl, tokenizer)
    plans = []
    for i, (c, parts) in enumerate(tasks, 1):
        tid = f"T{i - 1:04d}"
        reqs = [RequestPlan(f"{tid}:R{k + 1}", q, q.prompt, system, n) for k, (q, system, n) in enumerate(parts)]
        cancel = chosen("cancel", i)
        plans.append(TaskPlan(
            index=i, task_id=tid, cls=c, session_id=f"{tid}:S" if c.shape == "session" else None,
            requests=reqs, deadline_ms=c.deadline_ms if c.deadline_ms is not None else wl.deadline_ms,
            on_missing=c.on_missing or wl.on_missing, max_attempts=wl.max_attempts,
            cancel_after_tokens=cancel_after_tokens if cancel else None,
            cancel_after_ms=inject.cancel_after_ms if cancel else None,
            first_timeout_ms=inject.timeout_ms if chosen("timeout", i) else None,
            abandon=wl.on_timeout == "abandon" or chosen("abandon", i)))
    return plans


def _class_tasks(wl, tokenizer) -> list[tuple[TaskClass, list[tuple[Question, str | None, int | None]]]]:
    """(class, [(question, system message, exact prompt tokens)] of each request) of each task of the mix."""
    builders: dict[str, PromptBuilder] = {}
    out, q = [], 0
    for i, c in enumerate(class_sequence(wl.classes, wl.n_tasks), 1):
        tid = f"T{i - 1:04d}"
        n_req = c.turns if c.shape == "session" else c.branches if c.shape == "parallel" else 1
        qs = [wl.questions[(q + k) % len(wl.questions)] for k in range(n_req)]
        q += n_req
        systems, counts = [None] * n_req, [None] * n_req
        if tokenizer is not None and (c.prompt_tokens or c.shared_prefix_tokens):
            b = builders.setdefault(c.name, PromptBuilder(tokenizer, wl.seed, c))
            # a session keeps its first turn's system message; each branch has its own
            for k in (range(n_req) if c.shape == "parallel" else range(1)):
                systems[k], counts[k] = b.request(qs[k].prompt, f"{tid}:{k}")
            if c.shape == "session":
                systems = [systems[0]] * n_req
        out.append((c, list(zip(qs, systems, counts))))
    return out
