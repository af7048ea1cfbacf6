"""Long work shows a progress bar on stderr when stderr is a terminal, and only then: what a command prints
on stdout (`--format json|csv`) is the same bytes with the bar drawn or not."""
from __future__ import annotations

import os
import pty
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

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


@pytest.mark.slow  # the command in processes of its own
@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_reconstruct_prints_the_same_bytes_with_its_bar_on_a_terminal_or_without(tmp_path, fmt):
    run = tmp_path / "r"
    import_archive(E0 / "preemption" / "archive.jsonl", run, run_id="r")
    rc, piped_out, piped_err = _run(["reconstruct", str(run), "--format", fmt], terminal=False)
    assert rc == 0, piped_err
    rc, tty_out, tty_err = _run(["reconstruct", str(run), "--format", fmt], terminal=True)
    assert rc == 0, tty_err
    assert tty_out == piped_out and len(piped_out) > 100
    # the bar was drawn and ended at its total: a tick per ledger stage, the last one counted when it ended
    # (which stage names a redraw happens to show depends on the build's speed)
    done = re.findall(rb"(\d+)/(\d+)", tty_err)[-1]
    assert b"reconstruct" in tty_err and done[0] == done[1] and int(done[1]) > 30, tty_err[-300:]
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
    given), the tasks, a repeat of the microbenchmarks in the idle gap before the second arrival (4 s
    after the first: the first task's end at most 2.5 s in, on a busy host too) and the end's repeat after the last task."""
    import json

    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.collectors.capture.run import capture
    from inferledger.collectors.workload import Workload

    (tmp_path / "tasks.jsonl").write_text(json.dumps({"kind": "lookup", "prompt": "Capital of France?",
                                                      "answer": "paris"}) + "\n")
    (tmp_path / "arrivals.txt").write_text("0\n4000\n")
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


def _recorded_bars(monkeypatch) -> list[str]:
    """Every bar a command opens and each description it gives it, in order (no terminal needed)."""
    from contextlib import contextmanager

    from inferledger.cli import progress

    said: list[str] = []

    class Recorder(progress.Bar):
        def update(self, description=None, **kw) -> None:
            if description is not None:
                said.append(description)

    @contextmanager
    def bar(description, total=None, **kw):
        said.append(description)
        yield Recorder(None, None)
    monkeypatch.setattr(progress, "progress_bar", bar)
    return said


def test_serve_shows_its_start_up_the_load_then_the_engines_warm_up(bundle, monkeypatch):
    """Both slow steps before `serving ...` (the load, then the engine's compiled first step) are on
    the spinner; the listening is refused here (a fake), which ends the command at once."""
    from typer.testing import CliRunner

    from inferledger.cli.app import app
    from inferledger.engine import loader
    from inferledger.serve import lifecycle

    said = _recorded_bars(monkeypatch)

    class FakeServing:
        def __init__(self, *a, **kw):
            said.append("engine built")

        def start(self, host, port):
            raise OSError(98, "Address already in use")

        def stop(self, *a, **kw):
            return SimpleNamespace(in_flight=0, cancelled=0)
    monkeypatch.setattr(loader, "load_model", lambda *a, **kw: bundle)
    monkeypatch.setattr(lifecycle, "Serving", FakeServing)
    res = CliRunner().invoke(app, ["serve", "--port", "0"])
    assert res.exit_code == 2 and "already" in res.output and "--port" in res.output, res.output
    assert said == ["loading the bundled model", "warming up the engine (its compiled step)", "engine built"]


def test_predict_shows_the_load_the_microbenchmarks_and_the_plan(bundle, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from inferledger.cli.app import app
    from inferledger.collectors.capture import microbench
    from inferledger.engine import loader

    said = _recorded_bars(monkeypatch)
    real = microbench.device_params
    ticks = iter(range(10**6))

    def measured(b, **kw):  # the real measurement, small and on a clock that moves 1 ms a reading
        said.append("measured")
        return real(b, max_batch=2, max_tokens=4, cpu_threads=1, timer=lambda: next(ticks) * 1e-3,
                    stream_bytes=1 << 20)
    monkeypatch.setattr(loader, "load_model", lambda *a, **kw: bundle)
    monkeypatch.setattr(microbench, "device_params", measured)
    res = CliRunner().invoke(app, ["predict", "-w", str(E0.parent / "workloads" / "cpu_demo.toml"),
                                   "-o", str(tmp_path / "p.json"), "-f", "json"])
    assert said[:4] == ["predicting", "loading the bundled model", "measuring this host's roofs (microbenchmarks)",
                        "measured"], (said, res.output)
    assert said[4:] == ["planning the steps"] and res.exit_code == 0, (said, res.output)


@pytest.mark.parametrize("args, module", [
    (["capture", "-o", "{tmp}/run", "--target", "http://127.0.0.1:9", "--num-prompts", "1", "--dataset", "{tmp}/t.jsonl"],
     "inferledger.collectors.capture.run"),
    (["serve", "--port", "0"], "inferledger.serve.lifecycle"),
    (["study", "load", "-o", "{tmp}/s"], "inferledger.studies.registry"),
])
def test_the_bar_is_up_before_the_slow_imports(tmp_path, args, module):
    """A fresh process: when the bar opens, the command's heavy module (torch behind it) is not imported
    yet, so those seconds are under the bar (the bar ends the command there, before any work)."""
    script = (
        "import sys, contextlib\n"
        "from inferledger.cli import progress\n"
        "@contextlib.contextmanager\n"
        "def bar(*a, **kw):\n"
        "    print('bar opened; imported:', sys.argv[1] in sys.modules, flush=True)\n"
        "    raise SystemExit(0)\n"
        "    yield\n"
        "progress.progress_bar = bar\n"
        "from inferledger.cli.app import app\n"
        "app(sys.argv[2:])\n")
    (tmp_path / "t.jsonl").write_text('{"prompt": "Capital of France?", "answer": "paris"}\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    res = subprocess.run([sys.executable, "-c", script, module, *argv], capture_output=True, text=True, timeout=300)
    assert res.stdout == "bar opened; imported: False\n", (res.stdout, res.stderr)


def test_import_and_export_show_a_spinner_while_they_work(monkeypatch, tmp_path):
    """The other commands whose work grows with the run: an E0 archive's import, a load tool's output
    joined with its server run, a recorded capture's rejoin, and an export."""
    from typer.testing import CliRunner

    from inferledger.cli.app import app
    from inferledger.ledger.reconstruct import reconstruct

    said = _recorded_bars(monkeypatch)
    archive = E0 / "cancel_release" / "archive.jsonl"
    peers = E0.parent / "peers"
    runs = [("import", str(archive), "--out", str(tmp_path / "e0")),
            ("import", "--from", "vllm-recording", str(peers / "vllm-0.32-cpu"), "-o", str(tmp_path / "rec")),
            ("import", "--from", "guidellm", str(peers / "guidellm-0.8.1" / "tool"), "--server",
             str(peers / "guidellm-0.8.1" / "server"), "-o", str(tmp_path / "g"))]
    for args in runs:
        res = CliRunner().invoke(app, list(args))
        assert res.exit_code == 0, (args, res.output)
    reconstruct(tmp_path / "e0")
    res = CliRunner().invoke(app, ["export", str(tmp_path / "e0"), "--as", "perfetto", "-o", str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.output
    assert said == [f"import {archive}", f"import {peers / 'vllm-0.32-cpu'}: joining the engine's evidence",
                    f"import guidellm output {peers / 'guidellm-0.8.1' / 'tool'} and join it with the server's",
                    f"export {tmp_path / 'e0'} as perfetto"]
