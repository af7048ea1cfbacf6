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

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

Process = Literal["poisson", "gamma", "replay", "closed", "trace"]
TraceFormat = Literal["mooncake", "burstgpt", "azure"]
Shape = Literal["single", "session", "parallel"]
OnMissing = Literal["failure", "partial_success"]
OnTimeout = Literal["disconnect", "abandon"]
# The bounds of planning (docs/CAPTURE.md "Bounds"): planning a workload within them takes at most
# about 10 s and 1 GiB on the slowest machine we run on; they are checked from the declared counts,
# before anything is planned, so a file past them is refused at once instead of planning for hours.
MAX_TASKS = 100_000  # n_tasks, a trace's rows
MAX_REQUESTS = 100_000  # requests planned in all: tasks x turns (session) or branches (parallel)
MAX_BUILT_TOKENS = 1_500_000  # prompt tokens built to an exact count, in all requests together
MAX_PROMPT_TOKENS = 262_144  # one prompt built to an exact count (prompt_tokens, shared_prefix_tokens)
MAX_FANOUT = 256  # turns of a session, branches of a parallel task
MAX_CLASSES = 10_000  # [[classes]] entries (each a request shape: checked, dealt and predicted one by one)
MAX_FILE_BYTES = 2 << 20  # the workload file (its keys take a few KiB; 100,000 task numbers about 0.7 MB): ~4 s of TOML
MAX_LENGTH = 1 << 20  # tokens of any other length: max_tokens, context_tokens, block_tokens
MAX_MS = 86_400_000.0  # one day: any duration in ms (deadline, timeout, think, tool, backoff)
MAX_HORIZON_S = 7 * 86_400.0  # a week: the last planned arrival
MAX_RATE_RPS = 100_000.0
MAX_SCALE = 1_000.0  # speed, token_scale, cv2 (and 1/MAX_SCALE the least speed)
MAX_SEED = (1 << 63) - 1
# a trace file (collectors/workload/trace_read.py), bounded while it is read, before anything is planned
MAX_TRACE_ROWS_READ = 250_000  # rows read to fill the window (those before it too): about 5 s
MAX_TRACE_LINE_BYTES = 1 << 20  # one line (row) of a trace file
MAX_TRACE_BLOCK_IDS = MAX_BUILT_TOKENS  # Mooncake: block ids of the window's rows together
MAX_TRACE_TOKENS = 10 ** 9  # a row's token count, before token_scale
MAX_TRACE_S = 1e10  # a row's time (its timestamp, in s, as start_s and end_s)

Ms = Annotated[float, Field(ge=0, le=MAX_MS)]
TaskNumbers = Annotated[list[Annotated[int, Field(ge=1, le=MAX_TASKS)]],  # [inject] *_tasks: 1 = the first task
                        Field(max_length=MAX_TASKS)]


