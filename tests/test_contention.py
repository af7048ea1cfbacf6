"""Contention as evidence: what the step's compute threads got from the scheduler (schedstat), the
host's pressure and CPU time as samples, the ledger's contention_ms / cpu_ms, the load client's thread.

The readers are the real ones on hand-built /proc trees; the ledger figures come from hand-built
runs; one engine run on this host shows the figures exist, and one with CPU-burning co-tenants
shows them grow.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from inferledger.probes.host import HostReader, HostSampler
from inferledger.probes.schedstat import ComputeThreads, Sched, StepSched, ThreadClocks, ThreadUsage, parse_schedstat

from ledger_util import build_run, dict_rows


# -- schedstat on a hand-built task tree ------------------------------------------------------------

def write_task(root: Path, tid: int, cpu: int, wait: int) -> None:
    (root / str(tid)).mkdir(parents=True, exist_ok=True)
    (root / str(tid) / "schedstat").write_text(f"{cpu} {wait} 7\n")


def test_parse_schedstat_and_refuse_what_is_not_it():
    assert parse_schedstat(b"255486954 15260264 69\n") == Sched(255486954, 15260264)
    with pytest.raises(ValueError):
        parse_schedstat(b"")


def test_compute_threads_deltas_and_a_worker_wait_capped_at_the_window(tmp_path):
    me = threading.get_native_id()
    write_task(tmp_path, me, 1_000, 500)
    write_task(tmp_path, 9001, 2_000, 100)
    write_task(tmp_path, 9002, 3_000, 0)
    clock = iter([0, 10_000_000])  # a 10 ms window
    cpu = iter([7_000, 5_007_000])  # the step thread's CPU clock: 5 ms on a CPU
    threads = ComputeThreads(team=lambda: [9001, 9002], task_dir=str(tmp_path), now_ns=lambda: next(clock),
                             cpu_ns=lambda: next(cpu))
    threads.begin(3)
    write_task(tmp_path, me, 5_004_000, 2_000_500)  # 2 ms waiting (schedstat's on-CPU lags: not read)
    write_task(tmp_path, 9001, 6_000, 3_000_100)  # waited 3 ms
    write_task(tmp_path, 9002, 3_000, 25_000_000)  # runnable since before the step: 25 ms accounted now
    assert threads.end() == StepSched(cpu_ns=5_000_000, wait_ns=2_000_000, workers=2, workers_wait_ns_max=10_000_000)
    assert threads.end() is None  # no begin: nothing to say
    threads.close()


def test_one_intra_op_thread_reads_the_step_thread_alone(tmp_path):
    me = threading.get_native_id()
    write_task(tmp_path, me, 0, 0)
    cpu = iter([10, 13])
    threads = ComputeThreads(team=lambda: pytest.fail("no team for one thread"), task_dir=str(tmp_path),
                             cpu_ns=lambda: next(cpu))
    threads.begin(1)
    write_task(tmp_path, me, 3, 4)
    got = threads.end()
    assert got == StepSched(3, 4, 0, None)
    assert got.attrs() == {"cpu_ns": 3, "wait_ns": 4, "workers": 0}


def test_hidden_schedstat_measures_nothing_and_says_why(tmp_path):
    clocks, why = ThreadClocks.open([threading.get_native_id()], str(tmp_path))
    assert clocks is None and "schedstat unreadable" in why
    threads = ComputeThreads(team=list, task_dir=str(tmp_path))
    threads.begin(1)
    assert threads.end() is None and "schedstat" in threads.unavailable
    usage = ThreadUsage(task_dir=str(tmp_path)).start()
    usage.stop()
    assert list(usage.summary()) == ["unknown"]


def test_thread_usage_over_a_stretch(tmp_path):
    me = threading.get_native_id()
    write_task(tmp_path, me, 0, 0)
    clock, cpu = iter([0, 100_000_000]), iter([5, 20_000_005])
    usage = ThreadUsage(task_dir=str(tmp_path), now_ns=lambda: next(clock), cpu_ns=lambda: next(cpu)).start()
    write_task(tmp_path, me, 20_000_000, 30_000_000)
    usage.stop()
    assert usage.summary() == {"cpu_ms": 20.0, "wait_ms": 30.0, "wall_ms": 100.0, "cpu_share": 0.2,
                               "wait_share": 0.3}


def test_this_linux_host_reads_the_real_openmp_team():
    """The step thread's team: itself and torch.get_num_threads() - 1 workers, found through the loaded runtime."""
    import torch

    from inferledger.probes.schedstat import openmp_team

    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("this kernel hides schedstat")
    got = {}

    def body():
        torch.set_num_threads(2)
        torch.ones(1 << 16).add_(1)  # the runtime is loaded and the team made
        got["team"] = openmp_team()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert len(got["team"]) == 1 and got["team"][0] != threading.get_native_id()


