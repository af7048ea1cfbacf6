"""A capture's first second: the manifest is there before the model loads, and a capture whose
preparation fails (model, tokenizer, prompts) leaves no folder behind."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferledger.collectors.capture import run as capture_mod
from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.workload import Workload
from inferledger.engine import loader

WORKLOAD = Path(__file__).resolve().parent.parent / "samples" / "workloads" / "cpu_short_chat.toml"


class LoadStopped(RuntimeError):
    pass


@pytest.fixture
def listening():
    """A base URL something listens on (a bare socket, no server, no model): the capture's connect check
    passes, so a test reaches the preparation step it is about."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def _dead_url() -> str:
    """A loopback URL nothing listens on (a port taken from the system, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_the_manifest_exists_while_the_model_loads_and_goes_if_loading_fails(tmp_path, monkeypatch):
    out = tmp_path / "new" / "run"
    seen = {}

    def load_model_spy(model=None, device="cpu"):  # the real loader would take seconds to get here
        seen.update(json.loads((out / "manifest.json").read_text()))
        raise LoadStopped("stopped while loading")

    monkeypatch.setattr(loader, "load_model", load_model_spy)
    with pytest.raises(LoadStopped):
        capture_mod.capture(WORKLOAD, out)
    assert seen["state"] == "starting" and seen["run_id"] == "run"
    assert seen["workload"]["sha256"] == Workload.load(WORKLOAD).sha256
    assert seen["target"] == {"kind": "embedded", "url": "embedded"}
    # nothing was recorded: the folder this capture made (and its new parent) are gone again
    assert not out.exists() and not out.parent.exists() and tmp_path.exists()


def test_a_tokenizer_that_cannot_load_leaves_no_run(tmp_path, listening):
    wl = tmp_path / "w.toml"
    text = WORKLOAD.read_text().replace('file = "../tasks/basic.jsonl"',
                                        f'file = "{WORKLOAD.parent.parent / "tasks" / "basic.jsonl"}"')
    wl.write_text(text + '\n[prompt]\ntokenizer = "/nonexistent/tokenizer"\n')
    assert Workload.load(wl).needs_tokenizer  # this workload builds exact prompts: it needs the tokenizer
    out = tmp_path / "run"
    out.mkdir()  # an empty folder the user made stays, empty
    with pytest.raises(Exception, match="nonexistent"):
        capture_mod.capture(wl, out, CaptureOptions(target=listening))
    assert out.exists() and list(out.iterdir()) == []


@pytest.mark.slow
def test_the_workload_tokenizer_is_read_through_the_loaders_checks(tmp_path):
    from inferledger.collectors.load.prompt_tokenizer import load_tokenizer
    from inferledger.engine.loader import ModelLoadError

    bad = tmp_path / "half.gguf"
    bad.write_bytes(loader.default_model_path().read_bytes()[:4096])  # a torn copy of the bundled file
    with pytest.raises(ModelLoadError, match=r"half\.gguf: unreadable GGUF"):
        load_tokenizer(str(bad))
    assert load_tokenizer("bundled").hash == loader.load_tokenizer().hash


def test_a_folder_holding_a_run_is_refused_and_keeps_its_manifest(tmp_path, listening):
    from inferledger.collectors.rundir.out_dir import RunExistsError

    out = tmp_path / "run"
    out.mkdir()
    (out / "manifest.json").write_text('{"run_id": "run", "state": "complete"}')
    with pytest.raises(RunExistsError):
        capture_mod.capture(WORKLOAD, out, CaptureOptions(target=listening))
    assert json.loads((out / "manifest.json").read_text()) == {"run_id": "run", "state": "complete"}


@pytest.mark.slow
def test_the_calibration_probe_runs_as_the_step_thread_will(bundle):
    import os

    import torch

    from inferledger.collectors.capture.speed_probe import probe_throughput

    before = torch.get_num_threads()
    speed = probe_throughput(bundle, max_num_seqs=2, tokens=2)
    # cpu_threads "auto": one intra-op thread fewer than the CPUs this process may use (2 here: 1)
    assert speed.threads == len(os.sched_getaffinity(0)) - 1 and speed.tok_s > 0
    assert torch.get_num_threads() == before  # the caller's own thread count is left alone
    assert probe_throughput(bundle, max_num_seqs=2, tokens=2, engine_config={"cpu_threads": None}).threads is None


def _long_prompt_workload(tmp_path, prompt_tokens: int) -> Path:
    wl = tmp_path / "long.toml"
    wl.write_text(WORKLOAD.read_text().replace('file = "../tasks/basic.jsonl"',
                                               f'file = "{WORKLOAD.parent.parent / "tasks" / "basic.jsonl"}"')
                  + f'\n[[classes]]\nname = "huge"\nprompt_tokens = {prompt_tokens}\n')
    return wl


def test_a_prompt_past_the_models_context_is_refused_before_the_run_folder_exists(tmp_path, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("the model must not load for a workload the model cannot take")

    monkeypatch.setattr(loader, "load_model", no_load)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"\[\[classes\]\]\[1\]\.prompt_tokens: 9000 \+ max_tokens \d+ = \d+ "
                                         r"exceeds the model's context of 8192 tokens"):
        capture_mod.capture(_long_prompt_workload(tmp_path, 9000), out)
    assert not out.exists()


def test_a_url_target_without_a_context_skips_the_check_and_says_so():
    wl = Workload.load(WORKLOAD)
    context = wl.check_context(*capture_mod._served_context(wl, CaptureOptions(target="http://127.0.0.1:9"), None))
    assert context["checked"] is False and context["tokens"] is None and "URL target" in context["why"]


def test_sigterm_while_preparing_leaves_no_run_and_no_starting_manifest(tmp_path, monkeypatch):
    import os
    import signal

    from inferledger.collectors.capture.interrupt import Interrupted

    def load_then_sigterm(model=None, device="cpu"):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the preparation")

    def unhandled(signum, frame):  # what the default disposition would do: end the process, run left 'starting'
        raise SystemExit("SIGTERM not handled while preparing")

    monkeypatch.setattr(loader, "load_model", load_then_sigterm)
    old = signal.signal(signal.SIGTERM, unhandled)
    out = tmp_path / "run"
    try:
        with pytest.raises(Interrupted) as info:
            capture_mod.capture(WORKLOAD, out)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert info.value.signum == signal.SIGTERM and info.value.recorded is False and info.value.exit_code == 143
    assert not out.exists()


def test_the_capture_command_refuses_a_prompt_past_the_context_with_exit_2_and_writes_nothing(tmp_path):
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["capture", "-w", str(_long_prompt_workload(tmp_path, 9000)), "-o", str(out)])
    flat = res.output.replace("\n", "")
    assert res.exit_code == 2 and "[[classes]][1].prompt_tokens: 9000 + max_tokens" in flat  # the key, not markup
    assert not out.exists()


def test_a_session_whose_later_turn_cannot_fit_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """Turn 1 fits (64 + 2000 tokens of 8192) but the chat grows by each answer: by turn 5 it cannot, and
    the capture says so, with the task, the turn, its length and the context, before any weights load."""
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    def no_load(*a, **k):
        raise AssertionError("the model must not load for a workload the model cannot take")

    monkeypatch.setattr(loader, "load_model", no_load)
    wl = tmp_path / "chat.toml"
    wl.write_text(WORKLOAD.read_text().replace('file = "../tasks/basic.jsonl"',
                                               f'file = "{WORKLOAD.parent.parent / "tasks" / "basic.jsonl"}"')
                  .replace('prompt_tokens = 128', 'prompt_tokens = 64\nshape = "session"\nturns = 8\nmax_tokens = 2000'))
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"\[\[classes\]\]\[0\]\.turns: task T0000's turn 5 of 8 reaches \d+ prompt "
                                         r"tokens \(the first turn's 64, then 4 answer\(s\) at max_tokens 2000 .*\) "
                                         r"\+ max_tokens 2000 = \d+ exceeds the model's context of 8192 tokens "
                                         r"\(allowed: turns <= 4"):
        capture_mod.capture(wl, out)
    assert not out.exists()
    res = CliRunner().invoke(app, ["capture", "-w", str(wl), "-o", str(out)])
    assert res.exit_code == 2 and "[[classes]][0].turns: task T0000's turn 5 of 8" in res.output.replace("\n", "")
    assert not out.exists()


def test_a_failure_while_the_run_opens_leaves_no_run_and_no_writer_behind(tmp_path, monkeypatch, listening):
    """Past the preparation, opening the run (its writer, the registered prediction, the first manifest,
    the samplers) can still fail: nothing was recorded, so the folder goes as after a failed preparation,
    and the writer's flush thread does not write into it afterwards."""
    import threading
    import time

    class SamplerBroken(RuntimeError):
        pass

    def broken(*a, **k):
        raise SamplerBroken("the host sampler cannot start")

    monkeypatch.setattr(capture_mod, "HostSampler", broken)
    monkeypatch.setattr(capture_mod, "AUTOFLUSH_S", 0.05)
    out = tmp_path / "new" / "run"
    with pytest.raises(SamplerBroken):
        capture_mod.capture(WORKLOAD, out, CaptureOptions(target=listening))
    time.sleep(0.3)  # a flush thread left running would write clocks.parquet and the manifest again
    assert not out.exists() and not out.parent.exists() and tmp_path.exists()
    assert not [t for t in threading.enumerate() if t.name == "run-writer-flush"]


