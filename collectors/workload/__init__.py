"""Workloads: what the load client runs, from one TOML file (docs/CAPTURE.md lists every key).

A workload names a task set with known answers, an arrival process, the client's policy (timeouts,
retries, cancellations), the task contract and a mix of task classes (one call, the turns of a
session, parallel branches), and how long each prompt is in the model's own tokens. Everything is
deterministic from `seed`: the same file and task set give the same arrivals, prompts and plans.

One idea per module: `schema` (the format: keys, types, defaults, bounds, and the refusals),
`load` (the file read into a `Workload`), `tasks` (the task set), `arrivals` (the arrival
processes), `prompts` (prompts of exact token counts, with the caller's tokenizer), `plans` (each
task's plan), `calibration` (scaling to the machine's measured speed).
"""
from .arrivals import gamma_offsets, poisson_offsets, read_replay
from .load import Workload
from .plans import RequestPlan, TaskPlan
from .prompts import PromptBuilder
from .schema import TaskClass
from .tasks import Question, load_questions

__all__ = ["Workload", "TaskClass", "Question", "RequestPlan", "TaskPlan", "PromptBuilder", "load_questions",
           "poisson_offsets", "gamma_offsets", "read_replay"]