# -- the host's files -------------------------------------------------------------------------------

def proc_tree(root: Path, *, psi: bool = True) -> Path:
    if psi:
        (root / "pressure").mkdir(parents=True)
        (root / "pressure" / "cpu").write_text("some avg10=12.50 avg60=3.00 avg300=1.00 total=4000\n"
                                               "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
        (root / "pressure" / "memory").write_text("some avg10=0.25 avg60=0.00 avg300=0.00 total=77\n"
                                                  "full avg10=0.10 avg60=0.00 avg300=0.00 total=33\n")
    (root / "self").mkdir(parents=True)
    (root / "stat").write_text("cpu  100 5 20 300 7 1 2 9 4 0\ncpu0 50 2 10 150 3 0 1 4 2 0\nintr 1\n")
    # the name holds a space and a parenthesis: fields are counted after the last ')'
    (root / "self" / "stat").write_text("42 (py (x) y) S 1 42 42 0 -1 4194304 10 0 0 0 30 6 0 0 20 0 3\n")
    (root / "loadavg").write_text("2.50 1.00 0.50 3/142 999\n")
    return root


def test_host_reader_values_from_the_files(tmp_path):
    reader = HostReader(proc_tree(tmp_path / "proc"), now_ns=lambda: 123, clk_tck=100)
    got = {r.metric: (r.value, r.unit) for r in reader.read()}
    assert got == {
        "psi_cpu_some_avg10_pct": (12.5, "%"), "psi_cpu_some_total_us": (4000.0, "us"),
        "psi_cpu_full_avg10_pct": (0.0, "%"), "psi_cpu_full_total_us": (0.0, "us"),
        "psi_memory_some_avg10_pct": (0.25, "%"), "psi_memory_some_total_us": (77.0, "us"),
        "psi_memory_full_avg10_pct": (0.1, "%"), "psi_memory_full_total_us": (33.0, "us"),
        # user 100 + nice 5 + system 20 + irq 1 + softirq 2 = 128 ticks busy; + idle 300 + iowait 7 + steal 9
        "host_cpu_total_ns": (444 * 10_000_000.0, "ns"), "host_cpu_busy_ns": (128 * 10_000_000.0, "ns"),
        "host_cpu_steal_ns": (9 * 10_000_000.0, "ns"),
        "host_other_cpu_ns": ((128 - 36) * 10_000_000.0, "ns"),  # this process: utime 30 + stime 6
        "host_load1": (2.5, "1"), "host_runnable": (3.0, "tasks")}
    assert {r.ts_ns for r in reader.read()} == {123} and {r.device for r in reader.read()} == {"host"}


def test_missing_pressure_files_are_absent_not_zero(tmp_path):
    reader = HostReader(proc_tree(tmp_path / "proc", psi=False), clk_tck=100)
    metrics = {r.metric for r in reader.read()}
    assert not any(m.startswith("psi_") for m in metrics) and "host_cpu_steal_ns" in metrics
    unavailable = {s.name.rsplit("/", 2)[-1] for s in reader.sources() if not s.available}
    assert unavailable == {"cpu", "memory"}
    assert reader.manifest()["files"]["stat"] == "read"
    assert "FileNotFoundError" in reader.manifest()["files"]["pressure/cpu"]


def test_no_readable_file_starts_nothing(tmp_path):
    (tmp_path / "empty").mkdir()

    class Sink:
        rows: list = []

        def sample(self, **row):
            self.rows.append(row)

    sink = Sink()
    sampler = HostSampler(sink, reader=HostReader(tmp_path / "empty", clk_tck=100), host="h").start()
    sampler.stop()
    assert sink.rows == [] and sampler.manifest()["started"] is False


def test_host_sampler_writes_clock_tagged_samples(tmp_path):
    class Sink:
        def __init__(self):
            self.rows = []

        def sample(self, **row):
            self.rows.append(row)

    sink = Sink()
    sampler = HostSampler(sink, hz=50, reader=HostReader(proc_tree(tmp_path / "proc"), clk_tck=100), host="h",
                          applies_to_server=(False, "the server runs on b (--engine-host)"))
    sampler.start()
    sampler.stop()
    assert sink.rows and {(r["clock"], r["source"], r["host"]) for r in sink.rows} == {("mono:h", "host", "h")}
    m = sampler.manifest()
    assert m["applies_to_server"] is False and "--engine-host" in m["applies_why"] and m["started"] is True


# -- the ledger ---------------------------------------------------------------------------------------

def _steps(end_attrs: list[dict | None], ms: float = 10.0) -> list[dict]:
    ev, t = [], 0.0
    for sid, extra in enumerate(end_attrs, 1):
        ev.append({"name": "step.start", "ms": t, "step_id": sid, "source": "engine", "clock": "e",
                   "attrs": {"batch": [["A1", "decode", 1, 7 + sid]]}})
        ev.append({"name": "step.end", "ms": t + ms, "step_id": sid, "source": "engine", "clock": "e",
                   "attrs": {"mode": "eager", **(extra or {})}})
        t += ms + 1.0
    return ev


def test_contention_is_the_critical_threads_wait_and_cpu_the_rest(tmp_path):
    con = build_run(tmp_path / "c", _steps([
        {"cpu_ns": 6_000_000, "wait_ns": 2_500_000, "workers": 1, "workers_wait_ns_max": 4_000_000},
        {"cpu_ns": 8_000_000, "wait_ns": 1_500_000, "workers": 1, "workers_wait_ns_max": 250_000},
        {"cpu_ns": 9_000_000, "wait_ns": 750_000, "workers": 0},
        # on-CPU + wait 0.1 ms over the step (an on-CPU figure that lags): no sleep, the worker's wait not counted
        {"cpu_ns": 7_100_000, "wait_ns": 3_000_000, "workers": 1, "workers_wait_ns_max": 2_000_000},
    ]), domains=("e",), manifest={"run_id": "c"})
    rows = con.execute("SELECT step_id, measured_ms, contention_ms, cpu_ms FROM step_model ORDER BY step_id").fetchall()
    # step 1: its own 2.5 ms wait + its 1.5 ms of sleep (10 - 6 - 2.5), which the worker's 4 ms wait explains
    # step 2: 1.5 ms + the worker's 0.25 ms (the step thread slept 0.5 ms); step 3: no workers, its own wait
    assert rows == [(1, 10.0, 4.0, 6.0), (2, 10.0, 1.75, 8.25), (3, 10.0, 0.75, 9.25), (4, 10.0, 3.0, 7.0)]
    assert dict_rows(con, "SELECT * FROM gaps WHERE affects LIKE '%contention_ms%'") == []


def test_steps_without_the_figures_are_unknown_with_a_gap_never_zero(tmp_path):
    con = build_run(tmp_path / "n", _steps([
        None, {"cpu_ns": 1, "wait_ns": 20_000_000, "workers": 0},  # longer than the 10 ms step: impossible
        {"wait_ns": 1_000_000, "workers": 0},  # no on-CPU time: the sleep cannot be told
        {"cpu_ns": 9_000_000, "wait_ns": 1_000_000, "workers": 0}]), domains=("e",), manifest={"run_id": "n"})
    rows = con.execute("SELECT step_id, contention_ms, cpu_ms FROM step_model ORDER BY step_id").fetchall()
    assert rows == [(1, None, None), (2, None, None), (3, None, None), (4, 1.0, 9.0)]
    gaps = dict_rows(con, "SELECT scope, detail FROM gaps WHERE affects LIKE '%contention_ms%'")
    assert len(gaps) == 1 and gaps[0]["scope"] == "run" and gaps[0]["detail"].startswith("3 of 4 step(s)")



def test_blocked_is_the_lone_step_threads_sleep_unknown_with_workers(tmp_path):
    con = build_run(tmp_path / "b", _steps([
        {"cpu_ns": 6_000_000, "wait_ns": 1_000_000, "workers": 0},  # 3 ms asleep: a lock
        {"cpu_ns": 9_000_000, "wait_ns": 1_000_000, "workers": 0},  # on a CPU or waiting for one: none
        {"cpu_ns": 7_100_000, "wait_ns": 3_000_000, "workers": 0},  # an on-CPU figure that lags: floored at 0
        {"cpu_ns": 6_000_000, "wait_ns": 1_000_000, "workers": 1, "workers_wait_ns_max": 500_000},  # barrier sleep
        None,  # no figures at all
        {"cpu_ns": 6_000_000, "wait_ns": 1_000_000},  # another writer's: no worker count
        {"cpu_ns": 6_000_000, "wait_ns": 1_000_000, "workers": "two"},  # not a count
    ]), domains=("e",), manifest={"run_id": "b"})
    rows = con.execute("SELECT step_id, contention_ms, cpu_ms, blocked_ms FROM step_model ORDER BY step_id").fetchall()
    assert rows == [(1, 1.0, 9.0, 3.0), (2, 1.0, 9.0, 0.0), (3, 3.0, 7.0, 0.0), (4, 1.5, 8.5, None),
                    (5, None, None, None), (6, 1.0, 9.0, None), (7, 1.0, 9.0, None)]
    gaps = dict_rows(con, "SELECT detail FROM gaps WHERE affects LIKE '%blocked_ms%' ORDER BY detail")
    assert [g["detail"][:30] for g in gaps] == ["1 of 7 step(s) without on-CPU ", "1 step(s) ran with intra-op wo"]
    assert gaps[1]["detail"].endswith("; 2 step(s) recorded no worker count (step.end attrs.workers missing or not a "
                                      "count): their time blocked on a lock is unknown, not 0")

# -- a real engine on this host ------------------------------------------------------------------------

PHASE_STEPS = 3  # steps per phase: quiet, burners, quiet, burners
BURNER_NICE = -5  # where allowed (root): the burners outweigh the host's other load on their CPU


@pytest.fixture(scope="module")
def contended_run(bundle, tmp_path_factory):
    """One engine run, this thread stepping it with one intra-op thread, in four phases of PHASE_STEPS
    steps. Two CPU-burning processes share the thread's one CPU (both pinned to it; at a higher
    priority where allowed, so that the host's other load cannot hide them): started with the run,
    stopped (SIGSTOP) in the quiet phases, running (SIGCONT) in the others, so both kinds of phase
    share the host's background load; killed at the end (a few seconds of burning in all).
    -> (ledger, {step_id: burners running})."""
    import duckdb
    import torch

    from inferledger.collectors.rundir.writer import RunWriter
    from inferledger.engine import EngineConfig, LLMEngine, SamplingParams
    from inferledger.ledger.reconstruct import reconstruct

    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("this kernel hides schedstat")
    run_dir = tmp_path_factory.mktemp("contention") / "run"
    burn = "import time\nt = time.time() + 30\nwhile time.time() < t: pass"
    cpus, threads = os.sched_getaffinity(0), torch.get_num_threads()
    one = {max(cpus)}
    procs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(2)]
    phase: dict[int, bool] = {}
    try:
        for p in procs:
            os.kill(p.pid, signal.SIGSTOP)
            os.sched_setaffinity(p.pid, one)
            try:
                os.setpriority(os.PRIO_PROCESS, p.pid, BURNER_NICE)
            except PermissionError:
                pass  # at the default priority: still two more runnable threads on the step's CPU
        os.sched_setaffinity(0, one)  # this thread only
        torch.set_num_threads(1)
        with RunWriter(run_dir, run_id="contended") as writer:
            engine = LLMEngine(bundle, EngineConfig(max_num_seqs=4), sink=writer, run_id="contended")
            writer.write_manifest({"run_id": "contended", "source": "engine only", **engine.manifest()})
            prompt = bundle.tokenizer.encode("The weather today is")
            for i in range(4):
                engine.add_request(prompt, SamplingParams(max_tokens=4 * PHASE_STEPS, ignore_eos=True),
                                   request_id=f"r{i}")
            n = 0
            while engine.has_unfinished():
                burning = (n // PHASE_STEPS) % 2 == 1
                if n % PHASE_STEPS == 0:
                    for p in procs:
                        os.kill(p.pid, signal.SIGCONT if burning else signal.SIGSTOP)
                engine.step()
                phase[engine.step_id] = burning
                n += 1
            engine.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(threads)
    return duckdb.connect(str(reconstruct(run_dir).path), read_only=True), phase


def test_a_real_engine_run_has_contention_and_cpu_adding_up_to_each_step(contended_run):
    con, _ = contended_run
    rows = con.execute("SELECT measured_ms, contention_ms, cpu_ms FROM step_model").fetchall()
    assert len(rows) >= 4 * PHASE_STEPS
    assert all(c is not None and cpu is not None for _, c, cpu in rows)
    assert all(0 <= c <= m and cpu + c == pytest.approx(m, abs=1e-9) for m, c, cpu in rows)
    assert sum(c for _, c, _ in rows) > 0  # CPU-burning co-tenants ran: some wait, measured, not a default 0
    assert dict_rows(con, "SELECT * FROM gaps WHERE affects LIKE '%contention_ms%'") == []


def test_a_cpu_burning_co_tenant_shows_as_contention(contended_run):
    con, phase = contended_run
    rows = dict(con.execute("SELECT step_id, contention_ms FROM step_model").fetchall())
    burning = sorted(rows[s] for s, b in phase.items() if b)
    quiet = sorted(rows[s] for s, b in phase.items() if not b)
    # the steps beside two burners waited for a CPU more than the steps of the quiet phases
    assert burning[len(burning) // 2] > quiet[len(quiet) // 2]
    assert sum(burning) / len(burning) > sum(quiet) / len(quiet)


def test_host_samples_describe_the_server_only_on_its_host():
    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.collectors.capture.run import _host_samples_apply
    from inferledger.collectors.evidence.engine_evidence import EvidenceOptions

    assert _host_samples_apply(CaptureOptions())[0] is True
    assert _host_samples_apply(CaptureOptions(target="http://127.0.0.1:8000"))[0] is True
    applies, why = _host_samples_apply(CaptureOptions(target="http://10.0.0.2:8000",
                                                      evidence=EvidenceOptions(engine_host="gpu-7")))
    assert applies is False and "gpu-7" in why and "--engine-host" in why


def test_a_thread_holding_the_interpreter_shows_as_the_steps_blocked_time(bundle, tmp_path):
    """The step thread (one intra-op thread) beside a pure-Python loop in another thread of the process, which
    holds the interpreter lock but for the switch interval: the steps it runs beside sleep on that lock, and
    blocked_ms says so; the steps without it hardly sleep."""
    import duckdb
    import torch

    from inferledger.collectors.rundir.writer import RunWriter
    from inferledger.engine import EngineConfig, LLMEngine, SamplingParams
    from inferledger.ledger.reconstruct import reconstruct

    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("this kernel hides schedstat")
    run_dir, threads = tmp_path / "run", torch.get_num_threads()
    spinning, stop = threading.Event(), threading.Event()

    def spin():
        x = 0
        while not stop.is_set():
            if spinning.is_set():
                x += 1  # pure Python: the thread holds the interpreter lock until the switch interval ends
            else:
                spinning.wait(0.01)

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    phase: dict[int, bool] = {}
    try:
        torch.set_num_threads(1)
        with RunWriter(run_dir, run_id="blocked") as writer:
            engine = LLMEngine(bundle, EngineConfig(max_num_seqs=2), sink=writer, run_id="blocked")
            writer.write_manifest({"run_id": "blocked", "source": "engine only", **engine.manifest()})
            engine.add_request(bundle.tokenizer.encode("The weather today is"),
                               SamplingParams(max_tokens=4 * PHASE_STEPS, ignore_eos=True), request_id="r0")
            n = 0
            while engine.has_unfinished():
                (spinning.set if (n // PHASE_STEPS) % 2 == 1 else spinning.clear)()
                engine.step()
                phase[engine.step_id] = spinning.is_set()
                n += 1
            engine.close()
    finally:
        stop.set()
        spinning.set()
        spinner.join()
        torch.set_num_threads(threads)
    con = duckdb.connect(str(reconstruct(run_dir).path), read_only=True)
    rows = dict(con.execute("SELECT step_id, blocked_ms FROM step_model").fetchall())
    assert all(rows[s] is not None and rows[s] >= 0 for s in phase)
    beside = sorted(rows[s] for s, b in phase.items() if b)
    alone = sorted(rows[s] for s, b in phase.items() if not b)
    # the loop keeps the interpreter a switch interval (5 ms) each time it has it: a step beside it sleeps at least
    # one interval more than a step without it (which may still meet the run writer's thread, or another test's)
    assert beside[len(beside) // 2] >= alone[len(alone) // 2] + 5.0
    # the step fit's time is the step's own work: its on-CPU time (cpu_ms less its sleep on that lock)
    from inferledger.ledger.step_fit import fit_points
    on_cpu = dict(con.execute("SELECT step_id, cpu_ms - blocked_ms FROM step_model").fetchall())
    points = fit_points(con)
    assert points and all(p.measured_ms == on_cpu[p.step_id] for p in points)