@pytest.mark.slow
def test_sigint_while_the_model_loads_leaves_no_run_and_exits_130(tmp_path):
    """The real command in its own process, stopped by SIGINT once its manifest says "starting" (the
    model loading): exit 130, one line saying nothing was recorded, no folder, no traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    cli = Path(sys.executable).parent / "inferledger"
    proc = subprocess.Popen([str(cli), "capture", "-w", str(WORKLOAD), "-o", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
    deadline = time.monotonic() + 60
    while not (out / "manifest.json").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert json.loads((out / "manifest.json").read_text())["state"] == "starting"
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "interrupted (SIGINT) while preparing: nothing was recorded" in output and "Traceback" not in output
    assert not out.exists()


def test_a_url_target_nothing_listens_on_is_refused_before_the_run_folder_exists(tmp_path):
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    dead = _dead_url()
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=f"--target {dead}: nothing listens at 127.0.0.1:{dead.rsplit(':', 1)[1]} "):
        capture_mod.capture(WORKLOAD, out, CaptureOptions(target=dead))
    assert not out.exists()
    res = CliRunner().invoke(app, ["capture", "--target", dead, "--num-prompts", "2", "-o", str(out), "--no-microbench"])
    flat = " ".join(res.output.split())
    assert res.exit_code == 2 and f"error: --target {dead}: nothing listens at " in flat, res.output
    assert "is the server running there?" in flat and "nothing was written" in flat and "Traceback" not in flat
    assert "keeps what was recorded" not in flat and not out.exists()


def test_a_dead_router_metrics_url_or_replica_is_refused_naming_its_flag(tmp_path, listening):
    from inferledger.collectors.capture.deployment import ReplicaSpec

    dead, out = _dead_url(), tmp_path / "run"
    with pytest.raises(ValueError, match=f"^--router-metrics {dead}/metrics: nothing listens at "):
        capture_mod.capture(WORKLOAD, out, CaptureOptions(target=listening, router_metrics=f"{dead}/metrics"))
    with pytest.raises(ValueError, match=f"^--replica {dead}: nothing listens at "):
        capture_mod.capture(WORKLOAD, out, CaptureOptions(target=listening, replicas=(ReplicaSpec(dead, "blackbox"),)))
    entry = ReplicaSpec(dead, "vllm", where="w.toml: [deployment].replicas[0]")  # declared in the workload file
    with pytest.raises(ValueError, match=fr"^w\.toml: \[deployment\]\.replicas\[0\]: {dead}: nothing listens at "):
        capture_mod.capture(WORKLOAD, out, CaptureOptions(target=listening, replicas=(entry,)))
    assert not out.exists()
