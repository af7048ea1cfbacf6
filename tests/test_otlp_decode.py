"""OTLP decoding and vLLM span mapping, on a small hand-made span whose every time is worked out by hand.

The span: arrival at T = 1764578400 s (Unix), time_to_first_token 0.25 s, time_in_queue 0.05 s,
time_in_model_prefill 0.125 s, time_in_model_decode 1.0 s, e2e 1.5 s, 64 prompt / 11 output tokens.
So: first token T+250 ms; scheduled = first - prefill = T+125 ms; enqueued = scheduled - queue =
T+75 ms; the other 10 tokens by first + decode = T+1250 ms; finished = T+1500 ms.
"""
import copy
import json

import pytest

from inferledger.collectors.evidence.otlp_decode import OtlpDecodeError, decode_body, flatten, request_to_json_line
from inferledger.collectors.evidence.otlp_decode import request_from_json as _from_json
from inferledger.collectors.evidence.otlp_file import read_otlp_file
from inferledger.collectors.evidence.trace_context import trace_ids_for, traceparent_for
from inferledger.collectors.evidence.vllm_spans import map_spans

T = 1764578400 * 10**9
MS = 10**6


def _kv(key, **value):
    return {"key": key, "value": value}


def llm_request(request_id="chatcmpl-t1:A1", trace_id="0af7651916cd43dd8448eb211c80319c", span_id="b7ad6b7169203331"):
    return {"traceId": trace_id, "spanId": span_id, "parentSpanId": "00f067aa0ba902b7", "name": "llm_request",
            "kind": 2, "startTimeUnixNano": str(T), "endTimeUnixNano": str(T + 1501 * MS),
            "attributes": [_kv("gen_ai.request.id", stringValue=request_id),
                           _kv("gen_ai.latency.time_to_first_token", doubleValue=0.25),
                           _kv("gen_ai.latency.time_in_queue", doubleValue=0.05),
                           _kv("gen_ai.latency.time_in_model_prefill", doubleValue=0.125),
                           _kv("gen_ai.latency.time_in_model_decode", doubleValue=1.0),
                           _kv("gen_ai.latency.e2e", doubleValue=1.5),
                           _kv("gen_ai.usage.prompt_tokens", intValue="64"),
                           _kv("gen_ai.usage.completion_tokens", intValue="11"),
                           _kv("x.vendor.list", arrayValue={"values": [{"intValue": "1"}, {"stringValue": "a"}]})]}


def request(*spans):
    return {"resourceSpans": [{"resource": {"attributes": [_kv("service.name", stringValue="vllm")]},
                               "scopeSpans": [{"scope": {"name": "vllm.tracing", "version": "x"}, "spans": list(spans)}]}]}


def request_from_json(obj):
    req, refused = _from_json(obj)
    assert refused == []
    return req


def test_json_decodes_with_hex_ids_and_every_attribute():
    (sp,) = flatten(request_from_json(request(llm_request())))
    assert (sp.trace_id, sp.span_id, sp.parent_span_id) == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331",
                                                            "00f067aa0ba902b7")
    assert (sp.name, sp.kind, sp.start_unix_ns, sp.end_unix_ns) == ("llm_request", "SERVER", T, T + 1501 * MS)
    assert sp.attributes["gen_ai.usage.completion_tokens"] == 11
    assert sp.attributes["x.vendor.list"] == [1, "a"]  # an attribute nobody asked for is kept
    assert sp.resource == {"service.name": "vllm"} and sp.scope == "vllm.tracing"


def test_protobuf_and_file_line_round_trip():
    req = request_from_json(request(llm_request()))
    again, refused = decode_body(req.SerializeToString(), "application/x-protobuf")
    assert again == req and refused == []
    line = json.loads(request_to_json_line(again))  # the file exporter's hex ids, not base64
    assert line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] == "0af7651916cd43dd8448eb211c80319c"
    assert request_from_json(line) == req


def test_bad_bodies_are_refused_with_a_reason():
    req, refused = _from_json(request(llm_request(trace_id="zz"), llm_request(span_id="1111111111111111")))
    assert [sp.span_id for sp in flatten(req)] == ["1111111111111111"]  # the good span of the request stays
    assert len(refused) == 1 and "traceId" in refused[0].reason and "not hex" in refused[0].reason
    assert refused[0].span["traceId"] == "zz"  # kept as it came
    with pytest.raises(OtlpDecodeError, match="content-type"):
        decode_body(b"{}", "text/plain")
    with pytest.raises(OtlpDecodeError, match="not JSON"):
        decode_body(b"{", "application/json")
    with pytest.raises(OtlpDecodeError, match="nested deeper"):
        decode_body(b"[" * 100_000, "application/json")


def _rows(join):
    return [(r["name"], r["ts_ns"] - T, r["value"]) for r in join.rows]


