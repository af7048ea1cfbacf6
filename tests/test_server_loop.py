"""The server's event loop and its evidence: a 6 MB prompt is refused by a byte bound before it is
tokenised while /health keeps answering, /metrics declares every status label from the start, and
`server.done` is stamped at the hand-off of `[DONE]`, so on one clock the server's E2E never exceeds
the client's."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from inferledger.engine import AsyncEngine, EngineConfig, LLMEngine
from inferledger.serve.app import build_app
from inferledger.serve.options import ServeOptions
from inferledger.serve.thread import ServerThread
from inferledger.probes.probe import ListSink

pytestmark = pytest.mark.slow
BIG = 6 * 2**20


@pytest.fixture(scope="module")
def served(bundle):
    sink = ListSink()
    ae = AsyncEngine(LLMEngine(bundle, EngineConfig(max_num_seqs=8), sink=sink, run_id="loop-test"))
    srv = ServerThread(build_app(ae, bundle.tokenizer, ServeOptions(model_name="m"), sink=sink)).start()
    try:
        yield srv.url, sink
    finally:
        srv.stop()
        ae.close()


def _post(url: str, body: dict, rid: str):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "x-request-id": rid})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_declare_every_status_label_before_the_first_request(bundle):
    ae = AsyncEngine(LLMEngine(bundle, EngineConfig(max_num_seqs=2), run_id="fresh"))
    with ServerThread(build_app(ae, bundle.tokenizer, ServeOptions(model_name="m"))) as srv:
        text = urllib.request.urlopen(srv.url + "/metrics", timeout=60).read().decode()
    ae.close()
    for status in ("200", "400", "401", "404", "409", "413", "429", "500", "503"):  # every answer the server gives
        assert f'inferledger_http_requests_total{{status="{status}"}} 0.0' in text
    for reason in ("stop", "length"):
        assert f'vllm:request_success_total{{finished_reason="{reason}",model_name="m"}} 0.0' in text


def test_a_6mb_prompt_is_refused_before_tokenising_while_health_answers(served):
    url, sink = served
    result = {}
    big = threading.Thread(target=lambda: result.update(big=_post(
        url + "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "a " * (BIG // 2)}],
                                       "max_tokens": 4}, "BIG1")))
    big.start()
    health = [urllib.request.urlopen(url + "/health", timeout=600).status for _ in range(3)]
    big.join(600)
    status, text = result["big"]
    err = json.loads(text)["error"]
    assert health == [200, 200, 200] and status == 400
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert f"holds {BIG} bytes, at least" in err["message"]  # the byte bound, not a token count
    assert [r["name"] for r in sink.rows if r["attempt_id"] == "BIG1"] == ["server.received", "server.rejected"]


def test_server_done_is_stamped_at_the_done_hand_off_so_server_e2e_never_exceeds_client_e2e(served):
    import time

    url, sink = served
    client = {}

    def one(i: int) -> None:
        t0 = time.monotonic_ns()  # the server's probe reads the same CLOCK_MONOTONIC
        status, text = _post(url + "/v1/chat/completions", {"model": "m", "stream": True, "max_tokens": 4,
                                                            "messages": [{"role": "user", "content": f"Hi {i}"}]},
                             f"E{i}")
        client[f"E{i}"] = (t0, time.monotonic_ns(), status, text)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for aid, (sent, done, status, text) in client.items():
        assert status == 200 and text.rstrip().endswith("data: [DONE]")
        for _ in range(600):  # the row is logged once write_eof returned; its stamp is the hand-off
            rows = [r for r in list(sink.rows) if r["attempt_id"] == aid]
            if any(r["name"] == "server.done" for r in rows):
                break
            time.sleep(0.05)
        received = next(r["ts_ns"] for r in rows if r["name"] == "server.received")
        server_done = next(r["ts_ns"] for r in rows if r["name"] == "server.done")
        done_write = next(r["ts_ns"] for r in rows if r["name"] == "server.write" and "done" in r["attrs"])
        assert server_done == done_write  # the hand-off of the last bytes, not after write_eof returned
        assert sent <= received and server_done - received <= done - sent
