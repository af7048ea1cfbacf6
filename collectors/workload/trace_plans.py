"""A trace as the workload's tasks: each row of its window one single call, arriving at the row's trace
time divided by `speed`, whose prompt has exactly the row's input length in the model's tokens and whose
output is bounded by the row's output length; lengths scaled by `token_scale`, fitted to the model's
context, and what was done to the rows counted for the manifest (docs/CAPTURE.md "Real traces as
workloads")."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .schema import MAX_TASKS, TaskClass, Trace
from .trace_prompts import BlockPrompts
from .trace_read import FIELDS, TraceRead, TraceRow, read_trace

if TYPE_CHECKING:
    from .tasks import Question

MAX_LINES = 100  # trace lines listed per kind of change in the manifest (all are counted)


@dataclass
class TraceSource:
    spec: Trace  # the workload's [trace] section
    read: TraceRead
    speed: float  # [arrivals].speed
    summary: dict | None = None  # what planning did to the rows: the manifest's workload.trace

    @classmethod
    def load(cls, spec: Trace, base: Path, speed: float, where: str) -> "TraceSource":
        path = Path(os.path.normpath(base / spec.file))
        try:
            read = read_trace(path, spec.format, skip_rows=spec.skip_rows, max_rows=spec.max_rows,
                              start_s=spec.start_s, end_s=spec.end_s,
                              max_sent=MAX_TASKS if spec.max_rows is None else None)
        except OSError as exc:
            raise ValueError(f"{where}: [trace].file: {path} cannot be read ({exc})") from None
        src = cls(spec, read, speed)
        if not src.sent_rows:
            raise ValueError(f"{path}: every row of the window has 0 output tokens after token_scale = "
                             f"{spec.token_scale}: nothing to send")
        return src

    def scaled(self, tokens: int) -> int:
        """`tokens` times token_scale to the nearest whole token (halves up), never 0 unless it was 0."""
        return max(min(tokens, 1), math.floor(tokens * self.spec.token_scale + 0.5))

    @property
    def sent_rows(self) -> list[TraceRow]:
        """The rows replayed: those of the window with an output (a 0-token output is a failed request)."""
        return [r for r in self.read.rows if self.scaled(r.output_tokens) > 0]

    def offsets_s(self) -> list[float]:
        """Planned arrivals of the sent rows: trace time since the window's first row, over `speed`."""
        t0 = self.read.rows[0].t_ns
        return [(r.t_ns - t0) / 1e9 / self.speed for r in self.sent_rows]

    def class_name(self, row: TraceRow) -> str:
        return row.model or self.spec.format  # BurstGPT's rows say which model served them

    def class_names(self) -> list[str]:
        return list(dict.fromkeys(self.class_name(r) for r in self.sent_rows))


def trace_tasks(wl, tokenizer, context_tokens: int | None = None) \
        -> list[tuple[TaskClass, "Question", str, int]]:
    """(class, question, system message, prompt tokens) of each task, in row order; `context_tokens` is
    the served model's context when known (the embedded engine's). Sets `wl.trace.summary`; a ValueError
    lists every row that strict = true refuses. (`wl`, a load.Workload, is not annotated with its
    class: load.py imports this module.)"""
    src, spec = wl.trace, wl.trace.spec
    known = [c for c in (context_tokens, spec.context_tokens) if c is not None]
    context = min(known) if known else None
    prompts = BlockPrompts(tokenizer, wl.seed, src.scaled(spec.block_tokens))
    changed = {"zero_output": [], "output_capped": [], "clipped": [], "lengthened": []}
    path, in_field = src.read.path, FIELDS[spec.format][1]
    tasks, problems = [], []
    for row in src.read.rows:
        out, inp = src.scaled(row.output_tokens), src.scaled(row.input_tokens)
        if out == 0:
            changed["zero_output"].append(row.line)
            continue
        if len(tasks) == wl.n_tasks:
            break
        question = wl.questions[len(tasks) % len(wl.questions)]
        floor = prompts.min_tokens(question.prompt)
        if out > wl.max_tokens:  # [generation].max_tokens is the ceiling of every output
            out = wl.max_tokens
            changed["output_capped"].append(row.line)
        if context is not None and inp + out > context:
            if spec.strict:
                problems.append(f"{path}:{row.line}: {in_field}: {inp} input + {out} output tokens exceed the "
                                f"model's context of {context} (strict = true: not clipped)")
                continue
            if context - floor < 1:
                raise ValueError(f"a context of {context} tokens leaves no room for the template and question "
                                 f"({floor} tokens) and one output token")
            out = min(out, context - floor)
            inp = min(inp, context - out)
            changed["clipped"].append(row.line)
        if inp < floor:
            if spec.strict:
                problems.append(f"{path}:{row.line}: {in_field}: {inp} tokens is shorter than the chat template "
                                f"and question ({floor}) (strict = true: not lengthened)")
                continue
            inp = floor
            changed["lengthened"].append(row.line)
        system = prompts.build(question.prompt, inp, row.hash_ids, str(row.line))
        cls = TaskClass(name=src.class_name(row), prompt_tokens=inp, max_tokens=out, ignore_eos=wl.ignore_eos)
        tasks.append((cls, question, system, inp))
    if problems:
        raise ValueError("\n".join(problems))
    rows = src.read.rows
    src.summary = {
        "format": spec.format, "file": str(path), "sha256": src.read.sha256,
        "sha256_bytes": src.read.sha256_bytes, "file_bytes": src.read.file_bytes, "rows_read": src.read.rows_read,
        "window_rows": len(rows), "first_line": rows[0].line, "last_line": rows[-1].line, "sent": len(tasks),
        "speed": src.speed, "token_scale": spec.token_scale,
        "block_tokens": prompts.block_tokens if spec.format == "mooncake" else None,
        "context_tokens": context,
        "context_source": None if context is None else "engine" if context == context_tokens else "[trace]",
        "ignore_eos": wl.ignore_eos,
        **{k: {"rows": len(v), "lines": v[:MAX_LINES]} for k, v in changed.items()}}
    return tasks
