"""`inferledger import --from otlp` checks every span field it uses before it writes anything: a bad
value is refused as FILE:LINE with the span and the field (exit 2, nothing at --out); with --lenient
the bad spans become gap rows, kept as they came in otlp/refused.jsonl, and the rest is imported. A
span sent twice is counted once, with a gap naming the copy."""
import copy
import json

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.evidence import otlp_import
from inferledger.ledger.query import open_ledger
from inferledger.ledger.reconstruct import reconstruct
from test_otlp_decode import T, _kv, llm_request, request


def _attr(span, key, **value):
    """`span` with attribute `key` set to the AnyValue `value` (replaced, or added)."""
    span = copy.deepcopy(span)
    span["attributes"] = [a for a in span["attributes"] if a["key"] != key] + [_kv(key, **value)]
    return span


def _good(i):
    return llm_request(request_id=f"chatcmpl-t{i}:A1", trace_id=f"{i:032x}", span_id=f"{i + 1:016x}")


def _import(tmp_path, lines, *extra):
    f = tmp_path / "traces.jsonl"
    f.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["import", "--from", "otlp", str(f), "--out", str(out), *extra])
    return f, out, res


def _refused(res, f, line, *words):
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)  # a clear refusal, no traceback
    text = " ".join(res.output.split())
    assert f"{f}:{line}:" in text, text
    for w in words:
        assert w in text, (w, text)


LAT = "gen_ai.latency."
BAD_FIELDS = [
    ("ttft-nan", LAT + "time_to_first_token", {"doubleValue": "NaN"}),
    ("ttft-inf", LAT + "time_to_first_token", {"doubleValue": "Infinity"}),
    ("e2e-minus-inf", LAT + "e2e", {"doubleValue": "-Infinity"}),
    ("ttft-string", LAT + "time_to_first_token", {"stringValue": "0.25"}),
    ("ttft-negative", LAT + "time_to_first_token", {"doubleValue": -1.0}),
    ("queue-bool", LAT + "time_in_queue", {"boolValue": True}),
    ("inference-nan", LAT + "time_in_model_inference", {"doubleValue": "NaN"}),
    ("decode-past-int64", LAT + "time_in_model_decode", {"doubleValue": 1e12}),
    ("tokens-float", "gen_ai.usage.completion_tokens", {"doubleValue": 7.0}),
    ("tokens-negative", "gen_ai.usage.completion_tokens", {"intValue": "-5"}),
    ("tokens-huge", "gen_ai.usage.completion_tokens", {"intValue": str(2**62)}),
    ("prompt-string", "gen_ai.usage.prompt_tokens", {"stringValue": "64"}),
    ("request-id-int", "gen_ai.request.id", {"intValue": "7"}),
]


@pytest.mark.parametrize("case,key,value", BAD_FIELDS, ids=[c[0] for c in BAD_FIELDS])
def test_a_bad_field_of_a_span_is_refused_by_line_span_and_field(tmp_path, case, key, value):
    bad = _attr(_good(2), key, **value)
    f, out, res = _import(tmp_path, [json.dumps(request(_good(1))), json.dumps(request(bad))])
    _refused(res, f, 2, key, bad["spanId"], "nothing was written")
    assert not out.exists() and list(tmp_path.iterdir()) == [f]


@pytest.mark.parametrize("field,value", [("startTimeUnixNano", str(2**64 - 1)), ("endTimeUnixNano", str(2**64 - 1)),
                                         ("endTimeUnixNano", str(T - 1)), ("spanId", ""), ("traceId", "00" * 16)])
def test_a_span_time_or_id_the_run_cannot_hold_is_refused(tmp_path, field, value):
    bad = dict(_good(2), **{field: value})
    f, out, res = _import(tmp_path, [json.dumps(request(_good(1))), json.dumps(request(bad))])
    _refused(res, f, 2, field)
    assert not out.exists()


@pytest.mark.parametrize("body,words", [
    ('{"resourceSpans": [{"scopeSpans": [{"spans": 5}]}]}', ["spans", "expected a list"]),
    ('{"resourceSpans": 5}', ["resourceSpans", "expected a list"]),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [5]}]}]}', ["spans[0]", "expected an object"]),
    ('{"resourceSpans": [7]}', ["resourceSpans[0]", "expected an object"]),
    ("[1, 2]", ["expected a JSON object"]),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": NaN}]}]}]}', ["spans[0]"]),
])
def test_wrong_json_types_are_refused_by_line(tmp_path, body, words):
    f, out, res = _import(tmp_path, [json.dumps(request(_good(1))), body])
    _refused(res, f, 2, *words)
    assert not out.exists()


def test_deeply_nested_json_is_refused_by_line(tmp_path):
    f, out, res = _import(tmp_path, [json.dumps(request(_good(1))), "[" * 100_000 + "]" * 100_000])
    _refused(res, f, 2, "nested")
    assert not out.exists()
    deep = {"stringValue": "x"}
    for _ in range(40):  # protobuf reads it, but a kept attribute this deep is refused by its key
        deep = {"kvlistValue": {"values": [{"key": "k", "value": deep}]}}
    f, out, res = _import(tmp_path, [json.dumps(request(_attr(_good(1), "x.deep", **deep)))])
    _refused(res, f, 1, "x.deep", "nested")


