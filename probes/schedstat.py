"""What a thread got from the CPU scheduler: on-CPU time and run-queue wait (Linux schedstat).

`/proc/self/task/<tid>/schedstat` holds three numbers for one thread: ns on a CPU, ns runnable
but waiting on a run queue, timeslices. `ThreadClocks` keeps one open file per watched thread and
re-reads it in place (about 1 µs a read), so the engine can take the deltas over every step and
the load client over its run. Where the kernel hides schedstat (no file, unreadable: a kernel
without CONFIG_SCHEDSTATS, some sandboxes) `ThreadClocks.open` says why and nothing is measured;
the figures are then absent, never 0.

`openmp_team` finds the intra-op workers of the calling thread: it runs one parallel region of the
thread's own team size through the OpenMP runtime already loaded in the process (torch's
libgomp, or an Intel libiomp), in which every member records its thread id. The runtime reuses
that team for the thread's later parallel regions, so those ids are the threads its parallel
sections wait for. No OpenMP runtime loaded: no workers (the thread alone).
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass

TASK_DIR = "/proc/self/task"
OPENMP_LIBS = ("libgomp", "libiomp")


@dataclass(frozen=True)
class Sched:
    """One thread's schedstat reading: cumulative ns on a CPU and ns waiting on a run queue."""

    cpu_ns: int
    wait_ns: int


def parse_schedstat(text: bytes | str) -> Sched:
    """'<on-CPU ns> <run-queue wait ns> <timeslices>' -> Sched; ValueError on anything else."""
    fields = text.split()
    if len(fields) < 2:
        raise ValueError(f"schedstat: expected '<cpu ns> <wait ns> <slices>', got {text!r}")
    return Sched(int(fields[0]), int(fields[1]))


class ThreadClocks:
    """Open schedstat files of a set of threads, re-read in place. `read()` returns one Sched per
    thread (None for a thread that has gone)."""

    def __init__(self, tids: list[int], fds: list[int]) -> None:
        self.tids, self._fds = tids, fds

    @classmethod
    def open(cls, tids: list[int], task_dir: str = TASK_DIR) -> tuple["ThreadClocks | None", str]:
        """(the clocks, "") or (None, why schedstat cannot be read here)."""
        fds = []
        try:
            for tid in tids:
                fd = os.open(f"{task_dir}/{tid}/schedstat", os.O_RDONLY)
                fds.append(fd)
                parse_schedstat(os.pread(fd, 128, 0))
        except (OSError, ValueError) as exc:
            for fd in fds:
                os.close(fd)
            return None, f"{task_dir}/<tid>/schedstat unreadable: {exc}"
        return cls(list(tids), fds), ""

    def read(self) -> list[Sched | None]:
        out = []
        for fd in self._fds:
            try:
                out.append(parse_schedstat(os.pread(fd, 128, 0)))
            except (OSError, ValueError):  # the thread exited (ESRCH)
                out.append(None)
        return out

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __del__(self) -> None:  # an engine dropped without close() leaves no open files behind
        self.close()


def loaded_openmp(maps: str = "/proc/self/maps") -> str | None:
    """The path of the OpenMP runtime mapped into this process, or None."""
    try:
        with open(maps) as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]  # the mapped file (a line without one ends in its inode)
                if any(name in os.path.basename(path) for name in OPENMP_LIBS):
                    return path
    except OSError:
        return None
    return None


_REGION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def openmp_team() -> list[int]:
    """The thread ids of the calling thread's OpenMP team other than itself (its intra-op workers);
    [] where no OpenMP runtime is loaded or the team is the thread alone."""
    path = loaded_openmp()
    if path is None:
        return []
    try:
        lib = ctypes.CDLL(path)  # the handle of the library already loaded
        parallel = lib.GOMP_parallel  # the GCC entry point; Intel's runtime exports it too
    except (OSError, AttributeError):
        return []
    tids: set[int] = set()
    lock = threading.Lock()

    def member(_) -> None:
        with lock:
            tids.add(threading.get_native_id())

    region = _REGION(member)
    parallel(region, None, ctypes.c_uint(0), ctypes.c_uint(0))  # 0 threads: the thread's own team size
    me = threading.get_native_id()
    return sorted(t for t in tids if t != me)


@dataclass(frozen=True)
class StepSched:
    """What the step's compute threads got over one step: the step thread's on-CPU and run-queue
    wait, the number of workers read and the largest worker wait (capped at the window: a worker
    runnable since before the window has that earlier wait accounted when it next runs)."""

    cpu_ns: int
    wait_ns: int
    workers: int
    workers_wait_ns_max: int | None

    def attrs(self) -> dict:
        out = {"cpu_ns": self.cpu_ns, "wait_ns": self.wait_ns, "workers": self.workers}
        if self.workers_wait_ns_max is not None:
            out["workers_wait_ns_max"] = self.workers_wait_ns_max
        return out


