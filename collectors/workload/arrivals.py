"""Arrival processes: planned offsets (seconds from the start of the run) of the open-loop tasks."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

from .read_lines import ReadLines


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


def read_replay(path: Path, first: int | None = None, most: int = 100_000) -> tuple[list[float], dict]:
    """Planned arrival offsets in ms: one number per line, or JSON Lines with `t_ms` ('#' comments). Read
    as a stream, lines of at most 1 MiB: the `first` arrivals (None: every one, refused past `most`), a
    ValueError naming the file and line of a bad one; with what was read (`ReadLines.covered`: the sha256
    of the bytes read, through the last arrival used, and how many)."""
    out: list[float] = []
    with ReadLines(path, MAX_LINE, "one arrival a line") as lines:
        try:
            for n, line in enumerate(lines, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                out.append(_arrival(path, n, line, out[-1] if out else 0.0))
                if len(out) == first:
                    break
                if first is None and len(out) > most:
                    raise ValueError(f"{path}:{n}: more than {most} arrivals: at most {most} tasks in one "
                                     f"workload; set [arrivals].n_tasks (at most {most}) to replay the first ones")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not a text file of arrivals ({exc})") from None
        return out, lines.covered()


MAX_LINE = 1 << 20  # bytes of one line of a replay file


def _arrival(path: Path, n: int, line: str, last: float) -> float:
    """One line's offset in ms, at least the line before's."""
    try:
        value = json.loads(line)
        t_ms = float(value["t_ms"] if isinstance(value, dict) else value)
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise ValueError(f"{path}:{n}: expected a number of ms or a JSON object with t_ms "
                         f"({type(exc).__name__}: {str(exc)[:200]})") from None
    if not math.isfinite(t_ms) or t_ms < 0:
        raise ValueError(f"{path}:{n}: t_ms must be a finite number >= 0, not {t_ms}")
    if t_ms < last:
        raise ValueError(f"{path}:{n}: arrival offsets must not decrease ({t_ms} after {last})")
    return t_ms


def planned_offsets(process: str, *, seed: int, n_tasks: int, rate_rps: float | None = None, cv2: float = 1.0,
                    replay_ms: list[float] | None = None, speed: float = 1.0) -> list[float] | None:
    """Planned arrival offsets (s) of the open-loop processes, deterministic from `seed`; None for the
    closed loop (a worker's next task arrives when its last one ends)."""
    rng = random.Random(f"{seed}:arrivals")
    if process == "poisson":
        return poisson_offsets(rate_rps, n_tasks, rng)
    if process == "gamma":
        return gamma_offsets(rate_rps, cv2, n_tasks, rng)
    if process == "replay":
        return [t / 1000.0 / speed for t in replay_ms[:n_tasks]]
    return None
