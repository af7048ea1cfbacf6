"""Scraping an engine's Prometheus `/metrics` during a capture: vLLM's or llama.cpp's own gauges and counters.

A thread GETs the endpoint at `hz` (1-2 Hz is enough for queue depth and KV usage), stamps each
scrape with the client's monotonic clock before and after (the scrape's own timestamps; a value is
placed at the midpoint, the half-width says how well), and keeps the engine's series (`vllm:*`, or
`llamacpp:*` for `LlamaCppScraper`) that are not histogram buckets: every scrape as one JSON line in
`<run>/scrapes/metrics.jsonl` and as samples (metric = series name, labels summed over) that the
ledger turns into gauge series and counter deltas. Values are the engine's report about itself:
samples of source `vllm-metrics` / `llamacpp-metrics` are evidence of strength "reported".

Each scrape has a total deadline of at most one period (collectors.evidence.bounded_get), so a slow endpoint
costs that scrape, never the capture. Parsing follows the text exposition format (Prometheus 0.0.4
and OpenMetrics: `# TYPE`, `# HELP`, `# EOF`, escapes in label values, timestamps, exemplars), one
sample line at a time through prometheus-client's parser, so a malformed line is refused alone and
the rest of the scrape is kept. A sample's own timestamp is not used (the scrape's times are). What
is refused (a line, a failed scrape, a series whose value is NaN or infinite, left out of that
scrape) is one record of `<run>/scrapes/refused.jsonl`; `refused_gaps` makes the gap rows.
"""
from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from inferledger.collectors.evidence.bounded_get import GetFailed, bounded_get

SOURCE = "vllm-metrics"
PREFIX = "vllm:"
LLAMACPP_SOURCE, LLAMACPP_PREFIX = "llamacpp-metrics", "llamacpp:"
UNITS = {"_seconds_sum": "s", "_seconds_count": "count", "_perc": "ratio", "_tokens_total": "tokens",
         "_total": "count", "_count": "count", "_sum": "sum"}
MAX_SCRAPE_BYTES = 16 * 2**20
ACCEPT = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5"


@dataclass
class Scrape:
    values: dict[str, float] = field(default_factory=dict)  # series name -> value summed over label sets
    types: dict[str, str] = field(default_factory=dict)  # family name -> TYPE
    refused: list[tuple[int, str, str]] = field(default_factory=list)  # (line number, line, reason)
    not_finite: list[str] = field(default_factory=list)  # series left out: a label set was NaN or infinite


def _sample(line: str) -> tuple[str, dict, float]:
    (family,) = text_string_to_metric_families(line)
    (sample,) = family.samples
    return sample.name, sample.labels, float(sample.value)


def series_key(name: str, labels: dict) -> str:
    """`name{a="x",b="y"}` (labels sorted, values as JSON strings), or `name` without labels."""
    if not labels:
        return name
    return name + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())) + "}"


def parse_prometheus(body: bytes | str, prefix: str = PREFIX, keep_labels: bool = False) -> Scrape:
    """The families under `prefix` of one exposition; histogram buckets and `_created` are left out.
    Label sets are summed per series name, or each kept apart (`keep_labels`: keyed by `series_key`)."""
    lines = body.split(b"\n") if isinstance(body, bytes) else body.split("\n")
    out, unknown, ended = Scrape(), set(), False
    for n, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as exc:
            out.refused.append((n, raw.decode("utf-8", "backslashreplace"), f"not UTF-8 ({exc.reason})"))
            continue
        line = line.rstrip("\r")
        if not line.strip():
            continue
        if ended:
            out.refused.append((n, line, "after # EOF"))
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            ended = parts == ["#", "EOF"]
            if len(parts) >= 3 and parts[1] == "TYPE" and parts[2].startswith(prefix):
                if len(parts) < 4:
                    out.refused.append((n, line, "# TYPE without a type"))
                else:
                    out.types[parts[2]] = parts[3].strip()
            continue
        if not line.startswith(prefix):
            continue
        try:
            name, labels, value = _sample(line)
        except Exception as exc:  # the parser's ValueError, or any shape it did not expect
            out.refused.append((n, line, f"not a sample line ({type(exc).__name__}: {str(exc)[:120]})"))
            continue
        if name.endswith(("_bucket", "_created")):
            continue
        if keep_labels:
            name = series_key(name, labels)
        if not math.isfinite(value):
            unknown.add(name)
        out.values[name] = out.values.get(name, 0.0) + value
    for name in sorted(unknown):
        del out.values[name]
        out.not_finite.append(name)
    return out


