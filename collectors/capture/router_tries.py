"""`capture --router-traces FILE`: each upstream try a router sent, from the router's own spans.

vllm-router, with its tracing on (benchmarks/peers/router_traces.py starts it so and receives its
export into FILE, OTLP/JSON lines), records a SERVER span per client request (`request_id`: the
X-Request-Id the client sent, here the attempt id) and, under it, a CLIENT span per upstream try
(`url.full` the worker, `http.response.status_code` or an error status, start and end in Unix ns). Its
log does not: docs/PEERS.md "What the router records of each try".

After the load and the `--server` folders' join, the capture waits (bounded, `--server-wait`) until
every attempt it sent has its SERVER span in FILE, copies FILE into the run (`ROUTER_SPANS_FILE`), and
joins each try to the client attempt by request id alone:

- a request's tries in the order the router started them; the last is the answer the client saw (the
  router retries only what failed and hands the client its last try's answer), each earlier one a try
  the client never saw;
- each try is one `router.try` event (source `router`, reported): `attrs.replica_id` the replica the
  worker is (else the worker's host:port), `attrs.status` or `attrs.error`, `attrs.end_ns` (when the
  router had its answer, or gave up: a replica's work on the try after it is ghost load);
- a try a replica of ours holds is already an attempt of the run (its folder's `server.received` names
  the try's CLIENT span as `parent_span_id`: the router continues the trace from it), and its event goes
  under that attempt's id; any other is an unseen try under its own attempt id `<client
  attempt>@<replica>#<n>` (n: its place among the request's tries) with `attrs.parent_attempt_id`, or
  the answer, under the client attempt's own id.
  Its time is the router's Unix time: on this host's `wall:<host>` clock (mapped to the client's by the
  capture) for a router on loopback, else on `wall:<router host:port>`, which nothing maps.

Each try's `attrs.replica_id` is what places a client attempt no folder holds (a replica declared by URL:
two llama.cpp replicas, whose answers cannot say which of them it was): the ledger's attempts.replica_id.

A gap, never a row: a request id the client never sent, an attempt whose SERVER span never came (its
replica NULL too when no folder holds it), a CLIENT span without its request, a name a folder's try
already has, a line or span the reader refused.
"""
from __future__ import annotations

import json
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from inferledger.collectors.evidence.otlp_file import read_otlp_file
from inferledger.collectors.evidence.router_metrics import worker_key
from inferledger.probes.events import EVENT_SCHEMA
from inferledger.probes.probe import EventIds, Probe, wall_clock
from inferledger.probes.run_dir import list_parts
from inferledger.probes.run_folder import ROUTER_SPANS_FILE

POLL_S = 0.25
LOOPBACK = ("127.", "localhost", "[::1]")
AFFECTS = "attempts (the router's tries the client never saw), replicas.attempts, reconciliation.unseen_tries"


class RouterTracesError(ValueError):
    """A --router-traces file that cannot be read; the message names it."""


def check_router_traces(path: str | Path) -> Path:
    """The file as given, refused (naming it) when it is a folder or cannot be opened for reading."""
    p = Path(path)
    if p.is_dir():
        raise RouterTracesError(f"{p}: a folder; give the file the router's span receiver writes "
                                "(benchmarks/peers/router_traces.py receive PORT FILE)")
    if p.exists():
        try:
            p.open("rb").close()
        except OSError as exc:
            raise RouterTracesError(f"{p}: cannot be read ({exc.strerror})") from None
    return p


@dataclass
class _Run:
    """What the run holds before the router's tries are added."""
    sent: dict[str, EventIds]  # the client's attempts (attempt.sent) and their ids
    held: dict[str, str]  # CLIENT span id a replica folder's server.received names as its parent -> that attempt
    names: set[str]  # every attempt id in the run
    in_folders: set[str] = field(default_factory=set)  # the attempts a replica folder holds (its server's events)


def _read_run(run_dir: Path) -> _Run:
    run = _Run({}, {}, set())
    for p in list_parts(run_dir / "events", EVENT_SCHEMA) if (run_dir / "events").is_dir() else []:
        cols = ["name", "source", "task_id", "session_id", "request_id", "attempt_id", "attrs"]
        for r in pq.read_table(p, columns=cols).to_pylist():
            aid = r["attempt_id"]
            if aid is None:
                continue
            run.names.add(aid)
            if r["source"] in ("server", "engine"):
                run.in_folders.add(aid)
            if r["source"] == "client" and r["name"] == "attempt.sent":
                run.sent[aid] = EventIds(r["task_id"], r["session_id"], r["request_id"], aid)
            elif r["name"] == "server.received" and '"parent_span_id"' in (r["attrs"] or ""):
                run.held[json.loads(r["attrs"])["parent_span_id"]] = aid
    return run


