"""The OpenAI-compatible server over real loopback HTTP: the openai SDK as a client, greedy output equal
to the engine's own, disconnect -> engine cancellation, bad input, overload and API keys, 200
concurrent streams rebuilt by the ledger, /metrics, /clock and id propagation.

One engine per module (the bundled model is loaded once per session); servers run on ephemeral
ports in background threads.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass

import urllib.error
import urllib.request

import aiohttp
import openai
import pytest

from inferledger.engine import AsyncEngine, EngineConfig, LLMEngine, SamplingParams
from inferledger.serve.app import build_app
from inferledger.serve.options import ServeOptions
from inferledger.serve.thread import ServerThread
from inferledger.probes.probe import ListSink

pytestmark = pytest.mark.slow

MODEL = "smol"
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a colour."}]
KEY = "sekret"


@dataclass
class Stack:
    engine: LLMEngine
    sink: ListSink
    url: str  # the main server
    limited_url: str  # same engine, max_queue=2
    keyed_url: str  # same engine, api_key=KEY
    ref_completion: object
    ref_chat: object
    prompt_ids: list
    chat_ids: list

    def events(self, attempt_id: str) -> list[dict]:
        return [r for r in list(self.sink.rows) if r["attempt_id"] == attempt_id]

    def names(self, attempt_id: str) -> list[str]:
        return [r["name"] for r in self.events(attempt_id)]

    def events_when_done(self, attempt_id: str, timeout: float = 120.0) -> list[dict]:
        """The attempt's events once its server.done is logged: the server logs it after the response
        reached the socket, so the client can hold the whole response first."""
        deadline = time.monotonic() + timeout
        while "server.done" not in self.names(attempt_id) and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.events(attempt_id)

    def wait_idle(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.engine.has_unfinished():
            assert time.monotonic() < deadline, "the engine did not become idle"
            time.sleep(0.02)


@dataclass
class Reply:
    status_code: int
    headers: dict  # lower-case names
    text: str

    def json(self):
        return json.loads(self.text)


def _http(method: str, url: str, *, json_body=None, content: bytes | None = None, headers=None,
          timeout: float = 60) -> Reply:
    """A plain HTTP call (stdlib), errors included."""
    data = content if content is not None else (json.dumps(json_body).encode() if json_body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Reply(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode())
    except urllib.error.HTTPError as e:
        return Reply(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode())


def _generate_sync(engine: LLMEngine, prompt_ids: list[int], params: SamplingParams, rid: str):
    """LLM.generate's loop, on the very engine the server will use (before its loop thread starts)."""
    aid = engine.add_request(prompt_ids, params, request_id=rid)
    for _ in range(10 * params.max_tokens + 100):  # prefill + one step per token, with room to spare
        for d in engine.step():
            if d.request_finished and d.attempt_id == aid:
                return d.output
    raise AssertionError(f"{rid} did not finish within its step budget")


@pytest.fixture(scope="module")
def stack(bundle):
    tok = bundle.tokenizer
    sink = ListSink()
    engine = LLMEngine(bundle, EngineConfig(max_num_seqs=32), sink=sink, run_id="server-test")
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    prompt_ids = tok.encode(PROMPT, add_special=True)
    chat_ids = tok.encode(tok.apply_chat_template(MESSAGES, add_generation_prompt=True), add_special=False)
    ref_c = _generate_sync(engine, prompt_ids, greedy, "ref-completion")
    ref_chat = _generate_sync(engine, chat_ids, greedy, "ref-chat")
    ae = AsyncEngine(engine)
    servers = [ServerThread(build_app(ae, tok, ServeOptions(model_name=MODEL, **kw), sink=sink)).start()
               for kw in ({"max_queue": 256}, {"max_queue": 2}, {"api_key": KEY})]
    try:
        yield Stack(engine, sink, *(s.url for s in servers), ref_c, ref_chat, prompt_ids, chat_ids)
    finally:
        for s in servers:
            s.stop()
        ae.close()


