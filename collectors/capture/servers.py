"""`capture --target URL --server S`: the events of `inferledger serve --out S` joined into the capture's run.

A capture against a URL records only the client; a server started with `serve --out S` records its own
and its engine's events in S, flushing every `--flush-every` seconds (2 s) and at its stop. With
`--server S` (repeatable) the capture, after its load, waits until each folder's flushed parts cover
this run's attempts, then copies their server and engine events, and the engine's steps and KV samples
of the window they span, into the run: the run rebuilds whole whether the server still runs or has
stopped, as an embedded capture's does.

- **This run's attempts**, not the other clients' of the server: the capture sends each attempt a W3C
  traceparent derived from the attempt id and a salt of this capture (collectors/evidence/trace_context.py);
  the server keeps its trace id on `server.received`, so a server attempt is this run's by its trace id.
  The request id passed through (x-request-id) must agree: a server attempt whose own id is not the
  client's (less a `#n`) is counted (`id_disagrees`) and a gap.
  A server names an attempt id it has already seen `id#2` (serve/ids.py): its events are copied under the
  client's id. Model discovery and clock probes carry no attempt and are never copied.
- **Clocks.** A folder whose manifest names this host and this boot (`host.name`, `host.boot_id`) stamped
  its events on this capture's own `mono:<host>`: one domain. Otherwise its clock is another domain
  (renamed `<clock>@<server id>` when its name is one of ours), mapped to the client's by round trips to
  the server's `/clock` before and after the load (clocksync.py), mapping and epsilon recorded; without
  a mapping the cross-domain figures are NULL with a gap, never guessed.
- **Covered**: every attempt of this run that the server answered (the client saw its first byte) is
  found, and each found attempt's end is on disk: a server terminal (server.done, server.rejected or
  server.disconnect) and, once the engine took it (engine.enqueued), engine.finished, kv.free and the
  step.end of its last step. What is not covered within `wait_s` (`--server-wait`, SERVER_WAIT_S) is copied as
  far as it goes and is a gap naming the folder.
- **Replicas declared by URL beside the folders** (`deployment`): an answered attempt no folder holds may be
  theirs, so the wait ends once the found attempts are covered and every folder has flushed after the load
  (its manifest's `flushed.at_unix_s`, or a stopped server's final state), and an attempt no folder holds
  then is no gap of the folders (the replicas' own gaps name them).
- **Several folders** (replicas behind a router), or one beside replicas declared by URL: every copied event gets `attrs.replica_id` (the folder's
  server id), each folder's step ids are offset by (index + 1) x STEP_STRIDE (every engine counts from 0)
  and its KV samples name the replica as their device. A client attempt that reached servers more than once
  (the router's retries carry the same traceparent) is its latest try; each earlier try is copied as
  `<client attempt>@<server id>#<n>` with `attrs.parent_attempt_id` (`_name_tries`). Such a try can sit
  unflushed in one folder while another folder holds the answer the client saw, so with several folders the
  wait ends only once every folder has flushed after the load (or its server stopped cleanly); a folder
  that has not (its server killed, its last flush lost) is a gap naming it: the tries it received after its
  last flush are not in the run, and the router's count of what it sent that replica says how many.
- **A replica's own counters**: each such folder's server (its manifest's `server.host`, `server.port`) has its
  `/metrics` scraped from before the load to after it (`start_scrapes`, `stop_scrapes`), as a
  `--replica URL=ours` is: samples of source `inferledger-metrics` whose device is the replica, raw lines in
  `scrapes/metrics-<replica>.jsonl`; the ledger's `replicas` compares its prefix-cache counter with its events.
"""
from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from inferledger.collectors.capture import SERVER_WAIT_S
from inferledger.collectors.capture.clocksync import ClockMapping, ClockSyncError, ClockSyncFailure, estimate
from inferledger.collectors.evidence.trace_context import trace_ids_for
from inferledger.probes.events import CLOCK_SCHEMA, EVENT_SCHEMA, SAMPLE_SCHEMA
from inferledger.probes.probe import boot_id, mono_clock
from inferledger.probes.run_dir import PartError, list_parts
from inferledger.probes.run_folder import Manifest, RunFolderError

