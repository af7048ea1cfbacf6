"""What the studies on the real engine share: a workload built in memory, and one capture per run.

Each run is a normal `inferledger capture` of the embedded engine (its HTTP front end, the load
client over loopback, engine, server and client events in one run directory) on the model the study
was given, so it opens alone with `report` and `query`. The workload is declared here as the TOML
format's dict (collectors/workload/schema.py): a task set whose every answer is accepted (these
studies measure time, not answers: an attempt is good when it completes within its deadline) and
planned arrivals (a replay of offsets in ms, or an open-loop process).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from inferledger.collectors.capture.run import capture
from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.workload import Workload
from inferledger.studies.framework import task_ticks

# every answer accepted (a regex any output character matches): goodness is completion within the deadline
TASKS = ({"kind": "open", "prompt": "Write about the sea and the ships that sail on it.", "answer": "."},
         {"kind": "open", "prompt": "Tell a long story about a small village in the mountains.", "answer": "."})
LONG_MS = 600_000.0  # deadline and client timeout where a study does not judge time: ten minutes


def workload(name: str, classes: list[dict], *, max_tokens: int, arrivals_ms: list[float] | None = None,
             arrivals: dict | None = None, deadline_ms: float = LONG_MS, seed: int = 7,
             tasks: tuple[dict, ...] = TASKS) -> Workload:
    """A checked workload: `classes` as [[classes]] tables, greedy generation of `max_tokens` that
    ignores end-of-sequence, arrivals replayed from `arrivals_ms` or given as an [arrivals] table;
    `tasks` the task set's rows (prompt and answer)."""
    if (arrivals_ms is None) == (arrivals is None):
        raise ValueError("a study workload needs arrivals_ms or arrivals, not both")
    with tempfile.TemporaryDirectory(prefix="inferledger-study-") as tmp:
        base = Path(tmp)
        (base / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
        if arrivals_ms is not None:
            (base / "arrivals.txt").write_text("".join(f"{t:g}\n" for t in arrivals_ms))
            arrivals = {"process": "replay", "file": "arrivals.txt"}
        spec = {"name": name, "seed": seed, "taskset": {"file": "tasks.jsonl"}, "arrivals": arrivals,
                "contract": {"deadline_ms": deadline_ms},
                "client": {"timeout_ms": max(deadline_ms, LONG_MS), "max_attempts": 1},
                "generation": {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True},
                "classes": classes}
        return Workload.from_dict(spec, base=base, where=f"study workload {name}", default_name=name)


def check_order(wl: Workload, tokenizer, expected: list[str]) -> None:
    """The classes dealt to the tasks, in task order, are `expected` (a study's design relies on it)."""
    got = [p.cls.name for p in wl.plan(tokenizer)]
    if got != expected:
        raise ValueError(f"study workload {wl.name}: its tasks' classes are {got}, the design needs {expected}")


def capture_run(run_dir: Path, run_id: str, wl: Workload, bundle, *, max_num_seqs: int,
                engine_config: dict | None = None, microbenchmarks: bool = False) -> dict:
    """One capture of `wl` on the embedded engine serving `bundle`; returns the run's manifest. The
    device microbenchmarks are skipped (a study compares its runs with each other, not with roofs) unless
    `microbenchmarks` (the fidelity study prices one run's fit at another run's host with them)."""
    options = CaptureOptions(max_num_seqs=max_num_seqs, engine_config=engine_config or {}, run_id=run_id,
                             microbenchmarks=microbenchmarks)
    tick, done = task_ticks(), [0]

    def progress() -> None:  # the study's progress: tasks done of the run's
        done[0] += 1
        tick(done[0], wl.n_tasks)
    return capture(wl, run_dir, options, bundle=bundle, progress=progress if tick is not None else None).manifest
