"""fidelity: how close the simulated clock comes to the real engine on a workload it was not fitted on.

Three runs. `fit`: a real capture of the calibration workload (`--set calibration=W2.toml`, else the
study's own mix of prompt lengths and batch sizes), whose steps train a step fit (costmodel.fit.StepFit
over the ledger's step_model: its work at the run's measured rates, α and a compute efficiency fitted on
contention-free time, with the host time between steps as a second term). `real`: a real capture of the
workload under test (`--workload W.toml`, else the study's own second mix), retries, timeouts and
cancellations included. `sim`: the attempts of `real` on the simulated clock, keyed on `attempt_id`: each
attempt that reached the engine arrives when it reached it (a retry is its own attempt with its own
arrival; an arrival the real client made after another attempt ended, a closed loop's or a session's
next, comes that long after the other's simulated end: `causes`), with its prompt length (sharing the blocks the real prefix cache served it) and the output the
engine gave it; an attempt the engine saw cancelled
is aborted in the simulation when the real engine learned of the cancellation (engine.cancel_received),
whatever the simulated attempt had produced by then. The simulation is the real scheduler and block
manager with the bundled model's shape declared, each step lasting what the fit predicts for its work
(collectors/sim/step_time.FittedStepModel), around which the real run's own host is replayed: its engine's
idle wake-ups, its steps' contention by time and its gap between steps (`host_replay`). The knob is the
clock: real or simulated.

The comparison pairs the two runs' attempts on attempt_id and holds the server layer of request_metrics
(ttft_server_ms, tpot_server_ms, e2e_server_ms) of the attempts both engines completed, at p50 / p99,
against the targets, each error with its 95 % interval over the attempts (the paired attempts resampled:
how far this many attempts pin it down); it says what was replayed and what was not, and how much of
`real`'s step time was spent waiting for a CPU (step_model.contention_ms), since the fit and the real run
share the host.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from inferledger.collectors.sim.declared import DeclaredModel
from inferledger.collectors.sim.run import Follows, HostReplay, SimRequest, distinct_prompt, simulate
from inferledger.collectors.sim.runner import emitted_token
from inferledger.collectors.sim.step_time import FittedStepModel
from inferledger.collectors.workload import Workload
from inferledger.costmodel.fit import FitError, StepFit, decode_ratio_by_window, held_out_summary
from inferledger.engine.params import EngineConfig
from inferledger.ledger.query import Ledger, open_ledger, resolve_runs
from inferledger.ledger.fit_read import StepsUnreadable, ledger_fit_points, on_test_host, run_fit
from inferledger.probes.run_folder import Manifest, RunFolderError
from inferledger.studies.framework import Option, Study, StudyError, StudyRun, StudyRuns, Table
from inferledger.studies.real import capture_run, workload

MAX_NUM_SEQS = 8
# figure -> (request_metrics column, quantile, target: |sim − real| / real at most; None: shown, not judged)
TARGETS = (("TPOT p50", "tpot_server_ms", 0.5, 0.05), ("TTFT p50", "ttft_server_ms", 0.5, 0.10),
           ("E2E p99", "e2e_server_ms", 0.99, 0.10), ("TTFT p99", "ttft_server_ms", 0.99, None),
           ("TPOT p99", "tpot_server_ms", 0.99, None), ("E2E p50", "e2e_server_ms", 0.5, None))
FIGURE_COLUMNS = ("ttft_server_ms", "tpot_server_ms", "e2e_server_ms")
# scale -> (fit workload, test workload): (classes as (prompt tokens, output tokens), tasks, rate req/s, seed)
# The default fit mix reaches decode steps of 1 to 7 sequences and contexts past 600 tokens per sequence (on the
# simulated clock: 193 to 330 single-sequence decode steps, 59 to 169 of two, 53 to 110 of three, a few dozen of 4 to 8
# over seeds 3, 5 and 7), so a sequence's and a context token's cost are seen, not extrapolated (docs/STUDIES.md)
SCALES = {"default": ((((40, 48), (128, 48), (384, 24), (640, 16)), 32, 0.8, 3), (((64, 16), (256, 16)), 14, 0.4, 11)),
          "tiny": ((((40, 6), (96, 3)), 6, 8.0, 3), (((48, 4),), 3, 4.0, 11))}
FIT, REAL = 0, 1
# how each attempt of run real is replayed (the sim's manifest `workload.replay` counts them)
WHOLE, UNTIL_CANCEL = "whole", "until_cancel"


def shape(options: dict) -> tuple:
    if options["scale"] not in SCALES:
        raise StudyError(f"--set scale={options['scale']}: expected one of {', '.join(SCALES)}")
    return SCALES[options["scale"]]


def _given(options: dict, which: int) -> tuple[str, str]:
    """(the flag, the workload file) of the fit or the real run; the file is '' for the study's own mix."""
    return ("--set calibration", options["calibration"]) if which == FIT else ("--workload (--set workload)", options["workload"])


def _load(options: dict, which: int) -> Workload:
    """The workload of the fit or the real run: the file given (checked as `capture` checks it: exit 2
    naming the file and key, before any model is loaded), else the study's own mix at its scale."""
    flag, path = _given(options, which)
    if path:
        try:
            return Workload.load(path)
        except ValueError as exc:
            raise StudyError(f"{flag}: {exc}") from None
    classes, n, rate, seed = shape(options)[which]
    return workload(f"fidelity-{'fit' if which == FIT else 'test'}",
                    [{"name": f"p{p}", "prompt_tokens": p, "max_tokens": o} for p, o in classes],
                    max_tokens=max(o for _, o in classes), seed=seed,
                    arrivals={"process": "poisson", "rate_rps": rate, "n_tasks": n})