SERVE_SOURCE = "inferledger serve"
POLL_S = 0.25
SERVER_ENDS = ("server.done", "server.rejected", "server.disconnect")
ENGINE_ENDS = ("engine.finished", "kv.free")
SERVER_SOURCES = ("server", "engine", "device")
STEP_STRIDE = 10**12  # several folders: the i-th folder's (0-based) step ids are offset by (i + 1) x this
COPIED_SAMPLES = ("engine",)  # the engine's KV gauges; the host's are the capture's own (or another host's)


class ServerFolderError(ValueError):
    """A --server folder that is not a `serve --out` run folder; the message names it and what to do."""


@dataclass(frozen=True)
class ServerFolder:
    """One `serve --out` folder, checked before the capture starts."""
    path: Path
    server_id: str  # the folder's name, made unique among the --server folders
    manifest: dict

    @property
    def host(self) -> dict:
        host = self.manifest.get("host")
        return host if isinstance(host, dict) else {}

    @property
    def clock(self) -> str:
        """The domain its server and engine stamp (`mono:<its host>`)."""
        return mono_clock(self.host.get("name"))

    def same_clock(self, host: str) -> tuple[bool, str]:
        """Whether its events are on this capture's `mono:<host>`, and why (the manifest must say so)."""
        theirs, ours = self.host.get("boot_id"), boot_id()
        if self.host.get("name") != host:
            return False, f"the server's host is {self.host.get('name')!r}, the capture's {host!r}"
        if not theirs or not ours:
            return False, "the server's manifest or this kernel names no boot id: one boot cannot be proven"
        if theirs != ours:
            return False, f"the server ran on another boot of {host!r} (boot id {theirs})"
        return True, f"the server ran on this host and boot ({host}, boot id {ours}): one CLOCK_MONOTONIC"

    def clock_url(self, target: str, n_servers: int) -> str:
        """Where its /clock answers: the capture's target when it is the only server, else its own address."""
        return target if n_servers == 1 else self.own_url(target) or target

    def own_url(self, target: str) -> str | None:
        """Its own address from its manifest (`server.host`, `server.port`; an any-address bind is taken on
        the target's host); None when the manifest names no port."""
        server = self.manifest.get("server") or {}
        if not server.get("port"):
            return None
        bind = server.get("host") or "127.0.0.1"
        if bind in ("0.0.0.0", "::", ""):
            bind = target.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0] or "127.0.0.1"
        return f"http://{bind}:{server['port']}"


def check_server_folders(paths) -> list[ServerFolder]:
    """Each --server folder checked before anything is recorded: a `serve --out` run folder (its manifest
    readable, written by `inferledger serve`), each named once. ServerFolderError names the folder."""
    folders, seen, ids = [], set(), Counter()
    for p in paths:
        path = Path(p)
        if path.is_file():
            raise ServerFolderError(f"{path}: a file, not a `serve --out` folder; pass the folder the server writes")
        if not Manifest.exists(path):
            raise ServerFolderError(f"{path}: not a `serve --out` folder (no run manifest there); start the server "
                                    f"with `inferledger serve --out {path}` and pass that folder")
        try:
            manifest = Manifest.read(path).body
        except RunFolderError as exc:
            raise ServerFolderError(f"{exc}: the --server folder's manifest is damaged") from None
        if manifest.get("source") != SERVE_SOURCE:
            of = f"a run of {manifest['source']!r}" if manifest.get("source") else "a run that names no source (an import?)"
            raise ServerFolderError(f"{path}: {of}, not of `inferledger serve --out`; pass the folder a server writes")
        if path.resolve() in seen:
            raise ServerFolderError(f"{path}: given twice as --server")
        seen.add(path.resolve())
        ids[path.name] += 1
        sid = path.name if ids[path.name] == 1 else f"{path.name}-{ids[path.name]}"
        folders.append(ServerFolder(path, sid, manifest))
    return folders


