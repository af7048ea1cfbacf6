"""CPU-burning co-tenants for the benchmarks that measure a busy host on purpose: N processes, each
spinning on arithmetic (one core's worth), started and stopped around the work.

    with CoTenants(2):   # two burners beside what runs here
        ...
"""
from __future__ import annotations

import multiprocessing


def _burn() -> None:  # one core's worth of arithmetic until the process is killed
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % 2147483648


class CoTenants:
    """`n` burner processes (spawned, so no state of this process is shared) while the block runs;
    `start()` / `stop()` where a block does not fit (a callback starts them)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[multiprocessing.Process] = []

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        for _ in range(self.n - len(self.procs)):
            p = ctx.Process(target=_burn, daemon=True)
            p.start()
            self.procs.append(p)

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.join()
        self.procs.clear()

    def __enter__(self) -> "CoTenants":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
