"""A workload from command-line flags, under vLLM bench serve's names (`capture --request-rate 4
--num-prompts 200 --input-len 512 --output-len 64`), alone or over a workload file's keys.

The flags never plan anything themselves: they write the same spec dict a workload TOML parses to,
and `Workload.from_dict` checks it against the one format (schema) and plans it. docs/CAPTURE.md
"Load from flags" lists every flag beside vLLM bench's, AIPerf's and GuideLLM's names.
"""
from __future__ import annotations

import copy
import math
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .load import TASKS_DIR
from .schema import MAX_TASKS

TRACE_FORMATS = ("azure", "burstgpt", "mooncake")
# A workload from flags alone: vLLM bench serve's random dataset's lengths, a task set with answers for
# the prompts' words, and a client that waits as long as vLLM bench's (its requests have no deadline).
DEFAULT_NUM_PROMPTS = 100
DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128
DEFAULT_TIMEOUT_MS = 600_000.0
WHERE = "command line"


class FlagError(ValueError):
    """A flag (or two that contradict each other) refused: `flag` names it for the message."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


@dataclass(frozen=True)
class LoadFlags:
    """The load flags as given; None: not given (the file's key, else the default, stays)."""

    request_rate: float | None = None  # requests/s; math.inf: all at once
    num_prompts: int | None = None
    duration_s: float | None = None
    max_concurrency: int | None = None
    burstiness: float | None = None  # gamma shape of the gaps (1: Poisson), vLLM's
    input_len: int | None = None
    output_len: int | None = None
    range_ratio: float | None = None
    dataset: str | None = None  # random | PATH (a task set) | azure:PATH | burstgpt:PATH | mooncake:PATH
    seed: int | None = None
    ignore_eos: bool | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in vars(self).values())


def parse_rate(text: str) -> float:
    """`--request-rate`: a positive number of requests per second, or inf (every request at once)."""
    if text.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        rate = float(text)
    except ValueError:
        raise FlagError("--request-rate", f"{text!r}: a number of requests per second, or inf") from None
    if not (rate > 0 and math.isfinite(rate)):
        raise FlagError("--request-rate", f"{text!r}: must be > 0 (or inf)")
    return rate


def parse_dataset(text: str) -> tuple[str, str | None]:
    """`--dataset` as (kind, path): ('random', None), ('tasks', PATH) or (trace format, PATH)."""
    if text == "random":
        return "random", None
    kind, sep, path = text.partition(":")
    if sep and kind in TRACE_FORMATS:
        if not path:
            raise FlagError("--dataset", f"{text!r}: {kind}:PATH needs the trace file's path")
        return kind, path
    return "tasks", text


def workload_spec(flags: LoadFlags, base: dict | None = None) -> dict:
    """The workload spec dict the flags describe: over `base` (a workload file's parsed TOML, whose keys
    the flags override) or, without one, vLLM bench serve's random dataset. Paths in it are as given
    (relative to the current folder when given as flags). Contradictory flags raise FlagError."""
    spec = copy.deepcopy(base) if base is not None else _default_spec()
    for section in ("taskset", "arrivals", "generation", "client", "contract", "trace"):
        spec.setdefault(section, {})
    if flags.seed is not None:
        spec["seed"] = flags.seed
    kind = _dataset(spec, flags)
    _lengths(spec, flags, kind, fresh=base is None)
    _arrivals(spec, flags, kind)
    return {k: v for k, v in spec.items() if v != {} or k == "taskset"}


def _default_spec() -> dict:
    return {"name": "flags", "seed": 0, "taskset": {"file": str(TASKS_DIR / "basic.jsonl")},
            "arrivals": {"n_tasks": DEFAULT_NUM_PROMPTS},
            "contract": {"deadline_ms": DEFAULT_TIMEOUT_MS}, "client": {"timeout_ms": DEFAULT_TIMEOUT_MS},
            "generation": {"max_tokens": DEFAULT_OUTPUT_LEN, "temperature": 0.0}}


def _dataset(spec: dict, flags: LoadFlags) -> str:
    """Point the spec at the dataset; returns 'random', 'tasks' or a trace format."""
    if flags.dataset is None:
        return "trace" if spec["arrivals"].get("process") == "trace" else "tasks" if "classes" in spec else "random"
    kind, path = parse_dataset(flags.dataset)
    if kind == "tasks":
        spec["taskset"]["file"] = str(Path(path).absolute())
    elif kind in TRACE_FORMATS:
        spec["arrivals"] = {k: v for k, v in spec["arrivals"].items() if k in ("speed",)} | {"process": "trace"}
        spec["trace"] = {**{k: v for k, v in spec["trace"].items() if k not in ("format", "file", "block_tokens")},
                         "format": kind, "file": str(Path(path).absolute())}
        spec.pop("classes", None)
        spec["generation"].setdefault("ignore_eos", True)
        return "trace"
    return kind


