"""Scraping an engine's Prometheus `/metrics` during a capture: vLLM's own gauges and counters.

A thread GETs the endpoint at `hz` (1-2 Hz is enough for queue depth and KV usage), stamps each
scrape with the client's monotonic clock before and after (the scrape's own timestamps; a value is
placed at the midpoint, the half-width says how well), and keeps the `vllm:*` series that are not
histogram buckets: every scrape as one JSON line in `<run>/scrapes/metrics.jsonl` (the raw record)
and as samples (metric = series name, labels summed over) that the ledger turns into gauge series
and counter deltas. Values are the engine's report about itself: samples of source `vllm-metrics`
are evidence of strength "reported". A failed scrape is counted, never filled in.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

SOURCE = "vllm-metrics"
PREFIX = "vllm:"
UNITS = {"_seconds_sum": "s", "_seconds_count": "count", "_perc": "ratio", "_tokens_total": "tokens",
         "_total": "count", "_count": "count", "_sum": "sum"}


def parse_prometheus(text: str, prefix: str = PREFIX) -> tuple[dict[str, float], dict[str, str]]:
    """({series name: value summed over label sets}, {family name: TYPE}) of the families under `prefix`;
    histogram buckets and non-numeric values are left out."""
    values: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4 and parts[2].startswith(prefix):
                types[parts[2]] = parts[3]
            continue
        if not line.startswith(prefix):
            continue
        if "{" in line.split(" ", 1)[0]:
            name, value_text = line[:line.index("{")], line[line.rindex("}") + 1:].split()
        else:
            name, *value_text = line.split()
        if not value_text or name.endswith("_bucket") or name.endswith("_created"):
            continue
        try:
            value = float(value_text[0])
        except ValueError:
            continue
        values[name] = values.get(name, 0.0) + value
    return values, types


def unit_of(name: str, types: dict[str, str]) -> str:
    for suffix, unit in UNITS.items():
        if name.endswith(suffix):
            return unit
    return "requests" if name.startswith(PREFIX + "num_requests") else types.get(name, "value")


class MetricsScraper:
    """start() / stop(); `sink` is a RunWriter (samples) and the raw lines go under the run folder."""

    def __init__(self, url: str, run_dir: str | Path, sink, *, clock: str, host: str, hz: float = 2.0,
                 now_ns=time.monotonic_ns, timeout_s: float = 2.0) -> None:
        if not 0.1 <= hz <= 10:
            raise ValueError(f"scrape rate {hz} Hz: expected 0.1 to 10")
        self.url, self.sink, self.clock, self.host, self.period_s = url, sink, clock, host, 1.0 / hz
        self.now_ns, self.timeout_s = now_ns, timeout_s
        folder = Path(run_dir) / "scrapes"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "metrics.jsonl"
        self.scrapes = 0
        self.failures = 0
        self.last_error: str | None = None
        self.types: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape_once(self) -> bool:
        t0 = self.now_ns()
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
                text = resp.read().decode("utf-8", "replace")
        except OSError as exc:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:200]
            return False
        t1 = self.now_ns()
        values, types = parse_prometheus(text)
        self.types.update(types)
        mid = (t0 + t1) // 2
        with self.path.open("a") as f:
            f.write(json.dumps({"clock": self.clock, "t0_ns": t0, "t1_ns": t1, "values": values},
                               separators=(",", ":"), sort_keys=True) + "\n")
        for name, value in values.items():
            self.sink.sample(ts_ns=mid, clock=self.clock, source=SOURCE, host=self.host, metric=name,
                             value=value, unit=unit_of(name, self.types))
        self.scrapes += 1
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.scrape_once()
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))

    def start(self) -> "MetricsScraper":
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)
        self.scrape_once()  # a last scrape after the load: the counters' final values

    def summary(self) -> dict:
        return {"url": self.url, "scrapes": self.scrapes, "failures": self.failures, "last_error": self.last_error,
                "period_s": self.period_s, "file": "scrapes/metrics.jsonl", "types": self.types,
                "evidence": "reported"}
