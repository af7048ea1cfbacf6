"""Long work shows a progress bar on stderr when stderr is a terminal, and only then: what a command prints
on stdout (`--format json|csv`) is the same bytes with the bar drawn or not."""
from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from inferledger.collectors.rundir.e0_import import import_archive

E0 = Path(__file__).resolve().parent.parent / "samples" / "e0"
EXE = str(Path(sys.executable).with_name("inferledger"))  # the venv's command, beside its python


def _run(args: list[str], *, terminal: bool) -> tuple[int, bytes, bytes]:
    """The command with stdout piped and stderr a pseudo-terminal (`terminal`) or a pipe."""
    env = {**os.environ, "COLUMNS": "120"}
    env.pop("FORCE_COLOR", None)
    if not terminal:
        res = subprocess.run([EXE, *args], capture_output=True, env=env, timeout=600)
        return res.returncode, res.stdout, res.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen([EXE, *args], stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks: list[bytes] = []

    def pump() -> None:
        while True:
            try:
                got = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                return
            if not got:
                return
            chunks.append(got)
    reader = threading.Thread(target=pump)
    reader.start()
    out = proc.stdout.read()
    proc.wait(timeout=600)
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, out, b"".join(chunks)


def test_progress_bar_helper_without_a_terminal_draws_nothing_and_says_lines_on_stdout(capsys):
    from inferledger.cli.progress import progress_bar

    with progress_bar("work", 3) as bar:
        assert not bar.shown
        bar.advance()
        bar.update("more work", completed=2)
        bar.say("a line")
    out, err = capsys.readouterr()
    assert out == "a line\n" and err == ""


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_reconstruct_prints_the_same_bytes_with_its_bar_on_a_terminal_or_without(tmp_path, fmt):
    run = tmp_path / "r"
    import_archive(E0 / "preemption" / "archive.jsonl", run, run_id="r")
    rc, piped_out, piped_err = _run(["reconstruct", str(run), "--format", fmt], terminal=False)
    assert rc == 0, piped_err
    rc, tty_out, tty_err = _run(["reconstruct", str(run), "--format", fmt], terminal=True)
    assert rc == 0, tty_err
    assert tty_out == piped_out and len(piped_out) > 100
    assert b"reconstruct" in tty_err and b"gaps" in tty_err  # the bar was drawn, a tick per ledger stage
    assert piped_err == b""  # no terminal, no bar


def test_repartition_prints_the_same_json_with_its_bar_on_a_terminal_or_without(tmp_path):
    import_archive(E0 / "preemption" / "archive.jsonl", tmp_path / "a", run_id="r")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    rc, piped_out, piped_err = _run(["repartition", str(tmp_path / "a"), "-b", "2", "-f", "json"], terminal=False)
    assert rc == 0, piped_err
    rc, tty_out, tty_err = _run(["repartition", str(tmp_path / "b"), "-b", "2", "-f", "json"], terminal=True)
    assert rc == 0, tty_err
    assert tty_out == piped_out and piped_out.startswith(b"[{")
    assert b"repartition" in tty_err and piped_err == b""


def test_a_capture_says_each_slow_step_its_microbenchmarks_included(bundle, tmp_path):
    """The stages a capture's bar shows, in order: the device measured before the load (the model was
    given), the tasks, a repeat of the microbenchmarks in the idle gap before the second arrival (2.5 s
    after the first) and the end's repeat after the last task."""
    import json

    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.collectors.capture.run import capture
    from inferledger.collectors.workload import Workload

    (tmp_path / "tasks.jsonl").write_text(json.dumps({"kind": "lookup", "prompt": "Capital of France?",
                                                      "answer": "paris"}) + "\n")
    (tmp_path / "arrivals.txt").write_text("0\n2500\n")
    (tmp_path / "w.toml").write_text('name = "progress-test"\nseed = 1\n[taskset]\nfile = "tasks.jsonl"\n'
                                     '[arrivals]\nprocess = "replay"\nfile = "arrivals.txt"\n[contract]\n'
                                     'deadline_ms = 120000\n[client]\ntimeout_ms = 60000\n[generation]\n'
                                     'max_tokens = 4\ntemperature = 0.0\n[[classes]]\nname = "chat"\n'
                                     'prompt_tokens = 24\n')
    said: list[str] = []
    capture(Workload.load(tmp_path / "w.toml"), tmp_path / "run", CaptureOptions(max_num_seqs=2), bundle=bundle,
            on_ready=lambda: said.append("ready"), progress=lambda: said.append("task"),
            on_stage=said.append)
    assert said == ["measuring the device (microbenchmarks)", "ready", "task",
                    "tasks (measuring the device in an idle gap)", "tasks", "task",
                    "measuring the device again (the end's microbenchmarks)"]


def test_a_study_on_the_real_engine_ticks_each_task_of_the_run_it_captures(bundle, tmp_path):
    """A study's producer that captures tells the study's watcher each task done, of the run's total (the
    ticks do not depend on the dtype: the fp32 model the capture test above loaded serves)."""
    from inferledger.studies.framework import Study, StudyRun, StudyWatch, Table, run_study
    from inferledger.studies.real import capture_run, workload

    def produce(run_dir, run_id, bundle):
        wl = workload("ticks", [{"name": "chat", "prompt_tokens": 48}], max_tokens=3, arrivals_ms=[0, 20, 40])
        capture_run(run_dir, run_id, wl, bundle, max_num_seqs=2)

    study = Study("ticks", "?", "nothing", lambda options: [StudyRun("one", {}, produce)],
                  lambda runs: [Table("t", "t", ["run"], [["one"]])], needs_model=True)
    ticks: list[tuple] = []
    run_study(study, tmp_path / "s", bundle=bundle, watch=StudyWatch(on_task=lambda *a: ticks.append(a)))
    assert ticks == [(1, 3), (2, 3), (3, 3)]
