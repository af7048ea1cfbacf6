"""The recorded real llama.cpp run (samples/peers/llamacpp/: llama.cpp's own server through xllamacpp,
8 chats, closed loop of 2): the client's events, which carry the `timings` object each response ended
with, and llama.cpp's /metrics scrapes, joined again without llama.cpp installed and held to exact
values: every attempt joined with its timings, the reported prefill and decode durations and cached
tokens, each placed inside the client's own interval, and the llamacpp:* counters beside their sums.
The client's parsing of a final chunk's timings and the refusal of timings longer than the client's
interval are checked too."""
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inferledger.collectors.evidence.metrics_scrape import (LlamaCppScraper, MetricsScraper, parse_prometheus,
                                                            scraper_for, unit_of)
from inferledger.collectors.evidence.vllm_rejoin import is_recording, rejoin
from inferledger.collectors.load.http_transport import chunk_from_event
from inferledger.ledger.query import open_ledger
from inferledger.ledger.reconstruct import reconstruct

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "peers" / "llamacpp"

# attempt: (cache_n, prompt_n, prompt_ms, predicted_n, predicted_ms), as llama.cpp sent them
TIMINGS = {
    "T0000:R1:A1": (0, 96, 1500.396, 12, 3644.521),
    "T0001:R1:A1": (0, 96, 2811.771, 8, 343.76),
    "T0002:R1:A1": (64, 32, 408.936, 8, 700.611),
    "T0003:R1:A1": (64, 32, 408.968, 12, 904.628),
    "T0004:R1:A1": (64, 32, 431.145, 12, 721.983),
    "T0005:R1:A1": (64, 32, 396.416, 8, 609.081),
    "T0006:R1:A1": (64, 32, 449.79, 8, 638.009),
    "T0007:R1:A1": (64, 32, 422.245, 9, 206.998),
}


def _build(sample: Path, run: Path):
    summary = rejoin(sample, run)
    reconstruct(run)
    return summary


@pytest.fixture(scope="module")
def led(tmp_path_factory):
    run = tmp_path_factory.mktemp("llamacpp") / "run"
    summary = _build(SAMPLE, run)
    with open_ledger(run) as ledger:
        yield ledger, summary


def rows(led, sql):
    return led[0].rows(sql)[1]


def test_the_sample_is_llamacpps_own_output():
    manifest = json.loads((SAMPLE / "manifest.json").read_text())
    ev = manifest["engine_evidence"]
    assert (ev["reporter"], ev["version"]) == ("llamacpp-b0-unknown", "b0-unknown")
    assert (ev["metrics"]["prefix"], ev["metrics"]["source"]) == ("llamacpp:", "llamacpp-metrics")
    assert is_recording(SAMPLE) and not (SAMPLE / "otlp").exists()


def test_every_attempt_is_joined_with_its_timings(led):
    assert led[1] == {"attempts": 8, "with_timings": 8}
    assert rows(led, "select count(*), count(*) filter (where r.server_evidence = 'reported' "
                     "and r.server_reporter = 'llamacpp-b0-unknown'), count(t.attempt_id) "
                     "from attempts a join request_metrics r using (attempt_id) "
                     "left join reported_timings t using (attempt_id)") == [(8, 8, 8)]


def test_reported_prefill_decode_and_cached_tokens_exact(led):
    got = rows(led, "select attempt_id, cached_tokens, prompt_tokens, prefill_reported_ms, completion_tokens, "
                    "decode_reported_ms from reported_timings order by attempt_id")
    assert {r[0]: r[1:] for r in got} == TIMINGS
    metrics = rows(led, "select attempt_id, prefill_ms, decode_ms from request_metrics order by attempt_id")
    assert {a: (p, d) for a, p, d in metrics} == {a: (t[2], t[4]) for a, t in TIMINGS.items()}
    # the prompt as llama.cpp saw it (cached + processed) and its completion count agree with the usage
    assert rows(led, "select count(*) from reported_timings where completion_tokens_check <> 0 "
                     "or completion_tokens_check is null") == [(0,)]


def test_timings_lie_inside_the_clients_interval(led):
    got = rows(led, "select count(*) filter (where inside_client), round(min(prefill_slack_ms), 3), "
                    "round(min(e2e_slack_ms), 3) from reported_timings")
    assert got == [(8, 4.753, 2.707)]
    e2e = rows(led, "select e2e_client_ms, ttft_client_ms from reported_timings where attempt_id = 'T0000:R1:A1'")
    assert [round(x, 3) for x in e2e[0]] == [5147.624, 1505.149]
    assert rows(led, "select count(*) from gaps where gap_id like 'reported:timings:%'") == [(0,)]