def _lengths(spec: dict, flags: LoadFlags, kind: str, fresh: bool) -> None:
    """Prompt and output lengths: vLLM's random dataset draws each request's input and output length
    uniformly in [L (1 - r), L (1 + r)]; here the draws become classes weighted by their counts, so the
    workload's smooth round robin deals each drawn pair exactly as often as it was drawn."""
    if kind == "trace":
        for flag, v in (("--input-len", flags.input_len), ("--output-len", flags.output_len),
                        ("--random-range-ratio", flags.range_ratio)):
            if v is not None:
                raise FlagError(flag, f"{flag}: a trace's rows fix each request's lengths (scale them with the "
                                "workload file's [trace].token_scale)")
        return
    if flags.ignore_eos is not None:
        spec["generation"]["ignore_eos"] = flags.ignore_eos
    if flags.output_len is not None:
        spec["generation"]["max_tokens"] = flags.output_len
    ratio = flags.range_ratio or 0.0
    if not 0 <= ratio < 1:
        raise FlagError("--random-range-ratio", f"{ratio}: must be in [0, 1)")
    if kind != "random" or not fresh:  # a task set's questions, or a file's classes: lengths only where given
        if ratio:
            raise FlagError("--random-range-ratio", "only with --dataset random and no workload file (a file's "
                            "classes keep their own lengths)")
        if flags.input_len is not None:
            classes = spec.get("classes") or [{"name": "default"}]
            spec["classes"] = [{**c, "prompt_tokens": flags.input_len,
                                "shared_prefix_tokens": min(c.get("shared_prefix_tokens", 0), flags.input_len)}
                               for c in classes]
        if flags.output_len is not None:
            for c in spec.get("classes") or []:
                c.pop("max_tokens", None)
        return
    n_in = flags.input_len if flags.input_len is not None else DEFAULT_INPUT_LEN
    n_out = spec["generation"]["max_tokens"]
    spec["classes"] = _random_classes(n_in, n_out, ratio, _n_tasks(spec, flags), spec.get("seed", 0))


def _random_classes(n_in: int, n_out: int, ratio: float, n: int, seed: int) -> list[dict]:
    if ratio == 0:
        return [{"name": "random", "prompt_tokens": n_in, "max_tokens": n_out}]
    rng = random.Random(f"{seed}:random-lengths")

    def draw(length: int) -> int:
        return rng.randint(max(1, math.floor(length * (1 - ratio))), math.ceil(length * (1 + ratio)))

    pairs = Counter((draw(n_in), draw(n_out)) for _ in range(n))
    return [{"name": f"random_in{i}_out{o}", "weight": float(w), "prompt_tokens": i, "max_tokens": o}
            for (i, o), w in sorted(pairs.items())]


def _n_tasks(spec: dict, flags: LoadFlags) -> int:
    if flags.num_prompts is not None and flags.duration_s is not None:
        raise FlagError("--duration", "give --num-prompts or --duration, not both")
    if flags.duration_s is not None:
        rate = flags.request_rate if flags.request_rate is not None else spec["arrivals"].get("rate_rps")
        if rate is None or math.isinf(rate):
            raise FlagError("--duration", "--duration S needs a finite --request-rate R (R x S requests); at inf "
                            "give --num-prompts")
        if rate * flags.duration_s > MAX_TASKS:  # refused by the flags that make it, not the derived count
            raise FlagError("--duration", f"--duration {flags.duration_s:g} s at {rate:g} requests/s makes "
                            f"{rate * flags.duration_s:.3g} requests: at most {MAX_TASKS} in one workload "
                            f"(--duration <= {MAX_TASKS / rate:g} s at this rate)")
        return max(1, round(rate * flags.duration_s))
    if flags.num_prompts is not None:
        return flags.num_prompts
    return spec["arrivals"].get("n_tasks") or DEFAULT_NUM_PROMPTS


def _arrivals(spec: dict, flags: LoadFlags, kind: str) -> None:
    a = spec["arrivals"]
    if kind == "trace":
        if flags.request_rate is not None or flags.duration_s is not None or flags.burstiness is not None:
            flag = "--request-rate" if flags.request_rate is not None else \
                "--duration" if flags.duration_s is not None else "--burstiness"
            raise FlagError(flag, f"{flag}: a trace's rows carry their own arrival times (replay them faster "
                            "with the workload file's [arrivals].speed)")
        if flags.num_prompts is not None:
            spec["trace"]["max_rows"] = flags.num_prompts
        if flags.max_concurrency is not None:
            a["concurrency"] = flags.max_concurrency
        return
    n = _n_tasks(spec, flags)
    rate = flags.request_rate
    if rate is None and "process" not in a:
        rate = math.inf  # vLLM bench serve's default: every request at once
    if rate is not None:
        for k in ("file", "speed", "think_ms"):
            a.pop(k, None)
        if math.isinf(rate):
            if flags.burstiness is not None:
                raise FlagError("--burstiness", "--burstiness shapes the gaps of a finite --request-rate")
            a.update(process="closed", concurrency=flags.max_concurrency or n)
            a.pop("rate_rps", None)
            a.pop("cv2", None)
        else:
            a.update(process="poisson", rate_rps=rate)
            a.pop("cv2", None)
            if flags.max_concurrency is not None:
                a["concurrency"] = flags.max_concurrency
            else:
                a.pop("concurrency", None)
    elif flags.max_concurrency is not None:
        a["concurrency"] = flags.max_concurrency
    if flags.burstiness is not None:
        if a.get("process") not in ("poisson", "gamma"):
            raise FlagError("--burstiness", "--burstiness shapes the gaps of a finite --request-rate")
        a.update(process="gamma", cv2=1.0 / flags.burstiness)  # gamma of shape k: CV^2 of its gaps is 1/k
    a["n_tasks"] = n


def flags_workload(path: Path | None, flags: LoadFlags):
    """The workload to run: the file at `path` (its keys overridden by the flags given), or the flags
    alone; checked and planned by the one format (`Workload.from_dict`). ValueError / FlagError."""
    from .load import Workload, read_spec

    if path is None:
        return Workload.from_dict(workload_spec(flags), base=Path.cwd(), where=WHERE, default_name="flags")
    if not flags.given:
        return Workload.load(path)
    _, spec = read_spec(path)
    wl = Workload.from_dict(workload_spec(flags, spec), base=path.parent, default_name=path.stem,
                            where=f"{path} (with the command line's flags)")
    wl.path = str(path)
    return wl
