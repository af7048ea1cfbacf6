"""A real `inferledger serve` in a process of its own, for the tests that need one: a free loopback
port, the wait until /health answers, and the server started and stopped around a block."""
from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from inferledger.serve.local import START_LIMIT_S, free_port, wait_healthy  # noqa: F401 (the tests' names)


@contextmanager
def serve_out(folder: Path, *args: str) -> Iterator[str]:
    """`inferledger serve --out folder` (and `args`) on a free port: its URL once healthy; stopped after."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "inferledger.cli.app", "serve", "--port", str(port),
                             "--out", str(folder), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_healthy(proc, url), proc.stderr.read() if proc.poll() is not None else "the server did not start"
        yield url
    finally:
        proc.terminate()
        proc.communicate(timeout=120)


def static_http_server(body: bytes) -> http.server.HTTPServer:
    """A loopback server answering every GET with `body` (a /metrics page), on a thread; the caller shuts it
    down (`shutdown()`, `server_close()`); `server_port` is its port."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
