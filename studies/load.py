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

Against any server (`--set target=URL`, ours or a black box; `--set server=S` joins the folder of an
`inferledger serve --out S` behind it, so each point has the engine's account and its causes) the
saturated run and the points are captures of that URL; `--set rates=1,2,4` offers those rates (req/s)
instead of multiples of the capacity. A URL target's batch size is unknown: MAX_NUM_SEQS stands for
it in the deadline, and `--set deadline_ms=D` states the deadline outright.

From each run's ledger: goodput and completed rate (run_metrics), Little's law (mean_in_system, the
attempts in flight integrated over the window, against attempted_rps × mean_time_in_system_s: one sum on
a window that holds every attempt whole, so a bookkeeping check; and at the server, two independent
measurements: the engine's own in-system gauge against its admissions × their time in it, the client's L
less the server's being the attempts in the client and the transport), and why: each point's row of run_diagnosis (the ledger's one diagnosis: the late
attempts' delay time shared among the causes, in ms). The knee is the lowest rate from which the good
share stays below `KNEE_GOOD_SHARE`; its cause is run_diagnosis' first cause at the knee's point, named
in one sentence with its share and evidence.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from inferledger.collectors.capture.speed_probe import probe_throughput
from inferledger.ledger.query import open_ledger
from inferledger.probes.run_folder import Manifest
from inferledger.studies.framework import Option, Study, StudyError, StudyRun, StudyRuns, Table
from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.workload.schema import url_problem
from inferledger.collectors.capture.run import capture
from inferledger.studies.real import LONG_MS, capture_run, workload

MAX_NUM_SEQS = 8
KNEE_GOOD_SHARE = 0.9  # the knee: the first rate at which fewer than 90 % of the requests are good
# below this many attempts a point cannot tell 90 % good from not: one late request moves its good share
# by more than 5 points, so the study says it cannot conclude rather than name a knee or its absence
MIN_POINT_ATTEMPTS = 20
# scale -> (multiples of the capacity, tasks per run, prompt tokens, output tokens)
SCALES = {"default": ((0.25, 0.5, 1.0, 2.0, 4.0), 32, 64, 16),
          "tiny": ((0.5, 2.0), 4, 32, 4)}


def shape(options: dict) -> tuple:
    if options["scale"] not in SCALES:
        raise StudyError(f"--set scale={options['scale']}: expected one of {', '.join(SCALES)}")
    return SCALES[options["scale"]]


SATURATED = "saturated"


def rates(options: dict) -> list[float]:
    """The rates `--set rates=1,2,4` asks (req/s, ascending), or [] for multiples of the capacity."""
    text = options["rates"].strip()
    if not text:
        return []
    try:
        got = [float(r) for r in text.split(",")]
    except ValueError:
        raise StudyError(f"--set rates={text}: expected request rates in req/s separated by commas, e.g. 1,2,4") from None
    if not all(0.001 <= r <= 100_000 for r in got) or len(set(got)) != len(got):
        raise StudyError(f"--set rates={text}: each rate in 0.001..100000 req/s, none twice")
    return sorted(got)


def _embedded(options: dict) -> bool:
    return options["target"] == "embedded"


def _capture(options: dict, wl, run_dir: Path, run_id: str, bundle) -> None:
    """One capture of the study's workload: on the embedded engine, or against the target URL (with the
    server's folder joined when one is given)."""
    if _embedded(options):
        capture_run(run_dir, run_id, wl, bundle, max_num_seqs=MAX_NUM_SEQS)
        return
    servers = (options["server"],) if options["server"] else ()
    capture(wl, run_dir, CaptureOptions(target=options["target"], servers=servers, run_id=run_id,
                                        microbenchmarks=False))


def capacity(runs_dir: Path, bundle, out_tokens: int, embedded: bool = True) -> dict:
    """The capacity from the saturated run's ledger (completed requests per second with the batch kept
    full), with the speed probe's figure beside it (the embedded engine only)."""
    with open_ledger(runs_dir / SATURATED) as led:
        completed_rps = led.rows("SELECT completed_rps FROM run_metrics")[1][0][0]
    if not completed_rps:
        raise StudyError(f"run {SATURATED}: no completed request, so no capacity to offer multiples of")
    probe = None
    if embedded:
        speed = probe_throughput(bundle, MAX_NUM_SEQS)
        probe = {"probe_tok_s": round(speed.tok_s, 3), "probe_capacity_rps": round(speed.tok_s / out_tokens, 4)}
    return {"capacity_rps": round(completed_rps, 4), "full_batch_ms": round(MAX_NUM_SEQS / completed_rps * 1000, 1),
            **(probe or {"probe_tok_s": None, "probe_capacity_rps": None}),
            "source": f"run {SATURATED}: run_metrics.completed_rps of a closed loop of {2 * MAX_NUM_SEQS} clients"
                      + ("; probe: collectors/capture/speed_probe.py output tok/s / output tokens" if embedded else "")}


def _workload(options: dict, arrivals: dict, deadline_ms: float = LONG_MS):
    _, n, prompt, out = shape(options)
    return workload("load", [{"name": "chat", "prompt_tokens": prompt}], max_tokens=out, deadline_ms=deadline_ms,
                    arrivals={"n_tasks": n, **arrivals}, seed=options["seed"])


def _saturated(options: dict, run_dir: Path, run_id: str, bundle) -> None:
    wl = _workload(options, {"process": "closed", "concurrency": 2 * MAX_NUM_SEQS})
    _capture(options, wl, run_dir, run_id, bundle)


def _produce(options: dict, point: tuple[str, float], memo: dict, run_dir: Path, run_id: str, bundle) -> None:
    """A point: ("multiple", m) offers m × the capacity, ("rate", r) offers r req/s."""
    if "capacity" not in memo:  # measured once, from the saturated run written (and rebuilt) before this one
        memo["capacity"] = capacity(run_dir.parent, bundle, shape(options)[3], _embedded(options))
    cap = memo["capacity"]
    kind, value = point
    rate = value * cap["capacity_rps"] if kind == "multiple" else value
    deadline = options["deadline_ms"] or options["deadline_batches"] * cap["full_batch_ms"]
    wl = _workload(options, {"process": "poisson", "rate_rps": rate}, deadline)
    _capture(options, wl, run_dir, run_id, bundle)
    # the point's place on the curve, declared beside the run (the ledger's figures are measured)
    manifest = Manifest.read(run_dir)
    manifest.body["study_point"] = {"multiple_of_capacity": round(rate / cap["capacity_rps"], 4), "offered_rps": round(rate, 4),
                                    "deadline_ms": round(deadline, 1), **cap}
    manifest.write(run_dir)


def runs(options: dict) -> list[StudyRun]:
    memo: dict = {}
    if not _embedded(options) and url_problem(options["target"]):
        raise StudyError(f"--set target={options['target']}: 'embedded' or a server's base URL: "
                         f"{url_problem(options['target'])}")
    if options["server"] and _embedded(options):
        raise StudyError("--set server=S joins a `serve --out S` folder to a URL target: give --set target=URL too")
    if options["server"]:  # a folder that cannot be joined is refused before any run
        from inferledger.collectors.capture.servers import ServerFolderError, check_server_folders

        try:
            check_server_folders([options["server"]])
        except ServerFolderError as exc:
            raise StudyError(f"--set server={options['server']}: {exc}") from None
    asked = rates(options)
    points = [(f"r{r:g}", ("rate", r)) for r in asked] or [(f"x{m:g}", ("multiple", m)) for m in shape(options)[0]]
    return [StudyRun(SATURATED, {"multiple_of_capacity": None, "closed_loop_clients": 2 * MAX_NUM_SEQS},
                     partial(_saturated, options))] + \
        [StudyRun(name, {kind + ("_of_capacity" if kind == "multiple" else "_rps"): v},
                  partial(_produce, options, (kind, v), memo)) for name, (kind, v) in points]


CAUSES = ("server_queue", "client_queue", "prefill_interference", "preemption", "decode_stall", "host_contention",
          "transport", "client", "spec_rejected")
SHARES = [f"{c}_share" for c in CAUSES]

# a point's figures, and its diagnosis: the run_diagnosis row of its load point (the saturated closed loop
# offers no rate, so its run row). Its attempts are the client's, run_metrics.n_client_attempts (a router's
# retries and the tries it gave up on, which the client never made, are no requests of the load)
POINT_SQL = f"""
WITH m AS (SELECT * FROM run_metrics),
d AS (SELECT * FROM run_diagnosis ORDER BY scope = 'point' DESC LIMIT 1)
SELECT m.offered_rps, m.attempted_rps, m.completed_rps, m.goodput_rps, m.n_client_attempts AS n_attempts,
       m.n_good / nullif(m.n_client_attempts, 0) AS good_share,
       m.mean_in_system AS little_l, m.attempted_rps * m.mean_time_in_system_s AS little_lambda_w, m.little_rel_err,
       m.server_in_system AS server_l, m.server_attempted_rps * m.mean_time_in_server_s AS server_lambda_w,
       m.server_little_rel_err, m.client_transport_in_system AS client_transport_l,
       (SELECT p50_ms FROM latency_percentiles WHERE source_column = 'request_metrics.ttft_client_ms') AS ttft_p50_ms,
       (SELECT p99_ms FROM latency_percentiles WHERE source_column = 'request_metrics.e2e_client_ms') AS e2e_p99_ms,
       d.diagnosed, d.n_attempts AS n_diagnosed, {", ".join(f"d.{c}" for c in SHARES)},
       d.first_cause, d.first_cause_share, d.evidence
FROM m, d"""

COLUMNS = ["run", "multiple", "n_attempts", "offered_rps", "attempted_rps", "completed_rps", "goodput_rps", "good_share",
           "little_l", "little_lambda_w", "little_rel_err", "server_l", "server_lambda_w", "server_little_rel_err",
           "client_transport_l", "ttft_p50_ms", "e2e_p99_ms", "diagnosed", "n_diagnosed",
           *SHARES, "first_cause", "first_cause_share"]


def _rates(p: dict) -> str:
    """A point's offered rate, and the rate its attempts were actually sent at where that is known and
    differs (a client that could not keep up, or few arrivals over a short window)."""
    sent = p.get("attempted_rps")
    if sent is None or f"{sent:.3g}" == f"{p['offered_rps']:.3g}":
        return f"{p['offered_rps']:.3g} req/s"
    return f"{p['offered_rps']:.3g} req/s offered ({sent:.3g} req/s attempted)"


def explain(points: list[dict]) -> tuple[dict | None, str]:
    """The knee (the first point from which the good share stays below KNEE_GOOD_SHARE) and the sentence
    naming its first cause: run_diagnosis at the knee's point (at the highest rate when there is no knee)."""
    points = sorted(points, key=lambda p: p["offered_rps"])
    below = [p["good_share"] is not None and p["good_share"] < KNEE_GOOD_SHARE for p in points]
    # the first point from which every higher rate stays below: one bad point with good ones after it is a
    # blip (the host stalled during that run), not the knee
    knee = next((p for i, p in enumerate(points) if all(below[i:])), None)
    at = knee or points[-1]
    counts = [p["n_attempts"] for p in points if p.get("n_attempts") is not None]
    if counts and min(counts) < MIN_POINT_ATTEMPTS:
        few = min(points, key=lambda p: p.get("n_attempts") if p.get("n_attempts") is not None else 1 << 62)
        return None, (f"no conclusion: too few requests ({few['n_attempts']} attempts at {_rates(few)}; at least "
                      f"{MIN_POINT_ATTEMPTS} a point are needed to tell {KNEE_GOOD_SHARE:.0%} good from not)")
    if knee is None:
        head = f"no knee up to {_rates(at)} (every rate kept {KNEE_GOOD_SHARE:.0%} good)"
    else:
        head = f"knee at {_rates(at)} ({at['multiple']:g} × capacity, {at['good_share']:.0%} good)"
    if at["first_cause"] is None:
        cause = f"no measured delay at {at['offered_rps']:.3g} req/s ({at['evidence']})"
    elif at["first_cause"] == "unknown":
        cause = f"first cause unknown at {at['offered_rps']:.3g} req/s ({at['evidence']})"
    else:
        cause = (f"{'first cause' if knee else 'largest cause at the highest rate'}: {at['first_cause']} "
                 f"({at['first_cause_share']:.0%} of the delay; {at['evidence']})")
    return knee, f"{head}; {cause}"


def compare(runs: StudyRuns) -> list[Table]:
    points = []
    for name in runs.names:
        sp = runs.manifest(name).get("study_point", {})
        points.append({"run": name, "multiple": sp.get("multiple_of_capacity"), **runs.one(name, POINT_SQL)})
    knee, sentence = explain([p for p in points if p["offered_rps"] is not None])
    cap = runs.manifest(runs.names[1])["study_point"]
    return [Table("load", "goodput and completed rate against the offered arrival rate, with each point's diagnosis",
                  COLUMNS, [[p[c] for c in COLUMNS] for p in points],
                  f"capacity {cap['capacity_rps']:.3g} req/s: completed_rps of run {SATURATED} (a closed loop keeping "
                  + (f"the batch full; the speed probe read {cap['probe_capacity_rps']:.3g} req/s, "
                     f"{cap['probe_tok_s']:.3g} tok/s)" if cap.get("probe_tok_s") is not None else
                     f"{2 * MAX_NUM_SEQS} requests in flight against the target)")
                  + f"; good = completed within {cap['deadline_ms']:.0f} ms; "
                  "offered_rps and attempted_rps: run_metrics; each <cause>_share, first_cause: the point's "
                  "run_diagnosis row (the diagnosed attempts' delay time per cause); Little's law: little_l = "
                  "mean_in_system (in flight, integrated) against little_lambda_w = attempted_rps × "
                  "mean_time_in_system_s (one sum: a bookkeeping check); at the server, server_l = the engine's own "
                  "in-system gauge (run_metrics.server_in_system) against server_lambda_w = server_attempted_rps × "
                  "mean_time_in_server_s (independent); client_transport_l = little_l − server_l, the attempts in "
                  "the client and the transport"),
            Table("knee", "the knee and its first cause (run_diagnosis at the knee's point)",
                  ["knee_rps", "knee_multiple", "first_cause", "first_cause_share", "evidence", "sentence"],
                  [[knee["offered_rps"] if knee else None, knee["multiple"] if knee else None,
                    knee["first_cause"] if knee else None, knee["first_cause_share"] if knee else None,
                    knee["evidence"] if knee else None, sentence]])]


STUDY = Study(
    name="load",
    question="As the arrival rate rises from well below the engine's capacity to past it, where does goodput stop "
             "following the offered rate, and what takes the late requests' time there: queueing, prefill "
             "interference, preemption, the host or the client?",
    knob="the Poisson arrival rate, as a multiple of the capacity a saturated closed loop measures first",
    reading="below the knee goodput_rps follows offered_rps and good_share stays near 1; at the knee good_share "
            "drops and completed_rps flattens at the capacity; each point's <cause>_share says where its late "
            "requests' delay went (run_diagnosis), and the knee table names the knee point's first cause.",
    runs=runs, compare=compare, needs_model=True,
    options={"scale": Option("default", "default or tiny (two rates of four requests: the tests)"),
             "deadline_batches": Option(2.0, "a request's deadline: this many times a request's time in a full batch",
                                        0.01, 1000),
             "seed": Option(7, "the arrival process's seed", 0, 2 ** 63 - 1),
             "rates": Option("", "request rates to offer, req/s, comma-separated (e.g. 1,2,4); empty: the scale's "
                                 "multiples of the capacity"),
             "target": Option("embedded", "embedded, or the base URL of any OpenAI-compatible server (ours, vLLM, "
                                          "a black box) every run is a capture of"),
             "server": Option("", "with a URL target: the folder of the `inferledger serve --out S` serving it, "
                                  "joined to each run (the engine's account, the causes)"),
             "deadline_ms": Option(0.0, "a request's deadline in ms (0: deadline_batches × a full batch's time)",
                                   0, 86_400_000)},
    figures=({"kind": "curve", "title": "goodput and completed rate against the offered rate", "table": "load",
              "x": "offered_rps", "y": ["attempted_rps", "completed_rps", "goodput_rps"]},
             {"kind": "curve", "title": "where the late requests' delay went, against the offered rate", "table": "load",
              "x": "offered_rps", "y": ["good_share", *SHARES]}),
)
