"""load: goodput against arrival rate, from well below the engine's capacity to past the knee, and why.

The capacity is measured first, on the real path the other runs take: a closed loop of twice
`max_num_seqs` clients keeps the engine's batch full (run `saturated`), and its ledger's completed_rps is
the capacity (requests per second of this workload on this machine now). The capture's speed probe
(collectors/capture/speed_probe.py, the speed a workload's calibration compares with) is recorded beside
it: it decodes a full batch of cached prompts in-process, without prefill, HTTP or the client, so it
reads higher. Each further run offers Poisson arrivals at a multiple of the capacity (the knob); every
other setting is the same. A request is good when it completes within its deadline: `deadline_batches`
times the time a request spends in a full batch (max_num_seqs / capacity, Little's law on the
saturated run).

From each run's ledger: goodput and completed rate (run_metrics), Little's law (mean_in_system against
arrival_rps × mean_time_in_system_s), and the three things a knee can come from: queueing (the share
of the engine TTFT spent queued: Σ queue_ms / Σ ttft_server_ms), KV memory (the peak share of the KV
blocks in use, from the engine's kv_blocks_* samples, and preemptions), and prefill interference (the
share of decode steps that also computed prefill tokens, from step_attribution), and beside them the
engine's own speed (its TPOT against the saturated run's, whose batches were full: on a shared host the
engine can slow down with no queue, KV or prefill to blame). The knee is the lowest
rate from which the good share stays below `KNEE_GOOD_SHARE`; the first cause is the indicator that crosses its
onset threshold (ONSETS) at the lowest rate, named in one sentence.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from inferledger.collectors.capture.speed_probe import probe_throughput
from inferledger.ledger.query import open_ledger
from inferledger.probes.run_folder import Manifest
from inferledger.studies.framework import Option, Study, StudyError, StudyRun, StudyRuns, Table
from inferledger.studies.real import LONG_MS, capture_run, workload

MAX_NUM_SEQS = 8
KNEE_GOOD_SHARE = 0.9  # the knee: the first rate at which fewer than 90 % of the requests are good
# indicator -> (onset threshold, what crossing it means)
ONSETS = {"queue_share": (0.5, "queueing: more than half of the engine TTFT is spent waiting to be scheduled"),
          "kv_peak_share": (0.9, "KV memory: more than 90 % of the KV blocks in use at the peak"),
          "preemptions": (1, "KV memory: requests preempted for blocks"),
          "mixed_step_share": (0.5, "prefill interference: more than half of the decode steps also compute prefills"),
          "tpot_slowdown_ratio": (1.25, "slower decoding: TPOT p50 at least 25 % above the saturated run's, whose "
                                        "batches were full (less CPU for the engine, or more work per step)")}
# scale -> (multiples of the capacity, tasks per run, prompt tokens, output tokens)
SCALES = {"default": ((0.25, 0.5, 1.0, 2.0, 4.0), 32, 64, 16),
          "tiny": ((0.5, 2.0), 4, 32, 4)}


def shape(options: dict) -> tuple:
    if options["scale"] not in SCALES:
        raise StudyError(f"--set scale={options['scale']}: expected one of {', '.join(SCALES)}")
    return SCALES[options["scale"]]


SATURATED = "saturated"


def capacity(runs_dir: Path, bundle, out_tokens: int) -> dict:
    """The capacity from the saturated run's ledger (completed requests per second with the batch kept
    full), with the speed probe's figure beside it."""
    with open_ledger(runs_dir / SATURATED) as led:
        completed_rps = led.rows("SELECT completed_rps FROM run_metrics")[1][0][0]
    if not completed_rps:
        raise StudyError(f"run {SATURATED}: no completed request, so no capacity to offer multiples of")
    speed = probe_throughput(bundle, MAX_NUM_SEQS)
    return {"capacity_rps": round(completed_rps, 4), "full_batch_ms": round(MAX_NUM_SEQS / completed_rps * 1000, 1),
            "probe_tok_s": round(speed.tok_s, 3), "probe_capacity_rps": round(speed.tok_s / out_tokens, 4),
            "source": f"run {SATURATED}: run_metrics.completed_rps of a closed loop of {2 * MAX_NUM_SEQS} clients; "
                      "probe: collectors/capture/speed_probe.py output tok/s / output tokens"}


def _workload(options: dict, arrivals: dict, deadline_ms: float = LONG_MS):
    _, n, prompt, out = shape(options)
    return workload("load", [{"name": "chat", "prompt_tokens": prompt}], max_tokens=out, deadline_ms=deadline_ms,
                    arrivals={"n_tasks": n, **arrivals}, seed=options["seed"])


