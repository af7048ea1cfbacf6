"""Reading a workload: its TOML checked against the format (schema), its task set and its replay file
or trace read, and everything the load client needs gathered in one `Workload`, with its input identity."""
from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .arrivals import planned_offsets, read_replay
from .calibration import calibrate
from .plans import TaskPlan, build_plans, class_sequence, turn_checks
from .schema import (MAX_FILE_BYTES, MAX_HORIZON_S, MAX_TASKS, Deployment, Inject, TaskClass, context_checks,
                     count_checks, parse)
from .tasks import Question, load_questions
from .trace_plans import TraceSource

# The bundled samples (the repository's samples/, beside the installed package in an editable install,
# as `make demo` and `make test` install it): a copied sample workload finds its task set here.
SAMPLES_DIR = Path(__file__).resolve().parents[2] / "samples"
TASKS_DIR = SAMPLES_DIR / "tasks"


def taskset_path(base: Path, file: str, where: str) -> Path:
    """The task set a workload names: beside the workload file (relative to `base`), else a bundled
    task set of that name (a sample workload copied elsewhere); a ValueError naming both places."""
    given = base / file
    if given.is_file():
        return given
    if given.exists():
        raise ValueError(f"{where}: [taskset].file: {given} is not a regular file (a folder, a pipe or a device): "
                         f"a task set is a JSON Lines file, read whole")
    bundled = TASKS_DIR / Path(file).name
    if not Path(file).is_absolute() and bundled.is_file():
        return bundled
    raise ValueError(f"{where}: [taskset].file: {file!r} is neither at {given} nor a bundled task set "
                     f"({bundled})")