@dataclass
class RouterTries:
    """The router's spans of one capture, joined to its attempts after the load."""
    path: Path
    host: str
    target: str  # the router's URL (the capture's target)
    replicas: dict[str, str]  # worker host:port -> replica id
    summary: dict = field(default_factory=dict)
    gaps: list[dict] = field(default_factory=list)

    @property
    def clock(self) -> str:
        where = worker_key(self.target)
        return wall_clock(self.host) if where.startswith(LOOPBACK) else f"wall:{where}"

    def join(self, writer, run_dir: Path, wait_s: float, say=print) -> None:
        writer.flush()
        run = _read_run(run_dir)
        t0, told = time.monotonic(), False
        while True:
            spans, refusals = read_otlp_file(self.path) if self.path.exists() else ([], [])
            have = {s.attributes.get("request_id") for s in spans if s.kind == "SERVER"}
            missing = sorted(set(run.sent) - have)
            if not missing or time.monotonic() - t0 >= wait_s:
                break
            if not told:
                told = True
                say(f"waiting up to {wait_s:g} s (--server-wait) for the router's spans of {len(missing)} attempt(s) "
                    f"in {self.path}")
            time.sleep(POLL_S)
        if self.path.exists():
            shutil.copyfile(self.path, run_dir / ROUTER_SPANS_FILE)
        self._emit(writer, run, spans)
        self._gaps(writer.run_id, run, missing, refusals)
        self.summary.update(file=str(self.path), copied_as=ROUTER_SPANS_FILE, clock=self.clock, spans=len(spans),
                            refused=len(refusals), waited_s=round(time.monotonic() - t0, 3),
                            attempts_without_spans=len(missing))

    def _emit(self, writer, run: _Run, spans: list) -> None:
        server = {s.span_id: s for s in spans if s.kind == "SERVER"}
        tries = defaultdict(list)
        self.orphans, self.foreign, self.taken = [], [], []
        for s in spans:
            if s.kind != "CLIENT":
                continue
            parent = server.get(s.parent_span_id)
            if parent is None:
                self.orphans.append(s)
            elif parent.attributes.get("request_id") not in run.sent:
                self.foreign.append(s)
            else:
                tries[parent.attributes["request_id"]].append(s)
        probe = Probe(writer, "router", run_id=writer.run_id, host=self.host, clock=self.clock)
        reporter = next((f"vllm-router-{v}" for s in spans if (v := s.resource.get("service.version"))), "vllm-router")
        rows = unseen = held = 0
        for client, ts in sorted(tries.items()):
            ts.sort(key=lambda s: (s.start_unix_ns, s.span_id))
            for n, s in enumerate(ts, 1):
                worker = str(s.attributes.get("url.full", ""))
                replica = self.replicas.get(worker_key(worker), worker_key(worker))
                last = n == len(ts)
                name = run.held.get(s.span_id) or (client if last else f"{client}@{replica}#{n}")
                held += s.span_id in run.held
                if s.span_id not in run.held and not last and name in run.names:
                    self.taken.append((name, s))
                    continue
                status = s.attributes.get("http.response.status_code")
                attrs = {"replica_id": replica, "worker": worker,
                         "end_ns": s.end_unix_ns, "span_id": s.span_id, "trace_id": s.trace_id,
                         "evidence": "reported", "reporter": reporter}
                if str(status).isdigit():  # an HTTP status (OTLP/JSON may carry it as a string)
                    attrs["status"] = int(status)
                if s.status == "ERROR":
                    attrs["error"] = s.status_message or "error"
                if name != client:
                    attrs["parent_attempt_id"] = client
                    unseen += s.span_id not in run.held
                ids = run.sent[client]
                probe.emit("router.try", EventIds(ids.task_id, ids.session_id, ids.request_id, name),
                           ts_ns=s.start_unix_ns, **attrs)
                rows += 1
        self.summary.update(requests=len(tries), tries=sum(len(t) for t in tries.values()), held_by_folders=held,
                            events=rows, unseen_tries=unseen)

    def _gaps(self, run_id: str, run: _Run, missing: list[str], refusals: list) -> None:
        g = self.gaps
        for aid in missing:  # in no folder, only the router's span would have named its replica
            g.append({"run_id": run_id, "gap_id": f"collector:router-spans:{aid}", "scope": "attempt", "subject_id": aid,
                      "affects": AFFECTS if aid in run.in_folders else f"attempts.replica_id (no folder holds it), {AFFECTS}",
                      "needs": "the router's spans of the attempt (its tracing exports in batches)",
                      "detail": f"no SERVER span with request_id {aid} in {self.path}: the tries the router made for it "
                                "are not known from its spans"})
        for s in self.orphans:
            g.append({"run_id": run_id, "gap_id": f"collector:router-span:{s.span_id}", "scope": "run",
                      "subject_id": s.span_id, "affects": AFFECTS,
                      "needs": "the SERVER span the try belongs to (its request id)",
                      "detail": f"a try to {s.attributes.get('url.full')} whose request's span (span {s.parent_span_id}) "
                                f"is not in {self.path}: no request id joins it"})
        for s in self.foreign:
            g.append({"run_id": run_id, "gap_id": f"collector:router-span:{s.span_id}", "scope": "run",
                      "subject_id": s.span_id, "affects": AFFECTS, "needs": "a request id this capture sent",
                      "detail": f"a try to {s.attributes.get('url.full')} of a request this capture never sent "
                                "(another client's, or an id the router made)"})
        for name, s in self.taken:
            g.append({"run_id": run_id, "gap_id": f"collector:router-span:{s.span_id}", "scope": "attempt",
                      "subject_id": name, "affects": AFFECTS, "needs": "one numbering of the request's tries",
                      "detail": f"the router's try {s.span_id} would be {name}, the name a replica folder's try of the "
                                "request already has"})
        for k, r in enumerate(refusals, 1):
            g.append({"run_id": run_id, "gap_id": f"collector:router-span-refused:{k}", "scope": "run",
                      "subject_id": r.span_id, "affects": AFFECTS, "needs": "OTLP/JSON spans (the receiver's file)",
                      "detail": f"{self.path}:{r.line}: {r.reason}"})
