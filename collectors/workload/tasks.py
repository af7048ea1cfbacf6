"""The task set: questions with known answers (JSON Lines), which requests take in file order, cycling."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MATCHES = ("regex", "exact")


@dataclass
class Question:
    prompt: str
    answer: str
    match: str = "regex"  # regex (case-insensitive search) or exact (whole answer, case and '.' ignored)
    kind: str = "qa"


def load_questions(path: Path) -> list[Question]:
    """Every row of the task set, or a ValueError naming the file and line of the first bad one."""
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
        if q.match not in MATCHES:
            raise ValueError(f"{path}:{n}: match must be 'regex' or 'exact', not {q.match!r}")
        out.append(q)
    if not out:
        raise ValueError(f"{path}: the task set is empty")
    return out