def _capture(options: dict, which: int, run_dir: Path, run_id: str, bundle) -> None:
    # read again: a capture may calibrate its workload in place
    # with the microbenchmarks repeated over the run: the host's rates while it ran, which the simulation of run
    # real prices the fit of run fit at (ledger/fit_read.on_test_host)
    capture_run(run_dir, run_id, _load(options, which), bundle, max_num_seqs=MAX_NUM_SEQS, microbenchmarks=True)


# every attempt of run real, with what its engine saw of it: its arrival (engine.enqueued, with the prompt's
# token count, max_tokens and n), the cancellation it learned of (engine.cancel_received), how it ended
ATTEMPTS_SQL = """
WITH enq AS (
  SELECT attempt_id, ts_ns, clock, value::BIGINT AS prompt_tokens,
         TRY_CAST(json_extract(attrs, '$.max_tokens') AS BIGINT) AS max_tokens,
         coalesce(TRY_CAST(json_extract(attrs, '$.n') AS BIGINT), 1) AS n
  FROM events WHERE name = 'engine.enqueued'),
cancel AS (SELECT attempt_id, clock, min(ts_ns) AS ns FROM events WHERE name = 'engine.cancel_received' GROUP BY ALL),
fin AS (SELECT attempt_id, clock, min(ts_ns) AS ns FROM events WHERE name = 'engine.finished' GROUP BY ALL),
sent AS (SELECT attempt_id, any_value(json_extract_string(attrs, '$.planned')) AS planned FROM events
         WHERE name = 'attempt.sent' GROUP BY ALL)
SELECT a.attempt_id, a.request_id, a.task_id, a.attempt_index, a.client_status, a.server_status, a.finish_reason,
       a.n_tokens_engine, e.prompt_tokens, e.max_tokens, e.n, e.ts_ns AS enqueued_ns, e.clock, c.ns AS cancel_ns,
       f.ns AS finished_ns, s.planned
FROM attempts a LEFT JOIN enq e USING (attempt_id)
LEFT JOIN cancel c ON c.attempt_id = a.attempt_id AND c.clock = e.clock
LEFT JOIN fin f ON f.attempt_id = a.attempt_id AND f.clock = e.clock
LEFT JOIN sent s ON s.attempt_id = a.attempt_id
ORDER BY e.ts_ns NULLS LAST, a.attempt_id"""

# each task's planned arrival (with its process: a closed loop's arrival waits for a task's end) and its end, on
# the client's clock
TASKS_SQL = """SELECT task_id, min(ts_ns) FILTER (WHERE name = 'arrival.planned') AS arrival_ns,
       any_value(json_extract_string(attrs, '$.process')) FILTER (WHERE name = 'arrival.planned') AS process,
       max(ts_ns) FILTER (WHERE name = 'task.end') AS end_ns
FROM events WHERE name IN ('arrival.planned', 'task.end') AND task_id IS NOT NULL GROUP BY ALL"""


