"""Run an aiohttp application on a loopback port in a background thread (tests, notebooks, embedding).

    with ServerThread(build_app(engine, tok, ServeOptions(model_name="m"))) as srv:
        openai.OpenAI(base_url=srv.url + "/v1", api_key="x").completions.create(...)

The thread owns its own event loop; port 0 picks a free ephemeral port (`srv.port` after start).
"""
from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class ServerThread:
    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0, *,
                 shutdown_timeout: float = 2.0) -> None:
        self.app, self.host, self.port = app, host, port
        self.shutdown_timeout = shutdown_timeout
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self._thread = threading.Thread(target=self._run, name=f"http-{self.host}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the server did not start within {timeout} s")
        if self._error is not None:
            raise RuntimeError(f"the server could not start: {self._error!r}") from self._error
        return self

    def _run(self) -> None:
        loop = self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=self.shutdown_timeout)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            loop.run_until_complete(site.start())
            self.port = runner.addresses[0][1]
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def call(self, coro, timeout: float | None = None):
        """Run a coroutine on the server's loop from another thread and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if self.loop is not None and self._thread is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
