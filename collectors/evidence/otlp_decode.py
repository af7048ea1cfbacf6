"""OTLP trace payloads: decoding (protobuf or OTLP/JSON, gzip) and flattening into plain span records.

Decoding goes through `opentelemetry-proto`'s ExportTraceServiceRequest. OTLP/JSON spells trace and
span ids in hex (not protobuf-JSON's base64), so ids are converted both ways here. OTLP/JSON is read
one span at a time: a span that does not parse is refused alone (`RefusedSpan`, kept as it came) and
the request keeps its other spans; a request whose shape above the spans is wrong is refused whole
(OtlpDecodeError, the path named). Spans whose fields a run cannot hold (collectors.evidence.otlp_checks)
are refused the same way, from JSON and protobuf alike. A flattened span keeps every attribute (scalars, arrays,
key-value lists, bytes as hex) and its resource's and scope's attributes.
"""
from __future__ import annotations

import base64
import json
import re
import zlib
from dataclasses import dataclass, field

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanMessage

from inferledger.collectors.evidence.otlp_checks import json_attribute_problem, json_safe, span_problem

ID_FIELDS = ("traceId", "spanId", "parentSpanId")
SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}


class OtlpDecodeError(ValueError):
    """A payload that is not an ExportTraceServiceRequest; the message says which part failed."""


class BodyTooLarge(OtlpDecodeError):
    """A body over the byte bound (after decompression)."""


@dataclass
class RefusedSpan:
    span_id: str | None  # as sent (hex), when it could be read
    reason: str
    span: dict  # the span as OTLP/JSON (hex ids), as it came


@dataclass
class Span:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str | None
    name: str
    kind: str
    start_unix_ns: int
    end_unix_ns: int
    attributes: dict = field(default_factory=dict)
    resource: dict = field(default_factory=dict)
    scope: str = ""
    scope_version: str = ""
    status: str = "UNSET"
    status_message: str = ""
    events: list = field(default_factory=list)  # [(name, unix_ns, attributes)]
    line: int | None = field(default=None, compare=False)  # its line in a file, where read from one


def _convert_ids(sp: dict, convert) -> dict:
    """A copy of one span dict with its ids (and its links') converted."""
    sp = dict(sp)
    for key in ID_FIELDS:
        if sp.get(key):
            sp[key] = convert(sp[key], key)
    if isinstance(sp.get("links"), list):
        sp["links"] = [{**ln, **{k: convert(ln[k], f"links.{k}") for k in ("traceId", "spanId") if ln.get(k)}}
                       if isinstance(ln, dict) else ln for ln in sp["links"]]
    return sp


