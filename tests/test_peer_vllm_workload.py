"""The vLLM recipe's workload and its calibrated ghost-load timeout, without vLLM: the injected timeouts
hit the three abandoned tasks' first attempts; the recipe's copy sets them to half the fastest
unloaded time to first content it measured (a probe that skips the role chunk), and changes nothing else."""
from __future__ import annotations

import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from inferledger.collectors.load.prompt_tokenizer import load_tokenizer
from inferledger.collectors.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "samples" / "workloads" / "vllm_cpu.toml"
_spec = importlib.util.spec_from_file_location("ghost_timeout", ROOT / "benchmarks" / "peers" / "ghost_timeout.py")
ghost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ghost)
GHOSTS = [7, 19, 31]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)  # the bundled model's, which the workload's prompt_tokens count in


def _injected(wl: Workload, tok) -> dict[int, tuple[float | None, bool]]:
    return {p.index: (p.first_timeout_ms, p.abandon) for p in wl.plan(tok) if p.first_timeout_ms or p.abandon}


@pytest.mark.slow
def test_the_workload_abandons_three_first_attempts_and_retries_them(tokenizer):
    wl = Workload.load(WORKLOAD)
    assert (wl.n_tasks, wl.concurrency, wl.max_attempts, wl.max_tokens) == (40, 4, 2, 16)
    assert _injected(wl, tokenizer) == {i: (300.0, True) for i in GHOSTS}


def test_the_calibrated_copy_changes_only_the_injected_timeout(tmp_path, tokenizer):
    copy = tmp_path / "elsewhere" / "w.toml"
    copy.parent.mkdir()
    copy.write_text(ghost.calibrated_workload(WORKLOAD, 12.5))
    wl, orig = Workload.load(copy), Workload.load(WORKLOAD)
    assert _injected(wl, tokenizer) == {i: (12.5, True) for i in GHOSTS}
    assert [q.prompt for q in wl.questions] == [q.prompt for q in orig.questions]  # the task set, found from there
    spec, orig_spec = json.loads(json.dumps(wl.spec)), json.loads(json.dumps(orig.spec))
    for s in (spec, orig_spec):
        s["inject"].pop("timeout_ms")
        s["taskset"].pop("file")
    assert spec == orig_spec


def test_the_timeout_is_half_the_fastest_time_to_first_content():
    assert ghost.calibrated_timeout_ms(40.0) == 20.0
    assert ghost.calibrated_timeout_ms(9_000.3) == 4_500.1  # to 0.1 ms, rounded down
    assert ghost.calibrated_timeout_ms(1.2) == 1.0  # never below the load client's smallest timeout
    for bad in (0.0, -3.0, float("nan")):
        with pytest.raises(ValueError):
            ghost.calibrated_timeout_ms(bad)


class _Chat(BaseHTTPRequestHandler):
    chunks: list[dict] = []
    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        _Chat.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for c in _Chat.chunks:
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *_a):
        pass


@pytest.fixture
def chat_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    t.join()


def test_the_probe_waits_for_content_not_the_role_chunk(chat_server):
    role = {"choices": [{"delta": {"role": "assistant", "content": ""}}]}
    _Chat.chunks, _Chat.bodies = [role, {"choices": [{"delta": {"content": "banana"}}]}], []
    assert ghost.probe_ttft_ms(chat_server, "smollm2", "Say banana") > 0
    assert _Chat.bodies == [{"model": "smollm2", "messages": [{"role": "user", "content": "Say banana"}],
                             "stream": True, "max_tokens": 16, "temperature": 0.0}]
    _Chat.chunks = [role]
    with pytest.raises(RuntimeError, match="ended without content"):
        ghost.probe_ttft_ms(chat_server, "smollm2", "Say banana")


def test_the_probe_asks_the_task_sets_first_question():
    first = json.loads((ROOT / "samples" / "tasks" / "basic.jsonl").read_text().splitlines()[0])["prompt"]
    assert ghost.first_question(WORKLOAD) == first
