"""A URL target's own evidence during a capture: its OTLP spans and its `/metrics`, joined afterwards
(llama.cpp's per-response timings need neither: the load client keeps them on `attempt.done`).

`capture --otlp-port P` starts the loopback OTLP receiver (the engine exports to
http://127.0.0.1:P/v1/traces) and sends a `traceparent` with every attempt; `--scrape-metrics`
scrapes `<target>/metrics` at 2 Hz. After the load, `finish()` waits (bounded) for the spans of the
attempts the engine should have finished (vLLM exports in batches every ~5 s; a refused span has
arrived too, so it ends the wait as well), stops both, maps the spans to reported server / engine
events on the engine host's `wall:<host>` clock (the client's monotonic clock is mapped to it by
capture's WallMapping, same host; `engine_host` names another host, whose wall clock then needs a
declared mapping) and returns the gap rows and the manifest part. Each source is isolated per item:
a refused span, request, scrape line or scrape is one gap row, kept raw in `otlp/refused.jsonl` or
`scrapes/refused.jsonl`, and every read of the target (`/version`, `/metrics`) has a total deadline.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.dataset as ds

from inferledger.collectors.evidence.bounded_get import GetFailed, bounded_get
from inferledger.collectors.evidence.metrics_scrape import scraper_for
from inferledger.collectors.evidence.otlp_file import read_otlp_file, refused_gaps
from inferledger.collectors.evidence.otlp_receiver import OTLPReceiver
from inferledger.collectors.evidence.vllm_spans import map_spans

SPAN_WAIT_S = 30.0  # longest wait after the load for the engine's last span export


@dataclass(frozen=True)
class EvidenceOptions:
    """What a capture asks of a URL target's own evidence (`capture --otlp-port --scrape-metrics
    --engine-host --engine-clock-epsilon-ms`)."""
    otlp_port: int | None = None  # receive its OTLP spans on http://127.0.0.1:PORT/v1/traces
    scrape_metrics: bool = False  # scrape <target>/metrics at 2 Hz
    engine_host: str | None = None  # the engine's host when not this one (its spans on wall:<host>)
    engine_clock_epsilon_ms: float = 5.0  # the declared bound of that host's wall clock against this one's

    @property
    def wanted(self) -> bool:
        return self.otlp_port is not None or self.scrape_metrics


def _get_field(url: str, name: str) -> str | None:
    """A non-empty string field of the JSON object at `url`; None when anything else answers."""
    try:
        status, body = bounded_get(url, deadline_s=5.0, max_bytes=1 << 20)
        value = json.loads(body).get(name) if status == 200 else None
    except (GetFailed, ValueError, AttributeError, RecursionError):
        return None
    return value if isinstance(value, str) and value else None


def engine_reporter(base_url: str) -> tuple[str, str | None]:
    """("vllm-<version>", raw version) from the target's GET /version; else ("llamacpp-<build>", build)
    from llama.cpp's GET /props `build_info` (the build its responses name as `system_fingerprint`);
    ("unknown", None) without either."""
    base = base_url.rstrip("/")
    version = _get_field(f"{base}/version", "version")
    if version is not None:
        return f"vllm-{version.split('+')[0]}", version
    build = _get_field(f"{base}/props", "build_info")
    return (f"llamacpp-{build}", build) if build is not None else ("unknown", None)


def with_replica(rows: list[dict], replica_id: str | None) -> list[dict]:
    """Event rows with `attrs.replica_id` set (a deployment's one vLLM replica's spans); as they are for None."""
    if replica_id is None:
        return rows
    return [{**r, "attrs": json.dumps({**json.loads(r["attrs"] or "{}"), "replica_id": replica_id},
                                      separators=(",", ":"), sort_keys=True)} for r in rows]


class EngineEvidence:
    replica_id: str | None = None  # a deployment's one vLLM replica whose spans these are (attrs.replica_id)

    def __init__(self, writer, options: EvidenceOptions, *, host: str, client_clock: str, target_url: str) -> None:
        self.run_dir, self.writer, self.host = writer.run_dir, writer, host
        self.engine_host = options.engine_host or host
        self.mapped_spans = 0
        self.reporter, self.version = engine_reporter(target_url)
        self.receiver = OTLPReceiver(self.run_dir, options.otlp_port).start() if options.otlp_port is not None else None
        scraper = scraper_for(self.reporter)  # vLLM's vllm:* or llama.cpp's llamacpp:* series
        self.scraper = (scraper(f"{target_url.rstrip('/')}/metrics", self.run_dir, writer, clock=client_clock,
                                host=host).start() if options.scrape_metrics else None)

    @property
    def trace_salt(self) -> str | None:
        return self.writer.run_id if self.receiver is not None else None

    def _sent_attempts(self) -> dict[str, dict]:
        self.writer.flush()
        folder = self.run_dir / "events"
        if not folder.exists():
            return {}
        table = ds.dataset(str(folder), format="parquet").to_table(
            columns=["name", "attempt_id", "task_id", "request_id", "session_id"], filter=ds.field("name") == "attempt.sent")
        return {r["attempt_id"]: {"task_id": r["task_id"], "request_id": r["request_id"], "session_id": r["session_id"]}
                for r in table.to_pylist() if r["attempt_id"]}

    def finish(self, expected_spans: int) -> tuple[list[dict], dict]:
        """Gap rows and the manifest's `engine_evidence`; the mapped events go to the writer."""
        manifest: dict = {"reporter": self.reporter, "version": self.version}
        gaps: list[dict] = []
        if self.receiver is not None:
            deadline = time.monotonic() + SPAN_WAIT_S
            while self.receiver.request_spans_seen < expected_spans and time.monotonic() < deadline:
                time.sleep(0.5)
        if self.scraper is not None:
            self.scraper.stop()
            manifest["metrics"] = self.scraper.summary()
            gaps.extend(self.scraper.gap_rows(self.writer.run_id))
        if self.receiver is not None:
            self.receiver.stop()
            spans, late = read_otlp_file(self.receiver.path) if self.receiver.path.exists() else ([], [])
            if late:  # the receiver checked every span it kept; a line it wrote that reads back refused is kept too
                self.receiver.add_refused([{**r.record(), "from": "otlp/traces.jsonl"} for r in late])
            manifest["otlp"] = self.receiver.summary()
            join = map_spans(spans, run_id=self.writer.run_id, host=self.engine_host, reporter=self.reporter,
                             attempts=self._sent_attempts(), trace_salt=self.trace_salt)
            for row in with_replica(join.rows, self.replica_id):
                self.writer.emit(row)
            self.mapped_spans = join.spans
            gaps.extend(join.gaps + refused_gaps(self.writer.run_id, self.receiver.refused, "otlp/refused.jsonl"))
            manifest["spans"] = {**join.summary(), "refused": len(self.receiver.refused),
                                 "expected_request_spans": expected_spans, "clock": f"wall:{self.engine_host}",
                                 "evidence": "reported"}
        return gaps, manifest

    def write_clock(self, wall, client_clock: str, epsilon_ms: float) -> None:
        """Same host: capture's WallMapping already maps the client's clock to wall:<host>. Another host:
        the client's clock maps to that host's wall clock through ours, within a declared epsilon
        (NTP-synchronised hosts), the method saying so."""
        if self.engine_host == self.host:
            return
        to = f"wall:{self.engine_host}"
        self.writer.clock_domain(to, host=self.engine_host, kind="wall")
        self.writer.clock_map(client_clock, to, wall.offset_ns, wall.epsilon_ns + int(epsilon_ms * 1e6),
                              f"declared: this host's wall clock, the engine host's within {epsilon_ms} ms")

    def evidence_kinds(self) -> dict:
        """The manifest's `evidence` entries once finished: the target's own spans and scrapes are reported."""
        out = {}
        if self.mapped_spans:
            out["events"] = (f"observed (client, checker, tool); reported (server and engine events, from "
                             f"{self.reporter}'s spans)")
        if self.scraper is not None and self.scraper.scrapes:
            out["metrics"] = f"reported ({self.reporter}'s /metrics)"
        return out

    def abort(self) -> None:
        """Stop both without mapping (an interrupted capture keeps the raw files); no last scrape."""
        if self.scraper is not None:
            self.scraper.stop(final_scrape=False)
        if self.receiver is not None:
            self.receiver.stop()
