"""A router's own counters around a capture's load: vLLM's router (`vllm-router --prometheus-port P`).

`capture --router-metrics URL` scrapes the router's Prometheus `/metrics` once before the load and once
after it (metrics_scrape.py's scraper, its parser keeping each label set apart): the `vllm_router_*`
series, each as a sample of source `vllm-router` on the client's clock. A series labelled `worker`
(`vllm_router_processed_requests_total{worker="http://127.0.0.1:18111"}`) is a sample whose `device` is
the replica that worker URL is (the `serve --out` folder's replica id, by the host and port in its
manifest), else the worker URL as the router names it; its other labels stay in the metric's name
(`vllm_router_policy_decisions_total{policy="round_robin"}`). The ledger's `replicas` table takes each
counter's difference over the two scrapes. Values are the router's report about itself: evidence of
strength "reported". Each scrape is one JSON line in `<run>/scrapes/router.jsonl`; a refused line or a
failed scrape is a record of `<run>/scrapes/router-refused.jsonl` and a gap (`router-metrics:*`).
"""
from __future__ import annotations

import json
import re

from inferledger.collectors.evidence.metrics_scrape import MetricsScraper, Scrape, unit_of

SOURCE = "vllm-router"
PREFIX = "vllm_router_"
_LABEL = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*")')


def worker_key(url: str) -> str:
    """A worker URL as `host:port` (scheme and path dropped), the form replicas are matched by."""
    return url.split("://", 1)[-1].split("/", 1)[0].lower()


def split_worker(series: str) -> tuple[str, str | None]:
    """(the series without its `worker` label, that label's value or None)."""
    if "{" not in series:
        return series, None
    name, rest = series.split("{", 1)
    labels = dict(_LABEL.findall(rest.rstrip("}")))
    worker = labels.pop("worker", None)
    key = name + ("{" + ",".join(f"{k}={v}" for k, v in labels.items()) + "}" if labels else "")
    return key, None if worker is None else json.loads(worker)


class RouterScraper(MetricsScraper):
    """The router's counters: `scrape_once()` before the load, `stop()` after it (no thread runs)."""
    source, prefix, keep_labels, file_stem = SOURCE, PREFIX, True, "router"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.replicas: dict[str, str] = {}  # worker_key(url) -> replica id; set by the capture before the first scrape

    def _samples(self, ts_ns: int, scrape: Scrape) -> None:
        for series, value in scrape.values.items():
            metric, worker = split_worker(series)
            device = None if worker is None else self.replicas.get(worker_key(worker), worker)
            self.sink.sample(ts_ns=ts_ns, clock=self.clock, source=self.source, host=self.host, metric=metric,
                             value=value, unit=unit_of(metric.split("{", 1)[0], self.types), device=device)

    def gap_rows(self, run_id: str) -> list[dict]:
        gaps = []
        for g in super().gap_rows(run_id):
            gap_id = g["gap_id"].replace("collector:metrics", "collector:router-metrics", 1)
            gaps.append({**g, "gap_id": gap_id if gap_id != g["gap_id"] else "router-" + gap_id})
        if 0 < self.scrapes < 2:
            gaps.append({"run_id": run_id, "gap_id": "collector:router-metrics:one-scrape", "scope": "run",
                         "subject_id": None, "affects": "replicas router_sent (the router's counters over the load)",
                         "needs": "the router's /metrics answering before and after the load",
                         "detail": f"{self.url}: {self.scrapes} of the 2 scrapes succeeded; last error: {self.last_error}"})
        for g in gaps:
            if g["gap_id"] == "collector:router-metrics":
                g.update(affects="replicas router_sent (the router's counters over the load)",
                         needs="a reachable router /metrics (vllm-router --prometheus-port)")
        return gaps