class _Parts:
    """The parts of one folder read so far, each once: parts are renamed in whole and never rewritten,
    and a merged part (the server's compaction at its stop) replaces the single parts it covers."""

    def __init__(self, folder: Path, schema: pa.Schema) -> None:
        self.folder, self.schema = folder, schema
        self.read_parts: dict[str, list[dict]] = {}

    def rows(self) -> list[dict]:
        """Every row on disk now; PartError or OSError while the server compacts (the next poll reads again)."""
        if not self.folder.is_dir():
            return []
        parts = list_parts(self.folder, self.schema)
        for p in parts:
            if str(p) not in self.read_parts:
                self.read_parts[str(p)] = pq.read_table(p, schema=self.schema).to_pylist()
        current = {str(p) for p in parts}
        self.read_parts = {k: v for k, v in self.read_parts.items() if k in current}
        return [r for p in parts for r in self.read_parts[str(p)]]


@dataclass
class _Found:
    """What one folder's parts hold of this run's attempts."""
    ours: dict[str, str] = field(default_factory=dict)  # server attempt id -> the client's
    events: dict[str, list[dict]] = field(default_factory=dict)  # by server attempt id
    uncovered: dict[str, list[str]] = field(default_factory=dict)  # server attempt id -> what its end lacks
    received: dict[str, int] = field(default_factory=dict)  # server attempt id -> its server.received ts_ns


@dataclass
class _Joined:
    """One folder's outcome, for the manifest and the gap register."""
    folder: ServerFolder
    index: int  # its place among the --server folders
    clock: str  # its domain as written into the run
    same_domain: bool
    why: str
    url: str
    mappings: list = field(default_factory=list)  # ClockMapping or ClockSyncFailure
    found: _Found = field(default_factory=_Found)
    events: int = 0
    samples: int = 0
    state: str | None = None
    error: str | None = None  # a part that could not be read at the last poll
    flushed_at: float | None = None  # the folder's last periodic flush (manifest flushed.at_unix_s), Unix s
    settled: bool = False  # it flushed after the load, or its server stopped cleanly: nothing of the load is unwritten
    names: dict[str, str] = field(default_factory=dict)  # server attempt id -> the id it is copied under
    parents: dict[str, str] = field(default_factory=dict)  # an upstream try the client never saw -> its client attempt
    replica_id: str | None = None  # its server id where several folders are joined (attrs.replica_id)
    scraper: object = None  # its server's /metrics (OursScraper) during the load, a replica's

    def attrs(self, server_attempt: str | None) -> dict:
        """What its copied events' attrs gain: the replica, and an unseen try's client attempt."""
        extra = {"replica_id": self.replica_id} if self.replica_id is not None else {}
        if server_attempt in self.parents:
            extra["parent_attempt_id"] = self.parents[server_attempt]
        return extra

    def step_id(self, step_id: int | None) -> int | None:
        """Its step ids kept apart from the other folders' engines' (each engine counts its steps from 0)."""
        return step_id if step_id is None or self.replica_id is None else step_id + (self.index + 1) * STEP_STRIDE