class Section(BaseModel):
    """A table of the file: only its own keys, each of exactly its type, finite."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Taskset(Section):
    file: str  # JSON Lines of prompt and answer, relative to the workload file


class Prompt(Section):
    tokenizer: str | None = None  # None: the target's (embedded) or the bundled one


class Arrivals(Section):
    process: Process = "poisson"
    n_tasks: int | None = Field(None, ge=1, le=MAX_TASKS)  # replay: defaults to the file's arrivals; a trace: refused
    rate_rps: float | None = Field(None, gt=0, le=MAX_RATE_RPS)
    cv2: float = Field(1.0, ge=1 / MAX_SCALE, le=MAX_SCALE)
    file: str | None = None
    speed: float = Field(1.0, ge=1 / MAX_SCALE, le=MAX_SCALE)
    concurrency: int | None = Field(None, ge=1, le=MAX_TASKS)
    think_ms: Ms = 0.0
    calibrate_tok_s: float | None = Field(None, gt=0, le=1e9)


class Contract(Section):
    deadline_ms: Ms
    on_missing: OnMissing = "failure"


class Client(Section):
    timeout_ms: float = Field(ge=1, le=MAX_MS)
    max_attempts: int = Field(1, ge=1, le=100)
    backoff_ms: Ms = 100.0
    backoff_max_ms: Ms = 10_000.0
    jitter: float = Field(0.5, ge=0, le=1)  # a fraction of the backoff
    give_up_after_deadline: bool = True
    on_timeout: OnTimeout = "disconnect"
    drain_s: float = Field(30.0, ge=0, le=MAX_MS / 1000)


class Generation(Section):
    max_tokens: int = Field(ge=1, le=MAX_LENGTH)
    temperature: float = Field(0.0, ge=0, le=100)
    ignore_eos: bool | None = None  # None: false, true for a trace (its rows fix each output's length)


class Trace(Section):
    """A public trace replayed as the workload ([arrivals] process = 'trace'): its rows are the tasks."""

    format: TraceFormat | None = None  # required with process = 'trace'
    file: str | None = None  # relative to the workload file
    skip_rows: int = Field(0, ge=0, le=1 << 40)  # rows of the window passed over before the first replayed one
    max_rows: int | None = Field(None, ge=1, le=MAX_TASKS)  # None: every row of the window
    start_s: float = Field(0.0, ge=0, le=1e10)  # window on trace time (s since the file's first row)
    end_s: float | None = Field(None, gt=0, le=1e10)
    token_scale: float = Field(1.0, gt=0, le=MAX_SCALE)  # multiplies input, output and block lengths alike
    block_tokens: int = Field(512, ge=1, le=MAX_LENGTH)  # Mooncake: the tokens of one hash id, before token_scale
    context_tokens: int | None = Field(None, ge=1, le=MAX_LENGTH)  # the served model's context; embedded: at most the engine's
    strict: bool = False  # refuse a row that cannot be replayed at its own length instead of fitting it


class Slo(Section):
    """Thresholds of the vLLM-style goodput (docs/LEDGER.md); an undeclared one is not checked."""

    ttft_ms: float | None = Field(None, gt=0, le=MAX_MS)
    tpot_ms: float | None = Field(None, gt=0, le=MAX_MS)
    e2e_ms: float | None = Field(None, gt=0, le=MAX_MS)


class Inject(Section):
    cancel_every: int = Field(0, ge=0, le=MAX_TASKS)  # every N-th task; 0: none
    cancel_tasks: TaskNumbers = []
    cancel_after_tokens: int | None = Field(None, ge=1, le=MAX_LENGTH)
    cancel_after_ms: float | None = Field(None, gt=0, le=MAX_MS)
    timeout_every: int = Field(0, ge=0, le=MAX_TASKS)
    timeout_tasks: TaskNumbers = []
    timeout_ms: float | None = Field(None, gt=0, le=MAX_MS)
    abandon_every: int = Field(0, ge=0, le=MAX_TASKS)
    abandon_tasks: TaskNumbers = []


class TaskClass(Section):
    """One kind of task in the mix; unset overrides fall back to the workload's globals."""

    name: str | None = None  # None: class<i>
    weight: float = Field(1.0, gt=0, le=1e6)
    shape: Shape = "single"
    prompt_tokens: int | None = Field(None, ge=1, le=MAX_PROMPT_TOKENS)  # the first request's whole templated prompt, exactly
    shared_prefix_tokens: int = Field(0, ge=0, le=MAX_PROMPT_TOKENS)  # leading tokens identical across the class
    turns: int = Field(1, ge=1, le=MAX_FANOUT)  # session
    branches: int = Field(1, ge=1, le=MAX_FANOUT)  # parallel
    tool_ms: Ms = 0.0  # session: a simulated tool call before the turns in tool_before
    tool_before: list[Annotated[int, Field(ge=1, le=MAX_FANOUT)]] = [2]
    max_tokens: int | None = Field(None, ge=1, le=MAX_LENGTH)
    ignore_eos: bool | None = None
    timeout_ms: float | None = Field(None, ge=1, le=MAX_MS)
    deadline_ms: float | None = Field(None, ge=0, le=MAX_MS)
    on_missing: OnMissing | None = None


REPLICA_KINDS = ("ours", "vllm", "llamacpp", "blackbox")  # what a replica that is no `serve --out` folder is


