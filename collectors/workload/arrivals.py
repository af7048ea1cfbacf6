"""Arrival processes: planned offsets (seconds from the start of the run) of the open-loop tasks."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path


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
