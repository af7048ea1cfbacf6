"""Capture against a vLLM-like stub that reports about itself (OTLP spans to our receiver, a /metrics
endpoint) with bad evidence mixed in: each bad span or scrape line costs only itself (a gap row, the
item kept raw), a /metrics that trickles costs only its scrapes, and the manifest's state and counts
say what the ledger holds."""
from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from serve_util import free_port

from inferledger.collectors.capture.run import capture
from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.evidence.engine_evidence import EvidenceOptions
from inferledger.collectors.evidence import engine_evidence
from inferledger.collectors.workload import Workload
from inferledger.serve.thread import ServerThread
from inferledger.ledger.reconstruct import reconstruct

N_TASKS = 8
LAT = "gen_ai.latency."
GOOD_METRICS = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 1.0\n'
                '# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name="m"} 40.0\n')
BAD_LINE = 'vllm:x{a="b" 1'


def _kv(key, **value):
    return {"key": key, "value": value}


def _span(task: int, trace_id: str, request_id: str, bad: bool) -> dict:
    """vLLM's llm_request for one attempt; with `bad`, tasks 1-4 carry one field a run cannot hold."""
    start = time.time_ns()
    attrs = {"gen_ai.request.id": {"stringValue": f"chatcmpl-{request_id}"},
             LAT + "time_to_first_token": {"doubleValue": 0.01}, LAT + "time_in_queue": {"doubleValue": 0.001},
             LAT + "time_in_model_prefill": {"doubleValue": 0.005}, LAT + "time_in_model_decode": {"doubleValue": 0.02},
             LAT + "e2e": {"doubleValue": 0.03}, "gen_ai.usage.prompt_tokens": {"intValue": "9"},
             "gen_ai.usage.completion_tokens": {"intValue": "5"}}
    task = task if bad else 0
    if task == 1:
        attrs[LAT + "time_to_first_token"] = {"doubleValue": "NaN"}
    if task == 3:
        attrs[LAT + "time_to_first_token"] = {"doubleValue": "Infinity"}
    if task == 4:
        attrs["gen_ai.usage.completion_tokens"] = {"doubleValue": 7.0}
    span = {"traceId": trace_id, "spanId": hashlib.sha256(request_id.encode()).hexdigest()[:16], "name": "llm_request",
            "kind": 2, "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 30_000_000),
            "attributes": [_kv(k, **v) for k, v in attrs.items()]}
    if task == 2:
        span["startTimeUnixNano"] = str(2**64 - 1)
    return span


class _Vllm:
    """/version, /v1/models, streaming /v1/chat/completions that exports one span per request to the
    receiver before answering, and /metrics (one malformed line, or a body that trickles)."""

    def __init__(self, otlp_port: int, trickle: bool = False, bad: bool = True) -> None:
        self.otlp, self.trickle, self.bad = f"http://127.0.0.1:{otlp_port}/v1/traces", trickle, bad
        app = web.Application()
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        self.thread = ServerThread(app)

    async def version(self, request):
        return web.json_response({"version": "0.32.0"})

    async def models(self, request):
        return web.json_response({"data": [{"id": "m"}]})

    def _export(self, span: dict) -> None:
        body = json.dumps({"resourceSpans": [{"resource": {"attributes": [_kv("service.name", stringValue="vllm")]},
                                              "scopeSpans": [{"scope": {"name": "vllm"}, "spans": [span]}]}]})
        req = urllib.request.Request(self.otlp, data=body.encode(), headers={"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()

    async def chat(self, request):
        await request.json()
        task = int(request.headers["x-inferledger-task-id"][1:])
        trace_id = request.headers["traceparent"].split("-")[1]
        span = _span(task, trace_id, request.headers["x-request-id"], self.bad)
        await asyncio.get_running_loop().run_in_executor(None, self._export, span)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for piece in ("Paris", "."):
            await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]}).encode()
                             + b"\n\n")
        await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                         .encode() + b"\n\n")
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}})
                         .encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    async def metrics(self, request):
        if not self.trickle:
            return web.Response(text=GOOD_METRICS + BAD_LINE + "\n", content_type="text/plain")
        resp = web.StreamResponse(headers={"content-type": "text/plain", "content-length": "100000"})
        await resp.prepare(request)
        for _ in range(1200):  # one byte every 0.2 s for four minutes: longer than any test may wait
            await resp.write(b"v")
            await asyncio.sleep(0.2)
        return resp