def replica_entry(text: str) -> tuple[str, str]:
    """`URL[=KIND]` (`capture --replica`, `[deployment].replicas`) as (url, kind); KIND defaults to blackbox.
    ValueError says what is wrong."""
    url, kind = text.rsplit("=", 1) if "=" in text else (text, "blackbox")
    if kind not in REPLICA_KINDS:
        raise ValueError(f"{text!r}: KIND {kind!r} is not one of {', '.join(REPLICA_KINDS)} (URL[=KIND])")
    _url(url, "a replica's base URL, e.g. http://127.0.0.1:18112=llamacpp")
    return url.rstrip("/"), kind


def _replica(text: str) -> str:
    replica_entry(text)
    return text


def url_problem(url: str) -> str | None:
    """Why `url` is no server's http(s) base URL (no scheme, no host, a port no socket has), or None."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
        u.port  # noqa: B018 (a port past 65535 or not a number raises here)
    except ValueError as exc:
        return f"{url!r} is not a URL ({exc})"
    if u.scheme not in ("http", "https") or not u.hostname:
        return f"{url!r} is not an http(s):// URL with a host"
    return None


def _url(url: str, what: str) -> str:
    if (why := url_problem(url)) is not None:
        raise ValueError(f"{why} ({what})")
    return url


class Deployment(Section):
    """A router in front of several replicas (docs/CAPTURE.md "A deployment"); `capture`'s flags override it."""

    router: str | None = None  # the router's base URL: the capture's --target
    router_metrics: str | None = None  # its Prometheus /metrics (--router-metrics)
    router_traces: str | None = None  # its spans' file, relative to the file (--router-traces)
    servers: list[str] = []  # replicas that are `inferledger serve --out` folders, relative to the file (--server)
    replicas: list[Annotated[str, AfterValidator(_replica)]] = []  # the other replicas, URL[=KIND] (--replica)

    @field_validator("router", "router_metrics")
    @classmethod
    def _is_url(cls, v: str | None) -> str | None:
        return v if v is None else _url(v, "e.g. http://127.0.0.1:18200")

class WorkloadFile(Section):
    name: str | None = None  # None: the file's stem
    seed: int = Field(0, ge=0, le=MAX_SEED)
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
    deployment: Deployment
    classes: Annotated[list[TaskClass], Field(max_length=MAX_CLASSES)] | None = None  # None or empty: one class


SECTIONS = ("taskset", "prompt", "arrivals", "contract", "client", "generation", "slo", "inject", "trace", "deployment")


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
    seen: dict[str, int] = {}
    for n, c in enumerate(f.classes or []):
        if c.prompt_tokens is not None and c.prompt_tokens < c.shared_prefix_tokens:
            out.append((f"[[classes]][{n}].prompt_tokens",
                        f"{c.prompt_tokens} is shorter than shared_prefix_tokens = {c.shared_prefix_tokens}"))
        name = c.name if c.name is not None else f"class{n}"
        if name in seen:
            out.append((f"[[classes]][{n}].name", f"{name!r} is already the name of [[classes]][{seen[name]}]"))
        seen.setdefault(name, n)
        late = [t for t in c.tool_before if t > c.turns]
        if c.shape == "session" and "tool_before" in c.model_fields_set and late:
            out.append((f"[[classes]][{n}].tool_before", f"turn(s) {late} past turns = {c.turns} (allowed: 1..{c.turns})"))
    if a.n_tasks is not None:
        out += count_checks(f, a.n_tasks)
    return out


def requests_per_task(c: TaskClass) -> int:
    """The requests one task of class `c` sends."""
    return c.turns if c.shape == "session" else c.branches if c.shape == "parallel" else 1