class ServerJoin:
    """The --server folders of one capture: their clocks mapped around the load, then their events joined."""

    def __init__(self, folders: list[ServerFolder], *, host: str, client_clock: str, target: str,
                 deployment: bool = False) -> None:
        self.host, self.client_clock = host, client_clock
        self.salt = uuid.uuid4().hex  # this capture's traceparents: no other client's attempt has them
        ours = {client_clock, mono_clock(host)}
        self.joined = []
        for i, f in enumerate(folders):
            same, why = f.same_clock(host)
            clock = f.clock if same or f.clock not in ours else f"{f.clock}@{f.server_id}"
            self.joined.append(_Joined(f, i, clock, same, why, f.clock_url(target, len(folders)),
                                       replica_id=f.server_id if len(folders) > 1 or deployment else None))
        self.target, self.deployment = target, deployment
        self.flushed_after = False  # deployment: every folder flushed after the load (its unfound attempts are not its)
        self.load_end = 0.0  # Unix s: when the load ended (a folder's flushes are compared with it)
        self.waited_s = 0.0
        self.wait_s = SERVER_WAIT_S
        self.answered: set[str] = set()  # this run's attempts the server answered (join fills both)
        self.found: set[str] = set()  # those found in a folder

    @property
    def replicas(self) -> bool:
        """Several folders, or folders beside replicas declared by URL: a deployment behind a router."""
        return len(self.joined) > 1 or self.deployment

    @property
    def model_name(self) -> str | None:
        """The served model's name from the first folder's manifest: the capture asks it of no router."""
        return self.joined[0].folder.manifest.get("served_model_name") if self.joined else None

    def replica_urls(self) -> dict[str, str]:
        """Each folder's own address (from its manifest) -> its replica id (its server id)."""
        return {u: j.folder.server_id for j in self.joined if (u := j.folder.own_url(self.target))}

    def start_scrapes(self, run_dir: Path, writer) -> None:
        """Each replica folder's server's /metrics (where its manifest names its port), scraped once now, before
        the load, then at 2 Hz until `stop_scrapes`."""
        from inferledger.collectors.evidence.metrics_scrape import OursScraper

        for j in self.joined:
            url = j.folder.own_url(self.target)
            if j.replica_id is None or url is None:
                continue
            j.scraper = OursScraper(f"{url}/metrics", run_dir, writer, clock=self.client_clock,
                                    host=self.host).for_replica(j.replica_id)
            j.scraper.start()  # its first scrape before it returns

    def stop_scrapes(self, final_scrape: bool = True) -> None:
        """After the load: each scraper stopped, with one last scrape (the counters' final values)."""
        for j in self.joined:
            if j.scraper is not None:
                j.scraper.stop(final_scrape)

    async def map_clocks(self, label: str, headers: dict | None) -> None:
        """Round trips to each foreign server's /clock (start and end of the load); a failure is kept."""
        for j in self.joined:
            if j.same_domain:
                continue
            try:
                m = await estimate(j.url, self.client_clock, headers=headers, label=label)
            except ClockSyncError as exc:
                j.mappings.append(ClockSyncFailure(label, str(exc)))
                continue
            if m.from_clock != j.folder.clock:
                j.mappings.append(ClockSyncFailure(label, f"{j.url}/clock answers for {m.from_clock!r}, but the "
                                                          f"folder's events are on {j.folder.clock!r}: not its server"))
                continue
            j.mappings.append(ClockMapping(j.clock, m.to_clock, m.offset_ns, m.epsilon_ns,
                                           f"round-trip ({j.folder.server_id}'s /clock)", m.samples, label))

    # -- after the load ------------------------------------------------------------------------
    def join(self, writer, run_dir: Path, wait_s: float, say=print) -> None:
        """Wait (at most `wait_s`) until the folders cover this run's answered attempts, then copy; `say`
        tells once that the capture waits."""
        writer.flush()
        sent, answered = _client_attempts(run_dir)
        want = {trace_ids_for(aid, self.salt)[0]: aid for aid in sent}
        readers = [(_Parts(j.folder.path / "events", EVENT_SCHEMA)) for j in self.joined]
        t0, told, self.load_end = time.monotonic(), False, time.time()
        self.wait_s = wait_s
        while True:
            rows = [self._poll(j, r, want) for j, r in zip(self.joined, readers)]
            found = {c for j in self.joined for c in j.found.ours.values()}
            for j in self.joined:
                j.settled = j.state in ("complete", "interrupted") or (j.flushed_at or 0) >= self.load_end
            settled = all(j.settled for j in self.joined)
            self.flushed_after = self.deployment and settled
            # replicas: a try the router sent one folder may sit unflushed there while another answered the
            # client, so every folder must have flushed after the load; one server: its attempts found
            done = settled if self.replicas else answered <= found
            if (done and not any(j.found.uncovered or j.error for j in self.joined)) or time.monotonic() - t0 >= wait_s:
                break
            if not told:
                told = True
                say(f"waiting up to {wait_s:g} s (--server-wait) for {', '.join(str(j.folder.path) for j in self.joined)}"
                    " to flush the end of this run's attempts")
            time.sleep(POLL_S)
        self.waited_s = round(time.monotonic() - t0, 3)
        self._name_tries()
        for j, events in zip(self.joined, rows):
            self._copy(writer, j, events)
        self.answered, self.found = answered, found

    def _name_tries(self) -> None:
        """Each server attempt's id in the run: a client attempt that reached a server once keeps its id;
        one that reached servers more than once (a router's retries: the same traceparent again, in one
        folder as `id#2` or in another folder) is the latest-arriving try, and each earlier try, which the
        client never saw, is `<client attempt>@<server id>#<n>` (n: its place among the tries by arrival)
        with attrs.parent_attempt_id the client attempt. Arrivals are compared on the client's clock
        (a foreign folder's through its first mapping; without one, as written)."""
        tries = defaultdict(list)
        for j in self.joined:
            offset = 0 if j.same_domain else next((m.offset_ns for m in j.mappings if isinstance(m, ClockMapping)), 0)
            for sid, client in j.found.ours.items():
                tries[client].append((j.found.received.get(sid, 0) + offset, j.index, sid))
        for client, ts in tries.items():
            ts.sort()
            for n, (_, i, sid) in enumerate(ts, 1):
                j = self.joined[i]
                if n == len(ts):
                    j.names[sid] = client
                else:
                    j.names[sid] = f"{client}@{j.folder.server_id}#{n}"
                    j.parents[sid] = client

    def _poll(self, j: _Joined, reader: _Parts, want: dict[str, str]) -> list[dict]:
        try:
            events = reader.rows()
            j.error = None
        except (PartError, OSError) as exc:  # a part renamed away by the server's compaction: read again
            j.error = str(exc)
            return [r for rows in reader.read_parts.values() for r in rows]
        try:
            body = Manifest.read(j.folder.path).body
            j.state, j.flushed_at = body.get("state"), (body.get("flushed") or {}).get("at_unix_s")
        except RunFolderError:  # being replaced: keep the last state seen
            pass
        j.found = _find(events, want)
        return events

    def _copy(self, writer, j: _Joined, events: list[dict]) -> None:
        """This run's attempts' events, and the steps, device and KV samples of the window they span."""
        f, names = j.found, j.names
        ours = [e for evs in f.events.values() for e in evs]
        if not ours:
            return
        clock = Counter(e["clock"] for e in ours).most_common(1)[0][0]
        t0, t1 = min(e["ts_ns"] for e in ours if e["clock"] == clock), max(e["ts_ns"] for e in ours if e["clock"] == clock)
        steps = _steps_in(events, clock, t0, t1)
        clocks = {j.folder.clock: j.clock}
        for e in events:
            aid, name = e["attempt_id"], e["name"]
            if aid is not None:
                if aid not in f.ours:
                    continue  # another client's attempt
                row = {**e, "attempt_id": names[aid]}
            elif name in ("step.start", "step.end"):
                if (e["clock"], e["step_id"]) not in steps:
                    continue
                row = dict(e)
                if name == "step.start":
                    row["attrs"] = _batch_renamed(e["attrs"], names, j.folder.server_id)
            elif e["step_id"] is not None:
                if (clock, e["step_id"]) not in steps:
                    continue  # a device.step of a step outside the window
                row = dict(e)
            elif e["clock"] != clock or not t0 <= e["ts_ns"] <= t1 or e["source"] not in SERVER_SOURCES:
                continue
            else:
                row = dict(e)
            row.update(run_id=writer.run_id, event_id=f"{e['event_id']}@{j.folder.server_id}",
                       clock=clocks.get(e["clock"], e["clock"]), step_id=j.step_id(e["step_id"]),
                       attrs=_with_attrs(row["attrs"], j.attrs(aid)))
            writer.emit(row)
            j.events += 1
        try:
            samples = _Parts(j.folder.path / "samples", SAMPLE_SCHEMA).rows()
        except (PartError, OSError) as exc:
            samples, j.error = [], str(exc)
        for s in samples:
            if s["source"] in COPIED_SAMPLES and s["clock"] == clock and t0 <= s["ts_ns"] <= t1:
                writer.sample(**{k: v for k, v in s.items() if k not in ("run_id", "clock", "device")},
                              clock=clocks.get(clock, clock), device=s["device"] or j.replica_id)
                j.samples += 1
        self._clock_rows(writer, j)

    def _clock_rows(self, writer, j: _Joined) -> None:
        """The server's own domains and mappings but its wall clock (a CUDA clock to its mono), renamed;
        and, for a foreign domain, the round-trip mappings to the client's."""
        declared = {self.client_clock, mono_clock(self.host)}
        path = j.folder.path / "clocks.parquet"
        rows = pq.read_table(path, schema=CLOCK_SCHEMA).to_pylist() if path.exists() else []
        rename = {j.folder.clock: j.clock}
        for c in rows:
            names = [c["clock"]] if c["from_clock"] is None else [c["from_clock"], c["to_clock"]]
            if any(n is None or n.startswith("wall:") for n in names):
                continue
            if c["from_clock"] is None:
                if rename.get(c["clock"], c["clock"]) not in declared:
                    writer.clock_domain(rename.get(c["clock"], c["clock"]), host=c["host"], kind=c["kind"])
            else:
                writer.clock_map(rename.get(c["from_clock"], c["from_clock"]), rename.get(c["to_clock"], c["to_clock"]),
                                 c["offset_ns"], c["epsilon_ns"], c["method"])
        if not j.same_domain:
            if j.clock not in {rename.get(c.get("clock"), c.get("clock")) for c in rows if c["from_clock"] is None}:
                writer.clock_domain(j.clock, host=j.folder.host.get("name"), kind="monotonic")
            for m in j.mappings:
                if isinstance(m, ClockMapping):
                    writer.clock_map(m.from_clock, m.to_clock, m.offset_ns, m.epsilon_ns, m.method)

    # -- what the run says about it ------------------------------------------------------------
    def manifest(self) -> dict:
        """The manifest's `servers`, and the engine's identity (model, engine_config, served name) from
        the first folder that served this run."""
        entries = []
        for j in self.joined:
            f = j.found
            entries.append({
                "server_id": j.folder.server_id, "replica_id": j.replica_id, "url": j.folder.own_url(self.target),
                "path": str(j.folder.path.resolve()),
                "run_id": j.folder.manifest.get("run_id"), "state": j.state,
                "host": {k: j.folder.host.get(k) for k in ("name", "boot_id")},
                "clock": {"events": j.clock, "same_domain": j.same_domain, "why": j.why, "url": j.url,
                          "mappings": [m.__dict__ for m in j.mappings if isinstance(m, ClockMapping)],
                          "failed": [m.__dict__ for m in j.mappings if isinstance(m, ClockSyncFailure)]},
                "attempts": {"joined": len(f.ours), "covered": len(f.ours) - len(f.uncovered),
                             "unseen_tries": len(j.parents), "id_disagrees": len(_id_disagrees(f))},
                "events": j.events, "samples": j.samples,
                **({"metrics": j.scraper.summary()} if j.scraper is not None else {})})
        deployment = {"flushed_after_load": self.flushed_after} if self.deployment else {}
        first = next((j.folder.manifest for j in self.joined if j.found.ours), self.joined[0].folder.manifest)
        engine = {k: first[k] for k in ("model", "engine_config", "served_model_name", "device_clock") if k in first}
        return {"servers": {"folders": entries, "wait_s": self.wait_s, "waited_s": self.waited_s, **deployment,
                            "answered": len(self.answered), "joined": len(self.found & self.answered),
                            "joined_by": "the trace id of the traceparent each attempt was sent with "
                                         "(server.received attrs.trace_id)"}, **engine}

    def gap_rows(self, run_id: str) -> list[dict]:
        gaps = []
        # beside replicas declared by URL, an attempt no folder holds once each flushed after the load is theirs
        missing = [] if self.flushed_after else sorted(self.answered - self.found)
        paths = ", ".join(str(j.folder.path) for j in self.joined)
        for j in self.joined:
            f, sid = j.found, j.folder.server_id
            stale = self.replicas and not j.settled  # a replica's last flush before the load's end: tries unwritten
            if f.uncovered or missing or j.error or stale:
                lacking = len(f.uncovered) + len(missing)
                gaps.append(_gap(run_id, f"collector:server:{sid}", "run", None,
                                 f"server_status and the server's and engine's figures of {lacking} attempt(s)"
                                 + (f"; the tries the router sent {sid} after its last flush (attempts rows of "
                                    f"replica {sid}: replicas.router_sent counts them)" if stale else ""),
                                 f"the folder's flushed parts: `serve --out {j.folder.path}` flushes every "
                                 "--flush-every s and at its stop; a longer `capture --server-wait`, or a server "
                                 "that is not killed",
                                 f"{j.folder.path}: after {self.waited_s:g} s (--server-wait {self.wait_s:g}) "
                                 + ", and ".join(_lacks(j, len(missing), self.load_end if stale else None))
                                 + f" (server state {j.state}" + (f"; {j.error}" if j.error else "")
                                 + "): the server was killed, stopped flushing, or ended them later than the bound"))
            for sid_attempt, lacks in sorted(f.uncovered.items()):
                row = j.names.get(sid_attempt, f.ours[sid_attempt])  # an unseen try is its own row, not the client's
                gaps.append(_gap(run_id, f"collector:server-attempt:{row}", "attempt",
                                 row, "server_status, the server's and engine's figures",
                                 f"its end in {j.folder.path}", f"{j.folder.path}: its flushed parts lack the "
                                 f"attempt's {', '.join(lacks)}"))
            for sid_attempt in _id_disagrees(f):
                gaps.append(_gap(run_id, f"collector:server-id:{sid}:{sid_attempt}", "attempt", f.ours[sid_attempt],
                                 "the join of this attempt to its server attempt (by trace id only)",
                                 "the client's attempt id passed through as x-request-id / x-inferledger-attempt-id",
                                 f"{j.folder.path}: the server attempt {sid_attempt!r} carries the trace id of the "
                                 f"client attempt {f.ours[sid_attempt]!r}, but its own id names another: a proxy "
                                 "rewrote the request id, or the trace id was reused"))
            for m in j.mappings:
                if isinstance(m, ClockSyncFailure):
                    gaps.append(_gap(run_id, f"collector:clock-sync:{sid}:{m.label}", "run", None,
                                     f"every difference between the client's clock and {j.clock} ({j.folder.path})",
                                     "a server whose /clock answers at the start and end of the load", m.reason))
            for g in j.scraper.gap_rows(run_id) if j.scraper is not None else []:
                gaps.append({**g, "gap_id": f"{g['gap_id']}@{j.replica_id}", "subject_id": j.replica_id,
                             "affects": f"replica {j.replica_id}'s {g['affects']}"})
        for aid in missing:
            gaps.append(_gap(run_id, f"collector:server-attempt:{aid}", "attempt", aid,
                             "server_status, the server's and engine's figures",
                             "the server's events of this attempt (its server.received by trace id)",
                             f"answered by the server, but in no --server folder's flushed parts ({paths})"))
        return gaps


