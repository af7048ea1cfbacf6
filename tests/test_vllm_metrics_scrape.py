"""The /metrics scraper against a real HTTP server (loopback) serving Prometheus text shaped like vLLM's:
exact parsed values, the scrape's own timestamps, and a failed scrape counted, never filled in."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from inferledger.collectors.metrics_scrape import MetricsScraper, parse_prometheus, unit_of
from inferledger.probes.probe import ListSink

TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.125
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="smollm2"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="smollm2"} 5.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="smollm2"} 12.5
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="smollm2"} 2.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="smollm2"} 12.0
vllm:label_with_space{model_name="a b"} 4
python_gc_objects_collected_total{generation="0"} 99.0
"""


def test_parse_sums_label_sets_and_drops_buckets():
    values, types = parse_prometheus(TEXT)
    assert values == {"vllm:num_requests_running": 3.0, "vllm:kv_cache_usage_perc": 0.125,
                      "vllm:request_success_total": 12.0, "vllm:e2e_request_latency_seconds_sum": 12.5,
                      "vllm:e2e_request_latency_seconds_count": 12.0, "vllm:label_with_space": 4.0}
    assert types["vllm:e2e_request_latency_seconds"] == "histogram"
    assert [unit_of(m, types) for m in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                                        "vllm:e2e_request_latency_seconds_sum", "vllm:request_success_total")] == \
        ["requests", "ratio", "s", "count"]


class _Sink(ListSink):
    def __init__(self):
        super().__init__()
        self.samples = []

    def sample(self, **kw):
        self.samples.append(kw)


def test_scrape_once_stamps_its_own_times(tmp_path):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = TEXT.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    ticks = iter([1000, 3000])  # the client clock read before and after the scrape
    sink = _Sink()
    try:
        sc = MetricsScraper(f"http://127.0.0.1:{srv.server_address[1]}/metrics", tmp_path, sink, clock="mono:h",
                            host="h", now_ns=lambda: next(ticks))
        assert sc.scrape_once()
    finally:
        srv.shutdown()
        srv.server_close()
    line = json.loads((tmp_path / "scrapes" / "metrics.jsonl").read_text())
    assert (line["t0_ns"], line["t1_ns"], line["clock"]) == (1000, 3000, "mono:h")
    assert {s["ts_ns"] for s in sink.samples} == {2000} and len(sink.samples) == 6
    assert {s["source"] for s in sink.samples} == {"vllm-metrics"}


def test_a_failed_scrape_is_counted_not_filled(tmp_path):
    sink = _Sink()
    sc = MetricsScraper("http://127.0.0.1:18199/metrics", tmp_path, sink, clock="mono:h", host="h", timeout_s=0.5)
    assert not sc.scrape_once()
    assert (sc.scrapes, sc.failures, sink.samples) == (0, 1, [])
    assert "Error" in sc.last_error or "refused" in sc.last_error
