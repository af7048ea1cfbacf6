"""fidelity: how close the simulated clock comes to the real engine on a workload it was not fitted on.

Three runs. `fit`: a real capture of one workload (a mix of prompt lengths and batch sizes), whose steps train
a step fit (costmodel.fit.StepFit over the ledger's step_model: its work at the run's measured rates, α and a
compute efficiency fitted, with the host time between steps as a second term). `real`: a real capture of a
*different* workload (other prompt lengths, outputs, arrival rate and seed). `sim`: the same requests as
`real` (each one's arrival at the engine, prompt tokens and output tokens, read from that run's ledger) on the
simulated clock: the real scheduler and block manager with the bundled model's shape declared, each step
lasting what the fit predicts for its work (collectors/sim/step_time.FittedStepModel). The knob is the clock:
real or simulated. The comparison holds the simulated TTFT, TPOT and E2E against the real ones, per request
and at p50 / p99 (latency_percentiles, server and engine layers), beside the targets.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from inferledger.collectors.sim.declared import DeclaredModel
from inferledger.collectors.sim.run import SimRequest, distinct_prompt, simulate
from inferledger.collectors.sim.step_time import FittedStepModel
from inferledger.probes.run_folder import Manifest
from inferledger.engine.params import EngineConfig
from inferledger.ledger.query import open_ledger
from inferledger.ledger.step_fit import run_fit
from inferledger.studies.framework import Option, Study, StudyError, StudyRun, StudyRuns, Table
from inferledger.studies.real import capture_run, workload

MAX_NUM_SEQS = 8
# figure -> (latency_percentiles metric, request_metrics column, statistic, target: |sim − real| / real at most)
TARGETS = (("TPOT", "tpot_server_ms", "p50", 0.05), ("TTFT", "ttft_server_ms", "p50", 0.10),
           ("E2E", "e2e_server_ms", "p99", 0.15), ("TTFT", "ttft_server_ms", "p99", None),
           ("TPOT", "tpot_server_ms", "p99", None), ("E2E", "e2e_server_ms", "p50", None))
# scale -> (fit workload, test workload): (classes as (prompt tokens, output tokens), tasks, rate req/s, seed)
SCALES = {"default": ((((40, 24), (128, 12), (384, 8)), 18, 0.5, 3), (((64, 16), (256, 16)), 14, 0.4, 11)),
          "tiny": ((((40, 6), (96, 3)), 6, 8.0, 3), (((48, 4),), 3, 4.0, 11))}


def shape(options: dict) -> tuple:
    if options["scale"] not in SCALES:
        raise StudyError(f"--set scale={options['scale']}: expected one of {', '.join(SCALES)}")
    return SCALES[options["scale"]]


def _workload(name: str, spec: tuple):
    classes, n, rate, seed = spec
    return workload(name, [{"name": f"p{p}", "prompt_tokens": p, "max_tokens": o} for p, o in classes],
                    max_tokens=max(o for _, o in classes), seed=seed,
                    arrivals={"process": "poisson", "rate_rps": rate, "n_tasks": n})


def _capture(options: dict, which: int, run_dir: Path, run_id: str, bundle) -> None:
    capture_run(run_dir, run_id, _workload(f"fidelity-{'fit' if which == 0 else 'test'}", shape(options)[which]),
                bundle, max_num_seqs=MAX_NUM_SEQS)


# what the simulation replays of the real run: each request's arrival at the engine, prompt and output tokens
REQUESTS_SQL = """
WITH t0 AS (SELECT min(enqueued_ns) AS ns FROM attempts)
SELECT a.request_id, (a.enqueued_ns - t0.ns) / 1e6 AS arrival_ms, e.value::BIGINT AS prompt_tokens,
       r.n_output_tokens
FROM attempts a JOIN request_metrics r USING (attempt_id), t0,
     (SELECT attempt_id, value FROM events WHERE name = 'engine.enqueued') e
WHERE e.attempt_id = a.attempt_id ORDER BY a.enqueued_ns"""


def _simulate(run_dir: Path, run_id: str, bundle) -> None:
    runs_dir = run_dir.parent
    fit = run_fit(runs_dir / "fit")
    fit.trained_on = "run fit"
    with open_ledger(runs_dir / "real") as led:
        cols, rows = led.rows(REQUESTS_SQL)
    real = [dict(zip(cols, r)) for r in rows]
    if not real:
        raise StudyError("run real: no request reached the engine, nothing to simulate")
    manifest = Manifest.read(runs_dir / "real")
    requests = [SimRequest(r["request_id"], r["arrival_ms"], distinct_prompt(i, r["prompt_tokens"],
                                                                             bundle.config.shape.vocab),
                           r["n_output_tokens"]) for i, r in enumerate(real)]
    cfg = {k: v for k, v in manifest.block("engine_config").items() if k in EngineConfig.__dataclass_fields__}
    simulate(run_dir, requests, engine_config=EngineConfig(**cfg),
             step_model=FittedStepModel(fit, manifest.model_shape()),
             model=DeclaredModel(manifest.block("model").get("name") or "bundled", bundle.config, bundle.dtype),
             run_id=run_id, workload="the requests of run real, as its engine received them")


def runs(options: dict) -> list[StudyRun]:
    shape(options)
    return [StudyRun("fit", {"clock": "real", "workload": "fit"}, partial(_capture, options, 0)),
            StudyRun("real", {"clock": "real", "workload": "test"}, partial(_capture, options, 1)),
            StudyRun("sim", {"clock": "simulated", "workload": "test", "step_model": "fit on run fit"}, _simulate)]


PCT_SQL = """SELECT p50_ms, p99_ms, n FROM latency_percentiles WHERE source_column = 'request_metrics.' || ?"""
PER_REQUEST_SQL = """SELECT request_id, ttft_server_ms, tpot_server_ms, e2e_server_ms FROM request_metrics
ORDER BY request_id"""


def error_ratio(sim: float | None, real: float | None) -> float | None:
    """(sim − real) / real: the simulation's relative error (None when either is unknown or real is 0)."""
    return (sim - real) / real if sim is not None and real else None


