"""Workloads: the TOML format, the arrival processes, and the task plans the load client runs.

A workload file names a task set with known answers, an arrival process, the client's policy
(timeouts, retries, cancellations), the task contract and a mix of task classes (one call, the turns
of a session, parallel branches), and how long each prompt is in the model's own tokens. Everything
is deterministic from `seed`: the same file and task set give the same arrivals, prompts and plans
(docs/CAPTURE.md lists every key).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

PROCESSES = ("poisson", "gamma", "replay", "closed")
SHAPES = ("single", "session", "parallel")
ON_MISSING = ("failure", "partial_success")
ON_TIMEOUT = ("disconnect", "abandon")

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")  # [slo]: thresholds of the vLLM-style goodput (docs/LEDGER.md)


# ---- arrival processes (offsets in seconds from the start of the run) --------------------------


def poisson_offsets(rate_rps: float, n: int, rng: random.Random) -> list[float]:
    """Open-loop Poisson arrivals: exponential gaps of mean 1/rate; the first task arrives at 0."""
    return gamma_offsets(rate_rps, 1.0, n, rng)


def gamma_offsets(rate_rps: float, cv2: float, n: int, rng: random.Random) -> list[float]:
    """Gamma-distributed gaps with mean 1/rate and squared coefficient of variation cv2
    (shape k = 1/cv2, scale = 1/(rate k)); cv2 = 1 is Poisson, > 1 bursty, < 1 smoother."""
    if rate_rps <= 0 or cv2 <= 0:
        raise ValueError(f"rate_rps and cv2 must be > 0 (got {rate_rps}, {cv2})")
    k = 1.0 / cv2
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate_rps) if cv2 == 1.0 else rng.gammavariate(k, 1.0 / (rate_rps * k))
    return out


def read_replay(path: Path) -> list[float]:
    """Planned arrival offsets in ms: one number per line, or JSON Lines with `t_ms` ('#' comments)."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            value = json.loads(line)
            t_ms = float(value["t_ms"] if isinstance(value, dict) else value)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: expected a number of ms or a JSON object with t_ms ({exc})") from exc
        if not math.isfinite(t_ms) or t_ms < 0:
            raise ValueError(f"{path}:{n}: t_ms must be a finite number >= 0, not {t_ms}")
        out.append(t_ms)
    if out != sorted(out):
        raise ValueError(f"{path}: arrival offsets must not decrease")
    return out


# ---- the spec ----------------------------------------------------------------------------------


@dataclass
class TaskClass:
    """One kind of task in the mix; unset fields fall back to the workload's globals."""

    name: str
    weight: float = 1.0
    shape: str = "single"
    prompt_tokens: int | None = None  # the first request's whole templated prompt, exactly
    shared_prefix_tokens: int = 0  # leading tokens identical across the class (start of the system message)
    turns: int = 1  # session
    branches: int = 1  # parallel
    tool_ms: float = 0.0  # session: a simulated external tool call before turns in tool_before
    tool_before: tuple[int, ...] = (2,)
    max_tokens: int | None = None
    ignore_eos: bool | None = None
    timeout_ms: float | None = None
    deadline_ms: float | None = None
    on_missing: str | None = None


@dataclass
class Question:
    prompt: str
    answer: str
    match: str = "regex"  # regex (case-insensitive search) or exact (whole answer, case and '.' ignored)
    kind: str = "qa"


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