def read_spec(path: Path) -> tuple[bytes, dict]:
    """A workload file's bytes and its parsed TOML, or a ValueError naming the file."""
    try:
        if path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"{path}: {path.stat().st_size} bytes: a workload file is at most {MAX_FILE_BYTES} "
                             f"bytes (its keys take a few KiB; the task set, a replay file or a trace are files "
                             f"of their own)")
        raw = path.read_bytes()
        return raw, tomllib.loads(raw.decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: cannot read workload ({exc})") from exc


@dataclass
class Workload:
    """A checked workload; the defaults and bounds of every key are the format's (schema)."""

    name: str
    seed: int
    process: str
    n_tasks: int
    rate_rps: float | None
    cv2: float
    replay_ms: list[float] | None
    speed: float
    concurrency: int
    think_ms: float
    deadline_ms: float
    on_missing: str
    timeout_ms: float
    max_attempts: int
    backoff_ms: float
    backoff_max_ms: float
    jitter: float
    give_up_after_deadline: bool
    on_timeout: str
    drain_s: float
    max_tokens: int
    temperature: float
    ignore_eos: bool
    inject: Inject
    classes: list[TaskClass]
    questions: list[Question]
    max_concurrency: int | None = None  # open loop: at most this many tasks in flight (a late one waits)
    calibrate_tok_s: float | None = None  # [arrivals]: scale open-loop arrivals by measured/this engine speed
    slo: dict = field(default_factory=dict)  # [slo] ttft_ms / tpot_ms / e2e_ms that were declared
    tokenizer: str | None = None  # [prompt] tokenizer; None: the target's (embedded) or the bundled one
    trace: TraceSource | None = None  # process = 'trace': the rows replayed (their arrivals and tasks)
    spec: dict = field(default_factory=dict)  # the file as parsed, for the manifest
    taskset: dict = field(default_factory=dict)  # the task-set file used: path and sha256, for the manifest
    replay: dict = field(default_factory=dict)  # a replay file's path and what its sha256 covers, for the manifest
    sha256: str = ""  # of the workload file, its task set, and the lines read of its replay file or trace
    path: str | None = None
    context: dict | None = None  # the check against the served model's context (check_context), for the manifest
    deployment: Deployment | None = None  # [deployment] as declared, its servers relative to the file; None: none

    @classmethod
    def load(cls, path: str | Path) -> "Workload":
        path = Path(path)
        raw, spec = read_spec(path)
        wl = cls.from_dict(spec, base=path.parent, where=str(path), default_name=path.stem, extra_bytes=raw)
        wl.path = str(path)
        return wl

    @classmethod
    def from_dict(cls, spec: dict, *, base: Path | str = ".", where: str = "workload", default_name: str = "workload",
                  extra_bytes: bytes | None = None) -> "Workload":
        """A workload from its parsed TOML; relative files are relative to `base`; errors name `where`."""
        base = Path(base)
        f = parse(spec, where)
        identity = hashlib.sha256(extra_bytes or json.dumps(spec, sort_keys=True).encode())  # the input's, in order
        taskpath = taskset_path(base, f.taskset.file, where)
        questions = load_questions(taskpath)
        tasks_bytes = taskpath.read_bytes()
        identity.update(tasks_bytes)
        taskset = {"path": str(taskpath), "sha256": hashlib.sha256(tasks_bytes).hexdigest()}
        a = f.arrivals
        replay_ms, replay = None, {}
        if a.process == "replay":
            rpath = base / a.file
            try:
                replay_ms, replay = read_replay(rpath, first=a.n_tasks, most=MAX_TASKS)
            except OSError as exc:
                raise ValueError(f"{where}: [arrivals].file: {rpath} cannot be read ({exc})") from exc
            replay = {"path": str(rpath), **replay}
            identity.update(replay["sha256"].encode())  # of the lines read: a long file's rest is not its input
        trace = None
        if a.process == "trace":
            trace = TraceSource.load(f.trace, base, a.speed, where)
            identity.update(trace.read.sha256.encode())  # of the lines read: a long trace's rest is not its input
        n_tasks = a.n_tasks if a.n_tasks is not None else len(trace.sent_rows) if trace else len(replay_ms)
        if replay_ms is not None and n_tasks > len(replay_ms):
            raise ValueError(f"{where}: [arrivals].n_tasks: {n_tasks}, but the replay file has "
                             f"{len(replay_ms)} arrivals")
        problems = [] if a.n_tasks is not None and trace is None else count_checks(
            f, n_tasks, sum(trace.scaled(r.input_tokens) for r in trace.sent_rows[:n_tasks]) if trace else None)
        last_s = (replay_ms[n_tasks - 1] / 1000 / a.speed if replay_ms else
                  trace.offsets_s()[n_tasks - 1] if trace else 0.0)
        if last_s > MAX_HORIZON_S:
            problems.append(("[arrivals].speed", f"{a.speed:g} puts the last of {n_tasks} arrivals {last_s:.3g} s "
                             f"away (allowed: at most {MAX_HORIZON_S:g} s)"))
        if problems:
            raise ValueError("\n".join(f"{where}: {key}: {why}" for key, why in problems))
        classes = f.classes or ([TaskClass(name=n) for n in trace.class_names()] if trace else
                                [TaskClass(name="default")])
        for i, c in enumerate(classes):
            c.name = c.name if c.name is not None else f"class{i}"
        return cls(
            name=f.name if f.name is not None else default_name, seed=f.seed, process=a.process, n_tasks=n_tasks,
            rate_rps=a.rate_rps, cv2=a.cv2, replay_ms=replay_ms, speed=a.speed,
            concurrency=a.concurrency if a.concurrency is not None else 1, think_ms=a.think_ms,
            max_concurrency=a.concurrency if a.process != "closed" else None,
            deadline_ms=f.contract.deadline_ms, on_missing=f.contract.on_missing, timeout_ms=f.client.timeout_ms,
            max_attempts=f.client.max_attempts, backoff_ms=f.client.backoff_ms,
            backoff_max_ms=f.client.backoff_max_ms, jitter=f.client.jitter,
            give_up_after_deadline=f.client.give_up_after_deadline, on_timeout=f.client.on_timeout,
            drain_s=f.client.drain_s, max_tokens=f.generation.max_tokens, temperature=f.generation.temperature,
            ignore_eos=f.generation.ignore_eos if f.generation.ignore_eos is not None else trace is not None,
            calibrate_tok_s=a.calibrate_tok_s, inject=f.inject, classes=classes, questions=questions,
            tokenizer=f.prompt.tokenizer, trace=trace, spec=spec, taskset=taskset, replay=replay,
            slo=f.slo.model_dump(exclude_none=True), sha256=identity.hexdigest(),
            deployment=f.deployment.model_copy(update={
                "servers": [str(base / p) for p in f.deployment.servers],
                "router_traces": None if f.deployment.router_traces is None else str(base / f.deployment.router_traces)})
            if f.deployment.model_fields_set else None)

    def check_context(self, context_tokens: int | None, source: str, tokenizer=None) -> dict:
        """Every class's prompt and output budget against the served model's context, before anything is
        planned or written, and with `tokenizer` (the one the prompts are counted with) every turn of
        every session, each taken at its longest (`plans.turn_checks`); returns what the manifest records
        of the check (`workload.context`). An unknown context (a URL target that declares none) skips
        the check and says so. A trace's rows are fitted to the context instead (docs/CAPTURE.md)."""
        if context_tokens is None:
            return {"tokens": None, "source": None, "checked": False,
                    "why": f"the served model's context is unknown ({source}): prompts not checked against it"}
        problems = [] if self.trace is not None else context_checks(self.classes, self.max_tokens, context_tokens)
        if not problems and tokenizer is not None and self.trace is None:
            problems = turn_checks(self, tokenizer, context_tokens)
        if problems:
            where = self.path or self.name
            raise ValueError("\n".join(f"{where}: {key}: {why} ({source})" for key, why in problems))
        if self.trace is not None:
            return {"tokens": context_tokens, "source": source, "checked": False,
                    "why": "a trace's rows are fitted to the context when planned (manifest workload.trace)"}
        if self.has_later_turns and tokenizer is None:
            return {"tokens": context_tokens, "source": source, "checked": False,
                    "why": "the first turns were checked; the sessions' later turns need the tokenizer to be counted"}
        return {"tokens": context_tokens, "source": source, "checked": True}

    @property
    def has_later_turns(self) -> bool:
        """Whether a class is a session of more than one turn (its later prompts grow by the answers)."""
        return any(c.shape == "session" and c.turns > 1 for c in self.classes)

    # ---- what the client runs ------------------------------------------------------------------
    @property
    def needs_tokenizer(self) -> bool:
        return self.trace is not None or any(c.prompt_tokens or c.shared_prefix_tokens for c in self.classes)

    def arrival_offsets(self) -> list[float] | None:
        """Planned arrival offsets (s) of the open-loop processes; None for the closed loop."""
        if self.trace is not None:
            return self.trace.offsets_s()[: self.n_tasks]
        return planned_offsets(self.process, seed=self.seed, n_tasks=self.n_tasks, rate_rps=self.rate_rps,
                               cv2=self.cv2, replay_ms=self.replay_ms, speed=self.speed)

    def class_sequence(self) -> list[TaskClass]:
        return class_sequence(self.classes, self.n_tasks)

    def plan(self, tokenizer=None, context_tokens: int | None = None) -> list[TaskPlan]:
        """Every task's plan, prompts built to exact token counts with the caller's `tokenizer`; a trace's
        rows fitted to `context_tokens` (the served model's context) when it is known."""
        return build_plans(self, tokenizer, context_tokens)

    def calibrate(self, measured_tok_s: float) -> dict:
        return calibrate(self, measured_tok_s)