def _lacks(j: _Joined, missing: int, stale_since: float | None) -> list[str]:
    """What a folder's gap says it lacks: its attempts' ends, the answered attempts no folder holds, and
    (`stale_since`: the load's end, Unix s) the flush after the load a killed replica never made."""
    f, out = j.found, []
    if f.uncovered or stale_since is None:
        out.append(f"its flushed parts lack the end of {len(f.uncovered)} of the {len(f.ours)} attempt(s) of this "
                   "run it holds")
    if missing:
        out.append(f"{missing} attempt(s) the server answered are in no --server folder")
    if stale_since is not None:
        last = "it never flushed" if j.flushed_at is None else \
            f"its last flush {stale_since - j.flushed_at:.1f} s before the load's end"
        out.append(f"it did not flush after the load ({last}): what it received after its last flush is not in "
                   "the run")
    return out


def _id_disagrees(f: _Found) -> list[str]:
    """Server attempts joined by trace id whose own id (the request id passed through, less a `#n` the
    server added for an id it had seen) is not the client's attempt id: a join the two ids do not agree on."""
    return sorted(sid for sid, client in f.ours.items() if re.sub(r"#\d+$", "", sid) != client)


def _gap(run_id, gap_id, scope, subject, affects, needs, detail) -> dict:
    return {"run_id": run_id, "gap_id": gap_id, "scope": scope, "subject_id": subject, "affects": affects,
            "needs": needs, "detail": detail[:800]}


