"""An OTLP/HTTP trace receiver on loopback: what an engine exports during a capture, kept as it came.

POST /v1/traces with an ExportTraceServiceRequest (application/x-protobuf or application/json) is
decoded, appended as one OTLP/JSON line (the Collector file exporter's format, hex ids) to
`<run>/otlp/traces.jsonl`, and answered with an empty ExportTraceServiceResponse. A body that does
not decode is answered 400 and kept in `<run>/otlp/refused.jsonl` with the reason, so the gap is
visible. The file is the evidence: `collectors.vllm_spans` reads it back after the run.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from inferledger.collectors.otlp_decode import OtlpDecodeError, decode_body, request_to_json_line

TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 64 * 2**20


class OTLPReceiver:
    """Binds 127.0.0.1:<port> (0 = ephemeral); start() / stop(); thread-safe counters."""

    def __init__(self, run_dir: str | Path, port: int = 0, host: str = "127.0.0.1") -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the OTLP receiver binds loopback only, not {host!r}")
        self.folder = Path(run_dir) / "otlp"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / "traces.jsonl"
        self._lock = threading.Lock()
        self.requests = 0
        self.spans = 0
        self.refused = 0
        self.span_names: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # the run directory is the log
                pass

            def do_POST(self) -> None:
                if self.path.split("?")[0] != TRACES_PATH:
                    self._answer(404, b"only POST /v1/traces is served", "text/plain")
                    return
                n = int(self.headers.get("content-length") or 0)
                if n > MAX_BODY_BYTES:
                    self._answer(413, b"body too large", "text/plain")
                    return
                body = self.rfile.read(n)
                ctype = self.headers.get("content-type", "")
                try:
                    req = decode_body(body, ctype)
                except OtlpDecodeError as exc:
                    receiver._refuse(ctype, len(body), str(exc))
                    self._answer(400, str(exc).encode(), "text/plain")
                    return
                receiver._keep(req)
                if ctype.startswith("application/json"):
                    self._answer(200, b"{}", "application/json")
                else:
                    self._answer(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

            def _answer(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}{TRACES_PATH}"
        self._thread: threading.Thread | None = None

    def _keep(self, req) -> None:
        line = request_to_json_line(req)
        names = [sp.name for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
        with self._lock:
            with self.path.open("a") as f:
                f.write(line + "\n")
            self.requests += 1
            self.spans += len(names)
            self.span_names.update(names)

    def _refuse(self, ctype: str, size: int, reason: str) -> None:
        with self._lock:
            self.refused += 1
            with (self.folder / "refused.jsonl").open("a") as f:
                f.write(json.dumps({"content_type": ctype, "bytes": size, "reason": reason,
                                    "unix_ns": time.time_ns()}) + "\n")

    def start(self) -> "OTLPReceiver":
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self) -> dict:
        with self._lock:
            return {"endpoint": self.endpoint, "requests": self.requests, "spans": self.spans,
                    "refused": self.refused, "span_names": sorted(self.span_names),
                    "file": str(self.path.relative_to(self.folder.parent))}
