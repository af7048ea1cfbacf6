"""Whether something listens where a capture is told to send its load or scrape: a TCP connect to the
URL's host and port, bounded, before the run folder exists.

A URL target (`--target`), a router's metrics (`--router-metrics`) and each declared replica (`--replica`,
`[deployment].replicas`) are checked this way: without it, a target nothing listens on is found once the
run is open (a run folder left `interrupted`), a router's metrics or a replica's `/metrics` only as a gap
after the whole load. A `--server` folder is not: its server may have stopped, and its folder still joins.
Only the connection is tried, never HTTP: what answers there is the load's (and the scrapers') to find.
"""
from __future__ import annotations

import socket
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 3.0  # a listening host on a LAN answers a connect in milliseconds


def host_port(url: str) -> tuple[str, int]:
    """The URL's host and port (the scheme's default, 80 or 443, when it names none)."""
    u = urlsplit(url)
    return u.hostname, u.port if u.port is not None else (443 if u.scheme == "https" else 80)


def unreachable(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why nothing takes a TCP connection at `url`'s host and port within `timeout_s`, or None."""
    host, port = host_port(url)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as exc:
        return f"its host {host!r} does not resolve ({exc.strerror or exc})"
    except TimeoutError:
        return f"nothing at {host}:{port} took a connection within {timeout_s:g} s"
    except OSError as exc:
        return f"nothing listens at {host}:{port} ({exc.strerror or exc})"


def check_listening(urls: list[tuple[str, str]], timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Each (flag, url) connected to in turn; ValueError names the first flag (or a workload file's key: `file:
    key`) and URL nothing listens on."""
    for flag, url in urls:
        if (why := unreachable(url, timeout_s)) is not None:
            raise ValueError(f"{flag}{' ' if flag.startswith('--') else ': '}{url}: {why}: is the server running "
                             "there? (checked before the run folder is made: nothing was written)")
