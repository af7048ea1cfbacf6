"""An OTLP/HTTP trace receiver on loopback: what an engine exports during a capture, kept as it came.

POST /v1/traces with an ExportTraceServiceRequest (application/x-protobuf or application/json, plain
or `Content-Encoding: gzip`) is decoded; the spans a run can hold (collectors.evidence.otlp_checks) are
appended as one OTLP/JSON line (the Collector file exporter's format, hex ids) to
`<run>/otlp/traces.jsonl`, and the answer is an ExportTraceServiceResponse whose `partial_success`
counts the spans refused. Only accepted spans are counted, each (trace id, span id) once (a copy is
kept in the file and counted in `duplicate_spans`; the mapping takes it once). Each refused span, and each request refused whole (4xx: a body that does
not decode, a missing, non-integer, negative or too large Content-Length, a body truncated or not
received within `BODY_DEADLINE_S`, gzip that inflates past the byte bound), is one record of
`<run>/otlp/refused.jsonl` with the reason and, where it was read, the span as it came; each record
becomes one gap row. The file is the evidence:
`collectors.evidence.otlp_file` reads it back after the run.
"""
from __future__ import annotations

import base64
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from inferledger.collectors.evidence.otlp_checks import REQUEST_SPAN, dumps
from inferledger.collectors.evidence.otlp_decode import BodyTooLarge, OtlpDecodeError, decode_body, gunzip
from inferledger.collectors.evidence.otlp_decode import request_to_json_line

TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 64 * 2**20  # on the wire and again after decompression
BODY_DEADLINE_S = 10.0  # the whole body, however slowly it trickles
KEPT_BODY_BYTES = 4096  # the start of a refused body, kept (base64) beside the reason


class _Refused(Exception):
    def __init__(self, status: int, reason: str, body: bytes = b"") -> None:
        super().__init__(reason)
        self.status, self.reason, self.body = status, reason, body


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # a peer that went away: nothing to print
        pass


