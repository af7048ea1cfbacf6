"""A real `inferledger capture` killed mid-run (SIGKILL, SIGTERM) keeps everything flushed before the kill:
the run rebuilds, every attempt whose `attempt.done` was on disk is a completed attempt of the ledger,
and SIGTERM ends like Ctrl-C (manifest interrupted, exit 143, no traceback)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from serve_util import free_port, wait_healthy

from inferledger.ledger.reconstruct import reconstruct

pytestmark = pytest.mark.slow
START_LIMIT_S = 600  # model load and first answers on a busy 2-core host: a bound, not a timing
WORKLOAD = """
name = "durable"
seed = 1
[taskset]
file = "tasks.jsonl"
[arrivals]
process = "poisson"
rate_rps = 2.0
n_tasks = 2000
[contract]
deadline_ms = 600000
[client]
timeout_ms = 600000
[generation]
max_tokens = 6
temperature = 0.0
"""


def _done_on_disk(run: Path) -> set[str]:
    done = set()
    for part in sorted((run / "events").glob("part-*.parquet")):  # parts are renamed in whole
        t = pq.read_table(part, columns=["name", "attempt_id"]).to_pylist()
        done |= {r["attempt_id"] for r in t if r["name"] == "attempt.done"}
    return done


def _capture_until(tmp_path: Path, n_done: int):
    """A capture (no microbenchmarks: they are not what a kill may lose) until `n_done` attempts' ends are on disk."""
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"kind": "lookup", "answer": "paris", "prompt":
                                                      "What is the capital of France? Answer in one word."}) + "\n")
    (tmp_path / "w.toml").write_text(WORKLOAD)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "inferledger.cli.app", "capture", "-w", str(tmp_path / "w.toml"),
                             "-o", str(run), "--no-microbench"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + START_LIMIT_S
    done: set[str] = set()
    while len(done) < n_done and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        done = _done_on_disk(run) if (run / "events").is_dir() else set()
    assert (run / "manifest.json").exists(), "the manifest exists while the capture runs"
    return proc, run, done


def _completed(run: Path) -> set[str]:
    reconstruct(run)
    con = duckdb.connect(str(run / "ledger.duckdb"), read_only=True)
    return {r[0] for r in con.execute("SELECT attempt_id FROM attempts WHERE client_status = 'completed'").fetchall()}


def test_sigkill_keeps_every_flushed_attempt(tmp_path):
    proc, run, done = _capture_until(tmp_path, 3)
    try:
        assert len(done) >= 3, "attempts finished but none reached the disk: nothing is flushed while running"
    finally:
        proc.kill()
        proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["state"] == "running" and manifest["flushed"]["events"] > 0  # a killed run says so
    assert done <= _completed(run)


def test_sigterm_flushes_marks_the_manifest_and_exits_143(tmp_path):
    proc, run, done = _capture_until(tmp_path, 3)
    try:
        assert len(done) >= 3
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "never retrieved" not in err, err
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["state"], manifest["interrupted"]) == ("interrupted", "SIGTERM")
    assert done <= _completed(run)


@pytest.mark.dtype  # the serve command at the resolved dtype (capture's: tests/test_resolved_dtype.py)
def test_serve_out_flushes_while_serving_and_stops_on_sigterm(tmp_path):
    import urllib.request

    run, port = tmp_path / "srv", free_port()
    proc = subprocess.Popen([sys.executable, "-m", "inferledger.cli.app", "serve", "--port", str(port), "--out", str(run),
                             "--served-model-name", "m"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        up = wait_healthy(proc, f"http://127.0.0.1:{port}")
        assert up and json.loads((run / "manifest.json").read_text())["state"] == "running"
        body = json.dumps({"model": "m", "prompt": "The capital of France is", "max_tokens": 4}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"content-type": "application/json", "x-request-id": "S1"})
        assert urllib.request.urlopen(req, timeout=120).status == 200
        deadline, flushed = time.monotonic() + 60, False  # flushed within a period or two
        while not flushed and time.monotonic() < deadline:
            time.sleep(0.5)
            flushed = any(r["name"] == "server.done" for p in (run / "events").glob("part-*.parquet")
                          for r in pq.read_table(p, columns=["name"]).to_pylist())
        assert flushed, "the server's events reach the disk while it still serves"
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err, err
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["state"], manifest["interrupted"]) == ("interrupted", "SIGTERM")
    assert len(list((run / "events").glob("part-*.parquet"))) == 1  # compacted at the end
    con_done = _completed(run)
    assert con_done == set()  # no client events: nothing is client-completed, the server's side is there
    con = duckdb.connect(str(run / "ledger.duckdb"), read_only=True)
    assert con.execute("SELECT server_status FROM attempts WHERE attempt_id = 'S1'").fetchone()[0] == "completed"


def test_serve_started_with_sigint_ignored_still_stops_on_sigint(tmp_path):
    """A shell script's background job (`inferledger serve &`) inherits SIGINT ignored; `kill -INT`
    must stop it all the same, with its run written."""
    run, port = tmp_path / "bg", free_port()
    proc = subprocess.Popen([sys.executable, "-m", "inferledger.cli.app", "serve", "--port", str(port), "-o", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        up = wait_healthy(proc, f"http://127.0.0.1:{port}")
        assert up, proc.stderr.read() if proc.poll() is not None else "not up"
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)  # a bound: it stops, or the test fails
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["state"], manifest["interrupted"]) == ("interrupted", "SIGINT")


def test_sigint_raises_inside_the_stop_block_whatever_the_process_inherited():
    from inferledger.collectors.capture.interrupt import sigterm_like_sigint

    import os

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job starts
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigterm_like_sigint():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler runs here; reaching the end means SIGINT was ignored
                raise AssertionError("SIGINT was ignored inside the block")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the inherited disposition is back
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_signal_during_the_runs_last_close_waits_for_it_and_is_acted_on_after():
    """A SIGTERM or Ctrl-C that lands while a finished run is being closed (its parts compacted and renamed
    into place) must not cut the close half-way, nor escape as a bare KeyboardInterrupt (the process then
    died by SIGINT, exit -2, with a traceback): it is held and reported after the block."""
    import os

    from inferledger.collectors.capture.interrupt import Interrupted, signals_held

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    done = []
    with signals_held() as held:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handlers run between bytecodes: had either raised, the line below would not run
        done.append("closed")
    assert done == ["closed"] and held["signum"] == signal.SIGTERM  # the first that came
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    exc = Interrupted(held["signum"], finished=True)
    assert exc.exit_code == 143 and exc.finished
