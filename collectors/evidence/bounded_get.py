"""One HTTP GET with a total deadline and a byte bound, for reading another program's endpoints during
a capture (`/metrics`, `/version`): however slowly the peer answers, even a byte at a time, the read
ends by the deadline, so neither a scraper thread nor the capture waiting for it can hang.

A socket timeout bounds each read, not their sum; a timer shuts the socket down at the deadline,
which wakes whatever read is blocked then. Past the deadline, whichever fires first (the timer, or a
read's own timeout when the timer thread is starved on a loaded host), the answer is the deadline's.
"""
from __future__ import annotations

import http.client
import socket
import threading
import time
from urllib.parse import urlsplit


class GetFailed(OSError):
    """No complete answer: the message says why (deadline, size, connection, HTTP)."""


def bounded_get(url: str, *, deadline_s: float, max_bytes: int, headers: dict | None = None) -> tuple[int, bytes]:
    """(status, body) of GET `url`, or GetFailed within `deadline_s` seconds."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise GetFailed(f"{url!r} is not an http(s) URL")
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname, u.port, timeout=deadline_s)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        if conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass

    started = time.monotonic()
    timer = threading.Timer(deadline_s, expire)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()
        if expired.is_set():  # the timer fired before there was a socket to shut down
            raise GetFailed(f"no connection within {deadline_s:g} s")
        conn.request("GET", (u.path or "/") + (f"?{u.query}" if u.query else ""), headers=headers or {})
        resp = conn.getresponse()
        body = bytearray()
        while not expired.is_set():
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            body += chunk
            if len(body) > max_bytes:
                raise GetFailed(f"answer over {max_bytes} bytes")
        if expired.is_set():
            raise GetFailed(f"no complete answer within {deadline_s:g} s ({len(body)} bytes by then)")
        return resp.status, bytes(body)
    except GetFailed:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if expired.is_set() or time.monotonic() - started >= deadline_s:
            raise GetFailed(f"no complete answer within {deadline_s:g} s") from None
        raise GetFailed(f"{type(exc).__name__}: {exc}"[:300]) from None
    finally:
        timer.cancel()
        conn.close()