def test_llm_request_maps_to_reported_events_at_hand_computed_times():
    spans = flatten(request_from_json(request(llm_request())))
    join = map_spans(spans, run_id="r", host="h1", reporter="vllm-0.32.0",
                     attempts={"t1:A1": {"task_id": "t1", "request_id": "t1", "session_id": None}})
    assert _rows(join) == [("server.received", 0, None), ("engine.enqueued", 75 * MS, 64.0),
                           ("engine.scheduled", 125 * MS, None), ("engine.token", 250 * MS, 1.0),
                           ("engine.token", 1250 * MS, 10.0), ("engine.finished", 1500 * MS, 11.0)]
    for r in join.rows:
        attrs = json.loads(r["attrs"])
        assert (attrs["evidence"], attrs["reporter"], r["clock"], r["attempt_id"], r["task_id"]) == \
            ("reported", "vllm-0.32.0", "wall:h1", "t1:A1", "t1")
    received = json.loads(join.rows[0]["attrs"])
    assert received["joined_by"] == "gen_ai.request.id" and received["otel"]["x.vendor.list"] == [1, "a"]
    assert json.loads(join.rows[4]["attrs"])["aggregate"] is True
    assert (join.joined, join.gaps) == (1, [])


def test_join_by_traceparent_and_the_two_kinds_of_gap():
    trace_id, _ = trace_ids_for("t2:A1", "run-x")
    assert traceparent_for("t2:A1", "run-x") == f"00-{trace_id}-{trace_ids_for('t2:A1', 'run-x')[1]}-01"
    by_trace = llm_request(request_id="chatcmpl-vllm-random-id", trace_id=trace_id, span_id="1111111111111111")
    stray = llm_request(request_id="chatcmpl-nobody", trace_id="ab" * 16, span_id="2222222222222222")
    other = {"traceId": trace_id, "spanId": "3333333333333333", "name": "custom_op", "kind": 1,
             "startTimeUnixNano": str(T), "endTimeUnixNano": str(T + 5 * MS),
             "attributes": [_kv("custom.key", boolValue=True)]}
    attempts = {"t2:A1": {"task_id": "t2"}, "t3:A1": {"task_id": "t3"}}
    join = map_spans(flatten(request_from_json(request(by_trace, stray, other))), run_id="r", host="h",
                     reporter="vllm-0.32.0", attempts=attempts, trace_salt="run-x")
    assert join.joined == 1 and join.joined_by == {"traceparent": 1}
    assert sorted(g["gap_id"] for g in join.gaps) == ["otlp:no-span:t3:A1", "otlp:unjoined:2222222222222222"]
    stray_rows = {r["attempt_id"] for r in join.rows if json.loads(r["attrs"])["span_id"] == "2222222222222222"}
    assert stray_rows == {"otlp:2222222222222222"}  # kept as a server-only attempt, not dropped
    custom = [r for r in join.rows if r["name"] in ("span.start", "span.end")]
    assert [(r["name"], r["attempt_id"], r["ts_ns"] - T) for r in custom] == [("span.start", "t2:A1", 0),
                                                                              ("span.end", "t2:A1", 5 * MS)]
    assert json.loads(custom[0]["attrs"])["otel"] == {"custom.key": True}


def test_conflicting_ids_join_nothing():
    trace_id, _ = trace_ids_for("t2:A1", "s")
    span = llm_request(request_id="chatcmpl-t3:A1", trace_id=trace_id)
    join = map_spans(flatten(request_from_json(request(span))), run_id="r", host="h", reporter="v",
                     attempts={"t2:A1": {}, "t3:A1": {}}, trace_salt="s")
    assert join.joined == 0 and any(g["gap_id"].startswith("otlp:conflict:") for g in join.gaps)


def test_a_file_with_a_bad_line_names_it(tmp_path):
    good = json.dumps(request(llm_request()))
    broken = copy.deepcopy(request(llm_request()))
    broken["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "not-hex"
    f = tmp_path / "traces.jsonl"
    f.write_text(good + "\n\n" + json.dumps(broken) + "\n")
    spans, refusals = read_otlp_file(f)
    assert len(spans) == 1 and spans[0].line == 1
    assert [(r.line, r.span_id) for r in refusals] == [(3, "not-hex")] and "spanId" in refusals[0].reason
    f.write_text(good + "\n")
    assert len(read_otlp_file(f)[0]) == 1 and read_otlp_file(f)[1] == []


def test_a_missing_span_names_the_server_the_target_answered_as():
    """vLLM's own setting only for a vLLM; another server (or one that did not say) is told it is no vLLM."""
    attempts = {"t3:A1": {"task_id": "t3"}}

    def needs(reporter: str) -> str:
        join = map_spans([], run_id="r", host="h", reporter=reporter, attempts=attempts)
        (gap,) = join.gaps
        assert gap["gap_id"] == "otlp:no-span:t3:A1"
        return gap["needs"]
    assert needs("vllm-0.32.0").startswith("vLLM's llm_request span for this attempt (serve with --otlp-traces-endpoint")
    assert needs("llamacpp-b6000").startswith("an llm_request span for this attempt: the target answered as "
                                              "llamacpp-b6000, not vLLM,")
    unknown = needs("unknown")
    assert "did not say what it is (no GET /version or /props), not vLLM" in unknown and "vLLM's llm_request" not in unknown
