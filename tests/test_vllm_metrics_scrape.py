"""The /metrics scraper against a real HTTP server (loopback) serving Prometheus text shaped like vLLM's:
exact parsed values, the scrape's own timestamps, a failed scrape counted, never filled in; each bad
line one refusal (the rest of the scrape kept), and a scrape that never outlasts its period."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inferledger.collectors.evidence.metrics_scrape import MetricsScraper, parse_prometheus, refused_gaps, unit_of
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
    got = parse_prometheus(TEXT)
    values, types = got.values, got.types
    assert got.refused == [] and got.not_finite == []
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


class _Serve:
    """A loopback HTTP server whose GET answers `body` (bytes, or a callable writing to the handler)."""

    def __init__(self, body, status=200):
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if callable(outer.body):
                    return outer.body(self)
                self.send_response(status)
                self.send_header("content-length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

        self.body = body
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/metrics"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.srv.shutdown()
        self.srv.server_close()


def test_scrape_once_stamps_its_own_times(tmp_path):
    ticks = iter([1000, 3000])  # the client clock read before and after the scrape
    sink = _Sink()
    with _Serve(TEXT.encode()) as srv:
        sc = MetricsScraper(srv.url, tmp_path, sink, clock="mono:h", host="h", now_ns=lambda: next(ticks))
        assert sc.scrape_once()
    line = json.loads((tmp_path / "scrapes" / "metrics.jsonl").read_text())
    assert (line["t0_ns"], line["t1_ns"], line["clock"]) == (1000, 3000, "mono:h")
    assert {s["ts_ns"] for s in sink.samples} == {2000} and len(sink.samples) == 6
    assert {s["source"] for s in sink.samples} == {"vllm-metrics"}


def test_start_reads_the_counters_before_it_returns(tmp_path):
    """The first values of a counter whose delta over the run is taken are read before the caller goes on
    to the load: in start() itself, not left to the thread (whose first scrape could land after the first
    requests and miss them)."""
    sink = _Sink()
    with _Serve(TEXT.encode()) as srv:
        sc = MetricsScraper(srv.url, tmp_path, sink, clock="mono:h", host="h", hz=0.5)
        sc.start()
        try:
            assert (sc.scrapes, len(sink.samples)) == (1, 6)
        finally:
            sc.stop(final_scrape=False)
    assert sc.scrapes == 1  # the thread waits its period before its own first scrape


def test_a_failed_scrape_is_counted_not_filled(tmp_path):
    sink = _Sink()
    sc = MetricsScraper("http://127.0.0.1:18199/metrics", tmp_path, sink, clock="mono:h", host="h", timeout_s=0.5)
    assert not sc.scrape_once()
    assert (sc.scrapes, sc.failures, sink.samples) == (0, 1, [])
    assert "Error" in sc.last_error or "refused" in sc.last_error
    assert [g["gap_id"] for g in sc.gap_rows("r")] == ["collector:metrics"]


BAD = ['vllm:broken{a="b" 1', 'vllm:num_requests_running{model_name="x"} many', "vllm:no_value"]


def test_each_malformed_line_is_one_refusal_and_the_rest_is_kept():
    text = TEXT.replace("# TYPE vllm:kv_cache_usage_perc gauge", "\n".join(BAD) + "\n# TYPE vllm:kv_cache_usage_perc gauge")
    got = parse_prometheus(text.encode())
    assert got.values == parse_prometheus(TEXT).values  # every good line of the scrape, exactly
    assert [(n, line) for n, line, _ in got.refused] == [(4, BAD[0]), (5, BAD[1]), (6, BAD[2])]
    assert all("not a sample line" in why for _, _, why in got.refused)


def test_the_exposition_format_escapes_timestamps_openmetrics_and_eof():
    text = (b'# HELP vllm:esc A help with a \\ backslash.\n# TYPE vllm:esc gauge\n'
            b'vllm:esc{path="a\\"} 9\",b=\"c",z="x\\\\"} 2\n'
            b'vllm:esc{path="line\\nbreak"} 3 1712345678000\n'
            b'# TYPE vllm:lat_seconds histogram\n'
            b'vllm:lat_seconds_bucket{le="0.1"} 4 # {trace_id="ab"} 0.05 1712345678.5\n'
            b'vllm:lat_seconds_count 4\n'
            b'vllm:lat_seconds_created 1712345678.1\n'
            b'vllm:nan_gauge{a="1"} 1\nvllm:nan_gauge{a="2"} NaN\n'
            b'vllm:bad_utf8 \xff\n'
            b'# EOF\n'
            b'vllm:after_eof 1\n')
    got = parse_prometheus(text)
    assert got.values == {"vllm:esc": 5.0, "vllm:lat_seconds_count": 4.0}
    assert got.types == {"vllm:esc": "gauge", "vllm:lat_seconds": "histogram"}
    assert got.not_finite == ["vllm:nan_gauge"]  # one label set is NaN: the sum is unknown, left out
    assert [(n, why) for n, _, why in got.refused] == [(11, "not UTF-8 (invalid start byte)"), (13, "after # EOF")]


def test_refused_lines_and_scrapes_become_gap_rows_and_raw_records(tmp_path):
    text = (TEXT + BAD[0] + "\n").encode()
    with _Serve(text) as srv:
        sc = MetricsScraper(srv.url, tmp_path, _Sink(), clock="mono:h", host="h")
        assert sc.scrape_once() and sc.scrape_once()
        srv.body = lambda h: (h.send_response(500), h.send_header("content-length", "0"), h.end_headers())
        assert not sc.scrape_once()
    records = [json.loads(x) for x in (tmp_path / "scrapes" / "refused.jsonl").read_text().splitlines()]
    assert [(r["kind"], r.get("scrape"), r.get("text"), r.get("error")) for r in records] == \
        [("line", 1, BAD[0], None), ("line", 2, BAD[0], None), ("scrape", None, None, "HTTP 500")]
    gaps = {g["gap_id"]: g for g in sc.gap_rows("r")}
    line_gap = [g for k, g in gaps.items() if k.startswith("metrics:line:")]
    assert len(line_gap) == 1 and "refused in 2 scrape(s)" in line_gap[0]["detail"]
    assert "1 scrape(s) failed, 2 succeeded; last: HTTP 500" in gaps["metrics:failed-scrapes"]["detail"]
    assert refused_gaps("r", records, 2) == sc.gap_rows("r")  # the same rows from the kept records
    assert sc.summary()["refused_lines"] == 2


def _trickle(handler):
    """Headers, then one byte every 0.2 s of a body said to be 10 kB long: a scrape that never ends."""
    handler.send_response(200)
    handler.send_header("content-length", "10000")
    handler.end_headers()
    try:
        for _ in range(600):
            handler.wfile.write(b"v")
            handler.wfile.flush()
            time.sleep(0.2)
    except OSError:  # the scraper hung up at its deadline
        pass


@pytest.mark.parametrize("hz", [10.0, 2.0])
def test_a_trickling_endpoint_costs_one_scrape_of_at_most_its_period(tmp_path, hz):
    with _Serve(_trickle) as srv:
        sc = MetricsScraper(srv.url, tmp_path, _Sink(), clock="mono:h", host="h", hz=hz)
        assert not sc.scrape_once()
        sc.start()
        sc.stop()  # the thread's scrape and the last one each end at the deadline
    assert sc.scrapes == 0 and sc.failures >= 2
    assert sc.last_error.startswith(f"no complete answer within {1 / hz:g} s")


class _StarvedTimer:
    """A timer thread that never gets the CPU before the reads' own timeouts fire (a loaded host)."""

    def __init__(self, *_args, **_kw):
        self.daemon = True

    def start(self):
        pass

    def cancel(self):
        pass


