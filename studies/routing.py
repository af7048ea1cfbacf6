"""routing: one shared-prefix workload through two replicas behind vLLM's router, once per routing policy.

Prompts in several groups, each group's prompts sharing a long prefix (a system message's first three
quarters, its own per group), so a router that sends a group back to the replica that already holds
its prefix saves that replica the prefix's prefill. Each run starts two `inferledger serve --out`
replicas of the bundled model (prefix caching on, one thread each, free loopback ports) and vLLM's
router (`vllm-router`, installed by benchmarks/peers/vllm_router.sh) in front of them with one policy,
runs one deployment capture through the router (collectors/capture: both folders joined, the router's
counters scraped before and after the load), and stops all three. The groups are an odd number, dealt
to the tasks in turn, so round robin sends every group to both replicas.

From each run's ledger: per replica, the prompt tokens its engine took and those its prefix cache
served at first admission (`replicas.prompt_tokens`, `event_cached_tokens`) beside what its own prefix-cache counters
say over the load (the capture scrapes each replica's /metrics; `replicas.prefix_counter_agrees`), its attempts
against the router's own count (`replicas`), busy time and balance; per policy, TTFT p50 / p99 at the client
(`latency_percentiles`), goodput (`run_metrics`), the balance figure and the first cause
(`run_diagnosis`).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.capture.run import capture
from inferledger.probes.run_folder import Manifest
from inferledger.serve.local import START_LIMIT_S, free_port, wait_healthy
from inferledger.studies.framework import Option, Study, StudyError, StudyRun, StudyRuns, Table, task_ticks
from inferledger.studies.real import LONG_MS, workload

POLICIES = ("round_robin", "power_of_two", "cache_aware")
INSTALL = "bash benchmarks/peers/vllm_router.sh install"
# where that script installs the router: .peers/vllm-router under the project's root
INSTALLED = Path(__file__).resolve().parents[1] / ".peers" / "vllm-router" / "bin" / "vllm-router"
REPLICAS = ("replica1", "replica2")  # each replica's `serve --out` folder name: its replica_id in the ledger
MAX_NUM_SEQS = 2  # each replica's batch (the deployment recipe's)
STOP_LIMIT_S = 120.0


@dataclass(frozen=True)
class Scale:
    attempts: int
    groups: int  # prefix groups: odd, so round robin sends each group to both replicas
    prompt_tokens: int
    prefix_tokens: int  # each group's shared prefix (three quarters of the prompt)
    max_tokens: int
    rate_rps: float  # Poisson arrivals


SCALES = {"default": Scale(60, 5, 256, 192, 8, 1.0), "tiny": Scale(24, 5, 128, 96, 4, 2.0)}


def scale(options: dict) -> Scale:
    if options["scale"] not in SCALES:
        raise StudyError(f"--set scale={options['scale']}: expected one of {', '.join(SCALES)}")
    return SCALES[options["scale"]]


def policies(options: dict) -> list[str]:
    """The policies `--set policies=...` asks, in its order (each one of POLICIES, none twice)."""
    got = [p.strip() for p in options["policies"].split(",") if p.strip()]
    bad = [p for p in got if p not in POLICIES]
    if not got or bad or len(set(got)) != len(got):
        raise StudyError(f"--set policies={options['policies']}: expected one or more of {', '.join(POLICIES)} "
                         "separated by commas, none twice" + (f" ({bad[0]!r} is not one)" if bad else ""))
    return got


def router_binary(options: dict) -> Path:
    """The vllm-router executable: `--set router=PATH`, else the one the install script put under the
    project's .peers/, else one on PATH; StudyError naming the install script when there is none."""
    if options["router"]:
        path = Path(options["router"]).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise StudyError(f"--set router={options['router']}: not an executable file (the vllm-router "
                             f"binary; install it with `{INSTALL}`)")
        return path
    if INSTALLED.is_file() and os.access(INSTALLED, os.X_OK):
        return INSTALLED
    found = shutil.which("vllm-router")
    if found is None:
        raise StudyError(f"study routing needs vLLM's router, which is not installed: install it with `{INSTALL}` "
                         f"(vllm-router 0.1.17 into .peers/vllm-router), or give its binary with --set router=PATH; "
                         "nothing was run")
    return Path(found)


def _healthy(proc: subprocess.Popen, url: str, what: str, log: Path) -> None:
    """Wait until `url`/health answers 200; StudyError with the log's tail when `proc` exits or the bound passes."""
    if wait_healthy(proc, url, START_LIMIT_S):
        return
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    why = f"exited with {proc.returncode}" if proc.poll() is not None else f"did not answer in {START_LIMIT_S:.0f} s"
    raise StudyError(f"{what} {why}; its log ends: {tail.strip() or '(empty)'}")