@dataclass
class Workload:
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
    inject: dict
    classes: list[TaskClass]
    questions: list[Question]
    calibrate_tok_s: float | None = None  # [arrivals]: scale open-loop arrivals by measured/this engine speed
    slo: dict = field(default_factory=dict)  # [slo] ttft_ms / tpot_ms / e2e_ms: vLLM-style goodput thresholds
    tokenizer: str | None = None  # [prompt] tokenizer; None: the target's (embedded) or the bundled one
    spec: dict = field(default_factory=dict)
    sha256: str = ""  # of the workload file, its task set and replay file: the run's input identity
    path: str | None = None

    # ---- loading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> "Workload":
        path = Path(path)
        try:
            spec = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: cannot read workload ({exc})") from exc
        wl = cls.from_dict(spec, base=path.parent, where=str(path), default_name=path.stem,
                           extra_bytes=path.read_bytes())
        wl.path = str(path)
        return wl

    @classmethod
    def from_dict(cls, spec: dict, *, base: Path | str = ".", where: str = "workload", default_name: str = "workload",
                  extra_bytes: bytes | None = None) -> "Workload":
        base = Path(base)
        _refuse_non_finite(spec, where)
        known = {"name", "seed", "description", "taskset", "prompt", "arrivals", "contract", "client",
                 "generation", "inject", "classes", "slo"}
        for key in spec:
            if key not in known:
                raise ValueError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")

        def sect(name: str) -> dict:
            value = spec.get(name, {})
            if not isinstance(value, dict):
                raise ValueError(f"{where}: [{name}] must be a table")
            return value

        def num(section: str, key: str, default=None, *, lo=None, integer=False, required=False):
            value = sect(section).get(key)
            value = default if value is None else value
            if value is None:
                if required:
                    raise ValueError(f"{where}: [{section}] {key} is required")
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
                raise ValueError(f"{where}: [{section}] {key} must be {'an integer' if integer else 'a number'}, "
                                 f"not {value!r}")
            if lo is not None and value < lo:
                raise ValueError(f"{where}: [{section}] {key} must be >= {lo}, not {value}")
            return value

        def choice(section: str, key: str, default: str, allowed: tuple) -> str:
            value = sect(section).get(key, default)
            if value not in allowed:
                raise ValueError(f"{where}: [{section}] {key} must be one of {', '.join(allowed)}, not {value!r}")
            return value

        blobs = [extra_bytes or json.dumps(spec, sort_keys=True).encode()]
        taskfile = sect("taskset").get("file")
        if not taskfile:
            raise ValueError(f"{where}: [taskset] file is required (JSON Lines of prompt and answer)")
        taskpath = base / taskfile
        questions = load_questions(taskpath)
        blobs.append(taskpath.read_bytes())

        arr = sect("arrivals")
        process = choice("arrivals", "process", "poisson", PROCESSES)
        replay_ms = None
        if process == "replay":
            if not arr.get("file"):
                raise ValueError(f"{where}: [arrivals] file is required for process = 'replay'")
            rpath = base / arr["file"]
            try:
                replay_ms = read_replay(rpath)
                blobs.append(rpath.read_bytes())
            except OSError as exc:
                raise ValueError(f"{where}: [arrivals] file {rpath} cannot be read ({exc})") from exc
        n_tasks = num("arrivals", "n_tasks", len(replay_ms) if replay_ms is not None else None, lo=1, integer=True,
                      required=True)
        if replay_ms is not None and n_tasks > len(replay_ms):
            raise ValueError(f"{where}: n_tasks = {n_tasks} but the replay file has {len(replay_ms)} arrivals")
        rate = num("arrivals", "rate_rps", lo=1e-9, required=process in ("poisson", "gamma"))
        cv2 = num("arrivals", "cv2", 1.0, lo=1e-6)
        concurrency = num("arrivals", "concurrency", None if process == "closed" else 1, lo=1, integer=True,
                          required=process == "closed")

        inject = dict(sect("inject"))
        allowed_inject = {"cancel_every", "cancel_tasks", "cancel_after_tokens", "cancel_after_ms", "timeout_every",
                          "timeout_tasks", "timeout_ms", "abandon_every", "abandon_tasks"}
        for key in inject:
            if key not in allowed_inject:
                raise ValueError(f"{where}: [inject] unknown key {key!r} (known: {', '.join(sorted(allowed_inject))})")
            if key.endswith("_tasks"):
                if not isinstance(inject[key], list) or not all(isinstance(t, int) and t >= 1 for t in inject[key]):
                    raise ValueError(f"{where}: [inject] {key} must be a list of task numbers (1 = the first task)")
            else:
                num("inject", key, lo=0)
        if any(inject.get(k) for k in ("cancel_every", "cancel_tasks")) and not (
                inject.get("cancel_after_tokens") or inject.get("cancel_after_ms")):
            inject["cancel_after_tokens"] = 4
        if any(inject.get(k) for k in ("timeout_every", "timeout_tasks")) and not inject.get("timeout_ms"):
            raise ValueError(f"{where}: [inject] timeout_every / timeout_tasks need timeout_ms")

        for key in sect("slo"):
            if key not in SLO_KEYS:
                raise ValueError(f"{where}: [slo] unknown key {key!r} (known: {', '.join(SLO_KEYS)})")
        slo = {k: float(num("slo", k, lo=1e-9)) for k in SLO_KEYS if sect("slo").get(k) is not None}
        contract_missing = choice("contract", "on_missing", "failure", ON_MISSING)
        classes = [_task_class(c, i, where) for i, c in enumerate(spec.get("classes") or [{"name": "default"}])]
        ptok = sect("prompt").get("tokenizer")
        wl = cls(
            name=str(spec.get("name", default_name)), seed=int(spec.get("seed", 0)), process=process,
            n_tasks=n_tasks, rate_rps=rate, cv2=float(cv2), replay_ms=replay_ms,
            speed=float(num("arrivals", "speed", 1.0, lo=1e-9)), concurrency=int(concurrency),
            think_ms=float(num("arrivals", "think_ms", 0.0, lo=0)),
            deadline_ms=float(num("contract", "deadline_ms", required=True, lo=0)), on_missing=contract_missing,
            timeout_ms=float(num("client", "timeout_ms", required=True, lo=1)),
            max_attempts=int(num("client", "max_attempts", 1, lo=1, integer=True)),
            backoff_ms=float(num("client", "backoff_ms", 100, lo=0)),
            backoff_max_ms=float(num("client", "backoff_max_ms", 10_000, lo=0)),
            jitter=float(num("client", "jitter", 0.5, lo=0)),
            give_up_after_deadline=bool(sect("client").get("give_up_after_deadline", True)),
            on_timeout=choice("client", "on_timeout", "disconnect", ON_TIMEOUT),
            drain_s=float(num("client", "drain_s", 30, lo=0)),
            max_tokens=int(num("generation", "max_tokens", required=True, lo=1, integer=True)),
            temperature=float(num("generation", "temperature", 0.0, lo=0)),
            ignore_eos=bool(sect("generation").get("ignore_eos", False)),
            calibrate_tok_s=num("arrivals", "calibrate_tok_s", lo=1e-9),
            inject=inject, classes=classes, questions=questions, tokenizer=ptok, spec=spec, slo=slo,
            sha256=hashlib.sha256(b"".join(blobs)).hexdigest())
        if wl.jitter > 1:
            raise ValueError(f"{where}: [client] jitter must be within 0..1 (a fraction of the backoff)")
        return wl

    def calibrate(self, measured_tok_s: float) -> dict:
        """Scale an open-loop workload to a slower (or busier) machine than the one it was tuned on, by
        f = measured / calibrate_tok_s (never above 1): rate and task count times f, client timeouts and
        task deadlines divided by f (injected faults and tool delays unchanged), so the run keeps its
        load relative to capacity and its duration; [slo] thresholds stretch like the deadlines. Returns
        what was done (for the manifest)."""
        f = min(1.0, measured_tok_s / self.calibrate_tok_s)
        keys = ("rate_rps", "n_tasks", "timeout_ms", "deadline_ms")
        before = {k: getattr(self, k) for k in keys}
        before_slo = dict(self.slo)
        if self.process in ("poisson", "gamma") and f < 1.0:
            self.rate_rps *= f
            self.n_tasks = max(1, round(self.n_tasks * f))
            self.timeout_ms /= f
            self.deadline_ms /= f
            self.slo = {k: v / f for k, v in self.slo.items()}
            for c in self.classes:
                c.timeout_ms = c.timeout_ms / f if c.timeout_ms else c.timeout_ms
                c.deadline_ms = c.deadline_ms / f if c.deadline_ms is not None else None
        after = {k: round(v, 4) if isinstance(v, float) else v for k in keys for v in [getattr(self, k)]}
        if self.slo:
            before["slo"], after["slo"] = before_slo, {k: round(v, 4) for k, v in self.slo.items()}
        return {"measured_tok_s": round(measured_tok_s, 2), "reference_tok_s": self.calibrate_tok_s,
                "factor": round(f, 3), "before": before, "after": after}

    # ---- what the client runs ------------------------------------------------------------------
    @property
    def needs_tokenizer(self) -> bool:
        return any(c.prompt_tokens or c.shared_prefix_tokens for c in self.classes)

    def arrival_offsets(self) -> list[float] | None:
        """Planned arrival offsets (s) of the open-loop processes; None for the closed loop."""
        rng = random.Random(f"{self.seed}:arrivals")
        if self.process == "poisson":
            return poisson_offsets(self.rate_rps, self.n_tasks, rng)
        if self.process == "gamma":
            return gamma_offsets(self.rate_rps, self.cv2, self.n_tasks, rng)
        if self.process == "replay":
            return [t / 1000.0 / self.speed for t in self.replay_ms[: self.n_tasks]]
        return None

    def class_sequence(self) -> list[TaskClass]:
        """Classes in task order by smooth weighted round robin: exact proportions, evenly spread."""
        current = [0.0] * len(self.classes)
        total = sum(c.weight for c in self.classes)
        out = []
        for _ in range(self.n_tasks):
            for i, c in enumerate(self.classes):
                current[i] += c.weight
            best = max(range(len(self.classes)), key=lambda i: current[i])
            current[best] -= total
            out.append(self.classes[best])
        return out

    def plan(self, tokenizer=None) -> list[TaskPlan]:
        """Every task's plan: ids, contract, prompts (built to exact token counts with `tokenizer`)."""
        if self.needs_tokenizer and tokenizer is None:
            raise ValueError(f"workload {self.name}: prompt_tokens / shared_prefix_tokens need the model's tokenizer")
        builders: dict[str, PromptBuilder] = {}
        plans, q = [], 0
        def every(what: str, i: int) -> bool:  # [inject] <what>_every = N (i % N == 0) or <what>_tasks = [i, ...]
            n = self.inject.get(f"{what}_every")
            return bool(n) and i % int(n) == 0 or i in (self.inject.get(f"{what}_tasks") or ())
        for i, c in enumerate(self.class_sequence(), 1):
            tid = f"T{i - 1:04d}"
            n_req = c.turns if c.shape == "session" else c.branches if c.shape == "parallel" else 1
            qs = [self.questions[(q + k) % len(self.questions)] for k in range(n_req)]
            q += n_req
            systems, counts = [None] * n_req, [None] * n_req
            if tokenizer is not None and (c.prompt_tokens or c.shared_prefix_tokens):
                b = builders.setdefault(c.name, PromptBuilder(tokenizer, self.seed, c))
                # a session keeps its first turn's system message; each branch has its own
                for k in (range(n_req) if c.shape == "parallel" else range(1)):
                    systems[k], counts[k] = b.request(qs[k].prompt, f"{tid}:{k}")
                if c.shape == "session":
                    systems = [systems[0]] * n_req
            reqs = [RequestPlan(f"{tid}:R{k + 1}", qs[k], qs[k].prompt, systems[k], counts[k]) for k in range(n_req)]
            plans.append(TaskPlan(
                index=i, task_id=tid, cls=c, session_id=f"{tid}:S" if c.shape == "session" else None,
                requests=reqs, deadline_ms=c.deadline_ms if c.deadline_ms is not None else self.deadline_ms,
                on_missing=c.on_missing or self.on_missing, max_attempts=self.max_attempts,
                cancel_after_tokens=self.inject.get("cancel_after_tokens") if every("cancel", i) else None,
                cancel_after_ms=self.inject.get("cancel_after_ms") if every("cancel", i) else None,
                first_timeout_ms=self.inject.get("timeout_ms") if every("timeout", i) else None,
                abandon=self.on_timeout == "abandon" or every("abandon", i)))
        return plans