class ComputeThreads:
    """The step thread and its intra-op workers, read at a step's start and end.

    `begin()` in the step thread right after the step starts, `end()` right before it ends: the
    window lies inside the step, so the step thread's wait (it is running at both reads) is at most
    the step's time. The step thread's on-CPU time is its CPU clock (CLOCK_THREAD_CPUTIME_ID): schedstat's
    first number of a running thread lags by up to a scheduler tick. The team is found again when the
    calling thread or its thread count changes."""

    def __init__(self, team=openmp_team, task_dir: str = TASK_DIR, now_ns=time.monotonic_ns,
                 cpu_ns=time.thread_time_ns) -> None:
        self._team, self._task_dir, self._now_ns, self._cpu_ns = team, task_dir, now_ns, cpu_ns
        self._key: tuple | None = None
        self._clocks: ThreadClocks | None = None
        self.unavailable: str | None = None
        self._start: tuple[int, list] | None = None

    def _ensure(self, threads: int) -> None:
        key = (threading.get_native_id(), threads)
        if key == self._key:
            return
        if self._clocks is not None:
            self._clocks.close()
        self._key = key
        me = key[0]
        workers = self._team() if threads > 1 else []
        self._clocks, why = ThreadClocks.open([me, *workers], self._task_dir)
        self.unavailable = why or None

    def begin(self, threads: int) -> None:
        """The step's starting readings (`threads`: the step thread's intra-op thread count)."""
        self._ensure(threads)
        self._start = (self._now_ns(), self._cpu_ns(), self._clocks.read()) if self._clocks is not None else None

    def end(self) -> StepSched | None:
        """The deltas since `begin`, or None when schedstat is unreadable (or a thread went)."""
        if self._start is None or self._clocks is None:
            return None
        t0, cpu0, before = self._start
        after = self._clocks.read()
        cpu1, window = self._cpu_ns(), self._now_ns() - t0
        self._start = None
        if before[0] is None or after[0] is None:
            return None
        waits = [min(a.wait_ns - b.wait_ns, window) for b, a in zip(before[1:], after[1:])
                 if a is not None and b is not None]
        return StepSched(cpu1 - cpu0, after[0].wait_ns - before[0].wait_ns, len(waits), max(waits) if waits else None)

    def close(self) -> None:
        if self._clocks is not None:
            self._clocks.close()
            self._clocks, self._key = None, None


class ThreadUsage:
    """One thread's on-CPU time and run-queue wait over a stretch of wall time (the load client's
    event-loop thread over its run): `start()` and `stop()` in that thread; `summary()` for a manifest."""

    def __init__(self, task_dir: str = TASK_DIR, now_ns=time.monotonic_ns, cpu_ns=time.thread_time_ns) -> None:
        self._task_dir, self._now_ns, self._cpu_ns = task_dir, now_ns, cpu_ns
        self._clocks: ThreadClocks | None = None
        self._before: tuple[int, int, Sched | None] | None = None
        self.delta: Sched | None = None
        self.wall_ns: int | None = None
        self.unavailable: str | None = None

    def start(self) -> "ThreadUsage":
        self._clocks, why = ThreadClocks.open([threading.get_native_id()], self._task_dir)
        self.unavailable = why or None
        self._before = (self._now_ns(), self._cpu_ns(), self._clocks.read()[0]) if self._clocks is not None else None
        return self

    def stop(self) -> None:
        if self._clocks is None or self._before is None:
            return
        after = self._clocks.read()[0]
        self._clocks.close()
        self._clocks = None
        t0, cpu0, before = self._before
        self.wall_ns = self._now_ns() - t0
        if before is not None and after is not None:  # on-CPU from the thread's CPU clock (exact), as for steps
            self.delta = Sched(self._cpu_ns() - cpu0, after.wait_ns - before.wait_ns)

    def summary(self) -> dict:
        """{cpu_ms, wait_ms, wall_ms, cpu_share, wait_share} (shares of the wall time: a thread busy on
        its own CPU has a high cpu_share, one held back by others a high wait_share), or {unknown: why}."""
        d, wall = self.delta, self.wall_ns
        if d is None or not wall:
            return {"unknown": self.unavailable or "not measured"}
        return {"cpu_ms": round(d.cpu_ns / 1e6, 3), "wait_ms": round(d.wait_ns / 1e6, 3),
                "wall_ms": round(wall / 1e6, 3), "cpu_share": round(d.cpu_ns / wall, 4),
                "wait_share": round(d.wait_ns / wall, 4)}