def _saturated(options: dict, run_dir: Path, run_id: str, bundle) -> None:
    wl = _workload(options, {"process": "closed", "concurrency": 2 * MAX_NUM_SEQS})
    capture_run(run_dir, run_id, wl, bundle, max_num_seqs=MAX_NUM_SEQS)


def _produce(options: dict, multiple: float, memo: dict, run_dir: Path, run_id: str, bundle) -> None:
    if "capacity" not in memo:  # measured once, from the saturated run written (and rebuilt) before this one
        memo["capacity"] = capacity(run_dir.parent, bundle, shape(options)[3])
    cap = memo["capacity"]
    rate = multiple * cap["capacity_rps"]
    deadline = options["deadline_batches"] * cap["full_batch_ms"]
    wl = _workload(options, {"process": "poisson", "rate_rps": rate}, deadline)
    capture_run(run_dir, run_id, wl, bundle, max_num_seqs=MAX_NUM_SEQS)
    # the point's place on the curve, declared beside the run (the ledger's figures are measured)
    manifest = Manifest.read(run_dir)
    manifest.body["study_point"] = {"multiple_of_capacity": multiple, "offered_rps": round(rate, 4),
                                    "deadline_ms": round(deadline, 1), **cap}
    manifest.write(run_dir)


def runs(options: dict) -> list[StudyRun]:
    memo: dict = {}
    return [StudyRun(SATURATED, {"multiple_of_capacity": None, "closed_loop_clients": 2 * MAX_NUM_SEQS},
                     partial(_saturated, options))] + \
        [StudyRun(f"x{m:g}", {"multiple_of_capacity": m}, partial(_produce, options, m, memo))
         for m in shape(options)[0]]


POINT_SQL = """
WITH m AS (SELECT * FROM run_metrics),
kv AS (SELECT ts_ns, sum(value) FILTER (WHERE metric = 'kv_blocks_used') AS used, sum(value) AS total
       FROM samples WHERE metric IN ('kv_blocks_used', 'kv_blocks_cached', 'kv_blocks_free') GROUP BY ts_ns),
steps AS (SELECT step_id, bool_or(kind = 'decode') AS decodes, bool_or(kind = 'prefill') AS prefills
          FROM step_attribution GROUP BY step_id)
SELECT m.arrival_rps, m.completed_rps, m.goodput_rps,
       m.n_good / (SELECT count(*) FROM attempts) AS good_share,
       m.mean_in_system AS little_l, m.arrival_rps * m.mean_time_in_system_s AS little_lambda_w,
       abs(m.mean_in_system - m.arrival_rps * m.mean_time_in_system_s) / nullif(m.mean_in_system, 0) AS little_rel_err,
       (SELECT p50_ms FROM latency_percentiles WHERE source_column = 'request_metrics.ttft_client_ms') AS ttft_p50_ms,
       (SELECT p99_ms FROM latency_percentiles WHERE source_column = 'request_metrics.e2e_client_ms') AS e2e_p99_ms,
       (SELECT sum(queue_ms) / nullif(sum(ttft_server_ms), 0) FROM request_metrics) AS queue_share,
       (SELECT max(used / total) FROM kv) AS kv_peak_share,
       (SELECT sum(preemptions) FROM request_metrics) AS preemptions,
       (SELECT count(*) FILTER (WHERE prefills) / nullif(count(*), 0) FROM steps WHERE decodes) AS mixed_step_share,
       (SELECT p50_ms FROM latency_percentiles WHERE source_column = 'request_metrics.tpot_server_ms') AS tpot_p50_ms
FROM m"""

COLUMNS = ["run", "multiple", "offered_rps", "arrival_rps", "completed_rps", "goodput_rps", "good_share",
           "little_l", "little_lambda_w", "little_rel_err", "ttft_p50_ms", "e2e_p99_ms", "queue_share",
           "kv_peak_share", "preemptions", "mixed_step_share", "tpot_p50_ms", "tpot_slowdown_ratio"]