def test_openai_sdk_chat_and_completions_match_the_engine(stack):
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="x", max_retries=0)
    assert [m.id for m in c.models.list().data] == [MODEL]
    ref, ref_chat = stack.ref_completion, stack.ref_chat
    n_ref = len(ref.token_ids)

    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.choices[0].text == ref.text and r.choices[0].finish_reason == ref.finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(stack.prompt_ids), n_ref)
    assert r.usage.total_tokens == len(stack.prompt_ids) + n_ref

    chunks = list(c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == ref.text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == \
        [ref.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == n_ref
    assert all(ch.usage is None for ch in chunks[:-1])

    r = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == ref_chat.text
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(stack.chat_ids), len(ref_chat.token_ids))

    aid = "sdk-streamed-chat"
    chunks = list(c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_headers={"x-inferledger-attempt-id": aid}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ref_chat.text
    assert chunks[-2].choices[0].finish_reason == ref_chat.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref_chat.token_ids)
    assert len({ch.id for ch in chunks}) == 1

    # the streamed chat's evidence: server writes carry exactly the engine's tokens, role chunk first.
    # wait for this attempt's own server.done: counting server.done rows raced the non-streamed chat's, which
    # can be logged after its response reached the client.
    events = stack.events_when_done(aid)
    writes = [r for r in events if r["name"] == "server.write"]
    kinds = [json.loads(w["attrs"])["kinds"] for w in writes]
    assert kinds[0] == ["role"] and kinds[-2:] == [["usage"], ["done"]] and ["finish"] in kinds
    engine_tokens = sum(r["value"] for r in events if r["name"] == "engine.token")
    assert sum(w["value"] for w in writes) == engine_tokens == len(ref_chat.token_ids)


def test_client_disconnect_cancels_the_request_in_the_engine(stack):
    aid = "disconnect-1"

    async def read_two_then_leave():
        async with aiohttp.ClientSession() as s:
            resp = await s.post(stack.url + "/v1/completions", headers={"x-inferledger-attempt-id": aid},
                                json={"model": MODEL, "prompt": "Count: 1, 2,", "max_tokens": 200, "ignore_eos": True,
                                      "temperature": 0, "stream": True})
            assert resp.status == 200
            seen = 0
            async for line in resp.content:
                seen += line.startswith(b"data: ")
                if seen == 2:
                    break
            resp.close()  # drop the connection mid-stream

    asyncio.run(read_two_then_leave())
    deadline = time.monotonic() + 30
    while "engine.finished" not in stack.names(aid):
        assert time.monotonic() < deadline, "the engine never finished the abandoned request"
        time.sleep(0.02)
    stack.wait_idle()
    events = stack.events(aid)
    names = [e["name"] for e in events]
    assert "server.disconnect" in names and "engine.cancel_received" in names and "server.done" not in names
    finished = json.loads(next(e for e in events if e["name"] == "engine.finished")["attrs"])
    assert finished["reason"] == "cancelled"
    assert sum(e["value"] for e in events if e["name"] == "engine.token") < 200
    assert stack.engine.check_integrity()
    assert stack.engine.block_manager.num_used_blocks == 0


LONG = [1] * 8200  # more tokens than the model's 8192-token context
BAD_INPUT = [
    # endpoint, body, status, param, words the message must contain
    ("completions", b"{not json", 400, None, "not valid JSON"),
    ("completions", b"[1, 2]", 400, None, "JSON object"),
    ("chat", {"model": MODEL}, 400, "messages", "'messages' is required"),
    ("chat", {"model": MODEL, "messages": "hi"}, 400, "messages", "'messages' must be an array"),
    ("chat", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "role"),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": "8"}, 400, "max_tokens", "must be an integer"),
    ("completions", {"model": "gpt-4o", "prompt": "x"}, 404, "model", "'gpt-4o' does not exist"),
    ("completions", {"model": MODEL, "prompt": LONG, "max_tokens": 4}, 400, "prompt", "exceeds max_model_len"),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens", "max_tokens=0"),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": 100_000}, 400, "prompt", "max_tokens (100000)"),
    ("chat", {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": -1}, 400, "max_completion_tokens",
     "max_tokens=-1"),
    ("completions", {"model": MODEL, "prompt": "x", "n": 64}, 400, "n", "n=64"),
    ("completions", {"model": MODEL, "prompt": "x", "temperature": 5}, 400, "temperature", "temperature=5"),
    ("completions", {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options", "only allowed when 'stream' is true"),
    ("completions", {"model": MODEL, "prompt": "x", "logprobs": 2}, 400, "logprobs", "not supported"),
    ("completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt", "one prompt per request"),
]


@pytest.mark.parametrize("endpoint,body,status,param,words", BAD_INPUT,
                         ids=[f"{i}-{case[3] or 'body'}" for i, case in enumerate(BAD_INPUT)])
def test_bad_input_gets_an_openai_error(stack, endpoint, body, status, param, words):
    aid = f"bad-{BAD_INPUT.index((endpoint, body, status, param, words))}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = _http("POST", f"{stack.url}/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}",
              content=content, headers={"x-inferledger-attempt-id": aid})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and words in err["message"], err
    assert r.headers["x-inferledger-attempt-id"] == aid
    rejected = [json.loads(e["attrs"]) for e in stack.events(aid) if e["name"] == "server.rejected"]
    assert [x["status"] for x in rejected] == [status] and words in rejected[0]["error"]
    assert "engine.enqueued" not in stack.names(aid)