def unit_of(name: str, types: dict[str, str]) -> str:
    for suffix, unit in UNITS.items():
        if name.endswith(suffix):
            return unit
    requests = name.startswith(PREFIX + "num_requests") or name.startswith(LLAMACPP_PREFIX + "requests_")
    return "requests" if requests else types.get(name, "value")


def refused_gaps(run_id: str, records: list[dict], scrapes: int, kept_in: str = "scrapes/refused.jsonl") -> list[dict]:
    """Gap rows (`metrics:*`) for the refused records: one per distinct malformed line, one per series that
    was not finite, one for the failed scrapes (`scrapes`: how many succeeded)."""
    lines = Counter(r["text"] for r in records if r["kind"] == "line")
    series = Counter(r["series"] for r in records if r["kind"] == "not-finite")
    failed = [r for r in records if r["kind"] == "scrape"]
    gaps = [{"run_id": run_id, "gap_id": f"metrics:line:{hashlib.sha256(text.encode()).hexdigest()[:12]}",
             "scope": "run", "subject_id": None, "affects": "the series of that line in those scrapes",
             "needs": "sample lines that follow the Prometheus text exposition format",
             "detail": f"{text[:200]!r} refused in {n} scrape(s): "
                       f"{next(r['reason'] for r in records if r['kind'] == 'line' and r['text'] == text)} "
                       f"(each kept in {kept_in})"} for text, n in lines.items()]
    gaps += [{"run_id": run_id, "gap_id": f"metrics:not-finite:{name}", "scope": "run", "subject_id": None,
              "affects": f"{name} in those scrapes (left out, not a number)", "needs": "a finite value",
              "detail": f"{name} was NaN or infinite in {n} scrape(s)"} for name, n in series.items()]
    if failed and scrapes:  # with none at all, the scraper's `collector:metrics` row says so
        gaps.append({"run_id": run_id, "gap_id": "metrics:failed-scrapes", "scope": "run", "subject_id": None,
                     "affects": "reported gauges and counters between the scrapes that succeeded",
                     "needs": "a /metrics that answers within the scrape period",
                     "detail": f"{len(failed)} scrape(s) failed, {scrapes} succeeded; last: {failed[-1]['error']} "
                               f"(each kept in {kept_in})"})
    return gaps


