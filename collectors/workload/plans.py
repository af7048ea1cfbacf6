"""Task plans: what the load client runs for each task (ids, the class dealt to it, its requests and
prompts, its contract and the faults injected into it), deterministic from the workload."""
from __future__ import annotations

from dataclasses import dataclass

from tokenizers.models import BPE

from .prompts import PromptBuilder
from .schema import TaskClass, requests_per_task
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


def task_questions(wl):  # wl: a load.Workload
    """(task number from 1, its class, the task set's row of each of its requests' questions) of every
    task of the mix, in order: the questions are taken in file order, cycling."""
    q = 0
    for i, c in enumerate(class_sequence(wl.classes, wl.n_tasks), 1):
        n_req = requests_per_task(c)
        yield i, c, [(q + k) % len(wl.questions) for k in range(n_req)]
        q += n_req


def _class_tasks(wl, tokenizer) -> list[tuple[TaskClass, list[tuple[Question, str | None, int | None]]]]:
    """(class, [(question, system message, exact prompt tokens)] of each request) of each task of the mix."""
    builders: dict[str, PromptBuilder] = {}
    out = []
    for i, c, rows in task_questions(wl):
        tid = f"T{i - 1:04d}"
        n_req = len(rows)
        qs = [wl.questions[r] for r in rows]
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


def turn_checks(wl, tokenizer, context: int) -> list[tuple[str, str]]:  # wl: a load.Workload
    """Every turn of every session against the served model's context, counted with `tokenizer` and its
    chat template: turn k's prompt holds the first turn's, each earlier answer and each later question,
    so it is taken at its longest, every earlier answer at its max_tokens (the engine refuses a prompt
    plus max_tokens past its context). A task whose turns all fit by an upper bound of their tokens (the
    rendered text's bytes, `_TurnCounter.bound`) is cleared without counting; the others are counted
    exactly. (key, problem) pairs: per session class, the earliest turn of any task that does not fit."""
    out = []
    for n, c in enumerate(wl.classes):
        if c.shape != "session" or c.turns < 2:
            continue
        budget = c.max_tokens if c.max_tokens is not None else wl.max_tokens
        count = _TurnCounter(tokenizer, wl, c)
        worst = None  # (turn, task number, its prompt tokens, the first turn's) of the earliest turn past the context
        for i, cls, rows in task_questions(wl):
            if cls is not c:
                continue
            turns = len(rows) if worst is None else worst[0] - 1  # a later miss than the earliest known is moot
            if count.bounded and _first_miss(count.first_bound, count.added_bound, rows[:turns], budget,
                                             context) is None:
                continue
            miss = _first_miss(count.first, count.added, rows[:turns], budget, context)
            if miss is not None:
                worst = (*miss[:1], i, *miss[1:])
        if worst is None:
            continue
        k, i, length, first = worst
        total = f"+ max_tokens {budget} = {length + budget} exceeds the model's context of {context} tokens"
        if k == 1:  # a question too long for the context even before any answer
            out.append((f"[[classes]][{n}].turns", f"task T{i - 1:04d}'s turn 1 has {length} prompt tokens (its "
                        f"question in the chat template) {total}"))
        else:
            out.append((f"[[classes]][{n}].turns", f"task T{i - 1:04d}'s turn {k} of {c.turns} reaches {length} "
                        f"prompt tokens (the first turn's {first}, then {k - 1} answer(s) at max_tokens {budget} "
                        f"and the questions in the chat template) {total} (allowed: turns <= {k - 1}, or a smaller "
                        f"max_tokens)"))
    return out


def _first_miss(first, added, rows: list[int], budget: int, context: int) -> tuple[int, int, int] | None:
    """(turn, its prompt tokens, the first turn's) of the first of a task's turns (the task set's `rows`)
    whose prompt plus `budget` passes `context`, its tokens counted by `first` and `added`; None if all fit."""
    length = start = first(rows[0]) if rows else 0
    for k in range(1, len(rows) + 1):
        if k > 1:
            length += budget + added(rows[k - 1])
        if length + budget > context:
            return k, length, start
    return None


class _TurnCounter:
    """Token counts of one session class's turns, each question rendered once: the first turn's
    prompt, and what each later turn adds beside the answer before it (that answer's and the
    question's messages in the chat template)."""

    def __init__(self, tokenizer, wl, c: TaskClass) -> None:
        self.tok, self.wl, self.c = tokenizer, wl, c
        self.system = None
        if c.prompt_tokens is None and c.shared_prefix_tokens:  # the first turn's system message: the prefix
            self.system = PromptBuilder(tokenizer, wl.seed, c).shared
        probe = "x" if c.prompt_tokens or c.shared_prefix_tokens else None  # any system: only the growth counts
        self.head = ([{"role": "system", "content": probe}] if probe is not None else []) + \
            [{"role": "user", "content": "x"}]
        self.head_tokens = self._tokens(self.head)
        self._first: dict[int, int] = {}
        self._added: dict[int, int] = {}
        # A token of a BPE model with no normalizer holds at least one byte of the text (a byte-level
        # alphabet maps each byte to one symbol; a byte fallback spends one token a byte; a special token
        # matches its own text), one more for a prefix a Metaspace split may add: the rendered text's bytes
        # + 1 bound its tokens from above, without running the model's merges.
        backend = getattr(tokenizer, "backend", None)
        self.bounded = backend is not None and backend.normalizer is None and isinstance(backend.model, BPE)

    def _tokens(self, messages: list[dict]) -> int:
        return len(self.tok.encode(self._text(messages), add_special=False))

    def _text(self, messages: list[dict]) -> str:
        return self.tok.apply_chat_template(messages, add_generation_prompt=True)

    def _first_messages(self, row: int) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return system + [{"role": "user", "content": self.wl.questions[row].prompt}]

    def _grown(self, row: int) -> list[dict]:
        return self.head + [{"role": "assistant", "content": ""},
                            {"role": "user", "content": self.wl.questions[row].prompt}]

    def first_bound(self, row: int) -> int:
        """At least `first(row)` (exact when the prompt is built to a count), from the text's bytes."""
        if self.c.prompt_tokens is not None:
            return self.c.prompt_tokens
        return len(self._text(self._first_messages(row)).encode()) + 1

    def added_bound(self, row: int) -> int:
        """At least `added(row)`, from the text's bytes (the head's tokens are counted exactly)."""
        return len(self._text(self._grown(row)).encode()) + 1 - self.head_tokens

    def first(self, row: int) -> int:
        """The first turn's prompt tokens: exact when built (prompt_tokens), else its question's."""
        if self.c.prompt_tokens is not None:
            return self.c.prompt_tokens
        if row not in self._first:
            self._first[row] = self._tokens(self._first_messages(row))
        return self._first[row]

    def added(self, row: int) -> int:
        """The tokens a later turn whose question is row `row` adds, less its previous answer's own."""
        if row not in self._added:
            self._added[row] = self._tokens(self._grown(row)) - self.head_tokens
        return self._added[row]