def _client_attempts(run_dir: Path) -> tuple[set[str], set[str]]:
    """(sent, answered): the attempts this capture sent, and those the server answered (a first byte)."""
    sent, answered = set(), set()
    for p in list_parts(run_dir / "events", EVENT_SCHEMA) if (run_dir / "events").is_dir() else []:
        for r in pq.read_table(p, columns=["name", "attempt_id", "source"]).to_pylist():
            if r["source"] == "client" and r["attempt_id"] is not None:
                if r["name"] == "attempt.sent":
                    sent.add(r["attempt_id"])
                elif r["name"] == "attempt.first_byte":
                    answered.add(r["attempt_id"])
    return sent, answered & sent


def _find(events: list[dict], want: dict[str, str]) -> _Found:
    """This run's attempts among a folder's events (by trace id), their events, and whose end is not on disk."""
    f = _Found()
    for e in events:
        if e["name"] in ("server.received", "server.rejected") and e["attempt_id"] and '"trace_id"' in (e["attrs"] or ""):
            client = want.get(json.loads(e["attrs"]).get("trace_id"))
            if client is not None:
                f.ours.setdefault(e["attempt_id"], client)
                f.received.setdefault(e["attempt_id"], e["ts_ns"])
    by = defaultdict(list)
    step_ends = set()
    for e in events:
        if e["attempt_id"] in f.ours:
            by[e["attempt_id"]].append(e)
        elif e["name"] == "step.end":
            step_ends.add((e["clock"], e["step_id"]))
    for sid in f.ours:
        evs = by.get(sid, [])
        names = {e["name"] for e in evs}
        lacks = [] if names & set(SERVER_ENDS) else ["server.done"]
        if "engine.enqueued" in names:
            lacks += [n for n in ENGINE_ENDS if n not in names]
            last = max(((e["clock"], e["step_id"]) for e in evs if e["step_id"] is not None), default=None,
                        key=lambda cs: cs[1])
            if last is not None and last not in step_ends:
                lacks.append(f"step.end of step {last[1]}")
        if lacks:
            f.uncovered[sid] = lacks
    f.events = dict(by)
    return f