class MetricsScraper:
    """start() / stop(); `sink` is a RunWriter (samples) and the raw lines go under the run folder. A
    subclass scrapes another exporter by its class attributes (collectors/evidence/router_metrics.py)."""
    # the engine's series kept, the samples' source, whether label sets stay apart, the raw file's stem
    source, prefix, keep_labels, file_stem = SOURCE, PREFIX, False, "metrics"
    device: str | None = None  # the replica of a deployment whose /metrics these are (`for_replica`)

    def __init__(self, url: str, run_dir: str | Path, sink, *, clock: str, host: str, hz: float = 2.0,
                 now_ns=time.monotonic_ns, timeout_s: float = 2.0) -> None:
        if not 0.1 <= hz <= 10:
            raise ValueError(f"scrape rate {hz} Hz: expected 0.1 to 10")
        self.url, self.sink, self.clock, self.host, self.period_s = url, sink, clock, host, 1.0 / hz
        self.now_ns, self.deadline_s = now_ns, min(timeout_s, self.period_s)  # a scrape never outlasts its period
        folder = Path(run_dir) / "scrapes"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{self.file_stem}.jsonl"
        self.refused_path = folder / ("refused.jsonl" if self.file_stem == "metrics" else f"{self.file_stem}-refused.jsonl")
        self.scrapes = self.failures = 0
        self.last_error: str | None = None
        self.types: dict[str, str] = {}
        self.refused: list[dict] = []
        self._lock = threading.Lock()  # the thread's scrapes and the last one after stop()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape_once(self) -> bool:
        """One scrape; never raises: a failure is counted and kept, never filled in."""
        with self._lock:
            t0 = self.now_ns()
            try:
                status, body = bounded_get(self.url, deadline_s=self.deadline_s, max_bytes=MAX_SCRAPE_BYTES,
                                           headers={"accept": ACCEPT})
                if status != 200:
                    raise GetFailed(f"HTTP {status}")
            except GetFailed as exc:
                return self._failed(t0, str(exc))
            try:
                return self._keep(t0, self.now_ns(), parse_prometheus(body, self.prefix, self.keep_labels))
            except Exception as exc:  # a disk error writing the record: the next scrape tries again
                return self._failed(t0, f"{type(exc).__name__}: {exc}"[:200])

    def _keep(self, t0: int, t1: int, scrape: Scrape) -> bool:
        self.types.update(scrape.types)
        mid = (t0 + t1) // 2
        line = {"clock": self.clock, "t0_ns": t0, "t1_ns": t1, "values": scrape.values}
        with self.path.open("a") as f:
            f.write(json.dumps(line, separators=(",", ":"), sort_keys=True) + "\n")
        self.scrapes += 1
        self._record([{"kind": "line", "scrape": self.scrapes, "t0_ns": t0, "line": n, "text": text, "reason": why}
                      for n, text, why in scrape.refused] +
                     [{"kind": "not-finite", "scrape": self.scrapes, "t0_ns": t0, "series": name}
                      for name in scrape.not_finite])
        self._samples(mid, scrape)
        return True

    def for_replica(self, replica_id: str) -> "MetricsScraper":
        """One replica's of a deployment: its samples' `device` is the replica, its raw lines go to
        `scrapes/metrics-<replica>.jsonl` (and `-refused.jsonl`), apart from the other replicas'."""
        stem = "metrics-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in replica_id)
        self.device, self.path = replica_id, self.path.with_name(f"{stem}.jsonl")
        self.refused_path = self.path.with_name(f"{stem}-refused.jsonl")
        return self

    def _samples(self, ts_ns: int, scrape: Scrape) -> None:
        for name, value in scrape.values.items():
            self.sink.sample(ts_ns=ts_ns, clock=self.clock, source=self.source, host=self.host, metric=name,
                             value=value, unit=unit_of(name, self.types), device=self.device)

    def _failed(self, t0: int, error: str) -> bool:
        self.failures += 1
        self.last_error = error
        try:
            self._record([{"kind": "scrape", "t0_ns": t0, "t1_ns": self.now_ns(), "error": error}])
        except OSError:  # the count and last_error still say so
            pass
        return False

    def _record(self, records: list[dict]) -> None:
        if records:
            with self.refused_path.open("a") as f:
                f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
            self.refused.extend(records)

    def _loop(self) -> None:
        started = time.monotonic()  # start()'s own scrape was the first
        while not self._stop.wait(max(0.0, self.period_s - (time.monotonic() - started))):
            started = time.monotonic()
            self.scrape_once()

    def start(self) -> "MetricsScraper":
        """One scrape now, in the caller's thread, then one every `period_s` on a thread of its own: the
        counters' first values are read before whatever the caller does next (the load), so a counter's
        delta over the run misses none of it (a first scrape left to the thread could land after the first
        requests)."""
        self.scrape_once()
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_scrape: bool = True) -> None:
        """Stop the thread (each scrape ends within its deadline) and, by default, scrape once more after
        the load: the counters' final values."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.deadline_s + self.period_s + 1)
        if final_scrape:
            self.scrape_once()

    def gap_rows(self, run_id: str) -> list[dict]:
        gaps = refused_gaps(run_id, self.refused, self.scrapes, f"scrapes/{self.refused_path.name}")
        if self.scrapes == 0:
            gaps.append({"run_id": run_id, "gap_id": "collector:metrics", "scope": "run", "subject_id": None,
                         "affects": "reported gauges and counter deltas", "needs": "a reachable <target>/metrics",
                         "detail": self.last_error})
        return gaps

    def summary(self) -> dict:
        kinds = Counter(r["kind"] for r in self.refused)
        return {"url": self.url, "scrapes": self.scrapes, "failures": self.failures, "last_error": self.last_error,
                "period_s": self.period_s, "deadline_s": self.deadline_s, "file": f"scrapes/{self.path.name}",
                "refused_lines": kinds["line"], "not_finite_values": kinds["not-finite"],
                "refused_file": f"scrapes/{self.refused_path.name}", "types": self.types, "evidence": "reported",
                "prefix": self.prefix, "source": self.source}


class LlamaCppScraper(MetricsScraper):
    """llama.cpp's `/metrics` (`--metrics`): the `llamacpp:*` series, samples of source `llamacpp-metrics`."""

    prefix, source = LLAMACPP_PREFIX, LLAMACPP_SOURCE


class OursScraper(MetricsScraper):
    """`inferledger serve`'s `/metrics` (its vLLM-named `vllm:*` series), samples of source `inferledger-metrics`:
    a replica of ours that writes no `serve --out` folder (`capture --replica URL=ours`)."""

    source = "inferledger-metrics"


def scraper_for(reporter: str) -> type[MetricsScraper]:
    """The scraper of the engine that `reporter` names (`llamacpp-...`); vLLM's otherwise."""
    return LlamaCppScraper if reporter.startswith("llamacpp-") else MetricsScraper