def _started(stack: ExitStack, argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """A process of the run, stopped when `stack` closes (SIGINT, as Ctrl-C stops a server; killed past the bound)."""
    out = open(log, "wb")
    stack.callback(out.close)
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    stack.callback(stop)
    return proc


def replica_argv(port: int, folder: Path) -> list[str]:
    return [sys.executable, "-m", "inferledger.cli.app", "serve", "--port", str(port), "--max-num-seqs",
            str(MAX_NUM_SEQS), "--enable-prefix-caching", "--out", str(folder)]


def router_argv(router: Path, port: int, metrics_port: int, workers: list[str], policy: str) -> list[str]:
    return [str(router), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), "--log-level", "warning",
            "--worker-startup-timeout-secs", str(int(START_LIMIT_S)), "--worker-startup-check-interval", "1"]


def _workload(options: dict):
    s = scale(options)
    classes = [{"name": f"group{k + 1}", "prompt_tokens": s.prompt_tokens, "shared_prefix_tokens": s.prefix_tokens}
               for k in range(s.groups)]
    return workload("routing", classes, max_tokens=s.max_tokens, deadline_ms=options["deadline_ms"] or LONG_MS,
                    arrivals={"process": "poisson", "rate_rps": s.rate_rps, "n_tasks": s.attempts},
                    seed=options["seed"])


def _produce(options: dict, policy: str, run_dir: Path, run_id: str) -> None:
    """Two replicas and the router with `policy`, one deployment capture through it, everything stopped after."""
    router = router_binary(options)
    wl = _workload(options)
    tick, done = task_ticks(), [0]

    def progress() -> None:
        done[0] += 1
        tick(done[0], wl.n_tasks)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="inferledger-routing-")))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        started = []
        for name in REPLICAS:  # both loading their model at once
            port = free_port()
            argv = replica_argv(port, work / name)
            started.append((name, f"http://127.0.0.1:{port}", argv,
                            _started(stack, argv, work / f"{name}.log", env)))
        for name, url, _, proc in started:
            _healthy(proc, url, f"replica {name} (inferledger serve)", work / f"{name}.log")
        port, metrics_port = free_port(), free_port()
        argv = router_argv(router, port, metrics_port, [url for _, url, _, _ in started], policy)
        proc = _started(stack, argv, work / "router.log")
        url = f"http://127.0.0.1:{port}"
        _healthy(proc, url, f"vllm-router ({policy})", work / "router.log")
        capture(wl, run_dir, CaptureOptions(target=url, servers=tuple(work / n for n in REPLICAS),
                                            router_metrics=f"http://127.0.0.1:{metrics_port}/metrics", run_id=run_id,
                                            microbenchmarks=False),
                progress=progress if tick is not None else None)
    # how the run's deployment was started, beside the run (the ports were free loopback ones)
    manifest = Manifest.read(run_dir)
    installed = router.parents[1] / ".installed"  # the install script's record of the version it installed
    manifest.body["study_point"] = {"policy": policy, "router_argv": argv,
                                    "router_version": installed.read_text().strip() if installed.is_file() else None,
                                    "replica_argv": {name: a for name, _, a, _ in started},
                                    "replica_env": {"OMP_NUM_THREADS": "1"}}
    manifest.write(run_dir)


def runs(options: dict) -> list[StudyRun]:
    asked = policies(options)
    scale(options)
    router_binary(options)  # refused before any folder is written
    return [StudyRun(p, {"policy": p}, partial(_produce, options, p)) for p in asked]


# per replica: the ledger's `replicas` (prompt tokens its engine counted, those its prefix cache served at first
# admission, its own counters, busy time and queue)
REPLICA_SQL = """
SELECT replica_id, attempts, router_sent, router_agrees, prompt_tokens, event_cached_tokens AS cached_tokens,
       event_hit_rate AS hit_rate, prefix_hit_blocks, prefix_hit_tokens, prefix_query_tokens, prefix_counter_agrees,
       busy_ms, balance, queue_p50_ms
FROM replicas ORDER BY replica_id"""

POLICY_SQL = """
WITH d AS (SELECT * FROM run_diagnosis WHERE scope = 'run')
SELECT (SELECT n_client_attempts FROM run_metrics) AS n_attempts, (SELECT unseen_tries FROM reconciliation) AS unseen_tries,
       (SELECT p50_ms FROM latency_percentiles WHERE source_column = 'request_metrics.ttft_client_ms') AS ttft_p50_ms,
       (SELECT p99_ms FROM latency_percentiles WHERE source_column = 'request_metrics.ttft_client_ms') AS ttft_p99_ms,
       (SELECT goodput_rps FROM run_metrics) AS goodput_rps,
       d.replica_balance AS balance, d.diagnosed, d.first_cause, d.first_cause_share, d.replica_id AS cause_replica,
       d.evidence
FROM d"""

REPLICA_COLUMNS = ["policy", "replica_id", "attempts", "router_sent", "router_agrees", "prompt_tokens", "cached_tokens",
                   "hit_rate", "prefix_hit_blocks", "prefix_hit_tokens", "prefix_query_tokens", "prefix_counter_agrees",
                   "busy_ms", "balance", "queue_p50_ms"]