class OTLPReceiver:
    """Binds 127.0.0.1:<port> (0 = ephemeral); start() / stop(); thread-safe counters."""

    def __init__(self, run_dir: str | Path, port: int = 0, host: str = "127.0.0.1", *,
                 max_body_bytes: int = MAX_BODY_BYTES, body_deadline_s: float = BODY_DEADLINE_S) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the OTLP receiver binds loopback only, not {host!r}")
        self.folder = Path(run_dir) / "otlp"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / "traces.jsonl"
        self.refused_path = self.folder / "refused.jsonl"
        self.max_body_bytes, self.body_deadline_s = max_body_bytes, body_deadline_s
        self._lock = threading.Lock()
        self._closed = False
        self.requests = self.spans = self.duplicate_spans = self.empty_requests = self.request_spans_seen = 0
        self._ids: set[tuple[bytes, bytes]] = set()  # (trace id, span id) of every span kept
        self.refused: list[dict] = []  # the records of refused.jsonl, in order
        self.span_names: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            timeout = body_deadline_s  # a client that stalls while sending its headers

            def log_message(self, *args) -> None:  # the run directory is the log
                pass

            def do_POST(self) -> None:
                if self.path.split("?")[0] != TRACES_PATH:
                    self._answer(404, b"only POST /v1/traces is served", "text/plain")
                    return
                ctype = self.headers.get("content-type", "")
                try:
                    body = receiver._body(self)
                    status, answer = receiver._take(body, ctype)
                except _Refused as exc:
                    receiver._refuse_request(ctype, exc.reason, exc.body)
                    self.close_connection = True
                    self._answer(exc.status, exc.reason.encode(), "text/plain")
                    return
                except Exception as exc:  # never a traceback, never an unanswered request
                    receiver._refuse_request(ctype, f"receiver error: {exc!r}", b"")
                    self._answer(500, b"receiver error", "text/plain")
                    return
                json_answer = ctype.split(";")[0].strip().lower() == "application/json"
                if json_answer:
                    text = json_format.MessageToJson(answer, indent=None) if answer.ByteSize() else "{}"
                    self._answer(status, text.encode(), "application/json")
                else:
                    self._answer(status, answer.SerializeToString(), "application/x-protobuf")

            def _answer(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = _Server((host, port), Handler)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}{TRACES_PATH}"
        self._thread: threading.Thread | None = None

    def _body(self, handler) -> bytes:
        """The request body within the byte bound and `body_deadline_s`, gzip inflated."""
        text = handler.headers.get("content-length")
        if text is None:
            raise _Refused(411, "a Content-Length is required")
        if not (text.strip().isascii() and text.strip().isdigit()):
            raise _Refused(400, f"Content-Length {text!r} is not a non-negative integer")
        n = int(text)
        if n > self.max_body_bytes:
            raise _Refused(413, f"body of {n} bytes is over the {self.max_body_bytes}-byte bound")
        deadline, parts, got = time.monotonic() + self.body_deadline_s, [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Refused(408, f"body not received within {self.body_deadline_s:g} s ({got} of {n} bytes)",
                               b"".join(parts))
            handler.connection.settimeout(left)
            try:
                chunk = handler.rfile.read1(min(n - got, 1 << 16))
            except TimeoutError:
                raise _Refused(408, f"body not received within {self.body_deadline_s:g} s ({got} of {n} bytes)",
                               b"".join(parts)) from None
            if not chunk:
                raise _Refused(400, f"body truncated: {got} of {n} bytes", b"".join(parts))
            parts.append(chunk)
            got += len(chunk)
        body = b"".join(parts)
        encoding = (handler.headers.get("content-encoding") or "identity").strip().lower()
        if encoding == "gzip":
            try:
                return gunzip(body, self.max_body_bytes)
            except BodyTooLarge as exc:
                raise _Refused(413, str(exc), body) from None
            except OtlpDecodeError as exc:
                raise _Refused(400, str(exc), body) from None
        if encoding != "identity":
            raise _Refused(415, f"Content-Encoding {encoding!r}: gzip or none", body)
        return body

    def _take(self, body: bytes, ctype: str) -> tuple[int, ExportTraceServiceResponse]:
        try:
            req, refused = decode_body(body, ctype)
        except OtlpDecodeError as exc:
            raise _Refused(400, str(exc), body) from None
        kept = [(sp.trace_id, sp.span_id, sp.name) for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
        line = request_to_json_line(req) if kept else None
        with self._lock:
            if self._closed:  # after the run was read back: kept nowhere, so refused for the sender to retry
                raise _Refused(503, "the capture has ended")
            if line is not None:
                with self.path.open("a") as f:
                    f.write(line + "\n")
                self.requests += 1
            elif not refused:
                self.empty_requests += 1
            new = [(t, sid, name) for t, sid, name in kept if (t, sid) not in self._ids]
            self._ids.update((t, sid) for t, sid, _ in new)
            self.spans += len(new)
            self.duplicate_spans += len(kept) - len(new)
            self.span_names.update(name for _, _, name in new)
            self.request_spans_seen += sum(name == REQUEST_SPAN for _, _, name in new) + sum(
                r.span.get("name") == REQUEST_SPAN for r in refused)
            self._write_refused([{"span_id": r.span_id, "reason": r.reason, "span": r.span, "content_type": ctype,
                                  "unix_ns": time.time_ns()} for r in refused])
        answer = ExportTraceServiceResponse()
        if refused:
            answer.partial_success.rejected_spans = len(refused)
            answer.partial_success.error_message = "; ".join(r.reason for r in refused[:5])[:1000]
        return 200, answer

    def add_refused(self, records: list[dict]) -> None:
        """Keep refusal records found after the run (a kept line that reads back refused)."""
        with self._lock:
            self._write_refused(records)

    def _write_refused(self, records: list[dict]) -> None:
        if records:
            with self.refused_path.open("a") as f:
                f.write("".join(dumps(r) + "\n" for r in records))
            self.refused.extend(records)

    def _refuse_request(self, ctype: str, reason: str, body: bytes) -> None:
        with self._lock:
            if self._closed:  # the run was read back already; the sender is told, the run is not
                return
            self._write_refused([{"span_id": None, "reason": reason, "content_type": ctype, "bytes": len(body),
                                  "body_start_b64": base64.b64encode(body[:KEPT_BODY_BYTES]).decode(),
                                  "unix_ns": time.time_ns()}])

    def start(self) -> "OTLPReceiver":
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; a request still being read after this is refused, never half-kept."""
        with self._lock:
            self._closed = True
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self) -> dict:
        with self._lock:
            return {"endpoint": self.endpoint, "requests": self.requests, "spans": self.spans,
                    "duplicate_spans": self.duplicate_spans, "empty_requests": self.empty_requests,
                    "refused_spans": sum("span" in r for r in self.refused),
                    "refused_requests": sum("span" not in r for r in self.refused),
                    "span_names": sorted(self.span_names), "file": str(self.path.relative_to(self.folder.parent)),
                    "refused_file": str(self.refused_path.relative_to(self.folder.parent))}
