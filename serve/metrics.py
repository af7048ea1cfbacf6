"""The server's Prometheus metrics: a small registry and the text exposition format (version 0.0.4).

Names follow vLLM's where the meaning is the same (`vllm:*`, each with a `model_name` label) so
existing dashboards work; everything else is `inferledger_*`. Counters and histograms are updated on
the server's event loop; gauges read the engine when scraped. Latencies here are the front end's own
monotonic clock (received -> first token / done); the run directory's events carry the same
moments with evidence, and the ledger is where per-layer figures are defined.
"""
from __future__ import annotations

import math

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0)
HTTP_STATUSES = ("200", "400", "401", "404", "409", "413", "429", "500", "503")  # all the front end answers
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)


def _fmt(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v)) if not float(v).is_integer() else f"{v:.1f}"


def _labels(pairs) -> str:
    if not pairs:
        return ""
    esc = (str(v).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n") for _, v in pairs)
    return "{" + ",".join(f'{k}="{e}"' for (k, _), e in zip(pairs, esc)) + "}"


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, base: tuple = ()) -> None:
        self.name, self.help, self.base = name, help, base

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name, help, base=(), label: str | None = None, values=()) -> None:
        super().__init__(name, help, base)
        self.label = label
        self.values: dict = {v: 0.0 for v in values} if label else {None: 0.0}

    def inc(self, amount: float = 1.0, label_value=None) -> None:
        self.values[label_value] = self.values.get(label_value, 0.0) + amount

    def lines(self) -> list[str]:
        return [f"{self.name}{_labels(self.base + (((self.label, k),) if self.label else ()))} {_fmt(v)}"
                for k, v in sorted(self.values.items(), key=lambda kv: str(kv[0]))]


class Gauge(_Metric):
    """Read when scraped: fn() returns a number, or {label value: number} with `label`."""

    kind = "gauge"

    def __init__(self, name, help, fn, base=(), label: str | None = None) -> None:
        super().__init__(name, help, base)
        self.fn, self.label = fn, label

    def lines(self) -> list[str]:
        try:
            v = self.fn()
        except Exception:  # a gauge that cannot be read now is absent, never a made-up number
            return []
        if self.label:
            return [f"{self.name}{_labels(self.base + ((self.label, k),))} {_fmt(x)}" for k, x in v.items()]
        return [f"{self.name}{_labels(self.base)} {_fmt(v)}"]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name, help, buckets, base=()) -> None:
        super().__init__(name, help, base)
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum, self.count = 0.0, 0

    def observe(self, v: float) -> None:
        for i, le in enumerate(self.buckets):
            if v <= le:
                self.counts[i] += 1
                break
        self.sum += v
        self.count += 1

    def lines(self) -> list[str]:
        out, cum = [], 0
        for le, c in zip(self.buckets, self.counts):
            cum += c
            out.append(f"{self.name}_bucket{_labels(self.base + (('le', _fmt(le)),))} {cum}")
        out.append(f"{self.name}_bucket{_labels(self.base + (('le', '+Inf'),))} {self.count}")
        out.append(f"{self.name}_sum{_labels(self.base)} {_fmt(self.sum)}")
        out.append(f"{self.name}_count{_labels(self.base)} {self.count}")
        return out


class ServerMetrics:
    def __init__(self, model_name: str, llm_engine, server) -> None:
        b = (("model_name", model_name),)
        sched, bm = llm_engine.scheduler, llm_engine.block_manager
        self.prompt_tokens = Counter("vllm:prompt_tokens_total", "Prompt tokens of requests admitted to the engine.", b)
        self.generation_tokens = Counter("vllm:generation_tokens_total", "Output tokens streamed from the engine.", b)
        self.success = Counter("vllm:request_success_total", "Requests that finished (stop or length).", b,
                               "finished_reason", ("stop", "length"))
        self.preemptions = Counter("vllm:num_preemptions_total", "Preemptions of requests that finished.", b)
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Front end's received -> first output token, seconds.", TTFT_BUCKETS, b)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Front end's received -> response complete, seconds.", E2E_BUCKETS, b)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds",
                              "Per request (e2e - ttft) / (output tokens - 1), requests with > 1 token.",
                              TPOT_BUCKETS, b)
        # every label value a response can take, at 0 from the start: scrapers that diff two scrapes
        # (AIPerf) read a series that first appears mid-run as lost requests
        self.http = Counter("inferledger_http_requests_total", "HTTP responses by status code.", (), "status",
                            HTTP_STATUSES)
        self.disconnects = Counter("inferledger_client_disconnects_total",
                                   "Clients that went away before their response completed (engine cancelled).")
        self.sse_events = Counter("inferledger_sse_events_total", "Server-sent events written.")
        kv_help = ("Fraction of the KV cache's blocks held by requests (used / total; cached-but-unreferenced "
                   "prefix blocks count as free). On CPU too: this is the reference engine's paged KV pool.")
        self.gauges = [
            Gauge("vllm:num_requests_running", "Sequences in the engine's running batch (n>1 samples count apart).",
                  lambda: len(sched.running), b),
            Gauge("vllm:num_requests_waiting", "Sequences waiting for admission to the batch.",
                  lambda: len(sched.waiting), b),
            Gauge("vllm:gpu_cache_usage_perc", kv_help, lambda: bm.num_used_blocks / bm.num_blocks, b),
            Gauge("vllm:kv_cache_usage_perc", kv_help, lambda: bm.num_used_blocks / bm.num_blocks, b),
            Gauge("inferledger_kv_blocks", "KV blocks by state (used: referenced; cached: reusable prefix; free).",
                  lambda: {"used": bm.num_used_blocks, "cached": bm.num_cached_blocks, "free": bm.num_free_blocks},
                  label="state"),
            Gauge("inferledger_requests_in_flight", "Requests admitted by this front end and not yet finished.",
                  lambda: server.in_flight),
            Gauge("inferledger_max_queue", "Admission limit: above it requests get 429 with Retry-After.",
                  lambda: server.max_queue),
        ]

    def render(self) -> str:
        lines: list[str] = []
        for m in (*self.gauges, self.prompt_tokens, self.generation_tokens, self.success, self.preemptions,
                  self.ttft, self.e2e, self.tpot, self.http, self.disconnects, self.sse_events):
            body = m.lines()
            if body:
                lines += m.header() + body
        return "\n".join(lines) + "\n"