def _workload(tmp: Path) -> Workload:
    (tmp / "tasks.jsonl").write_text("".join(json.dumps({"kind": "lookup", "prompt": f"Capital of France? ({i})",
                                                         "answer": "paris"}) + "\n" for i in range(N_TASKS)))
    (tmp / "arrivals.txt").write_text("".join(f"{10 * i}\n" for i in range(N_TASKS)))
    return Workload.from_dict({"name": "evidence", "seed": 1, "taskset": {"file": "tasks.jsonl"},
                               "arrivals": {"process": "replay", "file": "arrivals.txt"},
                               "contract": {"deadline_ms": 60_000}, "client": {"timeout_ms": 30_000, "max_attempts": 1},
                               "generation": {"max_tokens": 5, "temperature": 0.0}}, base=tmp)


def _rows(con, sql):
    cur = con.execute(sql)
    return cur.fetchall()


@pytest.fixture(scope="module")
def bad_evidence_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evidence")
    port = free_port()
    stub = _Vllm(port)
    with stub.thread as srv:
        result = capture(_workload(tmp), tmp / "run", CaptureOptions(target=srv.url, evidence=EvidenceOptions(
            otlp_port=port, scrape_metrics=True)))
    reconstruct(tmp / "run")
    return tmp / "run", result, duckdb.connect(str(tmp / "run" / "ledger.duckdb"), read_only=True)


def test_bad_spans_and_a_bad_scrape_line_cost_only_themselves(bad_evidence_run):
    run, result, con = bad_evidence_run
    m = result.manifest
    assert m["state"] == "complete" and result.load.completed == N_TASKS
    ev = m["engine_evidence"]
    assert (ev["otlp"]["spans"], ev["otlp"]["refused_spans"], ev["spans"]["joined"]) == (4, 4, 4)
    joined = _rows(con, "select attempt_id from reported_spans order by 1")
    assert joined == [(f"T000{i}:R1:A1",) for i in (0, 5, 6, 7)]  # what the manifest counts is what the ledger holds
    assert _rows(con, "select count(*) from events where source = 'engine'") == [(4 * 5,)]
    gaps = dict(_rows(con, "select gap_id, detail from gaps"))
    refused = sorted(g for g in gaps if g.startswith("otlp:refused:"))
    assert refused == [f"otlp:refused:{k}" for k in range(1, 5)]
    reasons = " ".join(gaps[g] for g in refused)
    for field in ("time_to_first_token", "startTimeUnixNano", "completion_tokens"):
        assert field in reasons
    assert sorted(g for g in gaps if g.startswith("otlp:no-span:")) == [f"otlp:no-span:T000{i}:R1:A1" for i in (1, 2, 3, 4)]
    line_gaps = [d for g, d in gaps.items() if g.startswith("metrics:line:")]
    assert len(line_gaps) == 1 and BAD_LINE in line_gaps[0]
    kept = [json.loads(x) for x in (run / "otlp" / "refused.jsonl").read_text().splitlines()]
    assert len(kept) == 4 and all(k["span"]["name"] == "llm_request" for k in kept)
    scraped = [json.loads(x) for x in (run / "scrapes" / "refused.jsonl").read_text().splitlines()]
    assert {r["text"] for r in scraped} == {BAD_LINE} and len(scraped) == ev["metrics"]["scrapes"]
    assert _rows(con, "select count(*) > 0 from samples where metric = 'vllm:generation_tokens_total'") == [(True,)]