def test_llamacpp_counters_beside_the_timings_sums(led):
    got = {m: (d, s) for m, d, s in rows(led, "select metric, run_delta, span_sum from reported_counters "
                                              "where span_sum is not null")}
    assert {m: got[m] for m in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total",
                                "llamacpp:tokens_predicted_total")} == {
        "llamacpp:prompt_tokens_total": (384.0, 384.0), "llamacpp:prompt_tokens_cached_total": (384.0, 384.0),
        "llamacpp:tokens_predicted_total": (77.0, 77.0)}
    # seconds: the counter is printed to 6 significant digits; llama.cpp's own prompt total is 3.127 ms
    # short of the sum of the prompt_ms it reported (kept, not hidden)
    assert got["llamacpp:prompt_seconds_total"][0] == pytest.approx(6.82654, abs=1e-9)
    assert got["llamacpp:prompt_seconds_total"][1] == pytest.approx(6.829667, abs=1e-9)
    assert got["llamacpp:tokens_predicted_seconds_total"] == pytest.approx((7.76959, 7.769591), abs=1e-9)
    assert rows(led, "select run_delta, span_sum from reported_counters where metric = 'llamacpp:n_decode_total'") \
        == [(44.0, None)]


def test_timings_longer_than_the_client_saw_are_refused(tmp_path):
    sample = tmp_path / "sample"
    shutil.copytree(SAMPLE, sample)
    events = pq.read_table(sample / "client" / "events.parquet")
    out = []
    for r in events.to_pylist():
        if r["name"] == "attempt.done" and r["attempt_id"] == "T0005:R1:A1":
            attrs = json.loads(r["attrs"])
            attrs["server_timings"]["predicted_ms"] = 700.0  # 396.416 + 700 > the client's 1016.354 ms
            r = {**r, "attrs": json.dumps(attrs)}
        out.append(r)
    pq.write_table(pa.Table.from_pylist(out, schema=events.schema), sample / "client" / "events.parquet")
    run = tmp_path / "run"
    _build(sample, run)
    with open_ledger(run) as ledger:
        assert ledger.rows("select inside_client, round(e2e_slack_ms, 3) from reported_timings "
                           "where attempt_id = 'T0005:R1:A1'")[1] == [(False, -80.062)]
        assert ledger.rows("select prefill_ms, decode_ms, server_evidence from request_metrics "
                           "where attempt_id = 'T0005:R1:A1'")[1] == [(None, None, "reported")]
        assert ledger.rows("select scope, subject_id from gaps where gap_id = 'reported:timings:T0005:R1:A1'")[1] \
            == [("attempt", "T0005:R1:A1")]


def test_the_client_keeps_the_final_chunks_timings():
    final = {"choices": [], "system_fingerprint": "b0-unknown", "usage": {"completion_tokens": 8, "prompt_tokens": 37},
             "timings": {"cache_n": 0, "prompt_n": 37, "prompt_ms": 408.029, "predicted_n": 8, "predicted_ms": 145.189}}
    chunk = chunk_from_event(final)
    assert chunk.timings == {"timings": final["timings"], "system_fingerprint": "b0-unknown"}
    assert chunk.kinds == ["usage"]
    assert chunk_from_event({"choices": [{"index": 0, "delta": {"content": "4"}}]}).timings is None
    assert chunk_from_event({"choices": [], "timings": "soon"}).timings is None


def test_llamacpp_metrics_are_scraped_under_their_own_prefix():
    text = ("# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 38\n"
            "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\nvllm:x_total 3\n")
    got = parse_prometheus(text, LlamaCppScraper.prefix)
    assert got.values == {"llamacpp:prompt_tokens_total": 38.0, "llamacpp:requests_processing": 1.0}
    assert [unit_of(m, got.types) for m in got.values] == ["tokens", "requests"]
    assert (scraper_for("llamacpp-b0-unknown"), scraper_for("vllm-0.32.0"), scraper_for("unknown")) == \
        (LlamaCppScraper, MetricsScraper, MetricsScraper)
    assert LlamaCppScraper.source == "llamacpp-metrics"


def test_the_reporter_is_named_from_llamacpps_props():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from inferledger.collectors.evidence.engine_evidence import engine_reporter

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = json.dumps({"build_info": "b6500-1a2b3c", "total_slots": 4}).encode() if self.path == "/props" \
                else b'{"error": {"code": 404}}'
            self.send_response(200 if self.path == "/props" else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert engine_reporter(f"http://127.0.0.1:{srv.server_address[1]}") == ("llamacpp-b6500-1a2b3c", "b6500-1a2b3c")
    finally:
        srv.shutdown()
        srv.server_close()
