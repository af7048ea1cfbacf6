"""n > 1 on the client side: a stream event names the choice it carries, so the ledger can keep choices apart."""
from __future__ import annotations

from inferledger.collectors.load.http_transport import chunk_from_event


def test_a_chunk_carries_the_index_of_its_one_choice():
    assert chunk_from_event({"choices": [{"index": 1, "delta": {"content": "hi"}}]}).choice == 1
    assert chunk_from_event({"choices": [{"index": 0, "text": "a"}]}).choice == 0
    assert chunk_from_event({"choices": [{"delta": {"content": "x"}}]}).choice == 0  # OpenAI's default index


def test_a_chunk_with_several_choices_or_none_names_no_choice():
    two = {"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}]}
    assert chunk_from_event(two).choice is None
    assert chunk_from_event({"choices": [], "usage": {"completion_tokens": 3}}).choice is None
    assert chunk_from_event({"choices": [{"index": "1", "delta": {"content": "a"}}]}).choice is None
    assert chunk_from_event({"choices": [{"index": [1], "delta": {"content": "a"}}]}).choice is None


def test_the_server_names_the_choice_of_every_write_it_streams(bundle):
    """Real model, real HTTP: a streamed n=2 chat. Each role / content / finish event on the wire has one
    choice index; the server.write that sent it carries the same index, and so does the client's parse."""
    import json
    import time
    import urllib.request

    from inferledger.engine import AsyncEngine, EngineConfig, LLMEngine
    from inferledger.serve.app import build_app
    from inferledger.serve.options import ServeOptions
    from inferledger.serve.thread import ServerThread
    from inferledger.probes.probe import ListSink

    sink = ListSink()
    engine = LLMEngine(bundle, EngineConfig(max_num_seqs=8), sink=sink, run_id="n2")
    ae = AsyncEngine(engine)
    server = ServerThread(build_app(ae, bundle.tokenizer, ServeOptions(model_name="smol"), sink=sink)).start()
    try:
        body = json.dumps({"model": "smol", "messages": [{"role": "user", "content": "Say hi."}], "n": 2,
                           "max_tokens": 5, "temperature": 1.0, "seed": 3, "stream": True}).encode()
        req = urllib.request.Request(server.url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            aid = resp.headers["x-inferledger-attempt-id"]
            lines = [ln for ln in resp.read().decode().split("\n\n") if ln.startswith("data: ")]
        for _ in range(500):  # server.done is logged after [DONE] reached the socket: wait for it
            if any(r["name"] == "server.done" and r["attempt_id"] == aid for r in list(sink.rows)):
                break
            time.sleep(0.01)
    finally:
        server.stop()
        ae.close()
    events = [json.loads(ln[len("data: "):]) for ln in lines if ln != "data: [DONE]"]
    wire = [e["choices"][0]["index"] for e in events if e.get("choices")]
    rows = [r for r in list(sink.rows) if r["attempt_id"] == aid]
    writes = [json.loads(r["attrs"]) for r in rows if r["name"] == "server.write"]
    assert [w["choice"] for w in writes if "choice" in w] == wire and set(wire) == {0, 1}
    assert [chunk_from_event(e).choice for e in events if e.get("choices")] == wire
    tokens = {}
    for r in rows:
        if r["name"] == "engine.token":
            c = json.loads(r["attrs"])["choice"]
            tokens[c] = tokens.get(c, 0) + r["value"]
    content = {}
    for w, r in zip(writes, [r for r in rows if r["name"] == "server.write"]):
        if "choice" in w:
            content[w["choice"]] = content.get(w["choice"], 0) + r["value"]
    assert tokens == content and set(tokens) == {0, 1}  # every token written under its own choice