def _refuse_non_finite(value, where: str, key: str = "") -> None:
    """TOML allows nan and inf; no workload number may be either (a NaN deadline is no contract)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {key} must be a finite number, not {value}")
    if isinstance(value, dict):
        for k, v in value.items():
            _refuse_non_finite(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _refuse_non_finite(v, where, f"{key}[{i}]")


def _task_class(c: dict, i: int, where: str) -> TaskClass:
    if not isinstance(c, dict):
        raise ValueError(f"{where}: [[classes]] entry {i} must be a table")
    fields = set(TaskClass.__dataclass_fields__)
    for key in c:
        if key not in fields:
            raise ValueError(f"{where}: [[classes]] {c.get('name', i)}: unknown key {key!r} "
                             f"(known: {', '.join(sorted(fields))})")
    tc = TaskClass(**{**c, "name": str(c.get("name", f"class{i}"))})
    tc.tool_before = tuple(int(t) for t in (c.get("tool_before") or (2,)))
    if tc.shape not in SHAPES:
        raise ValueError(f"{where}: class {tc.name}: shape must be one of {', '.join(SHAPES)}, not {tc.shape!r}")
    if tc.on_missing is not None and tc.on_missing not in ON_MISSING:
        raise ValueError(f"{where}: class {tc.name}: on_missing must be one of {', '.join(ON_MISSING)}")
    for key in ("weight", "turns", "branches", "tool_ms", "shared_prefix_tokens"):
        if getattr(tc, key) < 0 or (key in ("turns", "branches") and getattr(tc, key) < 1):
            raise ValueError(f"{where}: class {tc.name}: {key} out of range ({getattr(tc, key)})")
    if tc.prompt_tokens is not None and tc.prompt_tokens < tc.shared_prefix_tokens:
        raise ValueError(f"{where}: class {tc.name}: prompt_tokens < shared_prefix_tokens")
    return tc


def load_questions(path: Path) -> list[Question]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"[taskset] file {path} cannot be read ({exc})") from exc
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            q = Question(str(row["prompt"]), str(row["answer"]), str(row.get("match", "regex")),
                         str(row.get("kind", "qa")))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: a task needs JSON with prompt and answer ({exc})") from exc
        if q.match not in ("regex", "exact"):
            raise ValueError(f"{path}:{n}: match must be 'regex' or 'exact', not {q.match!r}")
        out.append(q)
    if not out:
        raise ValueError(f"{path}: the task set is empty")
    return out


# ---- prompts of exact token counts --------------------------------------------------------------

_WORDS = ("the river market opened early and traders carried baskets of grain fruit salt cloth along "
          "narrow roads while clerks counted coins recorded every sale in long books kept the accounts "
          "of each family farm mill bridge harbor ship storm winter summer rain light stone wall tower "
          "garden field village town city north south east west morning evening night day week month year "
          "old new small large quiet busy simple careful clear bright dark warm cold green blue red white "
          "black brown golden silver copper iron wood paper glass water fire wind cloud hill valley lake "
          "forest path door window table chair letter number name story song voice hand head heart mind "
          "friend teacher student worker farmer baker driver sailor doctor writer reader builder").split()
SENTINEL = "\u0001USER\u0001"


class PromptBuilder:
    """Prompts whose templated token count is exact for one tokenizer, made of deterministic filler.

    All filler goes into the system message and the user message is the task's question alone (the
    small model answers as it would without the filler). The class's shared prefix is the start of
    that system message: identical text, hence identical leading tokens, in every request of the
    class, so a prefix cache can reuse its full blocks. Each request's own filler follows it and is
    padded or trimmed one token at a time until the whole templated prompt has exactly
    `prompt_tokens` tokens.
    """

    LEAD = "Reference notes:"

    def __init__(self, tokenizer, seed: int, cls: TaskClass) -> None:
        self.tok, self.seed, self.cls = tokenizer, seed, cls
        self.words = [w for w in _WORDS if len(tokenizer.encode(" " + w)) == 1]
        if len(self.words) < 20:
            raise ValueError("this tokenizer splits most filler words; cannot build exact prompts")
        self.shared, self.head = None, []
        if cls.shared_prefix_tokens:
            make = lambda n: self.LEAD + self._filler("prefix", n)
            n = self._fit(lambda n: len(self._head(make(n))), cls.shared_prefix_tokens, "shared prefix")
            self.shared = make(n)
            self.head = self._head(self.shared)

    def _filler(self, key: str, n: int) -> str:
        """n filler items (a word with its leading space, or a full stop), one token each."""
        rng = random.Random(f"{self.seed}:{self.cls.name}:{key}")
        items: list[str] = []
        while len(items) < n:
            items.extend([" " + rng.choice(self.words) for _ in range(rng.randint(6, 14))] + ["."])
        return "".join(items[:n])

    def _render(self, system: str | None, user: str) -> list[int]:
        msgs = ([{"role": "system", "content": system}] if system is not None else []) + \
               [{"role": "user", "content": user}]
        return self.tok.encode(self.tok.apply_chat_template(msgs, add_generation_prompt=True), add_special=False)

    def _head(self, system: str) -> list[int]:
        """Tokens of the templated prompt up to the end of `system` (the part every request shares)."""
        text = self.tok.apply_chat_template([{"role": "system", "content": system},
                                             {"role": "user", "content": SENTINEL}], add_generation_prompt=True)
        return self.tok.encode(text[: text.index(system) + len(system)], add_special=False)

    def _fit(self, count, target: int, what: str) -> int:
        n, seen = max(0, target - count(0)), set()
        for _ in range(64):
            got = count(n)
            if got == target:
                return n
            seen.add(n)
            n = max(0, n + target - got)
            if n in seen:  # oscillating around an item that is not one token here: try neighbours
                for m in (n - 1, n + 1, n - 2, n + 2):
                    if m >= 0 and m not in seen and count(m) == target:
                        return m
                break
        raise ValueError(f"class {self.cls.name}: cannot build a {what} of exactly {target} tokens "
                         f"(closest: {got})")

    def request(self, question: str, key: str) -> tuple[str | None, int | None]:
        """(system message, the prompt's exact token count) for one request whose user message is `question`."""
        target = self.cls.prompt_tokens
        if not target:
            return self.shared, None
        base = self.shared or self.LEAD
        if len(self._render(base, question)) > target:
            raise ValueError(f"class {self.cls.name}: prompt_tokens = {target} is shorter than the template, "
                             f"shared prefix and question ({len(self._render(base, question))} tokens)")
        make = lambda m: base + self._filler(key, m)
        system = make(self._fit(lambda m: len(self._render(make(m), question)), target, "prompt"))
        tokens = self._render(system, question)
        if self.head and tokens[: len(self.head)] != self.head:
            raise ValueError(f"class {self.cls.name}: the shared prefix does not tokenize the same in every prompt")
        return system, len(tokens)


def load_tokenizer(spec: str | None):
    """The tokenizer prompts are counted with: 'bundled' / None, a GGUF file, or a Hugging Face folder,
    read through the engine loader's checked path (a bad file is a ModelLoadError naming it)."""
    from inferledger.engine.loader import load_tokenizer as checkpoint_tokenizer

    return checkpoint_tokenizer(None if spec in (None, "", "bundled") else Path(spec))
