"""`inferledger import --from otlp FILE`: spans gathered elsewhere as a server-side run directory.

FILE is what the OpenTelemetry Collector's file exporter writes (one ExportTraceServiceRequest as
OTLP/JSON a line, hex ids), or `otlp/traces.jsonl` of a capture. vLLM's `llm_request` spans become
reported server / engine events (collectors.vllm_spans) with the attempt id vLLM names
(`chatcmpl-<x-request-id>` -> x-request-id), so a client run that sent those ids joins them; any
other span is kept as a span.start / span.end pair. Times are Unix ns on `wall:<host>`.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from inferledger.collectors.out_dir import check_new_run_dir
from inferledger.collectors.vllm_spans import map_spans, read_otlp_file
from inferledger.collectors.writer import RunWriter, write_table_atomic
from inferledger.probes.events import GAP_SCHEMA
from inferledger.probes.probe import wall_clock


@dataclass
class OtlpImportResult:
    run_id: str
    out: Path
    spans: int
    request_spans: int
    events: int
    host: str
    reporter: str


def _guess(spans, key: str) -> str | None:
    for sp in spans:
        v = sp.resource.get(key)
        if isinstance(v, str) and v:
            return v
    return None


def import_otlp(path: str | Path, out: str | Path, *, run_id: str | None = None, host: str | None = None,
                reporter: str | None = None) -> OtlpImportResult:
    """Raises OtlpFileError (file:line: reason), FileNotFoundError or OutDirError; writes nothing then."""
    path, out = Path(path), Path(out)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    check_new_run_dir(out)
    spans = read_otlp_file(path)  # every line decodes before anything is written
    host = host or _guess(spans, "host.name") or "otlp-source"
    service = _guess(spans, "service.name")
    reporter = reporter or (f"{service}-{_guess(spans, 'service.version')}" if service and _guess(spans, "service.version")
                            else service or "otlp")
    writer = RunWriter(out, run_id=run_id)
    join = map_spans(spans, run_id=writer.run_id, host=host, reporter=reporter, attempts=None)
    for row in join.rows:
        writer.emit(row)
    writer.clock_domain(wall_clock(host), host=host, kind="wall")
    (out / "otlp").mkdir(exist_ok=True)
    shutil.copyfile(path, out / "otlp" / "traces.jsonl")  # the raw evidence beside what was made of it
    write_table_atomic(pa.Table.from_pylist(join.gaps, schema=GAP_SCHEMA), out / "gaps.parquet")
    writer.write_manifest({"source": "inferledger import --from otlp", "file": str(path), "host": host,
                           "engine_evidence": {"reporter": reporter, "spans": {**join.summary(),
                                               "clock": wall_clock(host), "evidence": "reported"}}})
    writer.close()
    return OtlpImportResult(writer.run_id, out, join.spans, join.request_spans, len(join.rows), host, reporter)