def test_a_read_timing_out_before_a_starved_timer_still_reports_the_deadline(monkeypatch):
    from inferledger.collectors.evidence import bounded_get as bg

    monkeypatch.setattr(bg.threading, "Timer", _StarvedTimer)
    with _Serve(_trickle) as srv:
        with pytest.raises(bg.GetFailed, match=r"^no complete answer within 0\.1 s"):
            bg.bounded_get(srv.url, deadline_s=0.1, max_bytes=1 << 20)


def test_our_servers_exposition_reads_back_through_the_scraper():
    from types import SimpleNamespace as NS

    from prometheus_client.parser import text_string_to_metric_families

    from inferledger.serve.metrics import ServerMetrics

    class Broken:
        @property
        def num_used_blocks(self):
            raise RuntimeError("the pool is being resized")

    engine = NS(scheduler=NS(running=[1, 2], waiting=[3], prefix_cache_queries=120, prefix_cache_hits=48),
                block_manager=Broken())
    m = ServerMetrics('m"x', engine, NS(in_flight=2, max_queue=64))
    m.success.inc(label_value="stop")
    m.http.inc(label_value="429")
    m.ttft.observe(0.02)
    m.prompt_tokens.inc(5)
    text = m.render()
    families = {f.name: f for f in text_string_to_metric_families(text)}  # the whole text, strictly
    assert families["vllm:request_success"].type == families["vllm:prefix_cache_hits"].type == "counter"
    got = parse_prometheus(text)
    assert got.refused == [] and got.not_finite == []
    assert {k: v for k, v in got.values.items() if not k.endswith(("_sum",))} == {
        "vllm:num_requests_running": 2.0, "vllm:num_requests_waiting": 1.0, "vllm:prompt_tokens_total": 5.0,
        "vllm:generation_tokens_total": 0.0, "vllm:request_success_total": 1.0, "vllm:num_preemptions_total": 0.0,
        "vllm:time_to_first_token_seconds_count": 1.0, "vllm:e2e_request_latency_seconds_count": 0.0,
        "vllm:request_time_per_output_token_seconds_count": 0.0, "vllm:prefix_cache_queries_total": 120.0,
        "vllm:prefix_cache_hits_total": 48.0}
    assert 'model_name="m\\"x"' in text  # the label value escaped by the library, read back by the parser
    assert "vllm:kv_cache_usage_perc" not in text  # a gauge that cannot be read now is absent, not 0
    assert 'vllm:request_success_total{finished_reason="length",model_name="m\\"x"} 0.0' in text
    assert 'inferledger_http_requests_total{status="503"} 0.0' in text  # declared before any such answer
