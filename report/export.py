"""`inferledger export`: a run's ledger as a Perfetto trace or as OpenTelemetry spans.

    from inferledger.report.export import export_run
    export_run("runs/r1", "perfetto")                          # -> runs/r1/trace.perfetto.json
    export_run("runs/r1", "otlp")                              # -> runs/r1/spans.otlp.jsonl
    export_run("runs/r1", "otlp", endpoint="http://localhost:4318")   # OTLP/HTTP (protobuf)

The JSON-lines file holds one OTLP/JSON `ExportTraceServiceRequest` per line (as the OpenTelemetry
Collector's file exporter writes it and its otlpjsonfile receiver reads it): ids in hex, times in ns.
export_perfetto.py and export_otlp.py say how clocks are placed.
"""
from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from inferledger.report.read import open_run

FORMATS = ("perfetto", "otlp")
DEFAULT_NAMES = {"perfetto": "trace.perfetto.json", "otlp": "spans.otlp.jsonl"}


@dataclass
class ExportResult:
    format: str
    destination: str
    seconds: float
    counts: dict = field(default_factory=dict)


class OtlpJsonLinesExporter(SpanExporter):
    """Each export() call appends one OTLP/JSON ExportTraceServiceRequest line to a file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w", encoding="utf-8")

    def export(self, spans) -> SpanExportResult:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        msg = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        for rs in msg.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    _hex_ids(span)
                    span.setdefault("startTimeUnixNano", "0")  # proto3 JSON leaves out zero values
                    span.setdefault("endTimeUnixNano", "0")
                    for link in span.get("links", []):
                        _hex_ids(link)
        self._f.write(json.dumps(msg, separators=(",", ":")) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if not self._f.closed:
            self._f.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._f.flush()
        return True


def _hex_ids(obj: dict) -> None:
    # protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants trace and span ids in hex
    for key in ("traceId", "spanId", "parentSpanId"):
        if obj.get(key):
            obj[key] = base64.b64decode(obj[key]).hex()


def _traces_url(endpoint: str) -> str:
    u = urlparse(endpoint)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"--endpoint {endpoint!r}: expected an http(s) URL such as http://localhost:4318")
    return endpoint.rstrip("/") + "/v1/traces" if u.path in ("", "/") else endpoint


def export_run(run, fmt: str, out=None, *, endpoint: str | None = None) -> ExportResult:
    """Export `run` (a folder with ledger.duckdb) as `fmt`; OTLP goes to `endpoint` when given, else a file."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if endpoint and fmt != "otlp":
        raise ValueError("--endpoint goes with --format otlp")
    t0 = time.perf_counter()
    rv = open_run(run)
    try:
        if fmt == "perfetto":
            path = Path(out) if out else rv.run_dir / DEFAULT_NAMES[fmt]
            from inferledger.report.export_perfetto import write_trace

            counts = write_trace(rv, path)
            return ExportResult(fmt, str(path), time.perf_counter() - t0, counts)
        from inferledger.report.export_otlp import emit_spans

        if endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter, dest = OTLPSpanExporter(endpoint=_traces_url(endpoint)), _traces_url(endpoint)
        else:
            path = Path(out) if out else rv.run_dir / DEFAULT_NAMES[fmt]
            exporter, dest = OtlpJsonLinesExporter(path), str(path)
        try:
            stats = emit_spans(rv, exporter)
        finally:
            exporter.shutdown()
        return ExportResult(fmt, dest, time.perf_counter() - t0, dict(vars(stats)))
    finally:
        rv.close()