def replay_plan(attempts: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the attempts replayed, each with `replay` whole or until_cancel, its arrival and cancel in ms from the
    first arrival and its max_tokens; the attempts not replayed, each with `why`). Whole: the engine finished
    it (stop or length), replayed to the output it gave. Until cancel: the engine learned of a cancellation
    (a client timeout that disconnected, a client cancel, the capture's drain), replayed with its max_tokens
    and aborted at that moment. An abandoned attempt the engine served to its end is replayed whole."""
    done, left = [], []
    for a in attempts:
        why = None
        if a["enqueued_ns"] is None:
            why = f"never reached the engine (client {a['client_status']}, server {a['server_status']})"
        elif a["n"] != 1:
            why = f"asked for {a['n']} choices; the simulation replays one per attempt"
        elif a["finish_reason"] in ("stop", "length") and a["n_tokens_engine"]:
            done.append({**a, "replay": WHOLE, "tokens": a["n_tokens_engine"]})
        elif a["cancel_ns"] is not None and a["max_tokens"]:
            done.append({**a, "replay": UNTIL_CANCEL, "tokens": a["max_tokens"]})
        else:
            why = (f"the engine neither finished it with a token nor learned of a cancellation (server "
                   f"{a['server_status']}, finish reason {a['finish_reason']})")
        if why:
            left.append({"attempt_id": a["attempt_id"], "request_id": a["request_id"], "why": why})
    clocks = sorted({a["clock"] for a in done})
    if len(clocks) > 1:
        raise StudyError(f"run real: its attempts reached the engine on {len(clocks)} clocks ({', '.join(clocks)}); "
                         "arrivals on different clocks cannot be replayed on one")
    t0 = min((a["enqueued_ns"] for a in done), default=0)
    for a in done:
        a["arrival_ms"] = (a["enqueued_ns"] - t0) / 1e6
        a["cancel_at_ms"] = None if a["replay"] == WHOLE else (a["cancel_ns"] - t0) / 1e6
    return done, left


def causes(done: list[dict], tasks: list[dict]) -> dict[str, Follows]:
    """attempt_id -> the attempt whose simulated end (or arrival) sets its arrival, as the real client's did:
    a closed loop's task arrives when a task ends (the latest end before its planned arrival that no other
    arrival took), so its first attempts follow that task's last attempt to end; a session's next turn
    (sent as `turn`) follows the latest end of its task's other requests before it reached the engine; a retry
    (sent as `retry`) follows its previous attempt's arrival (its timeout counts from that send). The delay is
    the real one (this attempt's engine.enqueued − the cause's engine.finished or engine.enqueued). Only causes
    replayed whole count; any other attempt arrives at its own time."""
    whole = {a["attempt_id"]: a for a in done if a["replay"] == WHOLE and a["finished_ns"] is not None}
    by_task: dict[str, list[dict]] = {}
    for a in done:
        by_task.setdefault(a["task_id"], []).append(a)
    out: dict[str, Follows] = {}

    def after_end(a: dict, cause: dict | None) -> None:
        if cause is not None and a["enqueued_ns"] >= cause["finished_ns"]:
            out[a["attempt_id"]] = Follows(cause["attempt_id"], (a["enqueued_ns"] - cause["finished_ns"]) / 1e6)

    ends = sorted((t["end_ns"], t["task_id"]) for t in tasks if t["end_ns"] is not None)
    taken: set[str] = set()
    for t in sorted((t for t in tasks if t["process"] == "closed" and t["arrival_ns"] is not None),
                    key=lambda t: t["arrival_ns"]):
        freed = [tid for ns, tid in ends if ns <= t["arrival_ns"] and tid not in taken and tid != t["task_id"]]
        if not freed:
            continue  # one of the loop's first arrivals
        taken.add(freed[-1])
        last = max((c for c in by_task.get(freed[-1], []) if c["attempt_id"] in whole),
                   key=lambda c: c["finished_ns"], default=None)
        for a in by_task.get(t["task_id"], []):
            if a["planned"] == "arrival":
                after_end(a, last)
    for a in done:
        if a["planned"] == "turn":
            before = [c for c in by_task.get(a["task_id"], []) if c["attempt_id"] in whole
                      and c["request_id"] != a["request_id"] and c["finished_ns"] <= a["enqueued_ns"]]
            after_end(a, max(before, key=lambda c: c["finished_ns"], default=None))
        elif a["planned"] == "retry":
            prev = [c for c in done if c["request_id"] == a["request_id"]
                    and c["attempt_index"] == a["attempt_index"] - 1 and c["enqueued_ns"] <= a["enqueued_ns"]]
            if prev:
                out[a["attempt_id"]] = Follows(prev[0]["attempt_id"],
                                               (a["enqueued_ns"] - prev[0]["enqueued_ns"]) / 1e6, "arrival")
    return out


# the real engine's idle wake-ups: for each step whose every attempt reached the engine after the step before it
# ended (the engine was idle), from the first of those arrivals to the step's start: the run's first, and the
# median of the others (NULL where there is none)
WAKE_SQL = """
WITH st AS (SELECT step_id, ts_ns AS start_ns, json_extract(attrs, '$.batch') AS batch FROM events WHERE name = 'step.start'),
en AS (SELECT step_id, ts_ns AS end_ns FROM events WHERE name = 'step.end'),
s AS (SELECT st.*, lag(end_ns) OVER (ORDER BY st.step_id) AS prev_end FROM st JOIN en USING (step_id)),
b AS (SELECT step_id, start_ns, prev_end, json_extract_string(unnest(from_json(batch, '["json"]')), '$[0]') AS attempt_id
      FROM s),
e AS (SELECT attempt_id, min(ts_ns) AS ns FROM events WHERE name = 'engine.enqueued' GROUP BY ALL),
w AS (SELECT step_id, (start_ns - min(e.ns)) / 1e6 AS wake_ms FROM b JOIN e USING (attempt_id)
      GROUP BY step_id, start_ns, prev_end HAVING prev_end IS NULL OR min(e.ns) > prev_end)
