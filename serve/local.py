"""A server in a process of its own on this machine: a free loopback port to start it on, and the wait
until its /health answers (the routing study's replicas and router, the diagnosis bench's transport case,
the tests that start `inferledger serve`)."""
from __future__ import annotations

import socket
import subprocess
import time
import urllib.request

START_LIMIT_S = 600.0  # a model's load and first answer on a busy 2-core host: a bound, not a timing


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, limit_s: float = START_LIMIT_S) -> bool:
    """Whether `url`/health answered 200 before `proc` exited or `limit_s` passed (asked every 0.5 s)."""
    deadline = time.monotonic() + limit_s
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False