def _steps_in(events: list[dict], clock: str, t0: int, t1: int) -> set[tuple[str, int]]:
    """The engine steps on `clock` that overlap [t0, t1] (both ends on disk)."""
    start, end = {}, {}
    for e in events:
        if e["clock"] == clock and e["step_id"] is not None:
            if e["name"] == "step.start":
                start[e["step_id"]] = e["ts_ns"]
            elif e["name"] == "step.end":
                end[e["step_id"]] = e["ts_ns"]
    return {(clock, s) for s, ts in start.items() if s in end and ts <= t1 and end[s] >= t0}


def _with_attrs(attrs: str | None, extra: dict) -> str | None:
    """attrs (a JSON object, or None) with `extra`'s keys set."""
    if not extra:
        return attrs
    return json.dumps({**(json.loads(attrs) if attrs else {}), **extra}, separators=(",", ":"), sort_keys=True)


def _batch_renamed(attrs: str | None, ours: dict[str, str], server_id: str) -> str | None:
    """step.start's batch with this run's attempts under the client's ids and another client's apart
    (`<id>@<server id>`), so a step shared with other clients is never charged to an attempt of ours."""
    if not attrs or '"batch"' not in attrs:
        return attrs
    a = json.loads(attrs)
    a["batch"] = [[ours.get(item[0], f"{item[0]}@{server_id}"), *item[1:]] for item in a.get("batch") or []]
    return json.dumps(a, separators=(",", ":"), sort_keys=True)
