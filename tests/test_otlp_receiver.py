"""The loopback OTLP receiver fed by the real OpenTelemetry SDK exporter (protobuf over HTTP, plain and
gzip), by OTLP/JSON, and by garbage and hostile requests (each answered 4xx, kept in refused.jsonl,
never a traceback); and `inferledger import --from otlp` rebuilt into a ledger whose figures are
worked out by hand (the span of tests/test_otlp_decode.py)."""
import gzip
import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.evidence.otlp_receiver import OTLPReceiver
from inferledger.collectors.evidence.otlp_decode import request_from_json
from inferledger.collectors.evidence.otlp_file import read_otlp_file
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from inferledger.ledger.query import open_ledger
from inferledger.ledger.reconstruct import reconstruct
from test_otlp_decode import T, llm_request, request


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_sdk_exporter_protobuf_lands_as_a_file_line(tmp_path, compression):
    rx = OTLPReceiver(tmp_path).start()
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "engine-under-test"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=rx.endpoint, compression=compression)))
        span = provider.get_tracer("t").start_span("llm_request", kind=SpanKind.SERVER, start_time=T,
                                                  attributes={"gen_ai.request.id": "chatcmpl-a:A1", "odd": [1.5, 2.5]})
        span.end(end_time=T + 7)
        provider.shutdown()
        assert rx.summary()["spans"] == 1 and rx.summary()["span_names"] == ["llm_request"]
    finally:
        rx.stop()
    assert rx.summary()["refused_requests"] == 0
    (sp,), refused = read_otlp_file(rx.path)
    assert refused == []
    assert (sp.name, sp.kind, sp.start_unix_ns, sp.end_unix_ns) == ("llm_request", "SERVER", T, T + 7)
    assert sp.attributes == {"gen_ai.request.id": "chatcmpl-a:A1", "odd": [1.5, 2.5]}
    assert sp.resource["service.name"] == "engine-under-test"


def _post(url, body: bytes, ctype: str, **headers):
    headers = {"content-type": ctype, **{k.replace("_", "-"): v for k, v in headers.items()}}
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_json_accepted_garbage_refused_and_kept(tmp_path):
    rx = OTLPReceiver(tmp_path).start()
    try:
        assert _post(rx.endpoint, json.dumps(request(llm_request())).encode(), "application/json") == (200, b"{}")
        status, body = _post(rx.endpoint, b"\xff\x00garbage", "application/x-protobuf")
        assert status == 400 and b"not an ExportTraceServiceRequest" in body
        assert _post(rx.endpoint.replace("/v1/traces", "/v1/metrics"), b"", "application/json")[0] == 404
    finally:
        rx.stop()
    assert [s.span_id for s in read_otlp_file(rx.path)[0]] == ["b7ad6b7169203331"]
    refused = [json.loads(x) for x in (tmp_path / "otlp" / "refused.jsonl").read_text().splitlines()]
    assert len(refused) == 1 and refused[0]["bytes"] == 9 and refused[0]["span_id"] is None


def test_import_otlp_builds_a_server_side_ledger(tmp_path):
    f = tmp_path / "traces.jsonl"
    f.write_text(json.dumps(request(llm_request())) + "\n")
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["import", "--from", "otlp", str(f), "--out", str(run), "--engine-host", "gpu7",
                                   "--reporter", "vllm-0.32.0"])
    assert res.exit_code == 0, res.output
    reconstruct(run)
    with open_ledger(run) as led:
        row = led.rows("select attempt_id, server_status, client_status, ttft_server_ms, queue_ms, prefill_ms, "
                       "decode_ms, e2e_server_ms, a.n_output_tokens, server_evidence, server_reporter, itl_engine_max_ms "
                       "from attempts a join request_metrics using (attempt_id)")[1]
        # ttft_server = enqueued (T+75) -> first token (T+250); e2e_server = enqueued -> finished (T+1500)
        assert row == [("t1:A1", "completed", None, 175.0, 50.0, 125.0, 1250.0, 1425.0, 11, "reported",
                        "vllm-0.32.0", None)]
        spans = led.rows("select engine_request_id, ttft_reported_ms, decode_reported_ms, completion_tokens, evidence "
                         "from reported_spans")[1]
        assert spans == [("chatcmpl-t1:A1", 250.0, 1000.0, 11, "reported")]
        assert led.rows("select count(*) from itl where layer = 'engine'")[1] == [(0,)]
        assert led.rows("select count(*) from gaps where gap_id = 'reported:itl'")[1] == [(1,)]
        assert led.rows("select clock from events group by clock")[1] == [("wall:gpu7",)]