def explain(points: list[dict]) -> tuple[dict | None, list[list], str]:
    """The knee (the first point from which the good share stays below KNEE_GOOD_SHARE), each indicator's onset (the
    lowest offered rate at which it reaches its threshold) and the sentence naming the first cause."""
    points = sorted(points, key=lambda p: p["offered_rps"])
    below = [p["good_share"] is not None and p["good_share"] < KNEE_GOOD_SHARE for p in points]
    # the first point from which every higher rate stays below: one bad point with good ones after it is a
    # blip (the host stalled during that run), not the knee
    knee = next((p for i, p in enumerate(points) if all(below[i:])), None)
    onsets = []
    for name, (threshold, meaning) in ONSETS.items():
        first = next((p for p in points if p[name] is not None and p[name] >= threshold), None)
        onsets.append([name, threshold, first["offered_rps"] if first else None, first["run"] if first else None,
                       meaning])
    crossed = [o for o in onsets if o[2] is not None]
    # the earliest onset; at the same rate the indicator furthest past its threshold (value / threshold)
    by_run = {p["run"]: p for p in points}
    first = min(crossed, key=lambda o: (o[2], -by_run[o[3]][o[0]] / o[1])) if crossed else None
    if knee is None:
        head = f"no knee up to {points[-1]['offered_rps']:.3g} req/s (every rate kept {KNEE_GOOD_SHARE:.0%} good)"
    else:
        head = (f"knee at {knee['offered_rps']:.3g} req/s ({knee['multiple']:g} × capacity, "
                f"{knee['good_share']:.0%} good)")
    if first is None:
        cause = "no indicator reached its onset threshold"
    else:
        cause = f"{'first cause' if knee else 'first to grow'}: {ONSETS[first[0]][1]}, from {first[2]:.3g} req/s"
    return knee, onsets, f"{head}; {cause}"


def compare(runs: StudyRuns) -> list[Table]:
    points = []
    for name in runs.names:
        sp = runs.manifest(name).get("study_point", {})
        points.append({"run": name, "multiple": sp.get("multiple_of_capacity"), "offered_rps": sp.get("offered_rps"),
                       **runs.one(name, POINT_SQL)})
    base = points[0]["tpot_p50_ms"]  # the saturated run's: every decode step a full batch
    for p in points:
        p["tpot_slowdown_ratio"] = p["tpot_p50_ms"] / base if p["tpot_p50_ms"] is not None and base else None
    knee, onsets, sentence = explain([p for p in points if p["offered_rps"] is not None])
    cap = runs.manifest(runs.names[1])["study_point"]
    return [Table("load", "goodput and completed rate against the offered arrival rate, with the knee's indicators",
                  COLUMNS, [[p[c] for c in COLUMNS] for p in points],
                  f"capacity {cap['capacity_rps']:.3g} req/s: completed_rps of run {SATURATED} (a closed loop keeping "
                  f"the batch full; the speed probe read {cap['probe_capacity_rps']:.3g} req/s, "
                  f"{cap['probe_tok_s']:.3g} tok/s); good = completed within {cap['deadline_ms']:.0f} ms; "
                  "queue_share = Σ queue_ms / Σ ttft_server_ms; kv_peak_share = peak kv_blocks_used / all blocks; "
                  "mixed_step_share = decode steps that also computed prefill tokens / decode steps; "
                  f"tpot_slowdown_ratio = tpot_p50_ms (server TPOT p50) / run {SATURATED}'s; Little's law: "
                  "little_l = mean_in_system against little_lambda_w = arrival_rps × mean_time_in_system_s"),
            Table("knee", "the knee and its first cause", ["knee_rps", "knee_multiple", "first_cause"],
                  [[knee["offered_rps"] if knee else None, knee["multiple"] if knee else None, sentence]]),
            Table("onsets", "where each indicator reached its onset threshold",
                  ["indicator", "threshold", "onset_rps", "onset_run", "meaning"], onsets)]


STUDY = Study(
    name="load",
    question="As the arrival rate rises from well below the engine's capacity to past it, where does goodput stop "
             "following the offered rate, and what grows first: queueing, KV memory or prefill interference?",
    knob="the Poisson arrival rate, as a multiple of the capacity a saturated closed loop measures first",
    reading="below the knee goodput_rps follows offered_rps and good_share stays near 1; at the knee good_share "
            "drops and completed_rps flattens at the capacity; the onsets table says which indicator crossed its "
            "threshold first, and the knee table names it in one sentence.",
    runs=runs, compare=compare, needs_model=True,
    options={"scale": Option("default", "default or tiny (two rates of four requests: the tests)"),
             "deadline_batches": Option(2.0, "a request's deadline: this many times a request's time in a full batch",
                                        0.01, 1000),
             "seed": Option(7, "the arrival process's seed", 0, 2 ** 63 - 1)},
    figures=({"kind": "curve", "title": "goodput and completed rate against the offered rate", "table": "load",
              "x": "offered_rps", "y": ["arrival_rps", "completed_rps", "goodput_rps"]},
             {"kind": "curve", "title": "the knee's indicators against the offered rate", "table": "load",
              "x": "offered_rps", "y": ["good_share", "queue_share", "kv_peak_share", "mixed_step_share"]}),
)
