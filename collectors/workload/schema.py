"""The workload file's format: one declarative table of its sections, keys, types, defaults and bounds
(pydantic models), and the refusals, each naming the file and the key.

Every section refuses unknown keys (with the closest known key suggested), every value must have its
key's type exactly: no string becomes a boolean, no 1.7 becomes an integer, no nan or inf passes as a
number (TOML allows both; a NaN deadline is no contract). The rules that tie keys together (a replay
needs its file, a closed loop its concurrency) follow the table, in `cross_checks`. docs/CAPTURE.md
lists every key; a test keeps that list and this table in step.
"""
from __future__ import annotations

import difflib
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Process = Literal["poisson", "gamma", "replay", "closed", "trace"]
TraceFormat = Literal["mooncake", "burstgpt", "azure"]
Shape = Literal["single", "session", "parallel"]
OnMissing = Literal["failure", "partial_success"]
OnTimeout = Literal["disconnect", "abandon"]
TaskNumbers = list[Annotated[int, Field(ge=1)]]  # [inject] *_tasks: 1 = the first task


class Section(BaseModel):
    """A table of the file: only its own keys, each of exactly its type, finite."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Taskset(Section):
    file: str  # JSON Lines of prompt and answer, relative to the workload file


class Prompt(Section):
    tokenizer: str | None = None  # None: the target's (embedded) or the bundled one


class Arrivals(Section):
    process: Process = "poisson"
    n_tasks: int | None = Field(None, ge=1)  # replay: defaults to the file's arrivals; a trace: refused
    rate_rps: float | None = Field(None, gt=0)
    cv2: float = Field(1.0, gt=0)
    file: str | None = None
    speed: float = Field(1.0, gt=0)
    concurrency: int | None = Field(None, ge=1)
    think_ms: float = Field(0.0, ge=0)
    calibrate_tok_s: float | None = Field(None, gt=0)


class Contract(Section):
    deadline_ms: float = Field(ge=0)
    on_missing: OnMissing = "failure"


class Client(Section):
    timeout_ms: float = Field(ge=1)
    max_attempts: int = Field(1, ge=1)
    backoff_ms: float = Field(100.0, ge=0)
    backoff_max_ms: float = Field(10_000.0, ge=0)
    jitter: float = Field(0.5, ge=0, le=1)  # a fraction of the backoff
    give_up_after_deadline: bool = True
    on_timeout: OnTimeout = "disconnect"
    drain_s: float = Field(30.0, ge=0)


class Generation(Section):
    max_tokens: int = Field(ge=1)
    temperature: float = Field(0.0, ge=0)
    ignore_eos: bool | None = None  # None: false, true for a trace (its rows fix each output's length)


class Trace(Section):
    """A public trace replayed as the workload ([arrivals] process = 'trace'): its rows are the tasks."""

    format: TraceFormat | None = None  # required with process = 'trace'
    file: str | None = None  # relative to the workload file
    skip_rows: int = Field(0, ge=0)  # rows of the window passed over before the first replayed one
    max_rows: int | None = Field(None, ge=1)  # None: every row of the window
    start_s: float = Field(0.0, ge=0)  # window on trace time (s since the file's first row)
    end_s: float | None = Field(None, gt=0)
    token_scale: float = Field(1.0, gt=0)  # multiplies input, output and block lengths alike
    block_tokens: int = Field(512, ge=1)  # Mooncake: the tokens of one hash id, before token_scale
    context_tokens: int | None = Field(None, ge=1)  # the served model's context; embedded: at most the engine's
    strict: bool = False  # refuse a row that cannot be replayed at its own length instead of fitting it


class Slo(Section):
    """Thresholds of the vLLM-style goodput (docs/LEDGER.md); an undeclared one is not checked."""

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2e_ms: float | None = Field(None, gt=0)


class Inject(Section):
    cancel_every: int = Field(0, ge=0)  # every N-th task; 0: none
    cancel_tasks: TaskNumbers = []
    cancel_after_tokens: int | None = Field(None, ge=1)
    cancel_after_ms: float | None = Field(None, gt=0)
    timeout_every: int = Field(0, ge=0)
    timeout_tasks: TaskNumbers = []
    timeout_ms: float | None = Field(None, gt=0)
    abandon_every: int = Field(0, ge=0)
    abandon_tasks: TaskNumbers = []


class TaskClass(Section):
    """One kind of task in the mix; unset overrides fall back to the workload's globals."""

    name: str | None = None  # None: class<i>
    weight: float = Field(1.0, ge=0)
    shape: Shape = "single"
    prompt_tokens: int | None = Field(None, ge=1)  # the first request's whole templated prompt, exactly
    shared_prefix_tokens: int = Field(0, ge=0)  # leading tokens identical across the class
    turns: int = Field(1, ge=1)  # session
    branches: int = Field(1, ge=1)  # parallel
    tool_ms: float = Field(0.0, ge=0)  # session: a simulated tool call before the turns in tool_before
    tool_before: list[Annotated[int, Field(ge=1)]] = [2]
    max_tokens: int | None = Field(None, ge=1)
    ignore_eos: bool | None = None
    timeout_ms: float | None = Field(None, ge=1)
    deadline_ms: float | None = Field(None, ge=0)
    on_missing: OnMissing | None = None


class WorkloadFile(Section):
    name: str | None = None  # None: the file's stem
    seed: int = 0
    description: str | None = None
    taskset: Taskset
    prompt: Prompt
    arrivals: Arrivals
    contract: Contract
    client: Client
    generation: Generation
    slo: Slo
    inject: Inject
    trace: Trace
    classes: list[TaskClass] | None = None  # None or empty: one class, "default"