POLICY_COLUMNS = ["policy", "n_attempts", "unseen_tries", "prompt_tokens", "cached_tokens", "hit_rate",
                  *(f"{r}_hit_rate" for r in REPLICAS), "counter_hit_rate", "counters_agree", "ttft_p50_ms", "ttft_p99_ms", "goodput_rps", "balance",
                  "diagnosed", "first_cause", "first_cause_share", "cause_replica", "evidence"]


def _sum(values: list):
    return None if any(v is None for v in values) or not values else sum(values)


def compare(runs: StudyRuns) -> list[Table]:
    per_policy, per_replica = [], []
    for name in runs.names:
        reps = runs.records(name, REPLICA_SQL)
        per_replica += [[name, *(r[c] for c in REPLICA_COLUMNS[1:])] for r in reps]
        prompt, cached = _sum([r["prompt_tokens"] for r in reps]), _sum([r["cached_tokens"] for r in reps])
        rate = {r["replica_id"]: r["hit_rate"] for r in reps}
        hits, queries = _sum([r["prefix_hit_tokens"] for r in reps]), _sum([r["prefix_query_tokens"] for r in reps])
        agree = [r["prefix_counter_agrees"] for r in reps]
        p = runs.one(name, POLICY_SQL)
        per_policy.append([name, p["n_attempts"], p["unseen_tries"], prompt, cached,
                           None if prompt is None or cached is None or not prompt else cached / prompt,
                           *(rate.get(r) for r in REPLICAS),
                           None if hits is None or not queries else hits / queries,
                           None if not agree or None in agree else all(agree),
                           *(p[c] for c in POLICY_COLUMNS[8 + len(REPLICAS):])])
    return [Table("routing", "each policy: the prefix cache's hits, TTFT, goodput, balance and the first cause",
                  POLICY_COLUMNS, per_policy,
                  "hit_rate = cached_tokens / prompt_tokens over both replicas' engines (replicas.prompt_tokens and "
                  "event_cached_tokens: the prompt tokens each engine counted, and those its prefix cache served at "
                  "first admission), <replica>_hit_rate the same per replica (replicas.event_hit_rate); counter_hit_rate: "
                  "the replicas' own counters over the load, Σ vllm:prefix_cache_hits_total / Σ "
                  "vllm:prefix_cache_queries_total; counters_agree: each replica's counted hits equal its engine "
                  "events' (replicas.prefix_counter_agrees); ttft_*: "
                  "latency_percentiles of request_metrics.ttft_client_ms; "
                  "goodput_rps: run_metrics; balance: run_diagnosis.replica_balance (the busiest replica's busy time "
                  "over the mean); first_cause, cause_replica, evidence: run_diagnosis (scope run)"),
            Table("replicas", "each policy's replicas: what the router sent each, and what its prefix cache served",
                  REPLICA_COLUMNS, per_replica,
                  "attempts, router_sent (vllm_router_processed_requests_total over the load), router_agrees, "
                  "prefix_hit_blocks (kv_holds), prefix_hit_tokens, prefix_query_tokens (its own counters over the "
                  "load), prefix_counter_agrees, busy_ms, balance, queue_p50_ms: the ledger's `replicas`; "
                  "prompt_tokens, cached_tokens, hit_rate: replicas.prompt_tokens, event_cached_tokens, event_hit_rate "
                  "(its engine's events; NULL when an attempt it completed has no engine account)")]


STUDY = Study(
    name="routing",
    question="Prompts in groups that share long prefixes, sent through vLLM's router to two replicas with prefix "
             "caching: how much of the prompts does each routing policy let the replicas' caches serve, and what "
             "does that do to TTFT, goodput and the balance between the replicas?",
    knob="the router's policy (round_robin, power_of_two, cache_aware)",
    reading="a policy that sends each group back to the replica holding its prefix (what cache_aware aims at) "
            "computes each group's prefix once in the deployment, against once per replica under round_robin, so its "
            "hit_rate is higher; replica1_hit_rate, replica2_hit_rate and the replicas table show where, balance what "
            "it cost the spread, and first_cause where the attempts' delay went.",
    runs=runs, compare=compare,
    options={"scale": Option("default", "default (60 attempts at 1/s, 5 groups, 256-token prompts sharing 192, 8 output "
                                        "tokens) or tiny (24 at 2/s, 128-token prompts sharing 96, 4 output tokens)"),
             "policies": Option(",".join(POLICIES), "the router's policies to run, comma-separated, in that order "
                                                    f"(any of {', '.join(POLICIES)})"),
             "seed": Option(7, "the arrival process's seed", 0, 2 ** 63 - 1),
             "deadline_ms": Option(0.0, "a request's deadline in ms, what goodput counts (0: none, ten minutes)",
                                   0, 86_400_000),
             "router": Option("", "the vllm-router binary (empty: the one benchmarks/peers/vllm_router.sh installs "
                                  "under .peers/, else vllm-router on PATH)")},
)