def test_invalid_utf8_is_refused_by_line(tmp_path):
    f = tmp_path / "traces.jsonl"
    f.write_bytes(json.dumps(request(_good(1))).encode() + b"\n" + b'{"resourceSpans": [\xff\xfe]}\n')
    res = CliRunner().invoke(app, ["import", "--from", "otlp", str(f), "--out", str(tmp_path / "run")])
    _refused(res, f, 2, "UTF-8")
    assert not (tmp_path / "run").exists()


def test_every_bad_line_is_named_not_only_the_first(tmp_path):
    bad_a = _attr(_good(2), LAT + "e2e", doubleValue="NaN")
    bad_b = _attr(_good(3), "gen_ai.usage.completion_tokens", doubleValue=7.0)
    f, out, res = _import(tmp_path, [json.dumps(request(bad_a)), json.dumps(request(_good(1))), json.dumps(request(bad_b))])
    _refused(res, f, 1, LAT + "e2e")
    _refused(res, f, 3, "gen_ai.usage.completion_tokens")


def test_lenient_imports_the_rest_and_keeps_each_bad_span_raw_with_a_gap(tmp_path):
    bad = _attr(_good(2), LAT + "time_to_first_token", doubleValue="NaN")
    f, out, res = _import(tmp_path, [json.dumps(request(_good(1), bad)), "not json"], "--lenient")
    assert res.exit_code == 0, res.output
    refused = [json.loads(x) for x in (out / "otlp" / "refused.jsonl").read_text().splitlines()]
    assert [(r["line"], r["span_id"]) for r in refused] == [(1, bad["spanId"]), (2, None)]
    assert refused[0]["span"] == bad and LAT + "time_to_first_token" in refused[0]["reason"]
    assert refused[1]["text"] == "not json"
    reconstruct(out)
    with open_ledger(out) as led:
        assert led.rows("select attempt_id from reported_spans")[1] == [("t1:A1",)]
        gaps = led.rows("select gap_id, subject_id from gaps where gap_id like 'otlp:refused:%' order by 1")[1]
        assert gaps == [("otlp:refused:1", bad["spanId"]), ("otlp:refused:2", None)]
    manifest = json.loads((out / "manifest.json").read_text())["engine_evidence"]["spans"]
    assert (manifest["spans"], manifest["refused_spans"], manifest["refused_lines"], manifest["joined"]) == (1, 1, 1, 1)


def test_a_span_sent_three_times_is_one_request_with_one_gap(tmp_path):
    line = json.dumps(request(_good(1)))
    f, out, res = _import(tmp_path, [line, json.dumps(request(_good(2))), line, line])
    assert res.exit_code == 0, res.output
    reconstruct(out)
    with open_ledger(out) as led:
        rows = led.rows("select attempt_id, server_status, n_output_tokens from attempts order by 1")[1]
        assert rows == [("t1:A1", "completed", 11), ("t2:A1", "completed", 11)]  # 11 tokens, not 33
        gaps = led.rows("select gap_id, detail from gaps where gap_id like 'otlp:%'")[1]
        assert len(gaps) == 1 and gaps[0][0] == f"otlp:duplicate:{_good(1)['spanId']}"
        assert "3 copies" in gaps[0][1] and "identical" in gaps[0][1]
        (n, distinct), = led.rows("select count(*), count(distinct gap_id) from gaps")[1]
        assert n == distinct  # no gap id repeated
    spans = json.loads((out / "manifest.json").read_text())["engine_evidence"]["spans"]
    assert (spans["spans"], spans["llm_request_spans"], spans["duplicate_spans"]) == (2, 2, 2)


def test_a_copy_that_differs_keeps_the_first_and_says_so(tmp_path):
    other = _attr(_good(1), "gen_ai.usage.completion_tokens", intValue="5")
    f, out, res = _import(tmp_path, [json.dumps(request(_good(1))), json.dumps(request(other))])
    assert res.exit_code == 0, res.output
    reconstruct(out)
    with open_ledger(out) as led:
        assert led.rows("select n_output_tokens from attempts")[1] == [(11,)]
        (detail,) = led.rows("select detail from gaps where gap_id like 'otlp:duplicate:%'")[1][0]
        assert "2 copies" in detail and "differ" in detail and "line 1" in detail


def test_an_import_that_fails_after_writing_leaves_nothing_and_can_be_rerun(tmp_path, monkeypatch):
    lines = [json.dumps(request(_good(i))) for i in range(1, 4)]

    def fail(self, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(otlp_import.RunWriter, "close", fail)
    f, out, res = _import(tmp_path, lines)
    assert res.exit_code == 2 and "No space left" in res.output
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["traces.jsonl"]
    monkeypatch.undo()
    res = CliRunner().invoke(app, ["import", "--from", "otlp", str(f), "--out", str(out)])
    assert res.exit_code == 0, res.output
    reconstruct(out)
    with open_ledger(out) as led:
        assert led.rows("select count(*) from reported_spans")[1] == [(3,)]


def _strict(text):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_a_nan_in_a_vendor_attribute_is_kept_as_strict_json(tmp_path):
    span = _attr(_good(1), "x.vendor.ratio", doubleValue="NaN")
    f, out, res = _import(tmp_path, [json.dumps(request(span))])
    assert res.exit_code == 0, res.output
    reconstruct(out)
    with open_ledger(out) as led:
        (attrs,), = led.rows("select attrs from events where name = 'server.received'")[1]
    assert _strict(attrs)["otel"]["x.vendor.ratio"] == "NaN"  # OTLP/JSON's own spelling, readable by any reader