def test_the_manifest_says_the_engine_events_are_reported(bad_evidence_run):
    _, result, _ = bad_evidence_run
    evidence = result.manifest["evidence"]
    assert "reported (server and engine events, from vllm-0.32.0's spans)" in evidence["events"]
    assert evidence["metrics"] == "reported (vllm-0.32.0's /metrics)"


def test_a_trickling_metrics_endpoint_costs_its_scrapes_not_the_capture(tmp_path):
    port = free_port()
    stub = _Vllm(port, trickle=True)
    done: dict = {}
    with stub.thread as srv:
        worker = threading.Thread(target=lambda: done.update(result=capture(
            _workload(tmp_path), tmp_path / "run", CaptureOptions(target=srv.url, evidence=EvidenceOptions(
                otlp_port=port, scrape_metrics=True)))), daemon=True)
        worker.start()
        worker.join(120)  # a bound for a hang, not a timing: the capture takes a few seconds
        assert not worker.is_alive(), "the capture hung on a trickling /metrics"
    m = done["result"].manifest
    assert m["state"] == "complete" and m["engine_evidence"]["metrics"]["scrapes"] == 0
    gaps = {g["gap_id"]: g for g in pq.read_table(tmp_path / "run" / "gaps.parquet").to_pylist()}
    assert gaps["collector:metrics"]["detail"].startswith("no complete answer within 0.5 s")
    assert m["engine_evidence"]["spans"]["joined"] == 4  # the spans are all there


def test_a_part_that_cannot_be_written_never_leaves_a_complete_manifest(tmp_path, monkeypatch):
    real = engine_evidence.map_spans

    def with_an_unwritable_row(*args, **kw):
        join = real(*args, **kw)
        join.rows.append({**join.rows[0], "event_id": "otlp:bad", "ts_ns": 2**64 - 1})
        return join

    monkeypatch.setattr(engine_evidence, "map_spans", with_an_unwritable_row)
    port = free_port()
    with _Vllm(port, bad=False).thread as srv, pytest.raises(ValueError, match="could not write part"):
        capture(_workload(tmp_path), tmp_path / "run", CaptureOptions(target=srv.url, evidence=EvidenceOptions(otlp_port=port)))
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["state"] == "interrupted"


WORKLOAD_TOML = """
name = "evidence-sigterm"
seed = 1
[taskset]
file = "tasks.jsonl"
[arrivals]
process = "replay"
file = "arrivals.txt"
[contract]
deadline_ms = 60000
[client]
timeout_ms = 30000
max_attempts = 1
[generation]
max_tokens = 5
temperature = 0.0
"""


@pytest.mark.slow
def test_sigterm_stops_a_capture_whose_metrics_endpoint_trickles(tmp_path):
    _workload(tmp_path)
    # 24 s of load: the SIGTERM below lands in it however slow the host (it ends the test in seconds)
    (tmp_path / "arrivals.txt").write_text("".join(f"{1500 * i}\n" for i in range(N_TASKS * 2)))
    (tmp_path / "tasks.jsonl").write_text((tmp_path / "tasks.jsonl").read_text() * 2)
    (tmp_path / "w.toml").write_text(WORKLOAD_TOML)
    port, run = free_port(), tmp_path / "run"
    with _Vllm(port, trickle=True).thread as srv:
        proc = subprocess.Popen([sys.executable, "-m", "inferledger.cli.app", "capture", "-w", str(tmp_path / "w.toml"),
                                 "-o", str(run), "--target", srv.url, "--otlp-port", str(port), "--scrape-metrics"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300  # a bound for a slow start, not a timing
        while not (run / "scrapes" / "refused.jsonl").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the first scrape has met its deadline: the load is under way
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError("SIGTERM did not stop the capture")
    assert proc.returncode == 143, err
    assert "Traceback" not in err, err
    assert json.loads((run / "manifest.json").read_text())["state"] == "interrupted"
