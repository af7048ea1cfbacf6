"""A deployment's replicas that are not `serve --out` folders (`capture --replica URL[=KIND]`), and the
`[deployment]` workload section that declares a router, its metrics, the servers and the replicas.

A replica of ours with a folder is joined per attempt (servers.py). The others are declared by URL and
kind; each records what today's single-server path records for its kind, per replica:

- `vllm`: its Prometheus `/metrics` at 2 Hz (the `vllm:*` series, source `vllm-metrics`), and with
  `--otlp-port` its spans when it is the deployment's only vLLM replica (its spans' events carry
  `attrs.replica_id`; with several, spans could not be told apart by replica and the flag is refused);
- `llamacpp`: its `/metrics` (`llamacpp:*`, source `llamacpp-metrics`); the client keeps each response's
  `timings` on `attempt.done` whatever answers;
- `ours`: an `inferledger serve` without `--out`: its `/metrics` (`vllm:*` names, source `inferledger-metrics`);
- `blackbox`: nothing of its own.

Each replica's samples carry it as their `device`, its raw scrapes are `scrapes/metrics-<replica>.jsonl`,
and its id is its URL's `host:port` (the form the router's counters are matched by). Which attempts
such a replica served is not in its answers: each one is a gap naming the replica and its kind. One
exception, by evidence: an attempt answered with llama.cpp's timings that no `--server` folder holds is
the deployment's llama.cpp replica's when exactly one is declared (the ledger's attempts.replica_id).
With the router's spans (`--router-traces`) each attempt is placed on the replica its try's CLIENT span
names (router_tries.py), by the client's request id, whatever the kind: two llama.cpp replicas, whose
timings cannot say which of them answered, are told apart this way, and an attempt whose spans never
came has no replica (a gap of its own), never one guessed by position.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from inferledger.collectors.evidence.metrics_scrape import LlamaCppScraper, MetricsScraper, OursScraper
from inferledger.collectors.evidence.router_metrics import worker_key
from inferledger.collectors.workload.flags import FlagError
from inferledger.collectors.workload.schema import REPLICA_KINDS, replica_entry

SCRAPERS = {"vllm": MetricsScraper, "llamacpp": LlamaCppScraper, "ours": OursScraper}
WHAT = {"vllm": "its /metrics (vllm:*)", "llamacpp": "its /metrics (llamacpp:*); each response's timings are the "
        "client's", "ours": "its /metrics (vllm:* names)", "blackbox": "nothing of its own"}


@dataclass(frozen=True)
class ReplicaSpec:
    """One `--replica URL[=KIND]` (or one entry of the workload's `[deployment].replicas`: `where` names it)."""
    url: str
    kind: str = "blackbox"
    where: str = field(default="--replica", compare=False)  # the flag or the file's key, for messages

    @property
    def replica_id(self) -> str:
        return worker_key(self.url)


@dataclass(frozen=True)
class DeploymentFlags:
    """What the command line gave (None, or no entries: not given; an empty string was given), before the
    workload's [deployment] fills it."""
    target: str | None = None
    router_metrics: str | None = None
    servers: tuple = ()
    replicas: tuple[str, ...] = ()
    router_traces: Path | None = None


def resolve(flags: DeploymentFlags, deployment) -> DeploymentFlags:
    """The flags over the workload's `[deployment]` (each flag given replaces its key, an empty value too, for
    the command to refuse; `deployment` None: the flags alone); the target defaults to 'embedded'."""
    d = deployment
    router = d.router if d is not None else None
    return DeploymentFlags(
        target=flags.target if flags.target is not None else router or "embedded",
        router_metrics=flags.router_metrics if flags.router_metrics is not None else
        d.router_metrics if d is not None else None,
        servers=tuple(flags.servers) or tuple(Path(p) for p in (d.servers if d is not None else ())),
        replicas=tuple(flags.replicas) or tuple(d.replicas if d is not None else ()),
        router_traces=flags.router_traces if flags.router_traces is not None else
        Path(d.router_traces) if d is not None and d.router_traces is not None else None)


@dataclass(frozen=True)
class Declared:
    """Where a deployment's replicas and router were given, for messages: `workload` the file whose
    `[deployment].replicas` the replicas are (None: `--replica` flags); `router` the router's flag or key."""
    workload: str | None = None
    router: str = "--target"

    def replica(self, i: int) -> str:
        return "--replica" if self.workload is None else f"{self.workload}: [deployment].replicas[{i}]"

    def refusal(self, i: int, text: str, message: str) -> FlagError:
        if self.workload is None:
            return FlagError("--replica", f"{text!r}: {message}")
        return FlagError("--workload", f"{self.replica(i)}: {text!r}: {message}")


def check_replicas(texts, server_urls: dict[str, str], otlp: bool, target: str | None = None,
                   declared: Declared = Declared()) -> tuple[ReplicaSpec, ...]:
    """The --replica values parsed and checked against each other, the --server folders' own addresses
    (`server_urls`: URL -> server id) and the router (`target`: a replica is behind it, never it); FlagError
    names the flag, or the workload file's key when `declared` says they come from its `[deployment]`."""
    specs, seen = [], {worker_key(u): f"--server {sid}" for u, sid in server_urls.items()}
    for i, text in enumerate(texts):
        try:
            spec = ReplicaSpec(*replica_entry(text), where=declared.replica(i))
        except ValueError as exc:
            raise FlagError("--replica" if declared.workload is None else "--workload",
                            str(exc) if declared.workload is None else f"{declared.replica(i)}: {exc}") from None
        if target is not None and spec.replica_id == worker_key(target):
            raise declared.refusal(i, text, f"{spec.replica_id} is {declared.router}, the router; a replica is a "
                                            "server behind it (its own URL)")
        if spec.replica_id in seen:
            raise declared.refusal(i, text, f"{spec.replica_id} is already a replica ({seen[spec.replica_id]}); "
                                            "declare each replica once")
        seen[spec.replica_id] = f"{spec.where} {text}" if declared.workload is None else spec.where
        specs.append(spec)
    if otlp and sum(s.kind == "vllm" for s in specs) != 1:
        raise FlagError("--otlp-port", "--otlp-port in a deployment takes the spans of exactly one vLLM replica "
                        "(--replica URL=vllm): spans name no replica, so several could not be told apart")
    return tuple(specs)


class Replicas:
    """The declared replicas' own evidence during one capture: `start()` as the target starts, `stop()` after
    the load, then `gap_rows` and `manifest`."""

    def __init__(self, specs: tuple[ReplicaSpec, ...], run_dir: Path, writer, *, clock: str, host: str) -> None:
        self.specs = specs
        self.scrapers = {s.replica_id: SCRAPERS[s.kind](f"{s.url}/metrics", run_dir, writer, clock=clock,
                                                         host=host).for_replica(s.replica_id)
                         for s in specs if s.kind in SCRAPERS}

    def urls(self) -> dict[str, str]:
        """Each replica's URL -> its id (the router's workers are matched by it)."""
        return {s.url: s.replica_id for s in self.specs}

    def start(self) -> None:
        for s in self.scrapers.values():
            s.start()

    def stop(self, final_scrape: bool = True) -> None:
        for s in self.scrapers.values():
            s.stop(final_scrape)

    def by_timings(self, spec: ReplicaSpec) -> bool:
        """Whether llama.cpp's timings place the replica's attempts: it is the deployment's one llama.cpp replica."""
        return spec.kind == "llamacpp" and sum(s.kind == "llamacpp" for s in self.specs) == 1

    def gap_rows(self, run_id: str, router_spans: bool = False) -> list[dict]:
        """Per replica: what its kind does not record per attempt (and, without `router_spans`, the router's
        spans given to the capture, which attempts it served unless llama.cpp's timings say), its scrapes'
        failures under its own ids."""
        gaps = []
        for s in self.specs:
            rid = s.replica_id
            placed = router_spans or self.by_timings(s)
            how = ("its attempts are those whose try the router's spans (--router-traces) name it for, by the "
                   "client's request id (an attempt without its spans is a gap of its own)" if router_spans else
                   "its attempts are those answered with llama.cpp's timings that no --server folder holds (the "
                   "deployment's one llama.cpp replica)" if placed else "its answers name no replica")
            gaps.append({"run_id": run_id, "gap_id": f"collector:replica:{rid}", "scope": "run", "subject_id": rid,
                         "affects": ("" if placed else f"which attempts replica {rid} served (attempts.replica_id), ")
                                    + "their server_status and server and engine figures; its replicas row's "
                                      "per-attempt figures",
                         "needs": "the replica's own events per attempt: `inferledger serve --out S` joined with "
                                  "--server S",
                         "detail": f"replica {rid} ({s.kind}, {s.url}) is declared by URL: the capture records "
                                   f"{WHAT[s.kind]}, and {how}"})
            scraper = self.scrapers.get(rid)
            for g in scraper.gap_rows(run_id) if scraper is not None else []:
                gaps.append({**g, "gap_id": f"{g['gap_id']}@{rid}", "subject_id": rid,
                             "affects": f"replica {rid}'s {g['affects']}"})
        return gaps

    def manifest(self) -> list[dict]:
        """The manifest's `deployment.replicas` entries."""
        out = []
        for s in self.specs:
            scraper = self.scrapers.get(s.replica_id)
            out.append({"replica_id": s.replica_id, "url": s.url, "kind": s.kind, "records": WHAT[s.kind],
                        **({"metrics": scraper.summary()} if scraper is not None else {})})
        return out


__all__ = ["REPLICA_KINDS", "Declared", "DeploymentFlags", "ReplicaSpec", "Replicas", "check_replicas",
           "resolve"]