def test_import_otlp_bad_line_exits_2_naming_file_and_line(tmp_path):
    f = tmp_path / "traces.jsonl"
    f.write_text(json.dumps(request(llm_request())) + "\nnot json\n")
    res = CliRunner().invoke(app, ["import", "--from", "otlp", str(f), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2
    assert f"{f}:2:" in res.output and not (tmp_path / "run").exists()
    res = CliRunner().invoke(app, ["import", "--from", "nope", str(f), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "--from" in res.output and "otlp" in res.output and "nope" in res.output


def _raw(rx, head: bytes, body: bytes = b"", *, then_close: bool = True, wait_s: float = 0.0) -> tuple[int, bytes]:
    """One request written by hand on a socket (what urllib would not send); the status and body."""
    with socket.create_connection(("127.0.0.1", rx.port), timeout=30) as sock:
        sock.sendall(head + b"\r\n\r\n" + body)
        time.sleep(wait_s)
        if then_close:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1]


def _head(**headers) -> bytes:
    lines = [b"POST /v1/traces HTTP/1.1", b"host: 127.0.0.1", b"content-type: application/json"]
    return b"\r\n".join(lines + [f"{k.replace('_', '-')}: {v}".encode() for k, v in headers.items()])


def test_malformed_requests_get_4xx_and_are_kept_never_a_traceback(tmp_path, capfd):
    rx = OTLPReceiver(tmp_path, max_body_bytes=250_000).start()
    deep = b"[" * 100_000 + b"]" * 100_000
    try:
        cases = [
            (_post(rx.endpoint, deep, "application/json")[0], 400),
            (_raw(rx, _head(content_length="abc"))[0], 400),
            (_raw(rx, _head(content_length="-5"))[0], 400),
            (_raw(rx, _head())[0], 411),
            (_raw(rx, _head(content_length="100"), b'{"resourceSpans"')[0], 400),  # truncated
            (_raw(rx, _head(content_length="300000"), b"{}")[0], 413),
            (_post(rx.endpoint, gzip.compress(b"{" * 300_000), "application/json", content_encoding="gzip")[0], 413),
            (_post(rx.endpoint, b"not gzip", "application/json", content_encoding="gzip")[0], 400),
            (_post(rx.endpoint, gzip.compress(b"{}")[:-6], "application/json", content_encoding="gzip")[0], 400),
            (_post(rx.endpoint, b"{}", "application/json", content_encoding="br")[0], 415),
        ]
    finally:
        rx.stop()
    assert [got for got, _ in cases] == [want for _, want in cases]
    err = capfd.readouterr().err
    assert "Traceback" not in err and err == ""
    refused = [json.loads(x) for x in rx.refused_path.read_text().splitlines()]
    assert len(refused) == len(cases) and all(r["span_id"] is None and r["reason"] for r in refused)
    assert "nested deeper" in refused[0]["reason"] and "truncated: 16 of 100 bytes" in refused[4]["reason"]
    assert rx.summary()["refused_requests"] == len(cases) and rx.summary()["requests"] == 0


def test_a_body_that_trickles_past_the_deadline_is_refused(tmp_path):
    rx = OTLPReceiver(tmp_path, body_deadline_s=0.3).start()
    try:
        status, body = _raw(rx, _head(content_length="50"), b"{", then_close=False)
    finally:
        rx.stop()
    assert status == 408 and b"not received within 0.3 s (1 of 50 bytes)" in body


def test_gzip_json_is_inflated_within_the_bound(tmp_path):
    rx = OTLPReceiver(tmp_path, max_body_bytes=4000).start()
    body = json.dumps(request(llm_request())).encode()
    try:
        assert _post(rx.endpoint, gzip.compress(body), "application/json", content_encoding="gzip") == (200, b"{}")
    finally:
        rx.stop()
    assert rx.summary()["spans"] == 1


def test_only_accepted_spans_are_counted_and_the_bad_one_is_kept_raw(tmp_path):
    nan = llm_request(span_id="1111111111111111")
    nan["attributes"][1] = {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": "NaN"}}
    rx = OTLPReceiver(tmp_path).start()
    try:
        status, body = _post(rx.endpoint, json.dumps(request(llm_request(), nan)).encode(), "application/json")
        assert status == 200 and json.loads(body)["partialSuccess"]["rejectedSpans"] == "1"
        proto = request_from_json(request(llm_request(span_id="2222222222222222")))[0]
        proto.resource_spans[0].scope_spans[0].spans[0].attributes[1].value.double_value = float("inf")
        status, body = _post(rx.endpoint, proto.SerializeToString(), "application/x-protobuf")
        answer = ExportTraceServiceResponse.FromString(body)
        assert status == 200 and answer.partial_success.rejected_spans == 1
        assert "time_to_first_token" in answer.partial_success.error_message
        assert _post(rx.endpoint, b"{}", "application/json") == (200, b"{}")  # no spans: nothing to count
    finally:
        rx.stop()
    s = rx.summary()
    assert (s["requests"], s["spans"], s["refused_spans"], s["empty_requests"], rx.request_spans_seen) == (1, 1, 2, 1, 3)
    assert [sp.span_id for sp in read_otlp_file(rx.path)[0]] == ["b7ad6b7169203331"]
    refused = [json.loads(x) for x in rx.refused_path.read_text().splitlines()]
    assert [r["span_id"] for r in refused] == ["1111111111111111", "2222222222222222"]
    assert refused[0]["span"] == nan  # as it came
    assert refused[1]["span"]["attributes"][1]["value"] == {"doubleValue": "Infinity"}


def test_a_span_sent_twice_is_kept_once_in_the_counts(tmp_path):
    rx = OTLPReceiver(tmp_path).start()
    body = json.dumps(request(llm_request())).encode()
    try:
        assert _post(rx.endpoint, body, "application/json")[0] == _post(rx.endpoint, body, "application/json")[0] == 200
    finally:
        rx.stop()
    s = rx.summary()
    assert (s["requests"], s["spans"], s["duplicate_spans"], rx.request_spans_seen) == (2, 1, 1, 1)


def test_a_request_after_stop_is_refused_and_not_kept(tmp_path):
    rx = OTLPReceiver(tmp_path).start()
    rx._closed = True  # as stop() leaves it for a handler still reading its body
    try:
        assert _post(rx.endpoint, json.dumps(request(llm_request())).encode(), "application/json")[0] == 503
    finally:
        rx.stop()
    assert not rx.path.exists() and rx.summary()["spans"] == 0
