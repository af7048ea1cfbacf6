"""A URL target's own evidence during a capture: its OTLP spans and its `/metrics`, joined afterwards.

`capture --otlp-port P` starts the loopback OTLP receiver (the engine exports to
http://127.0.0.1:P/v1/traces) and sends a `traceparent` with every attempt; `--scrape-metrics`
scrapes `<target>/metrics` at 2 Hz. After the load, `finish()` waits (bounded) for the spans of the
attempts the engine should have finished (vLLM exports in batches every ~5 s), stops both, maps
the spans to reported server / engine events on the engine host's `wall:<host>` clock (the client's
monotonic clock is mapped to it by capture's WallMapping, same host; `engine_host` names another
host, whose wall clock then needs a declared mapping) and returns the gap rows and the manifest part.
"""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pyarrow.dataset as ds

from inferledger.collectors.metrics_scrape import MetricsScraper
from inferledger.collectors.otlp_receiver import OTLPReceiver
from inferledger.collectors.vllm_spans import REQUEST_SPAN, map_spans, read_otlp_file

SPAN_WAIT_S = 30.0  # longest wait after the load for the engine's last span export


def engine_reporter(base_url: str) -> tuple[str, str | None]:
    """("vllm-<version>", raw version) from the target's GET /version; ("unknown", None) without one."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/version", timeout=5) as resp:
            version = json.loads(resp.read()).get("version")
    except (OSError, ValueError, AttributeError):
        return "unknown", None
    if not isinstance(version, str) or not version:
        return "unknown", None
    return f"vllm-{version.split('+')[0]}", version


class EngineEvidence:
    def __init__(self, run_dir: Path, writer, *, host: str, client_clock: str, target_url: str,
                 otlp_port: int | None, scrape_metrics: bool, engine_host: str | None = None,
                 span_wait_s: float = SPAN_WAIT_S) -> None:
        self.run_dir, self.writer, self.host, self.engine_host = Path(run_dir), writer, host, engine_host or host
        self.span_wait_s = span_wait_s
        self.reporter, self.version = engine_reporter(target_url)
        self.receiver = OTLPReceiver(run_dir, otlp_port).start() if otlp_port is not None else None
        self.scraper = (MetricsScraper(f"{target_url.rstrip('/')}/metrics", run_dir, writer, clock=client_clock,
                                       host=host).start() if scrape_metrics else None)

    @property
    def trace_salt(self) -> str | None:
        return self.writer.run_id if self.receiver is not None else None

    def _request_spans(self) -> int:
        path = self.receiver.path
        if not path.exists():
            return 0
        return path.read_text().count(f'"name":"{REQUEST_SPAN}"')

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
            deadline = time.monotonic() + self.span_wait_s
            while self._request_spans() < expected_spans and time.monotonic() < deadline:
                time.sleep(0.5)
        if self.scraper is not None:
            self.scraper.stop()
            manifest["metrics"] = self.scraper.summary()
            if self.scraper.scrapes == 0:
                gaps.append({"run_id": self.writer.run_id, "gap_id": "collector:metrics", "scope": "run",
                             "subject_id": None, "affects": "reported gauges and counter deltas",
                             "needs": "a reachable <target>/metrics", "detail": self.scraper.last_error})
        if self.receiver is not None:
            self.receiver.stop()
            manifest["otlp"] = self.receiver.summary()
            spans = read_otlp_file(self.receiver.path) if self.receiver.path.exists() else []
            join = map_spans(spans, run_id=self.writer.run_id, host=self.engine_host, reporter=self.reporter,
                             attempts=self._sent_attempts(), trace_salt=self.trace_salt)
            for row in join.rows:
                self.writer.emit(row)
            gaps.extend(join.gaps)
            manifest["spans"] = {**join.summary(), "expected_request_spans": expected_spans,
                                 "clock": f"wall:{self.engine_host}", "evidence": "reported"}
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

    def abort(self) -> None:
        """Stop both without mapping (an interrupted capture keeps the raw files)."""
        if self.scraper is not None:
            self.scraper.stop()
        if self.receiver is not None:
            self.receiver.stop()
