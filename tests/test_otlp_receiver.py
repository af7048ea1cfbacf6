"""The loopback OTLP receiver fed by the real OpenTelemetry SDK exporter (protobuf over HTTP), by
OTLP/JSON, and by garbage; and `inferledger import --from otlp` rebuilt into a ledger whose figures
are worked out by hand (the span of tests/test_otlp_decode.py)."""
import json
import urllib.error
import urllib.request

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.otlp_receiver import OTLPReceiver
from inferledger.collectors.vllm_spans import read_otlp_file
from inferledger.ledger.query import open_ledger
from inferledger.ledger.reconstruct import reconstruct
from test_otlp_decode import T, llm_request, request


def test_sdk_exporter_protobuf_lands_as_a_file_line(tmp_path):
    rx = OTLPReceiver(tmp_path).start()
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "engine-under-test"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=rx.endpoint)))
        span = provider.get_tracer("t").start_span("llm_request", kind=SpanKind.SERVER, start_time=T,
                                                  attributes={"gen_ai.request.id": "chatcmpl-a:A1", "odd": [1.5, 2.5]})
        span.end(end_time=T + 7)
        provider.shutdown()
        assert rx.summary()["spans"] == 1 and rx.summary()["span_names"] == ["llm_request"]
    finally:
        rx.stop()
    (sp,) = read_otlp_file(rx.path)
    assert (sp.name, sp.kind, sp.start_unix_ns, sp.end_unix_ns) == ("llm_request", "SERVER", T, T + 7)
    assert sp.attributes == {"gen_ai.request.id": "chatcmpl-a:A1", "odd": [1.5, 2.5]}
    assert sp.resource["service.name"] == "engine-under-test"


def _post(url, body: bytes, ctype: str):
    req = urllib.request.Request(url, data=body, headers={"content-type": ctype}, method="POST")
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
    assert [s.span_id for s in read_otlp_file(rx.path)] == ["b7ad6b7169203331"]
    refused = [json.loads(x) for x in (tmp_path / "otlp" / "refused.jsonl").read_text().splitlines()]
    assert len(refused) == 1 and refused[0]["bytes"] == 9


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
