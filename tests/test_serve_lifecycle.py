"""Stopping a server: stop admitting, let in-flight requests finish up to the drain timeout, then
cancel what is left, so every attempt ends with a terminal event; and a run it owns is written."""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pyarrow.parquet as pq

from inferledger.collectors.rundir.writer import RunWriter
from inferledger.engine import EngineConfig
from inferledger.probes.probe import ListSink
from inferledger.serve.lifecycle import Serving
from inferledger.serve.options import ServeOptions


def _post(url: str, attempt: str, max_tokens: int, stream: bool = False):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0, "stream": stream}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={
        "content-type": "application/json", "x-inferledger-attempt-id": attempt})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait_front_idle(url: str, timeout_s: float = 30.0) -> None:
    """Until /health says nothing is in flight: a response can reach the client a moment before its
    handler has finished (and left the front end's count), and a stop begun in that moment rightly
    counts it as in flight."""
    deadline = time.monotonic() + timeout_s
    while json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())["in_flight"]:
        assert time.monotonic() < deadline, "the front end never went idle"
        time.sleep(0.01)


def _names(rows: list[dict], attempt: str) -> list[str]:
    return [r["name"] for r in rows if r["attempt_id"] == attempt]


def _first_token(sink: ListSink, attempt: str, client: threading.Thread, event: str = "engine.token") -> None:
    """Wait until the attempt's first `event` (the engine's first token, or with server.write the stream's
    first bytes sent, its response prepared) is recorded (or its client gave up: then fail)."""
    while not any(r["name"] == event and r["attempt_id"] == attempt for r in list(sink.rows)):
        assert client.is_alive(), f"{attempt} ended before its first token: {_names(sink.rows, attempt)}"
        client.join(0.01)


def test_a_request_left_after_the_drain_timeout_is_cancelled_with_terminal_events(bundle):
    sink = ListSink()
    life = Serving(bundle, EngineConfig(max_num_seqs=2), ServeOptions(model_name="m"), sink=sink)
    url = life.start()
    got = {}
    long = threading.Thread(target=lambda: got.update(long=_post(url, "LONG", 1500, stream=True)))
    long.start()
    # its stream has started (its first bytes written, so its status is sent), far from its 1500 tokens; the
    # engine's first token alone may come before the response is prepared, and a stop then rightly answers 503
    _first_token(sink, "LONG", long, event="server.write")
    drain = life.stop(drain_timeout_s=0)
    long.join(60)
    assert (drain.in_flight, drain.cancelled, drain.left) == (1, 1, 0)
    names = _names(sink.rows, "LONG")
    assert "engine.cancel_received" in names and "engine.cancel_effective" in names
    done = [r for r in sink.rows if r["attempt_id"] == "LONG" and r["name"] == "server.done"]
    assert len(done) == 1 and json.loads(done[0]["attrs"])["aborted"] == "server shutting down"
    finished = [r for r in sink.rows if r["attempt_id"] == "LONG" and r["name"] == "engine.finished"]
    assert len(finished) == 1 and json.loads(finished[0]["attrs"])["reason"] == "cancelled"
    status, body = got["long"]
    assert status == 200 and b"[DONE]" not in body  # the stream had started; it ends without [DONE]
    assert life.engine.check_integrity() and not life.engine.has_unfinished()


def test_draining_refuses_new_requests_and_lets_in_flight_ones_finish(bundle):
    sink = ListSink()
    life = Serving(bundle, EngineConfig(max_num_seqs=2), ServeOptions(model_name="m"), sink=sink)
    url = life.start()
    got = {}
    first = threading.Thread(target=lambda: got.update(first=_post(url, "FIRST", 24)))
    first.start()
    _first_token(sink, "FIRST", first)
    stopper = threading.Thread(target=lambda: got.update(drain=life.stop(drain_timeout_s=300)))
    stopper.start()
    while not life.front.draining:
        stopper.join(0.01)
    got["late"] = _post(url, "LATE", 4)
    first.join(300)
    stopper.join(300)
    status, body = got["late"]
    assert status == 503 and json.loads(body)["error"]["code"] == "server_shutting_down"
    assert _names(sink.rows, "LATE") == ["server.received", "server.rejected"]
    status, body = got["first"]
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 24
    assert _names(sink.rows, "FIRST")[-1] == "server.done" and "engine.cancel_received" not in _names(sink.rows, "FIRST")
    drain = got["drain"]
    assert (drain.in_flight, drain.cancelled, drain.left) == (1, 0, 0)


def test_a_run_the_server_owns_is_written_when_it_stops(bundle, tmp_path):
    run = tmp_path / "srv"
    writer = RunWriter(run)
    life = Serving(bundle, EngineConfig(max_num_seqs=2), ServeOptions(model_name="m"), sink=writer, owns_run=True)
    url = life.start()
    assert json.loads((run / "manifest.json").read_text())["state"] == "running"
    assert _post(url, "A1", 3)[0] == 200
    _wait_front_idle(url)
    life.stop(stopped_by="SIGINT")
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["state"], manifest["interrupted"], manifest["served_model_name"]) == ("interrupted", "SIGINT", "m")
    assert manifest["drain"]["in_flight"] == 0 and manifest["drain"]["cancelled"] == 0
    parts = list((run / "events").glob("part-*.parquet"))
    assert len(parts) == 1  # compacted: a clean stop
    names = [r["name"] for r in pq.read_table(parts[0]).to_pylist() if r["attempt_id"] == "A1"]
    assert names[0] == "server.received" and names[-1] == "server.done"
    clocks = pq.read_table(run / "clocks.parquet").to_pylist()
    assert any(c["to_clock"] == f"wall:{life.host}" and c["from_clock"] == life.clock for c in clocks)
    # the host sampled from start to stop, on the server's clock, as a capture samples it
    assert manifest["host_samples"]["applies_to_server"] is True and manifest["host_samples"]["clock"] == life.clock
    host = [r for r in pq.read_table(run / "samples").to_pylist() if r["source"] == "host"]
    assert host and {r["clock"] for r in host} == {life.clock}