def compare(runs: StudyRuns) -> list[Table]:
    key = []
    for metric, column, stat, target in TARGETS:
        real, sim = (runs.one(n, PCT_SQL, [column]) for n in ("real", "sim"))
        err = error_ratio(sim[f"{stat}_ms"], real[f"{stat}_ms"])
        key.append([f"{metric} {stat}", column, real[f"{stat}_ms"], sim[f"{stat}_ms"], err, target,
                    None if target is None or err is None else abs(err) <= target, real["n"], sim["n"]])
    real = {r["request_id"]: r for r in runs.records("real", PER_REQUEST_SQL)}
    sim = {r["request_id"]: r for r in runs.records("sim", PER_REQUEST_SQL)}
    per_request = []
    for rid, r in real.items():
        s = sim.get(rid, {})
        row = [rid]
        for c in ("ttft_server_ms", "tpot_server_ms", "e2e_server_ms"):
            row += [r[c], s.get(c), error_ratio(s.get(c), r[c])]
        per_request.append(row)
    fit = runs.manifest("sim")["simulation"]["step_model"]["fit"]
    steps = [[n, *runs.one(n, STEPS_SQL).values()] for n in runs.names]
    return [Table("fidelity", "simulated against real TTFT, TPOT and E2E (server and engine layers), with the targets",
                  ["figure", "column", "real_ms", "sim_ms", "error_ratio", "target_ratio", "met", "n_real", "n_sim"],
                  key, "real_ms / sim_ms: latency_percentiles of each run (request_metrics.<column>); error_ratio = "
                       "(sim − real) / real; met: |error_ratio| <= target_ratio"),
            Table("requests", "each request of the test workload, real and simulated",
                  ["request", "ttft_real_ms", "ttft_sim_ms", "ttft_error_ratio", "tpot_real_ms", "tpot_sim_ms",
                   "tpot_error_ratio", "e2e_real_ms", "e2e_sim_ms", "e2e_error_ratio"], per_request),
            Table("steps", "the steps of each run", ["run", "steps", "step_ms_p50", "step_ms_mean", "busy_s"], steps,
                  f"the sim's steps last what the fit predicts (trained on {fit['n_train']} steps of run fit, held-out "
                  f"median error {_pct(fit['held_out_median_abs_pct'])}), plus its host time between steps"),
            Table("fit", "the step fit the simulation used",
                  ["alpha_ms", "ms_per_gflop", "ms_per_mb", "gap_alpha_ms", "gap_ms_per_seq", "n_train", "n_held_out",
                   "held_out_median_abs_pct", "held_out_p90_abs_pct"],
                  [[fit[k] for k in ("alpha_ms", "ms_per_gflop", "ms_per_mb", "gap_alpha_ms", "gap_ms_per_seq",
                                     "n_train", "n_held_out", "held_out_median_abs_pct", "held_out_p90_abs_pct")]])]


STEPS_SQL = """SELECT count(DISTINCT step_id) AS steps, median(step_ms) AS step_ms_p50, avg(step_ms) AS step_ms_mean,
(SELECT engine_busy_s FROM run_metrics) AS busy_s
FROM (SELECT DISTINCT step_id, step_ms FROM step_attribution)"""


def _pct(v) -> str:
    return "unknown" if v is None else f"{v:.1f} %"


STUDY = Study(
    name="fidelity",
    question="Fitted on one real run, how close does the simulated clock come to the real engine on a different "
             "workload: TTFT, TPOT and E2E per request and at p50 / p99?",
    knob="the clock: the real engine, or the simulated clock with a step fit from another real run",
    reading="the fidelity table holds each figure's simulated value against the real one: met where the error is "
            "within its target (TPOT p50 5 %, TTFT p50 10 %, E2E p99 15 %); the requests table shows where the "
            "simulation drifts (queueing the real run had, or host time the fit does not see).",
    runs=runs, compare=compare, needs_model=True,
    options={"scale": Option("default", "default or tiny (a few short requests: the tests)")},
    figures=({"kind": "timeline", "title": "the test workload on the real engine and on the simulated clock",
              "runs": ["real", "sim"]},),
)
