"""What one capture is asked to do, as one value (`CaptureOptions`).

`inferledger capture` builds it once from its flags (and `demo`, the studies, the benchmarks and the
tests build their own); `run.capture` hands it to each of its steps, so an option travels as a field
of this value, never as a loose keyword. The defaults are the command's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from inferledger.collectors.capture import SERVER_WAIT_S
from inferledger.collectors.evidence.engine_evidence import EvidenceOptions
from inferledger.costmodel.fit import StepFit
from inferledger.engine.params import EngineConfig
from inferledger.serve import DRAIN_TIMEOUT_S




@dataclass(frozen=True)
class CaptureOptions:
    target: str = "embedded"  # "embedded" (serve the engine in this process on loopback) or a base URL
    separate_clocks: bool = False  # the client on a clock of its own, mapped by round trips to /clock
    # the embedded engine
    max_num_seqs: int = EngineConfig.max_num_seqs  # the engine's own default, as `serve` and `predict`
    model: str | Path | None = None  # a GGUF file or HF folder (None: $INFERLEDGER_MODEL, else the bundled one)
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    engine_config: dict = field(default_factory=dict)  # further EngineConfig fields
    drain_timeout_s: float = DRAIN_TIMEOUT_S  # after the load: what requests in flight get to finish
    microbenchmarks: bool = True  # measure the device before the load (manifest `device_params`)
    warmups: int = 0  # requests sent before the run is opened: no attempts, no events (collectors/capture/warmup.py)
    # a URL target
    served_model: str | None = None  # the model name to request (None: the first of its /v1/models)
    api_key: str | None = None
    evidence: EvidenceOptions = EvidenceOptions()  # its own OTLP spans and /metrics
    servers: tuple[str | Path, ...] = ()  # its `serve --out` folders, joined after the load (servers.py)
    server_wait_s: float = SERVER_WAIT_S  # how long after the load the folders get to flush this run's attempts
    router_metrics: str | None = None  # a router target's Prometheus /metrics, scraped before and after the load
    router_traces: str | Path | None = None  # the router's spans (its receiver's OTLP/JSON file), joined after the load
    replicas: tuple = ()  # a router target's replicas that are no `serve --out` folder (deployment.py ReplicaSpec)
    # the run
    prediction: str | Path | None = None  # a file from `inferledger predict` (None: the capture's own)
    prediction_fit: StepFit | None = None  # an earlier run's step fit: the capture's own prediction's fit ranges
    run_id: str | None = None  # None: the folder's name
    buckets: int | None = None  # a clean run's events end partitioned into this many task buckets
    # the interpreter's thread switch interval during the run, so the client's loop is not held for
    # 5 ms by the server's or engine's threads (None leaves it alone)
    switch_interval_s: float | None = 0.0005

    @property
    def embedded(self) -> bool:
        return self.target == "embedded"

    @property
    def engine_settings(self) -> dict:
        """The embedded engine's EngineConfig fields: the batch limit and whatever `engine_config` adds."""
        return {"max_num_seqs": self.max_num_seqs, **self.engine_config}

    def target_entry(self) -> dict:
        """The manifest's `target`."""
        return {"kind": "embedded" if self.embedded else "url", "url": self.target}
