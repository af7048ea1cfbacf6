"""SIGINT and SIGTERM as a clean stop of a capture or a server, and the exit code each owes (128 + N).

A CI timeout, `docker stop` or systemd sends SIGTERM; it must stop a capture or a server the way
Ctrl-C does: inside `asyncio.run` its main task is cancelled (asyncio's own SIGINT path, so every
task is awaited and none is left with an unretrieved exception), elsewhere KeyboardInterrupt is
raised. The command then records what stopped it, closes the run and exits 143 (130 for SIGINT).

SIGINT is taken whatever disposition the process inherited: a shell script's background job (`cmd &`)
starts with SIGINT ignored, and `kill -INT` must still stop it, as it stops uvicorn-based servers.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    """A capture stopped by a signal after its run directory was closed; `.signum` says which."""

    def __init__(self, signum: int, recorded: bool = True, finished: bool = False) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.recorded = recorded  # False: stopped while preparing, before anything was recorded (no run left)
        self.finished = finished  # True: it came as the finished run was being closed (the run is whole)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def sigterm_like_sigint():
    """Within the block SIGINT raises KeyboardInterrupt and SIGTERM acts as SIGINT; yields a dict whose
    "signum" is set by SIGTERM."""
    got: dict = {"signum": None}
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def on_term(signum, frame):
        got["signum"] = signum
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signal.SIGINT, frame)  # asyncio.run's handler: cancels its main task
        else:
            raise KeyboardInterrupt("SIGTERM")

    old_int = signal.getsignal(signal.SIGINT)
    if old_int is signal.SIG_IGN or old_int is signal.SIG_DFL:  # inherited ignored (or reset): take it back
        signal.signal(signal.SIGINT, signal.default_int_handler)
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, old)
        if old_int is not None and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, old_int)


@contextmanager
def signals_held():
    """Within the block SIGINT and SIGTERM are recorded, not acted on, so what it does (a run's last close:
    its parts compacted, its files renamed into place) is never cut half-way; yields a dict whose "signum"
    is the first that came. The caller acts on it after the block."""
    held: dict = {"signum": None}
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def record(signum, frame):
        held["signum"] = held["signum"] or signum

    old = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield held
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def signal_name(got: dict, exc: BaseException) -> str:
    """What stopped the run, as the manifest records it."""
    if got.get("signum") == signal.SIGTERM:
        return "SIGTERM"
    if isinstance(exc, KeyboardInterrupt):
        return "SIGINT"
    return repr(exc)[:300]