SECTIONS = ("taskset", "prompt", "arrivals", "contract", "client", "generation", "slo", "inject", "trace")


def parse(spec: dict, where: str) -> WorkloadFile:
    """The file's parsed TOML as a WorkloadFile, or a ValueError listing every refusal, one per line
    (`<file>: [section].key: what is wrong`). An absent section is an empty one, so its required keys
    are named; None stands for an absent key (TOML has no null; Python callers use it)."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: a workload is a TOML table, not {type(spec).__name__}")
    spec = _without_none(spec)
    spec = {**{s: {} for s in SECTIONS}, **spec}
    try:
        parsed = WorkloadFile.model_validate(spec)
    except ValidationError as exc:
        raise ValueError("\n".join(f"{where}: {_key(e['loc'])}: {_problem(e)}" for e in exc.errors())) from None
    problems = cross_checks(parsed)
    if problems:
        raise ValueError("\n".join(f"{where}: {key}: {why}" for key, why in problems))
    return parsed


def cross_checks(f: WorkloadFile) -> list[tuple[str, str]]:
    """The rules between keys, as (key, problem) pairs; empty when the file is consistent."""
    a, out = f.arrivals, []
    if a.process == "replay" and not a.file:
        out.append(("[arrivals].file", "required for process = 'replay'"))
    if a.process not in ("replay", "trace") and a.n_tasks is None:
        out.append(("[arrivals].n_tasks", "required"))
    if a.process in ("poisson", "gamma") and a.rate_rps is None:
        out.append(("[arrivals].rate_rps", f"required for process = {a.process!r}"))
    if a.process == "closed" and a.concurrency is None:
        out.append(("[arrivals].concurrency", "required for process = 'closed'"))
    out += _trace_checks(f)
    i = f.inject
    if (i.timeout_every or i.timeout_tasks) and i.timeout_ms is None:
        out.append(("[inject].timeout_ms", "required by timeout_every / timeout_tasks (the injected timeout)"))
    for n, c in enumerate(f.classes or []):
        if c.prompt_tokens is not None and c.prompt_tokens < c.shared_prefix_tokens:
            out.append((f"[[classes]][{n}].prompt_tokens",
                        f"{c.prompt_tokens} is shorter than shared_prefix_tokens = {c.shared_prefix_tokens}"))
    return out


def _trace_checks(f: WorkloadFile) -> list[tuple[str, str]]:
    """A trace is the task source and the arrival process: it takes no task count and no classes."""
    t, out = f.trace, []
    if f.arrivals.process != "trace":
        if t.model_fields_set:
            out.append(("[trace]", "only with [arrivals].process = 'trace'"))
        return out
    out += [(f"[trace].{k}", "required for process = 'trace'") for k in ("format", "file") if getattr(t, k) is None]
    if f.arrivals.n_tasks is not None:
        out.append(("[arrivals].n_tasks", "a trace's rows are its tasks: limit them with [trace].max_rows"))
    if f.classes:
        out.append(("[[classes]]", "a trace's rows are its tasks (single calls): no classes with process = 'trace'"))
    if t.end_s is not None and t.end_s <= t.start_s:
        out.append(("[trace].end_s", f"{t.end_s} is not after start_s = {t.start_s}"))
    if "block_tokens" in t.model_fields_set and t.format not in (None, "mooncake"):
        out.append(("[trace].block_tokens", f"only Mooncake traces have blocks, not {t.format!r}"))
    return out


def _without_none(spec: dict) -> dict:
    """The top level, the sections and the classes without their None values."""
    def strip(d):
        return {k: v for k, v in d.items() if v is not None} if isinstance(d, dict) else d
    out = {k: strip(v) for k, v in spec.items() if v is not None}
    if isinstance(out.get("classes"), list):
        out["classes"] = [strip(c) for c in out["classes"]]
    return out


def _key(loc: tuple) -> str:
    """A pydantic location as the file spells it: seed, [client].timeout_ms, [[classes]][1].turns."""
    first, rest = loc[0], loc[1:]
    if first == "classes":
        head, rest = "[[classes]]" + (f"[{rest[0]}]" if rest else ""), rest[1:]
    else:
        head = f"[{first}]" if first in SECTIONS else str(first)
    return head + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest)


def _known(loc: tuple) -> list[str]:
    """The keys allowed where `loc` (an unknown key) sits."""
    if len(loc) == 1:
        return list(WorkloadFile.model_fields)
    model = TaskClass if loc[0] == "classes" else WorkloadFile.model_fields[loc[0]].annotation
    return list(model.model_fields)


def _problem(e: dict) -> str:
    """What is wrong with one value, in the file's words."""
    kind, value, ctx = e["type"], e.get("input"), e.get("ctx") or {}
    if kind == "extra_forbidden":
        known = _known(e["loc"])
        near = difflib.get_close_matches(str(e["loc"][-1]), known, n=1, cutoff=0.6)
        return "unknown key " + (f"(did you mean {near[0]}?)" if near else f"(known: {', '.join(known)})")
    bounds = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le")}
    if kind in bounds:
        op, name = bounds[kind]
        return f"must be {op} {ctx[name]}, not {value!r}"
    plain = {"missing": "required", "model_type": "must be a table", "dict_type": "must be a table",
             "list_type": f"must be a list, not {value!r}", "int_type": f"must be an integer, not {value!r}",
             "float_type": f"must be a number, not {value!r}", "bool_type": f"must be true or false, not {value!r}",
             "string_type": f"must be a string, not {value!r}", "finite_number": f"must be a finite number, not {value!r}",
             "literal_error": f"must be one of {ctx.get('expected')}, not {value!r}"}
    return plain.get(kind, e["msg"])
