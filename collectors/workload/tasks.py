"""The task set: questions with known answers (JSON Lines), which requests take in file order, cycling."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MATCHES = ("regex", "exact")
MAX_TASKSET_BYTES = 64 << 20  # a task set is read whole: at most 64 MiB (docs/CAPTURE.md "Bounds")
MAX_TASKSET_ROWS = 100_000  # requests cycle through it, and no workload plans more requests than this


@dataclass
class Question:
    prompt: str
    answer: str
    match: str = "regex"  # regex (case-insensitive search) or exact (whole answer, case and '.' ignored)
    kind: str = "qa"


def load_questions(path: Path) -> list[Question]:
    """Every row of the task set, or a ValueError naming the file and line of the first bad one."""
    try:
        size = path.stat().st_size
        if size > MAX_TASKSET_BYTES:
            raise ValueError(f"{path}: the task set is {size} bytes: at most {MAX_TASKSET_BYTES} ({MAX_TASKSET_BYTES >> 20} "
                             f"MiB) are read; keep the rows the workload asks (requests take them in order, cycling)")
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"[taskset] file {path} cannot be read ({exc})") from exc
    rows = sum(1 for line in lines if line.strip())
    if rows > MAX_TASKSET_ROWS:
        raise ValueError(f"{path}: the task set has {rows} rows: at most {MAX_TASKSET_ROWS} (no workload plans more "
                         f"requests than that)")
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: a task needs JSON with prompt and answer ({exc})") from exc
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: a task is a JSON object with prompt and answer, not {line[:40]!r}")
        for key, default in (("prompt", None), ("answer", None), ("match", "regex"), ("kind", "qa")):
            value = row.get(key, default)
            if not isinstance(value, str) or (key == "prompt" and not value.strip()):
                raise ValueError(f"{path}:{n}: {key}: must be a non-empty string, not {value!r}" if key == "prompt"
                                 else f"{path}:{n}: {key}: must be a string, not {value!r}")
        q = Question(row["prompt"], row["answer"], row.get("match", "regex"), row.get("kind", "qa"))
        if q.match not in MATCHES:
            raise ValueError(f"{path}:{n}: match must be 'regex' or 'exact', not {q.match!r}")
        out.append(q)
    if not out:
        raise ValueError(f"{path}: the task set is empty")
    return out
