"""The values one capture's steps hand each other (collectors/capture/run.py).

`Prepared`: what exists before anything is recorded (the model, the prompts, the device's
measurements, the prediction to register). `Live`: the run's recording parts while the load runs.
`Driven`: what the load produced. `finish_run` (manifest.py) reads all three.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferledger.collectors.capture.deployment import Replicas
    from inferledger.collectors.capture.router_tries import RouterTries
    from inferledger.collectors.capture.servers import ServerJoin
    from inferledger.collectors.evidence.engine_evidence import EngineEvidence
    from inferledger.collectors.evidence.router_metrics import RouterScraper
    from inferledger.collectors.load.loadgen import LoadResult
    from inferledger.collectors.rundir.writer import RunWriter
    from inferledger.collectors.workload import Workload
    from inferledger.probes.probe import WallMapping
    from inferledger.probes.host import HostSampler
    from inferledger.probes.sampler import EnergySampler
    from inferledger.serve.lifecycle import Serving


@dataclass
class Prepared:
    wl: "Workload"
    bundle: object | None  # the embedded engine's loaded model (None for a URL target)
    tokenizer: object | None  # what the prompts were counted with (None: the workload needs none)
    plans: list  # the workload's task plans
    calibration: dict | None  # how `[arrivals] calibrate_tok_s` changed the workload
    device_params: dict  # the manifest's `device_params`, measured or skipped
    prediction: bytes | None  # the prediction to register (a given file, else the capture's own)
    prediction_source: str  # where it came from, or why there is none
    warmups: dict = field(default_factory=lambda: {"n": 0})  # the warm-ups sent before the run opened
    servers: list = field(default_factory=list)  # the --server folders, checked (servers.py ServerFolder)


@dataclass
class Live:
    out: Path
    writer: "RunWriter"
    host: str
    engine_clock: str
    client_clock: str
    wall: "WallMapping"  # mono -> Unix time, for exports in wall time (OTLP); checked again at the end
    sampler: "EnergySampler"
    host_sampler: "HostSampler"  # the host's pressure, CPU time and load (probes/host.py)
    server: "Serving | None" = None  # the embedded target
    evidence: "EngineEvidence | None" = None  # a URL target's own spans and scrapes
    servers: "ServerJoin | None" = None  # a URL target's `serve --out` folders (capture --server)
    router: "RouterScraper | None" = None  # a router target's counters, before and after the load (--router-metrics)
    router_tries: "RouterTries | None" = None  # a router target's own spans of its tries (--router-traces)
    replicas: "Replicas | None" = None  # a router target's replicas declared by URL (--replica), their own evidence
    url: str | None = None  # what the load client talks to


@dataclass
class Driven:
    result: "LoadResult"
    lags: list  # (ts_ns, ms): how late the client's event loop woke
    mappings: list  # the clock mappings (or failures) estimated by round trips to /clock