def _hex_to_b64(value, key: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except (ValueError, TypeError) as exc:
        raise OtlpDecodeError(f"{key}: {value!r} is not hex ({exc})") from None


def _b64_to_hex(value: str, key: str) -> str:
    return base64.b64decode(value).hex()


def _list(obj: dict, key: str, where: str) -> list:
    value = obj.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpDecodeError(f"{where}{key}: expected a list, got {type(value).__name__}")
    return value


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise OtlpDecodeError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _parse(obj: dict, message, where: str):
    try:
        return json_format.ParseDict(obj, message, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, TypeError, ValueError) as exc:
        # protobuf nests one "Failed to parse X field" per level: name the first field and the real cause
        field_name = re.match(r"Failed to parse (\w+) field", str(exc))
        cause = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise OtlpDecodeError(f"{where}: " + (f"field {field_name.group(1)}: " if field_name else "") +
                              str(cause)[:300]) from None


def request_from_json(obj) -> tuple[ExportTraceServiceRequest, list[RefusedSpan]]:
    """An OTLP/JSON ExportTraceServiceRequest (hex ids) as the protobuf message holding the spans a run can
    hold, and the spans refused (each as it came)."""
    if not isinstance(obj, dict):
        raise OtlpDecodeError(f"expected a JSON object, got {type(obj).__name__}")
    req, refused = ExportTraceServiceRequest(), []
    for i, rs in enumerate(_list(obj, "resourceSpans", "")):
        where = f"resourceSpans[{i}]"
        rs = _object(rs, where)
        out_rs = req.resource_spans.add()
        out_rs.CopyFrom(_parse({k: v for k, v in rs.items() if k != "scopeSpans"}, ResourceSpans(), where))
        for j, ss in enumerate(_list(rs, "scopeSpans", where + ".")):
            where_ss = f"{where}.scopeSpans[{j}]"
            ss = _object(ss, where_ss)
            out_ss = out_rs.scope_spans.add()
            out_ss.CopyFrom(_parse({k: v for k, v in ss.items() if k != "spans"}, ScopeSpans(), where_ss))
            for k, sp in enumerate(_list(ss, "spans", where_ss + ".")):
                where_sp = f"{where_ss}.spans[{k}]"
                try:
                    problem = json_attribute_problem(sp.get("attributes") if isinstance(sp, dict) else None)
                    if problem:
                        raise OtlpDecodeError(problem)
                    msg = _parse(_convert_ids(_object(sp, where_sp), _hex_to_b64), SpanMessage(), where_sp)
                    problem = span_problem(flatten_span(msg, {}, out_ss.scope))
                    if problem:
                        raise OtlpDecodeError(problem)
                    out_ss.spans.append(msg)
                except OtlpDecodeError as exc:
                    sid = sp.get("spanId") if isinstance(sp, dict) and isinstance(sp.get("spanId"), str) else None
                    refused.append(RefusedSpan(sid, str(exc),
                                               json_safe(sp) if isinstance(sp, dict) else {"value": json_safe(sp)}))
    return req, refused


def gunzip(body: bytes, max_bytes: int) -> bytes:
    """A gzip body, refused when it is not gzip or would inflate past `max_bytes`."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise OtlpDecodeError(f"body is not gzip: {exc}") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise BodyTooLarge(f"body inflates past {max_bytes} bytes")
    if not inflater.eof:
        raise OtlpDecodeError("gzip body is truncated")
    return out


def decode_body(body: bytes, content_type: str) -> tuple[ExportTraceServiceRequest, list[RefusedSpan]]:
    """An OTLP/HTTP request body: application/x-protobuf or application/json."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype == "application/json":
        try:
            obj = json.loads(body)
        except RecursionError:
            raise OtlpDecodeError("body is not JSON: nested deeper than the JSON reader allows") from None
        except ValueError as exc:
            raise OtlpDecodeError(f"body is not JSON: {exc}") from None
        return request_from_json(obj)
    if ctype in ("application/x-protobuf", "application/protobuf", ""):
        req = ExportTraceServiceRequest()
        try:
            req.ParseFromString(body)
        except Exception as exc:  # protobuf's DecodeError
            raise OtlpDecodeError(f"body is not an ExportTraceServiceRequest protobuf: {exc}") from None
        return req, drop_bad_spans(req)
    raise OtlpDecodeError(f"unsupported content-type {content_type!r} (application/x-protobuf or application/json)")


def span_to_json(sp) -> dict:
    """One span message as OTLP/JSON with hex ids."""
    return _convert_ids(json_format.MessageToDict(sp), _b64_to_hex)


def request_to_json_line(req: ExportTraceServiceRequest) -> str:
    """One line of the OpenTelemetry Collector's file exporter: OTLP/JSON with hex ids."""
    obj = json_format.MessageToDict(req)
    for rs in obj.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            ss["spans"] = [_convert_ids(sp, _b64_to_hex) for sp in ss.get("spans", [])]
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def any_value(v):
    """An OTLP AnyValue as plain Python (bytes as hex; an unset value as None)."""
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which)


def _attrs(kvs) -> dict:
    return {kv.key: any_value(kv.value) for kv in kvs}


def flatten_span(sp, resource: dict, scope) -> Span:
    return Span(trace_id=sp.trace_id.hex(), span_id=sp.span_id.hex(), parent_span_id=sp.parent_span_id.hex() or None,
                name=sp.name, kind=SPAN_KINDS.get(sp.kind, str(sp.kind)), start_unix_ns=int(sp.start_time_unix_nano),
                end_unix_ns=int(sp.end_time_unix_nano), attributes=_attrs(sp.attributes), resource=resource,
                scope=scope.name, scope_version=scope.version, status=STATUS_CODES.get(sp.status.code, str(sp.status.code)),
                status_message=sp.status.message,
                events=[(e.name, int(e.time_unix_nano), _attrs(e.attributes)) for e in sp.events])


def flatten(req: ExportTraceServiceRequest) -> list[Span]:
    """Every span of the request, with its resource's and scope's attributes."""
    out = []
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            out.extend(flatten_span(sp, resource, ss.scope) for sp in ss.spans)
    return out


def drop_bad_spans(req: ExportTraceServiceRequest) -> list[RefusedSpan]:
    """Take out of `req` (in place) every span a run cannot hold, each with the reason."""
    refused = []
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for i in reversed(range(len(ss.spans))):
                sp = ss.spans[i]
                problem = span_problem(flatten_span(sp, {}, ss.scope))
                if problem:
                    refused.append(RefusedSpan(sp.span_id.hex(), problem, span_to_json(sp)))
                    del ss.spans[i]
    refused.reverse()
    return refused