SELECT arg_min(wake_ms, step_id) AS first_wake_ms,
       quantile_cont(wake_ms, 0.5) FILTER (WHERE step_id > (SELECT min(step_id) FROM w)) AS wake_ms,
       count(*) AS n FROM w"""

# each real step's share of wall time spent waiting for a CPU or asleep on a lock (step_model.contention_ms and
# blocked_ms: the fit learns neither), with its start and end;
# and the median host time between two steps the engine worked across (step_model.gap_after_ms)
GAP_SQL = "SELECT quantile_cont(gap_after_ms, 0.5) AS gap_ms, count(gap_after_ms) AS n FROM step_model"


CONTENTION_PERIODS_SQL = """
SELECT s.ts_ns AS start_ns, e.ts_ns AS end_ns, (m.contention_ms + coalesce(m.blocked_ms, 0)) / nullif(m.measured_ms, 0) AS share
FROM step_model m JOIN events s ON s.name = 'step.start' AND s.step_id = m.step_id
JOIN events e ON e.name = 'step.end' AND e.step_id = m.step_id
WHERE m.contention_ms IS NOT NULL ORDER BY s.ts_ns"""


def host_replay(led, done: list[dict]) -> HostReplay:
    """What run real's host added around its steps, from its own events: the engine's first idle wake-up, the
    median of its later ones (the first where there is no other), its steps' contention by time, from the
    first replayed arrival (the simulation's time 0), and its median host time between steps (None where it
    has none: the fit's own)."""
    t0 = min(a["enqueued_ns"] for a in done)
    cols, rows = led.rows(WAKE_SQL)
    wake = dict(zip(cols, rows[0]))
    periods = tuple(((s - t0) / 1e6, (e - t0) / 1e6, max(0.0, sh))
                    for s, e, sh in led.rows(CONTENTION_PERIODS_SQL)[1] if sh is not None)
    first = wake["first_wake_ms"] or 0.0
    gap_ms, n_gaps = led.rows(GAP_SQL)[1][0]
    return HostReplay(first_wake_ms=first, wake_ms=first if wake["wake_ms"] is None else wake["wake_ms"],
                      contention=periods, gap_ms=gap_ms,
                      source=f"run real: its first and the median of its other {max(0, wake['n'] - 1)} idle wake-ups "
                             f"(engine.enqueued → step.start), the (contention_ms + blocked_ms) / wall time of its {len(periods)} "
                             f"steps whose wait is known and the median of its {n_gaps} gaps between steps "
                             "(step_model.gap_after_ms)")


# the real engine's block traffic: which attempt filled each block (kv.alloc), which cached blocks each attempt's
# prompt reused (kv.prefix_hit), in the order they happened
KV_SQL = """SELECT attempt_id, name, json_extract(attrs, '$.blocks')::BIGINT[] AS blocks FROM events
WHERE name IN ('kv.alloc', 'kv.prefix_hit') AND attempt_id IS NOT NULL ORDER BY ts_ns, seq"""


def prefix_sources(kv: list[tuple]) -> dict[str, tuple[str, int]]:
    """attempt_id -> (the attempt whose prompt and output it shared, the blocks shared): at an attempt's first
    prefix-cache hit, its k reused blocks are its first k, and the chained block hash makes them the first k
    of the attempt that last allocated the k-th of them (a reallocated block loses its hash)."""
    filled: dict[int, str] = {}
    sources: dict[str, tuple[str, int]] = {}
    for attempt, name, blocks in kv:
        if name == "kv.alloc":
            filled.update((b, attempt) for b in blocks or [])
        elif blocks and attempt not in sources and filled.get(blocks[-1], attempt) != attempt:
            sources[attempt] = (filled[blocks[-1]], len(blocks))
    return sources


def replay_prompts(done: list[dict], sources: dict[str, tuple[str, int]], block_size: int, vocab: int,
                   eos_ids) -> dict[str, tuple[int, ...]]:
    """attempt_id -> its simulated prompt, the attempts taken in arrival order. The attempts of one request
    replay one prompt (a retry resends its request's). An attempt whose prompt hit k cached blocks in the real
    run begins with the first k blocks of its source's simulated sequence (prompt, then the tokens the
    simulation emits: a session's next turn reuses the last one's answer), so the simulated cache can serve
    them too; the rest of every prompt shares no block with another request's."""
    index = {rid: i for i, rid in enumerate(dict.fromkeys(a["request_id"] for a in done))}
    by_request: dict[str, tuple[int, ...]] = {}
    sequences: dict[str, tuple[int, ...]] = {}
    prompts: dict[str, tuple[int, ...]] = {}
    for a in done:
        n = a["prompt_tokens"]
        prompt = by_request.get(a["request_id"])
        if prompt is None or len(prompt) != n:
            prompt = distinct_prompt(index[a["request_id"]], n, vocab)
            source, blocks = sources.get(a["attempt_id"], (None, 0))
            shared = sequences.get(source, ())[:min(blocks * block_size, n)]
            prompt = shared + prompt[len(shared):]
            by_request.setdefault(a["request_id"], prompt)
        prompts[a["attempt_id"]] = prompt
        output = tuple(emitted_token(n - 1 + j, vocab, eos_ids) for j in range(a["tokens"]))
        sequences[a["attempt_id"]] = prompt + output
    return prompts


def _simulate(run_dir: Path, run_id: str, bundle) -> None:
    runs_dir = run_dir.parent
    try:  # a fit run that cannot train one (a kept run edited or damaged before a --resume): named, not a traceback
        fit = run_fit(runs_dir / "fit")
    except (FitError, StepsUnreadable, RunFolderError, FileNotFoundError) as exc:
        raise StudyError(f"run fit ({runs_dir / 'fit'}): no step fit to simulate with: {exc}") from None
    fit.trained_on = "run fit"
    manifest = Manifest.read(runs_dir / "real")
    # run real's host: the fit's memory and compute terms scaled by the two captures' measured rates (the host of a
    # shared machine moves between captures minutes apart; its microbenchmarks see it apart from the steps)
    fit, at_host = on_test_host(fit, Manifest.read(runs_dir / "fit"), manifest)
    with open_ledger(runs_dir / "real") as led:
        cols, rows = led.rows(ATTEMPTS_SQL)
        attempts = [dict(zip(cols, r)) for r in rows]
        done, left = replay_plan(attempts)
        if not done:
            raise StudyError("run real: no attempt reached the engine, nothing to simulate")
        sources = prefix_sources(led.rows(KV_SQL)[1])
        cols, rows = led.rows(TASKS_SQL)
        follows = causes(done, [dict(zip(cols, r)) for r in rows])
        host = host_replay(led, done)
    cfg = {k: v for k, v in manifest.block("engine_config").items() if k in EngineConfig.__dataclass_fields__}
    config = EngineConfig(**cfg)
    prompts = replay_prompts(done, sources, config.block_size, bundle.config.shape.vocab,
                             set(bundle.config.eos_ids or []))
    requests = [SimRequest(a["request_id"], a["arrival_ms"], prompts[a["attempt_id"]], a["tokens"],
                           cancel_at_ms=a["cancel_at_ms"], attempt_id=a["attempt_id"],
                           follows=follows.get(a["attempt_id"])) for a in done]
    simulate(run_dir, requests, engine_config=config,
             step_model=FittedStepModel(fit, manifest.model_shape()),
             model=DeclaredModel(manifest.block("model").get("name") or "bundled", bundle.config, bundle.dtype),
             run_id=run_id, workload="the attempts of run real, as its engine received them", host=host)
    # what was replayed of run real, declared beside the plan (the study's replay table reads it)
    sim = Manifest.read(run_dir)
    sim.body["simulation"]["host_rates"] = at_host
    sim.body["workload"]["replay"] = {"of_run": "real", "attempts": len(attempts),
                          WHOLE: sum(a["replay"] == WHOLE for a in done),
                          UNTIL_CANCEL: sum(a["replay"] == UNTIL_CANCEL for a in done),
                          "not_replayed": left}
    sim.write(run_dir)


def _check_context(options: dict, which: int, wl: Workload) -> None:
    """A workload file's prompts and output budgets against the bundled model's context, read from the model
    file without its weights (the check `capture` makes, which in a study would come after the model loaded)."""
    flag, path = _given(options, which)
    if not path:
        return
    from inferledger.engine.loader import ModelLoadError, load_tokenizer, model_context

    try:
        context, tokenizer = model_context(), load_tokenizer() if wl.has_later_turns else None
        wl.check_context(context, "the model file's context length", tokenizer)
    except (ValueError, ModelLoadError) as exc:
        raise StudyError(f"{flag}: {exc}") from None


def runs(options: dict) -> list[StudyRun]:
    names = []
    for which in (FIT, REAL):  # every file checked before the model loads
        wl = _load(options, which)
        _check_context(options, which, wl)
        names.append(wl.name)
    return [StudyRun("fit", {"clock": "real", "workload": names[FIT]}, partial(_capture, options, FIT)),
            StudyRun("real", {"clock": "real", "workload": names[REAL]}, partial(_capture, options, REAL)),
            StudyRun("sim", {"clock": "simulated", "workload": names[REAL], "step_model": "fit on run fit"},
                     _simulate)]


def error_ratio(sim: float | None, real: float | None) -> float | None:
    """(sim − real) / real: the simulation's relative error (None when either is unknown or real is 0)."""
    return (sim - real) / real if sim is not None and real else None


# the fidelity table's columns, in the order its rows are built (compare)
FIDELITY_COLUMNS = ("figure", "column", "real_ms", "sim_ms", "error_ratio", "error_lo_ratio", "error_hi_ratio",
                    "target_ratio", "met", "n", "n_real", "n_sim")
RESAMPLES = 2000  # the paired bootstrap's resamples of the attempts (seeded: the same interval every time)
LEVEL = 0.95      # the interval's coverage
BEYOND = 5        # attempts needed on each side of a quantile for an interval: a p99 needs 500, a p50 10
RESAMPLE_CELLS = 1 << 21  # attempts drawn per batch of resamples (16 MiB of indices): a 100,000-attempt run's
# interval takes 100 batches of 20 resamples, not 1.6 GB of indices at once


def error_interval(pairs: list[tuple[float, float]], q: float) -> tuple[float | None, float | None]:
    """The LEVEL interval of a figure's error_ratio over the attempts it was computed on: `pairs` (real, sim)
    per attempt are resampled with replacement, RESAMPLES times (seed 0), the error of the two quantiles
    (quantile_linear, as the figure) computed on each resample, and its 2.5th and 97.5th percentile kept.
    Resampling the pairs keeps each attempt's real and simulated value together, so the interval is that of
    the error, not of either figure. (None, None) where fewer than BEYOND attempts lie on either side of the
    quantile (a bootstrap cannot tell where a p99 of 60 attempts would fall: it is their slowest one), and
    where a value is not a finite number (no interval is better than one computed over a NaN)."""
    n = len(pairs)
    if n == 0 or min(n * q, n * (1 - q)) < BEYOND:
        return None, None
    a = np.asarray(pairs, dtype=float)
    if not np.isfinite(a).all():
        return None, None
    rng, real, sim = np.random.default_rng(0), [], []
    per_batch = max(1, RESAMPLE_CELLS // n)  # resamples drawn at once: memory bounded whatever the attempts
    for start in range(0, RESAMPLES, per_batch):
        idx = rng.integers(0, n, size=(min(per_batch, RESAMPLES - start), n))
        real.append(np.quantile(a[:, 0][idx], q, axis=1))
        sim.append(np.quantile(a[:, 1][idx], q, axis=1))
    real, sim = np.concatenate(real), np.concatenate(sim)
    ok = real != 0
    if not ok.any():
        return None, None
    lo, hi = np.quantile(sim[ok] / real[ok] - 1, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


def sampling_sentence(key: list[list]) -> str:
    """Each judged figure's error with its interval over the attempts (the fidelity table's rows), in words:
    whether these attempts can tell a miss or a match from the target ('' without a judged figure)."""
    parts = []
    for row in key:
        r = dict(zip(FIDELITY_COLUMNS, row))
        figure, err, lo, hi, target, n = (r[k] for k in ("figure", "error_ratio", "error_lo_ratio", "error_hi_ratio",
                                                         "target_ratio", "n"))
        if target is None or err is None:
            continue
        if lo is None:
            parts.append(f"{figure} {err:+.1%} (no interval: {n} attempts leave fewer than {BEYOND} past its quantile)")
            continue
        tell = ("within" if -target <= lo and hi <= target else
                "outside" if hi < -target or lo > target else "straddling")
        parts.append(f"{figure} {err:+.1%} ({lo:+.1%} to {hi:+.1%}: {tell} its ±{target:.0%})")
    if not parts:
        return ""
    return (f"the paired attempts resampled, each judged error's {LEVEL:.0%} interval: " + "; ".join(parts)
            + " — an interval straddling its target is a miss or a match these attempts cannot tell apart; ")


# the attempts of both runs, paired on attempt_id (a full join: an attempt of one run alone keeps its row),
# with the server layer of request_metrics and each run's server_status; ? = run real's run_id, run sim's
PAIRED_SQL = """
WITH m AS (SELECT run_id, attempt_id, m.request_id, a.attempt_index, a.server_status, {cols}
           FROM request_metrics m JOIN attempts a USING (run_id, attempt_id)),
r AS (SELECT * FROM m WHERE run_id = ?), s AS (SELECT * FROM m WHERE run_id = ?)
SELECT coalesce(r.attempt_id, s.attempt_id) AS attempt_id, coalesce(r.request_id, s.request_id) AS request_id,
       coalesce(r.attempt_index, s.attempt_index) AS attempt_index, r.server_status AS real_status,
       s.server_status AS sim_status, {pairs},
       r.server_status = 'completed' AND s.server_status = 'completed' AS both_completed
FROM r FULL JOIN s USING (attempt_id)"""


def _paired_sql() -> str:
    return PAIRED_SQL.format(cols=", ".join(FIGURE_COLUMNS),
                             pairs=", ".join(f"r.{c} AS real_{c}, s.{c} AS sim_{c}" for c in FIGURE_COLUMNS))


def _figures_sql() -> str:
    """Each figure's quantile over the attempts both engines completed where both runs have it (quantile_cont:
    the ledger's quantile_linear), the paired count, and each run's own count of completed attempts with it."""
    parts = []
    for i, (_, c, q, _) in enumerate(TARGETS):
        both = f"both_completed AND real_{c} IS NOT NULL AND sim_{c} IS NOT NULL"
        parts += [f"quantile_cont(real_{c}, {q}) FILTER (WHERE {both}) AS real_{i}",
                  f"quantile_cont(sim_{c}, {q}) FILTER (WHERE {both}) AS sim_{i}",
                  f"count(*) FILTER (WHERE {both}) AS n_{i}",
                  f"count(real_{c}) FILTER (WHERE real_status = 'completed') AS n_real_{i}",
                  f"count(sim_{c}) FILTER (WHERE sim_status = 'completed') AS n_sim_{i}"]
    return f"WITH p AS ({_paired_sql()}) SELECT {', '.join(parts)} FROM p"


# how long run's steps waited for a CPU, over the steps whose wait is known (NULL where none is), and how long
# their thread slept on a lock, over the steps whose sleep is known (step_model.blocked_ms)
CONTENTION_SQL = """
SELECT count(*) AS n_steps, count(contention_ms) AS n_steps_known, sum(contention_ms) AS contention_ms,
       sum(measured_ms) FILTER (WHERE contention_ms IS NOT NULL) AS step_ms,
       sum(contention_ms) / nullif(sum(measured_ms) FILTER (WHERE contention_ms IS NOT NULL), 0) AS contention_share,
       sum(blocked_ms) AS blocked_ms,
       sum(blocked_ms) / nullif(sum(measured_ms) FILTER (WHERE blocked_ms IS NOT NULL), 0) AS blocked_share
FROM step_model"""
CONTENTION_COLUMNS = ["run", "n_steps", "n_steps_known", "contention_ms", "step_ms", "contention_share", "blocked_ms",
                      "blocked_share"]

STEPS_SQL = """SELECT count(DISTINCT step_id) AS steps, median(step_ms) AS step_ms_p50, avg(step_ms) AS step_ms_mean,
(SELECT engine_busy_s FROM run_metrics) AS busy_s
FROM (SELECT DISTINCT step_id, step_ms FROM step_attribution)"""


def contention_sentence(c: dict) -> str:
    """run real's contention in words: measured, partly measured, or unknown (never 0 for unknown)."""
    if not c["n_steps_known"] or c["contention_share"] is None:
        return (f"run real's contention is unknown (none of its {c['n_steps']} steps carries the engine threads' "
                "run-queue wait: schedstat hidden or not recorded)")
    part = "" if c["n_steps_known"] == c["n_steps"] else f" (the {c['n_steps_known']} of {c['n_steps']} steps " \
                                                          "whose wait is known)"
    asleep = ("; its steps' sleep on a lock is unknown (they ran with intra-op workers)"
              if c.get("blocked_share") is None else
              f"; its steps slept {c['blocked_ms']:.1f} ms on a lock (the interpreter): "
              f"{100 * c['blocked_share']:.1f} % of their time")
    return (f"run real waited {c['contention_ms']:.1f} ms for a CPU over {c['step_ms']:.1f} ms of steps"
            f"{part}: {100 * c['contention_share']:.1f} % of its step time{asleep}")


DRIFT = 0.03  # run real's decode steps this far from the fit's prediction (Σ measured / Σ predicted) are named


def drift_sentence(ratio: float | None) -> str:
    """What run real's decode time ratio (ON_REAL's real_decode_time_ratio) says of the TPOT figure, where it
    is DRIFT or more away from 1 ('' otherwise, and where there is no decode step to hold the fit to)."""
    if ratio is None or abs(ratio - 1) < DRIFT:
        return ""
    way = "more" if ratio > 1 else "less"
    return (f"run real's decode steps took {abs(ratio - 1):.1%} {way} time than the fit (trained on run fit) predicts, "
            f"so the simulated TPOT comes out {'short' if ratio > 1 else 'long'} by about as much: the host "
            "ran them at another speed than during run fit, or the fit does not carry to their shapes (the fit "
            "table); ")


def steadiness_sentence(p10: float | None, p90: float | None) -> str:
    """How far run real's own decode steps moved against the fit from one second to the next
    (ON_REAL's real_decode_p10_ratio / real_decode_p90_ratio); '' where too few seconds held decode steps."""
    if p10 is None or p90 is None:
        return ""
    return (f"within run real, second by second, its decode steps took {p10:.2f} to {p90:.2f} of the fit's time "
            f"(10th to 90th percentile): the host's own speed moving under one run, which the simulation, one fit "
            f"for the whole run, cannot follow, so a TPOT within about {100 * max(abs(1 - p10), abs(p90 - 1)):.0f} % "
            "of real is as close as this host held still for; ")


def compare(runs: StudyRuns) -> list[Table]:
    ids = [runs.one(n, "SELECT DISTINCT run_id FROM attempts")["run_id"] for n in ("real", "sim")]
    with Ledger([(n, path) for n in ("real", "sim") for _, path in resolve_runs(runs.dirs[n])]) as both:
        cols, rows = both.rows(_figures_sql(), ids)
        f = dict(zip(cols, rows[0]))
        cols, rows = both.rows(_paired_sql() + " ORDER BY 1", ids)
        paired = [dict(zip(cols, r)) for r in rows]
    key = []
    for i, (figure, column, q, target) in enumerate(TARGETS):
        err = error_ratio(f[f"sim_{i}"], f[f"real_{i}"])
        both = [(p[f"real_{column}"], p[f"sim_{column}"]) for p in paired
                if p["both_completed"] and p[f"real_{column}"] is not None and p[f"sim_{column}"] is not None]
        key.append([figure, column, f[f"real_{i}"], f[f"sim_{i}"], err, *error_interval(both, q), target,
                    None if target is None or err is None else abs(err) <= target, f[f"n_{i}"], f[f"n_real_{i}"],
                    f[f"n_sim_{i}"]])
    sim_manifest = runs.manifest("sim")
    replay = sim_manifest["workload"].get("replay")
    if replay is None:
        raise StudyError("run sim: its manifest says nothing of what it replayed (workload.replay): a simulation "
                         "of requests, not attempts, by an older version; run the study again to compare")
    how = {a["attempt_id"]: WHOLE if a["cancel_at_ms"] is None else UNTIL_CANCEL
           for a in sim_manifest["workload"]["plan"]}
    how.update({a["attempt_id"]: f"not replayed: {a['why']}" for a in replay["not_replayed"]})
    per_attempt = []
    for p in paired:
        row = [p["attempt_id"], p["request_id"], p["attempt_index"], p["real_status"], p["sim_status"],
               how.get(p["attempt_id"], "not in run real")]
        for c in FIGURE_COLUMNS:
            row += [p[f"real_{c}"], p[f"sim_{c}"], error_ratio(p[f"sim_{c}"], p[f"real_{c}"])]
        per_attempt.append(row)
    contention = [[n, *runs.one(n, CONTENTION_SQL).values()] for n in ("fit", "real")]
    real_contention = dict(zip(CONTENTION_COLUMNS, contention[1]))
    fit = sim_manifest["simulation"]["step_model"]["fit"]
    on_real = fit_row(fit, runs.dirs["real"])
    real_fit = dict(zip(FIT_COLUMNS + ON_REAL, on_real))
    steps = [[n, *runs.one(n, STEPS_SQL).values()] for n in runs.names]
    replay_rows = [[WHOLE, replay[WHOLE], "the engine finished it: replayed to the output it gave"],
                   [UNTIL_CANCEL, replay[UNTIL_CANCEL], "the engine learned of a cancellation (client timeout, "
                    "cancel, drain): replayed with its max_tokens, aborted when the real engine learned of it"]]
    replay_rows += [["not_replayed", 1, f"{a['attempt_id']} (request {a['request_id']}): {a['why']}"]
                    for a in replay["not_replayed"]]
    return [Table("fidelity", "simulated against real TTFT, TPOT and E2E (server layer), paired on attempt_id, "
                              "with the targets",
                  list(FIDELITY_COLUMNS), key, "real_ms / sim_ms: the quantile of request_metrics.<column> over the attempts both engines "
                       "completed (n; n_real / n_sim: each run's completed attempts with the figure); error_ratio "
                       f"= (sim − real) / real; error_lo_ratio / error_hi_ratio: its {LEVEL:.0%} interval, the paired "
                       f"attempts resampled {RESAMPLES} times (NULL with fewer than {BEYOND} attempts on either side "
                       "of the quantile); met: |error_ratio| <= target_ratio. "
                       f"{sampling_sentence(key)}"
                       f"{contention_sentence(real_contention)}; "
                       f"{drift_sentence(real_fit['real_decode_time_ratio'])}"
                       f"{steadiness_sentence(real_fit['real_decode_p10_ratio'], real_fit['real_decode_p90_ratio'])}"
                       f"replayed {replay[WHOLE] + replay[UNTIL_CANCEL]} of run real's {replay['attempts']} attempts "
                       f"({replay[UNTIL_CANCEL]} until their cancellation, {len(replay['not_replayed'])} not: the "
                       "replay table)"),
            Table("replay", "what the simulation replayed of run real's attempts (keyed on attempt_id)",
                  ["replay", "n_attempts", "what"], replay_rows,
                  "every attempt of run real is replayed whole, until its cancellation, or named here with why not; "
                  "a retry resends its request's prompt, and a prompt shares the blocks the real prefix cache "
                  "served it with the attempt that filled them, nothing else"),
            Table("attempts", "each attempt of the workload under test, real and simulated, paired on attempt_id",
                  ["attempt_id", "request_id", "attempt_index", "real_status", "sim_status", "replay",
                   "ttft_real_ms", "ttft_sim_ms", "ttft_error_ratio", "tpot_real_ms", "tpot_sim_ms",
                   "tpot_error_ratio", "e2e_real_ms", "e2e_sim_ms", "e2e_error_ratio"], per_attempt),
            Table("contention", "how long each real run's steps waited for a CPU (step_model.contention_ms)",
                  CONTENTION_COLUMNS, contention,
                  "contention_share = Σ contention_ms / Σ step wall time over the steps whose wait is known "
                  "(n_steps_known); NULL where none is. blocked_ms, blocked_share: the same for the steps' sleep on a "
                  "lock (step_model.blocked_ms: the interpreter, held by the front end or a full collection), over "
                  "the steps whose sleep is known; NULL where none is (intra-op workers). The fit is trained on the steps' own work (cpu_ms less "
                  "blocked_ms), so the simulation adds back run real's contention and its steps' sleep on a lock "
                  "at the times they happened (the sim's manifest, simulation.host_replay)"),
            Table("steps", "the steps of each run", ["run", "steps", "step_ms_p50", "step_ms_mean", "busy_s"], steps,
                  f"the sim's steps last what the fit predicts (trained on {fit['n_train']} steps of run fit, held-out "
                  f"median error {_pct(fit['held_out_median_abs_pct'])}), plus its host time between steps"),
            Table("fit", "the step fit the simulation used, and how it does on run real's steps",
                  list(FIT_COLUMNS) + list(ON_REAL), [on_real],
                  "held_out_*: its |error| on run fit's held-out step shapes; real_*: on every step of run real "
                  "(`inferledger fit FIT --test REAL`: a diagnosis after the fact, the simulation never sees them), "
                  "real_extrapolated_steps of them outside the fit's covered batch sizes, tokens or context; "
                  "real_time_ratio (real_decode_time_ratio: its decode-only steps) Σ (cpu_ms − blocked_ms) / Σ predicted "
                  "over them, signed: above 1 run real's steps took longer than the fit predicts (the host slower "
                  "than during run fit, or the fit low), and the simulated TPOT and E2E come out short by about as "
                  "much; real_decode_p10_ratio / real_decode_p90_ratio: the decode ratio second by second of run real's step time "
                  "(its 10th and 90th percentile over the seconds with 5 decode-only steps or more; NULL below 3 "
                  "such seconds), how far the host's speed moved within run real itself under one fit. "
                  "real_* large against held_out_*: the fit does not transfer (run real's shapes, or the host "
                  "between the two runs); both small while the figures miss: the replay")]


FIT_COLUMNS = ("alpha_ms", "ms_per_gflop", "ms_per_mb", "gap_alpha_ms", "gap_ms_per_seq", "n_train", "n_held_out",
               "held_out_median_abs_pct", "held_out_p90_abs_pct", "ms_per_seq", "kv_factor", "attention_efficiency")
ON_REAL = ("real_steps", "real_extrapolated_steps", "real_median_abs_pct", "real_p90_abs_pct", "real_time_ratio",
           "real_decode_time_ratio", "real_decode_p10_ratio", "real_decode_p90_ratio")


def fit_row(recorded: dict, real_dir: Path) -> list:
    """The fit table's row from the fit the sim recorded: FIT_COLUMNS (ms_per_seq and gap_ms_per_seq unknown,
    None, where the fit held them) and its |error| on run real's steps (ON_REAL's columns; NULL where real has no step it
    can see)."""
    fit = StepFit.from_dict(recorded)
    values = {**recorded, "ms_per_seq": fit.ms_per_seq_reported, "gap_ms_per_seq": fit.gap_ms_per_seq_reported}
    points = ledger_fit_points(real_dir)
    summary = held_out_summary(fit, points)
    by_second = decode_ratio_by_window(fit, points)
    return [values.get(k) for k in FIT_COLUMNS] + [len(points), fit.n_extrapolated(points),
                                                  summary["held_out_median_abs_error_pct"],
                                                  summary["held_out_p90_abs_error_pct"], summary["time_ratio"],
                                                  summary["by_kind"]["decode"]["time_ratio"], by_second["p10"],
                                                  by_second["p90"]]


def _pct(v) -> str:
    return "unknown" if v is None else f"{v:.1f} %"


STUDY = Study(
    name="fidelity",
    question="Fitted on one real run, how close does the simulated clock come to the real engine on a workload it "
             "was not fitted on: TTFT, TPOT and E2E per attempt and at p50 / p99?",
    knob="the clock: the real engine, or the simulated clock with a step fit from another real run",
    reading="the fidelity table holds each figure's simulated value against the real one, over the attempts both "
            "completed: met where the error is within its target (TPOT p50 5 %, TTFT p50 10 %, E2E p99 10 %); its "
            "note names the real run's contention; the replay table says what was replayed; the attempts table "
            "shows where the simulation drifts (queueing the real run had, or host time the fit does not see).",
    runs=runs, compare=compare, needs_model=True,
    options={"scale": Option("default", "default or tiny (a few short requests: the tests): the study's own "
                                        "workloads, used where no file is given"),
             "workload": Option("", "the workload file under test (a capture workload TOML; also --workload), "
                                    "replayed on the simulated clock; empty: the study's own at its scale"),
             "calibration": Option("", "the workload file the step fit is trained on (a capture workload TOML); "
                                       "empty: the study's own at its scale")},
    figures=({"kind": "timeline", "title": "the workload on the real engine and on the simulated clock",
              "runs": ["real", "sim"]},),
)