def count_checks(f: WorkloadFile, n_tasks: int, built_tokens: int | None = None) -> list[tuple[str, str]]:
    """The rules that need the task count (declared, or a replay file's or a trace's rows): the
    [inject] task numbers within it, the arrivals within MAX_HORIZON_S, and planning within its bounds
    (MAX_REQUESTS requests, MAX_BUILT_TOKENS prompt tokens built to an exact count), all from the
    declared counts, before anything is planned. `built_tokens`: a trace's prompt tokens, from its rows."""
    out, a = [], f.arrivals
    for what in ("cancel", "timeout", "abandon"):
        late = [t for t in getattr(f.inject, f"{what}_tasks") if t > n_tasks]
        if late:
            out.append((f"[inject].{what}_tasks", f"task(s) {late} past the {n_tasks} tasks (allowed: 1..{n_tasks})"))
    if a.process in ("poisson", "gamma") and a.rate_rps is not None and (n_tasks - 1) / a.rate_rps > MAX_HORIZON_S:
        out.append(("[arrivals].rate_rps", f"{a.rate_rps:g} tasks/s puts {n_tasks} tasks' arrivals "
                    f"{(n_tasks - 1) / a.rate_rps:.3g} s away (allowed: at most {MAX_HORIZON_S:g} s: rate_rps >= "
                    f"{(n_tasks - 1) / MAX_HORIZON_S:.3g})"))
    classes = f.classes or [TaskClass()]
    total = sum(c.weight for c in classes)
    share = [c.weight / total for c in classes]  # dealt in exact proportions (plans.class_sequence)
    requests = round(n_tasks * sum(s * requests_per_task(c) for s, c in zip(share, classes)))
    if requests > MAX_REQUESTS:
        out.append(("[arrivals].n_tasks", f"{n_tasks} tasks send {requests} requests (turns, branches): allowed "
                    f"at most {MAX_REQUESTS} in one workload"))
    if built_tokens is None:
        built_tokens = round(n_tasks * sum(s * (c.prompt_tokens or c.shared_prefix_tokens)
                                           * (c.branches if c.shape == "parallel" else 1)
                                           for s, c in zip(share, classes)))
    if built_tokens > MAX_BUILT_TOKENS:
        key = "[trace].max_rows" if a.process == "trace" else "[arrivals].n_tasks"
        out.append((key, f"{n_tasks} tasks need {built_tokens} prompt tokens built to an exact count: allowed at "
                    f"most {MAX_BUILT_TOKENS} in one workload"))
    return out


def context_checks(classes: list[TaskClass], max_tokens: int, context: int) -> list[tuple[str, str]]:
    """Each class's exact prompt and its output budget against the served model's context (the engine
    refuses a request past it): (key, problem) pairs, empty when every class fits."""
    out = []
    if max_tokens >= context:
        out.append(("[generation].max_tokens", f"{max_tokens} leaves no room for a prompt in the model's context "
                    f"of {context} tokens (allowed: 1..{context - 1})"))
    for n, c in enumerate(classes):
        budget = c.max_tokens if c.max_tokens is not None else max_tokens
        if c.prompt_tokens is not None and c.prompt_tokens + budget > context:
            out.append((f"[[classes]][{n}].prompt_tokens", f"{c.prompt_tokens} + max_tokens {budget} = "
                        f"{c.prompt_tokens + budget} exceeds the model's context of {context} tokens (allowed: "
                        f"prompt_tokens <= {context - budget})"))
        elif c.max_tokens is not None and c.max_tokens >= context:
            out.append((f"[[classes]][{n}].max_tokens", f"{c.max_tokens} leaves no room for a prompt in the "
                        f"model's context of {context} tokens (allowed: 1..{context - 1})"))
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
    if kind == "too_long":
        return f"must hold at most {ctx.get('max_length')} entries, not {ctx.get('actual_length')}"
    plain = {"missing": "required", "model_type": "must be a table", "dict_type": "must be a table",
             "list_type": f"must be a list, not {value!r}", "int_type": f"must be an integer, not {value!r}",
             "float_type": f"must be a number, not {value!r}", "bool_type": f"must be true or false, not {value!r}",
             "string_type": f"must be a string, not {value!r}", "finite_number": f"must be a finite number, not {value!r}",
             "literal_error": f"must be one of {ctx.get('expected')}, not {value!r}"}
    return plain.get(kind, e["msg"].removeprefix("Value error, "))
