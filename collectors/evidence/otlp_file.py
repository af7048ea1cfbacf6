"""An OTLP file (the Collector file exporter's: one ExportTraceServiceRequest as OTLP/JSON a line) read
back span by span, with every refusal kept: a line that is not UTF-8, JSON or a request, and a span a
run cannot hold (collectors.evidence.otlp_checks), each with its line and reason. `inferledger import --from
otlp` refuses the file by them (or keeps them as gaps with --lenient); capture and the recorded
samples read the receiver's file the same way. Refusals are kept as `otlp/refused.jsonl` records,
each of which is one gap row.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inferledger.collectors.evidence.otlp_decode import OtlpDecodeError, Span, flatten, request_from_json

REFUSED_NEEDS = "spans whose ids, times and llm_request fields follow OTLP and vLLM's tracing (docs/EVENTS.md)"


@dataclass
class Refusal:
    """A span, or a whole line or request, that could not enter the run: where, why, and what came."""

    reason: str
    span_id: str | None = None
    line: int | None = None  # of the file it was read from
    span: dict | None = None  # the span as OTLP/JSON, as it came
    text: str | None = None  # the line itself, when it did not read as spans

    def record(self) -> dict:
        return {k: v for k, v in {"line": self.line, "span_id": self.span_id, "reason": self.reason,
                                  "span": self.span, "text": self.text}.items() if v is not None or k == "span_id"}


class OtlpFileError(ValueError):
    """Lines of an OTLP file that a run cannot take; names the file, each line and the field."""

    def __init__(self, path: Path, refusals: list[Refusal]) -> None:
        self.path, self.refusals = path, refusals
        self.line, self.reason = refusals[0].line, refusals[0].reason
        shown = [f"{path}:{r.line}: " + (f"span {r.span_id}: " if r.span_id else "") + r.reason for r in refusals[:20]]
        more = f"\n... and {len(refusals) - 20} more" if len(refusals) > 20 else ""
        super().__init__("\n".join(shown) + more)


def _read_line(raw: bytes, n: int) -> tuple[list[Span], list[Refusal]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [Refusal(f"not UTF-8 ({exc.reason} at byte {exc.start})", line=n,
                            text=raw.decode("utf-8", "backslashreplace").rstrip("\n"))]
    try:
        req, refused = request_from_json(json.loads(text))
    except RecursionError:
        return [], [Refusal("nested deeper than the JSON reader allows", line=n, text=text.rstrip("\n"))]
    except ValueError as exc:  # not JSON, or OtlpDecodeError: the request's shape
        reason = str(exc) if isinstance(exc, OtlpDecodeError) else f"not JSON: {exc}"
        return [], [Refusal(reason, line=n, text=text.rstrip("\n"))]
    spans = flatten(req)
    for sp in spans:
        sp.line = n
    return spans, [Refusal(r.reason, r.span_id, n, r.span) for r in refused]


def read_otlp_file(path: str | Path) -> tuple[list[Span], list[Refusal]]:
    """Every span of a Collector file-exporter file (one ExportTraceServiceRequest OTLP/JSON a line), and
    what was refused, by line: a line that is not UTF-8, JSON or a request; a span a run cannot hold."""
    path = Path(path)
    spans: list[Span] = []
    refusals: list[Refusal] = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            got, refused = _read_line(raw, n)
            spans += got
            refusals += refused
    return spans, refusals


def refused_gaps(run_id: str, refusals: list[dict], kept_in: str) -> list[dict]:
    """One gap row per refusal record (as kept, in order, in `kept_in`)."""
    return [{"run_id": run_id, "gap_id": f"otlp:refused:{k}", "scope": "otlp", "subject_id": r.get("span_id"),
             "affects": "the span's server and engine events (its attempt then has no span)", "needs": REFUSED_NEEDS,
             "detail": f"{r['reason']} (kept as record {k} of {kept_in})"} for k, r in enumerate(refusals, 1)]
