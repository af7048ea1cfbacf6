"""OTLP trace payloads: decoding (protobuf or OTLP/JSON) and flattening into plain span records.

Decoding goes through `opentelemetry-proto`'s ExportTraceServiceRequest. OTLP/JSON spells trace and
span ids in hex (not protobuf-JSON's base64), so ids are converted both ways here. A flattened span
keeps every attribute (scalars, arrays, key-value lists, bytes as hex) and its resource's and
scope's attributes: nothing a sender says is dropped, whatever the span's name.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ID_FIELDS = ("traceId", "spanId", "parentSpanId")
SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}


class OtlpDecodeError(ValueError):
    """A payload that is not an ExportTraceServiceRequest; the message says which part failed."""


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


def _walk_ids(obj, convert) -> None:
    """Convert the id fields of every span, span link and span event in an OTLP/JSON dict in place."""
    for rs in obj.get("resourceSpans", []) or []:
        for ss in rs.get("scopeSpans", []) or []:
            for sp in ss.get("spans", []) or []:
                for key in ID_FIELDS:
                    if sp.get(key):
                        sp[key] = convert(sp[key], key)
                for link in sp.get("links", []) or []:
                    for key in ("traceId", "spanId"):
                        if link.get(key):
                            link[key] = convert(link[key], key)


def _hex_to_b64(value: str, key: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except (ValueError, TypeError) as exc:
        raise OtlpDecodeError(f"{key}: {value!r} is not hex ({exc})") from None


def _b64_to_hex(value: str, key: str) -> str:
    return base64.b64decode(value).hex()


def request_from_json(obj: dict) -> ExportTraceServiceRequest:
    """An OTLP/JSON ExportTraceServiceRequest (hex ids) as the protobuf message."""
    if not isinstance(obj, dict):
        raise OtlpDecodeError(f"expected a JSON object, got {type(obj).__name__}")
    obj = json.loads(json.dumps(obj))  # a private copy: ids are rewritten in place
    _walk_ids(obj, _hex_to_b64)
    try:
        return json_format.ParseDict(obj, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise OtlpDecodeError(f"not an ExportTraceServiceRequest: {exc}") from None


def decode_body(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """An OTLP/HTTP request body: application/x-protobuf or application/json."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype == "application/json":
        try:
            return request_from_json(json.loads(body))
        except ValueError as exc:
            if isinstance(exc, OtlpDecodeError):
                raise
            raise OtlpDecodeError(f"body is not JSON: {exc}") from None
    if ctype in ("application/x-protobuf", "application/protobuf", ""):
        req = ExportTraceServiceRequest()
        try:
            req.ParseFromString(body)
        except Exception as exc:  # protobuf's DecodeError
            raise OtlpDecodeError(f"body is not an ExportTraceServiceRequest protobuf: {exc}") from None
        return req
    raise OtlpDecodeError(f"unsupported content-type {content_type!r} (application/x-protobuf or application/json)")


def request_to_json_line(req: ExportTraceServiceRequest) -> str:
    """One line of the OpenTelemetry Collector's file exporter: OTLP/JSON with hex ids."""
    obj = json_format.MessageToDict(req)
    _walk_ids(obj, _b64_to_hex)
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


def flatten(req: ExportTraceServiceRequest) -> list[Span]:
    """Every span of the request, with its resource's and scope's attributes."""
    out = []
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append(Span(
                    trace_id=sp.trace_id.hex(), span_id=sp.span_id.hex(),
                    parent_span_id=sp.parent_span_id.hex() or None, name=sp.name,
                    kind=SPAN_KINDS.get(sp.kind, str(sp.kind)),
                    start_unix_ns=int(sp.start_time_unix_nano), end_unix_ns=int(sp.end_time_unix_nano),
                    attributes=_attrs(sp.attributes), resource=resource, scope=ss.scope.name,
                    scope_version=ss.scope.version, status=STATUS_CODES.get(sp.status.code, str(sp.status.code)),
                    status_message=sp.status.message,
                    events=[(e.name, int(e.time_unix_nano), _attrs(e.attributes)) for e in sp.events]))
    return out