def test_overload_gets_429_with_retry_after(stack):
    async def burst():
        async with aiohttp.ClientSession() as s:
            async def one(i):
                async with s.post(stack.limited_url + "/v1/completions", headers={"x-inferledger-attempt-id": f"ovl-{i}"},
                                  json={"model": MODEL, "prompt": f"Item {i}:", "max_tokens": 8, "temperature": 0}) as r:
                    return r.status, r.headers.get("Retry-After"), await r.json()
            return await asyncio.gather(*(one(i) for i in range(12)))

    results = asyncio.run(burst())
    statuses = [s for s, _, _ in results]
    assert statuses.count(200) >= 2 and statuses.count(429) >= 1, statuses
    for status, retry_after, body in results:
        if status == 429:
            assert int(retry_after) >= 1
            assert body["error"]["type"] == "rate_limit_error" and "admission limit (2" in body["error"]["message"]
    rejected = [e for i in range(12) for e in stack.events(f"ovl-{i}") if e["name"] == "server.rejected"]
    assert len(rejected) == statuses.count(429)
    stack.wait_idle()


def test_api_key_is_enforced(stack):
    url = stack.keyed_url + "/v1/completions"
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = _http("POST", url, json_body=body, headers={**headers, "x-inferledger-attempt-id": "key-bad"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    # one attempt id sent three times is three attempts (the server names them #2, #3), each refused
    assert [json.loads(e["attrs"])["status"] for aid in ("key-bad", "key-bad#2", "key-bad#3")
            for e in stack.events(aid)] == [401, 401, 401]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=stack.keyed_url + "/v1", api_key="wrong", max_retries=0).models.list()
    good = openai.OpenAI(base_url=stack.keyed_url + "/v1", api_key=KEY, max_retries=0)
    assert good.completions.create(**body).usage.completion_tokens == 2
    assert _http("GET", stack.keyed_url + "/health").status_code == 200  # probes stay open


def test_chat_render_gives_the_prompt_ids_the_chat_endpoint_computes_and_records_nothing(stack):
    """vLLM's POST /v1/chat/completions/render, which vLLM's router asks of each worker for its cache-aware
    policy: the messages' token ids as the chat endpoint encodes them, no attempt and no event."""
    n_events = len(stack.sink.rows)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "stream": True}
    r = _http("POST", stack.url + "/v1/chat/completions/render", json_body=body,
              headers={"x-request-id": "render-1"})
    assert r.status_code == 200 and r.json() == {"token_ids": stack.chat_ids}
    assert len(stack.sink.rows) == n_events and stack.events("render-1") == []
    r = _http("POST", stack.url + "/v1/chat/completions/render", json_body={**body, "model": "other"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = _http("POST", stack.keyed_url + "/v1/chat/completions/render", json_body=body)
    assert r.status_code == 401


_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*"'
                     r'(,[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*")*\})? (-?[0-9.]+(e[-+]?[0-9]+)?|NaN|[+-]Inf)$')


def _scrape(url: str) -> dict[str, float]:
    r = _http("GET", url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            assert not line or line.startswith(("# HELP ", "# TYPE ")), line
            continue
        assert _SAMPLE.match(line), f"not Prometheus text: {line!r}"
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def test_metrics_clock_and_client_ids(stack):
    before = _scrape(stack.url)
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {"x-request-id": "client-rid-7", "traceparent": f"00-{trace_id}-{parent}-01"}
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    r1 = _http("POST", stack.url + "/v1/completions", json_body=body, headers=headers)
    r2 = _http("POST", stack.url + "/v1/completions", json_body=body, headers=headers)  # a retry, same id
    assert r1.status_code == r2.status_code == 200
    assert r1.headers["x-request-id"] == r2.headers["x-request-id"] == "client-rid-7"
    a1, a2 = r1.headers["x-inferledger-attempt-id"], r2.headers["x-inferledger-attempt-id"]
    assert a1 == "client-rid-7" and a2 == "client-rid-7#2"
    for aid in (a1, a2):
        events = stack.events_when_done(aid)
        assert {e["request_id"] for e in events} == {"client-rid-7"}
        received = json.loads(next(e for e in events if e["name"] == "server.received")["attrs"])
        assert received["trace_id"] == trace_id and received["parent_span_id"] == parent
        assert {"server.received", "engine.enqueued", "engine.token", "server.write", "server.done"} <= \
            {e["name"] for e in events}

    after = _scrape(stack.url)
    lbl = f'{{model_name="{MODEL}"}}'
    assert after[f"vllm:generation_tokens_total{lbl}"] - before[f"vllm:generation_tokens_total{lbl}"] == 6
    assert after[f"vllm:prompt_tokens_total{lbl}"] > before[f"vllm:prompt_tokens_total{lbl}"]
    key = f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL}"}}'
    assert after[key] - before[key] == 2
    assert after[f"vllm:time_to_first_token_seconds_count{lbl}"] - before[f"vllm:time_to_first_token_seconds_count{lbl}"] == 2
    assert 0.0 <= after[f"vllm:gpu_cache_usage_perc{lbl}"] <= 1.0
    assert {f"vllm:num_requests_running{lbl}", f"vllm:num_requests_waiting{lbl}"} <= set(after)

    t_before = time.monotonic_ns()
    clock = _http("GET", stack.url + "/clock").json()
    t_after = time.monotonic_ns()
    assert clock["clock"] == stack.engine.probe.clock and clock["clock"].startswith("mono:")
    assert t_before <= clock["t_ns"] <= t_after


def test_prefix_cache_counters_count_the_tokens_looked_up_and_served(stack):
    # 40 token ids no other test sends, then the same first 35 and 5 others: the second prompt's lookup
    # finds the first's 2 full 16-token blocks (32 tokens) of the 35 it shares
    first = list(range(2001, 2041))
    second = first[:35] + list(range(3001, 3006))
    stack.wait_idle()
    before = _scrape(stack.url)
    ids = []
    for prompt in (first, second):
        r = _http("POST", stack.url + "/v1/completions",
                  json_body={"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        ids.append(r.headers["x-inferledger-attempt-id"])
    after = _scrape(stack.url)
    lbl = f'{{model_name="{MODEL}"}}'
    assert after[f"vllm:prefix_cache_queries_total{lbl}"] - before[f"vllm:prefix_cache_queries_total{lbl}"] == 80
    assert after[f"vllm:prefix_cache_hits_total{lbl}"] - before[f"vllm:prefix_cache_hits_total{lbl}"] == 32
    cached = [sum(json.loads(e["attrs"])["cached_tokens"] for e in stack.events_when_done(aid)
                  if e["name"] == "engine.prefill") for aid in ids]
    assert cached == [0, 32]  # the engine's events say the same


def test_200_concurrent_streams_all_finish_and_every_attempt_is_accounted(stack, tmp_path):
    import duckdb

    from inferledger.collectors.rundir.writer import RunWriter
    from inferledger.ledger.reconstruct import reconstruct

    n = 200

    async def one(s, i):
        async with s.post(stack.url + "/v1/completions",
                          headers={"x-inferledger-attempt-id": f"c200-{i}", "x-inferledger-task-id": f"T{i}"},
                          json={"model": MODEL, "prompt": f"Fact {i}:", "max_tokens": 4, "temperature": 0,
                                "ignore_eos": True, "stream": True}) as r:
            assert r.status == 200
            return [line[6:].strip() async for line in r.content if line.startswith(b"data: ")]

    async def run_all():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            return await asyncio.wait_for(asyncio.gather(*(one(s, i) for i in range(n))), 100)

    results = asyncio.run(run_all())
    for data in results:
        assert data[-1] == b"[DONE]"
        assert json.loads(data[-2])["choices"][0]["finish_reason"] == "length"
    stack.wait_idle()
    assert stack.engine.check_integrity() and stack.engine.block_manager.num_used_blocks == 0

    rows = list(stack.sink.rows)
    for i in range(n):
        names = {r["name"] for r in rows if r["attempt_id"] == f"c200-{i}"}
        assert {"server.received", "server.done", "engine.finished"} <= names, (i, names)

    run = tmp_path / "run"
    with RunWriter(run, run_id="server-test") as w:  # everything this module's servers and engine emitted
        for row in rows:
            w.emit(row)
    summary = reconstruct(run)
    con = duckdb.connect(str(summary.path), read_only=True)
    status = dict(con.execute("select attempt_id, server_status from attempts").fetchall())
    con.close()
    assert all(status.get(f"c200-{i}") == "completed" for i in range(n))
    bad = {a: s for a, s in status.items() if s in (None, "unknown", "unterminated")}
    assert not bad, bad
    assert status["disconnect-1"] == "cancelled" and status["bad-0"] == "rejected"
