"""`inferledger import --from otlp FILE`: spans gathered elsewhere as a server-side run directory.

FILE is what the OpenTelemetry Collector's file exporter writes (one ExportTraceServiceRequest as
OTLP/JSON a line, hex ids), or `otlp/traces.jsonl` of a capture. vLLM's `llm_request` spans become
reported server / engine events (collectors.evidence.vllm_spans) with the attempt id vLLM names
(`chatcmpl-<x-request-id>` -> x-request-id), so a client run that sent those ids joins them; any
other span is kept as a span.start / span.end pair. Times are Unix ns on `wall:<host>`.

Every line and every field the mapping uses is checked before anything is written (collectors.
otlp_file): a refusal names the file, line, span and field, and nothing is written; with `lenient`
the refused spans and lines go to `otlp/refused.jsonl`, one gap row each, and the rest is imported.
The run is built in a hidden folder beside `out` and renamed into place only once it is whole.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from inferledger.collectors.evidence.otlp_checks import dumps
from inferledger.collectors.evidence.otlp_file import OtlpFileError, read_otlp_file, refused_gaps
from inferledger.collectors.rundir.out_dir import building_run_dir, check_new_run_dir
from inferledger.collectors.evidence.vllm_spans import map_spans
from inferledger.collectors.rundir.writer import RunWriter, write_table_atomic
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
    refused: int = 0


def _guess(spans, key: str) -> str | None:
    for sp in spans:
        v = sp.resource.get(key)
        if isinstance(v, str) and v:
            return v
    return None


def import_otlp(path: str | Path, out: str | Path, *, run_id: str | None = None, host: str | None = None,
                reporter: str | None = None, lenient: bool = False) -> OtlpImportResult:
    """Raises OtlpFileError (file:line: span: field), FileNotFoundError or OutDirError; writes nothing then."""
    path, out = Path(path), Path(out)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    check_new_run_dir(out)
    spans, refusals = read_otlp_file(path)  # every line is read and checked before anything is written
    if refusals and not lenient:
        raise OtlpFileError(path, refusals)
    host = host or _guess(spans, "host.name") or "otlp-source"
    service, version = _guess(spans, "service.name"), _guess(spans, "service.version")
    reporter = reporter or (f"{service}-{version}" if service and version else service or "otlp")
    records = [r.record() for r in refusals]
    with building_run_dir(out) as staging:
        writer = RunWriter(staging, run_id=run_id or out.name)
        join = map_spans(spans, run_id=writer.run_id, host=host, reporter=reporter, attempts=None)
        for row in join.rows:
            writer.emit(row)
        writer.clock_domain(wall_clock(host), host=host, kind="wall")
        (staging / "otlp").mkdir()
        shutil.copyfile(path, staging / "otlp" / "traces.jsonl")  # the raw evidence beside what was made of it
        if records:
            (staging / "otlp" / "refused.jsonl").write_text("".join(dumps(r) + "\n" for r in records))
        gaps = join.gaps + refused_gaps(writer.run_id, records, "otlp/refused.jsonl")
        write_table_atomic(pa.Table.from_pylist(gaps, schema=GAP_SCHEMA), staging / "gaps.parquet")
        summary = {**join.summary(), "refused_spans": sum(r.span is not None for r in refusals),
                   "refused_lines": sum(r.span is None for r in refusals)}
        writer.write_manifest({"source": "inferledger import --from otlp", "file": str(path), "host": host,
                               "engine_evidence": {"reporter": reporter, "spans": {
                                   **summary, "clock": wall_clock(host), "evidence": "reported"}}})
        writer.close()
    return OtlpImportResult(writer.run_id, out, join.spans, join.request_spans, len(join.rows), host, reporter,
                            len(refusals))
