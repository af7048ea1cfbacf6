"""The server's Prometheus metrics, exposed with prometheus-client (text format 0.0.4).

Names follow vLLM's where the meaning is the same (`vllm:*`, each with a `model_name` label) so
existing dashboards work; everything else is `inferledger_*`. Each server has its own registry (no
global state). Counters and histograms are updated on the server's event loop; gauges, and the counters
the engine keeps itself (vLLM's prefix-cache queries and hits, in tokens), read the engine when scraped.
Every label value a counter can take is declared at 0 from the start. Latencies here are the front
end's own monotonic clock (received -> first token / done); the run directory's events carry the same
moments with evidence, and the ledger is where per-layer figures are defined.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as _Counter
from prometheus_client import Histogram as _Histogram
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0)
HTTP_STATUSES = ("200", "400", "401", "404", "409", "413", "429", "500", "503")  # all the front end answers
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)


class _ByLabel:
    """A counter keyed by one label (after the fixed ones), every value in `values` declared at 0;
    `inc(amount, label_value=...)` as the front end calls it."""

    def __init__(self, counter: _Counter, fixed: dict, label: str, values) -> None:
        self.counter, self.fixed, self.label = counter, fixed, label
        for v in values:
            counter.labels(**fixed, **{label: v})

    def inc(self, amount: float = 1.0, label_value=None) -> None:
        self.counter.labels(**self.fixed, **{self.label: str(label_value)}).inc(amount)


class _Gauges:
    """Gauges read from the engine when scraped: (name, help, fn, labels, label) with fn() a number, or
    {label value: number} with `label`. A gauge that cannot be read now is absent, never made up."""

    def __init__(self, gauges: list[tuple]) -> None:
        self.gauges = gauges

    def collect(self):
        for name, help_text, fn, labels, label in self.gauges:
            try:
                value = fn()
            except Exception:
                continue
            family = GaugeMetricFamily(name, help_text, labels=[*labels, *([label] if label else [])])
            for key, v in (value.items() if label else [(None, value)]):
                family.add_metric([*labels.values(), *([str(key)] if label else [])], float(v))
            yield family


class _EngineCounters:
    """Counters the engine keeps itself, read when scraped: (name, help, fn) with fn() the total so far;
    `model_name` labelled. Exposed with the `_total` suffix, as prometheus-client exposes every counter."""

    def __init__(self, counters: list[tuple], labels: dict) -> None:
        self.counters, self.labels = counters, labels

    def collect(self):
        for name, help_text, fn in self.counters:
            family = CounterMetricFamily(name, help_text, labels=list(self.labels))
            family.add_metric(list(self.labels.values()), float(fn()))
            yield family


class ServerMetrics:
    def __init__(self, model_name: str, llm_engine, server) -> None:
        self.registry = reg = CollectorRegistry(auto_describe=False)
        b = {"model_name": model_name}
        sched, bm = llm_engine.scheduler, llm_engine.block_manager

        def counter(name, help_text, labels=("model_name",)):
            return _Counter(name, help_text, labels, registry=reg)

        def histogram(name, help_text, buckets):
            return _Histogram(name, help_text, ["model_name"], buckets=buckets, registry=reg).labels(**b)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of requests admitted to the engine.").labels(**b)
        self.generation_tokens = counter("vllm:generation_tokens", "Output tokens streamed from the engine.").labels(**b)
        self.success = _ByLabel(counter("vllm:request_success", "Requests that finished (stop or length).",
                                        ("model_name", "finished_reason")), b, "finished_reason", ("stop", "length"))
        self.preemptions = counter("vllm:num_preemptions", "Preemptions of requests that finished.").labels(**b)
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Front end's received -> first output token, seconds.", TTFT_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Front end's received -> response complete, seconds.", E2E_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Per request (e2e - ttft) / (output tokens - 1), requests with > 1 token.", TPOT_BUCKETS)
        # every label value a response can take, at 0 from the start: scrapers that diff two scrapes
        # (AIPerf) read a series that first appears mid-run as lost requests
        self.http = _ByLabel(counter("inferledger_http_requests", "HTTP responses by status code.", ("status",)),
                             {}, "status", HTTP_STATUSES)
        self.disconnects = counter("inferledger_client_disconnects",
                                   "Clients that went away before their response completed (engine cancelled).", ())
        self.sse_events = counter("inferledger_sse_events", "Server-sent events written.", ())
        kv_help = ("Fraction of the KV cache's blocks held by requests (used / total; cached-but-unreferenced "
                   "prefix blocks count as free). On CPU too: this is the reference engine's paged KV pool.")
        reg.register(_Gauges([
            ("vllm:num_requests_running", "Sequences in the engine's running batch (n>1 samples count apart).",
             lambda: len(sched.running), b, None),
            ("vllm:num_requests_waiting", "Sequences waiting for admission to the batch.",
             lambda: len(sched.waiting), b, None),
            ("vllm:gpu_cache_usage_perc", kv_help, lambda: bm.num_used_blocks / bm.num_blocks, b, None),
            ("vllm:kv_cache_usage_perc", kv_help, lambda: bm.num_used_blocks / bm.num_blocks, b, None),
            ("inferledger_kv_blocks", "KV blocks by state (used: referenced; cached: reusable prefix; free).",
             lambda: {"used": bm.num_used_blocks, "cached": bm.num_cached_blocks, "free": bm.num_free_blocks},
             {}, "state"),
            ("inferledger_requests_in_flight", "Requests admitted by this front end and not yet finished.",
             lambda: server.in_flight, {}, None),
            ("inferledger_max_queue", "Admission limit: above it requests get 429 with Retry-After.",
             lambda: server.max_queue, {}, None),
        ]))

        # vLLM's (v1 engine: vllm/v1/metrics/loggers.py, counted in kv_cache_manager.get_computed_blocks),
        # in tokens; counted where the scheduler admits a sequence with its prefix-cache lookup
        # (engine/scheduler.py `_count_lookups` says how it differs from vLLM's)
        reg.register(_EngineCounters([
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens "
             "(each sequence's tokens when it enters the batch, recomputes after a preemption not counted).",
             lambda: sched.prefix_cache_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens "
             "(of the same lookups).", lambda: sched.prefix_cache_hits),
        ], b))

    def render(self) -> str:
        return generate_latest(self.registry).decode()
