"""Capture end to end: the embedded engine served on loopback, the load client over real HTTP, then the
ledger. One scenario run covers a ghost timeout and its retry, a cancellation, a session with a tool call
and parallel branches; a second run gives the client its own clock; a third is black-box against a stub."""
from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from ledger_util import dict_rows as _rows
from aiohttp import web

from inferledger.collectors.capture.run import capture
from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.workload import Workload
from inferledger.serve.thread import ServerThread
from inferledger.ledger.reconstruct import reconstruct
from inferledger.probes.events import missing_requirements
from inferledger.probes.run_folder import Manifest

pytestmark = pytest.mark.slow

QUESTIONS = [  # greedy answers of the bundled model that these patterns accept
    ("What is the capital of France? Answer in one word.", "paris"),
    ("What is the capital of Japan? Answer in one word.", "tokyo"),
    ("What is the capital of Germany? Answer in one word.", "berlin"),
    ("What is the capital of Italy? Answer in one word.", "rome"),
    ("What is the capital of France? Answer in one word.", "paris"),
    ("What is the capital of Japan? Answer in one word.", "tokyo"),
    ("What is the capital of Germany? Answer in one word.", "berlin"),
]


def _spec(tmp: Path, **over) -> dict:
    (tmp / "tasks.jsonl").write_text("".join(json.dumps({"kind": "lookup", "prompt": p, "answer": a}) + "\n"
                                             for p, a in QUESTIONS))
    spec = {"name": "capture-test", "seed": 1, "taskset": {"file": "tasks.jsonl"},
            "arrivals": {"process": "replay", "file": "arrivals.txt"},
            "contract": {"deadline_ms": 120_000}, "client": {"timeout_ms": 60_000, "max_attempts": 2, "backoff_ms": 20},
            "generation": {"max_tokens": 12, "temperature": 0.0}}
    spec.update(over)
    return spec


def _ledger(run: Path):
    reconstruct(run)
    return duckdb.connect(str(run / "ledger.duckdb"), read_only=True)


@pytest.fixture(scope="module")
def scenario(bundle, tmp_path_factory):
    """T0000 single: first attempt times out after 400 ms and abandons its connection (the server
    completes: ghost load), the retry completes. T0001 session of two turns with a 200 ms tool call
    between them. T0002 three parallel branches under partial_success, the last one cancelled after 2
    tokens. T0003 single, cancelled after 2 tokens."""
    tmp = tmp_path_factory.mktemp("scenario")
    (tmp / "arrivals.txt").write_text("0\n50\n100\n150\n")
    spec = _spec(tmp,
                 inject={"timeout_tasks": [1], "timeout_ms": 400, "abandon_tasks": [1], "cancel_tasks": [3, 4],
                         "cancel_after_tokens": 2},
                 classes=[{"name": "single", "weight": 2, "ignore_eos": True, "max_tokens": 16},
                          {"name": "session", "shape": "session", "turns": 2, "tool_ms": 200, "tool_before": [2],
                           "prompt_tokens": 48},
                          {"name": "branches", "shape": "parallel", "branches": 3, "on_missing": "partial_success",
                           "ignore_eos": True, "shared_prefix_tokens": 32}],
                 slo={"ttft_ms": 60_000, "e2e_ms": 60_000})
    wl = Workload.from_dict(spec, base=tmp)
    assert [p.cls.name for p in wl.plan(bundle.tokenizer)] == ["single", "session", "branches", "single"]
    run = tmp / "run"
    wall_before = time.time_ns()
    result = capture(wl, run, CaptureOptions(max_num_seqs=8), bundle=bundle)
    result.wall_window_ns = (wall_before, time.time_ns())
    return run, result, _ledger(run)


def test_every_client_event_is_complete_and_nothing_unterminated(scenario):
    run, result, con = scenario
    events = pq.read_table(run / "events").to_pylist()
    mine = [e for e in events if e["source"] in ("client", "checker", "tool")]
    assert mine and all(missing_requirements(e) == [] for e in mine)
    statuses = _rows(con, "SELECT client_status, server_status FROM accounts")
    assert statuses and not [s for s in statuses if "unterminated" in s.values()]
    m = json.loads((run / "manifest.json").read_text())
    assert m["client"]["pacing_error_ms"]["arrival"]["n"] == 3 + 3  # three branches sent at one arrival
    assert isinstance(m["client"]["client_bound"], bool) and m["client"]["loop_lag_p99_ms"] >= 0
    assert json.loads(events[[e["name"] for e in events].index("attempt.sent")]["attrs"])["pacing_error_ms"] >= 0


def test_client_overhead_percentiles_follow_the_ledger_quantile_rule(scenario):
    """The manifest's loop-lag p99 and pacing p50 / p99 are DuckDB's quantile_cont over what the run
    recorded (the lag trace, and attempt.sent pacing_error_ms per kind), not another rule."""
    run, _, _ = scenario
    m = json.loads((run / "manifest.json").read_text())["client"]
    con = duckdb.connect()
    n, p99 = con.execute(f"SELECT count(*), quantile_cont(value, 0.99) FROM '{run}/samples/*.parquet' "
                         "WHERE metric = 'client_loop_lag_ms'").fetchone()
    wakes, every = m["loop_lag_wakes"], m["loop_lag_trace_every"]
    assert wakes >= 2 and every == max(1, wakes // 2000) and n == -(-wakes // every)  # every k-th wake, the first kept
    if every == 1:  # the trace holds every wake: the manifest's p99 is the trace's
        assert m["loop_lag_p99_ms"] == pytest.approx(p99, abs=5e-4)  # the manifest rounds to the µs
    for kind, stats in m["pacing_error_ms"].items():
        row = con.execute(f"SELECT count(*), quantile_cont(v, 0.5), quantile_cont(v, 0.99) FROM ("
                          f"SELECT CAST(json_extract_string(attrs, '$.pacing_error_ms') AS DOUBLE) AS v "
                          f"FROM '{run}/events/*.parquet' WHERE name = 'attempt.sent' "
                          f"AND json_extract_string(attrs, '$.planned') = ?)", [kind]).fetchone()
        assert stats["n"] == row[0]
        if row[0]:  # the attrs carry 4 decimals, the summary 3
            assert (stats["p50"], stats["p99"]) == (pytest.approx(row[1], abs=6e-4), pytest.approx(row[2], abs=6e-4))


def test_wall_clock_mapping_puts_otlp_spans_in_unix_time(scenario, tmp_path):
    from inferledger.report.export import export_run

    run, result, con = scenario
    maps = _rows(con, "SELECT * FROM clocks WHERE to_clock LIKE 'wall:%'")
    assert [m["from_clock"] for m in maps] == [result.manifest["client"]["clock"]]  # one clock in this run
    assert maps[0]["method"] == "clock pair (monotonic, realtime)" and maps[0]["epsilon_ns"] >= 1
    res = export_run(run, "otlp", tmp_path / "spans.jsonl")
    lo, hi = result.wall_window_ns
    eps = maps[0]["epsilon_ns"]  # covers the drift between the clocks over the run
    spans = [s for ln in Path(res.destination).read_text().splitlines()
             for rs in json.loads(ln)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert spans
    for s in spans:  # Unix time, inside the wall-clock window the capture ran in
        start, end = int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
        assert lo - eps <= start and end <= hi + eps, (lo, start, end, hi, eps, s["name"])
        assert start <= end, s
    bases = {a["value"]["stringValue"] for s in spans for a in s["attributes"] if a["key"] == "inferledger.time_base"}
    assert bases == {f"unix ns via {maps[0]['to_clock']}"}


def test_declared_slo_gives_the_vllm_goodput(scenario):
    """Expected value from the raw events, by the definition in docs/LEDGER.md (run_metrics), not from the
    ledger's own predicate or window."""
    run, result, con = scenario
    assert result.manifest["slo"] == {"ttft_ms": 60_000.0, "e2e_ms": 60_000.0}
    m = _rows(con, "SELECT vllm_goodput_rps, slo_ttft_ms, slo_e2e_ms, slo_tpot_ms FROM run_metrics")[0]
    events = [e for e in pq.read_table(run / "events").to_pylist() if e["source"] == "client"]
    assert len({e["clock"] for e in events}) == 1  # one clock: plain differences are exact
    by = {}
    for e in events:
        by.setdefault(e["attempt_id"], []).append(e)
    within = 0
    for rows in by.values():
        ts = {}
        for e in sorted(rows, key=lambda e: e["ts_ns"]):
            kinds = json.loads(e["attrs"] or "{}").get("kinds")
            if e["name"] == "attempt.chunk" and (kinds is None or {"content", "reasoning", "tool_call"} & set(kinds)):
                ts.setdefault("first", e["ts_ns"])
            ts.setdefault(e["name"], e["ts_ns"])
        if "attempt.done" in ts and "first" in ts:
            ttft_ms, e2e_ms = (ts["first"] - ts["attempt.sent"]) / 1e6, (ts["attempt.done"] - ts["attempt.sent"]) / 1e6
            within += ttft_ms <= 60_000 and e2e_ms <= 60_000
    start = min(e["ts_ns"] for e in events)  # first planned arrival or client event
    end = max(e["ts_ns"] for e in events if e["name"] in ("attempt.done", "attempt.timeout", "attempt.cancel",
                                                             "attempt.error"))
    assert within >= 4 and (m["slo_ttft_ms"], m["slo_e2e_ms"], m["slo_tpot_ms"]) == (60_000, 60_000, None)
    assert m["vllm_goodput_rps"] == pytest.approx(within / ((end - start) / 1e9), rel=1e-9)


def test_ghost_timeout_then_retry(scenario):
    _, result, con = scenario
    a = {r["attempt_id"]: r for r in _rows(con, "SELECT * FROM accounts WHERE task_id = 'T0000'")}
    assert a["T0000:R1:A1"]["client_status"] == "timeout"
    assert a["T0000:R1:A1"]["server_status"] == "completed"  # the server finished work nobody read
    assert a["T0000:R1:A2"]["attempt_index"] == 2 and a["T0000:R1:A2"]["client_status"] == "completed"
    assert result.load.abandoned == 1 and result.load.retries >= 1
    t = _rows(con, "SELECT * FROM tasks WHERE task_id = 'T0000'")[0]
    assert t["n_attempts"] == 2 and t["outcome"] == "success"  # the retry answered right, in time
    ghost = _rows(con, "SELECT ghost_attempts, ghost_tokens FROM reconciliation")[0]
    assert ghost["ghost_attempts"] >= 1 and ghost["ghost_tokens"] >= 1


def test_cancellation_releases_every_block(scenario):
    run, _, con = scenario
    acc = _rows(con, "SELECT * FROM accounts WHERE attempt_id = 'T0003:R1:A1'")[0]
    assert (acc["client_status"], acc["server_status"], acc["resource_status"]) == \
        ("cancelled", "cancelled", "reallocatable")
    assert acc["task_outcome"] == "failure"
    rm = _rows(con, "SELECT release_after_cancel_ms, release_after_cancel_label FROM request_metrics "
                    "WHERE attempt_id = 'T0003:R1:A1'")[0]
    assert rm["release_after_cancel_ms"] >= 0 and rm["release_after_cancel_label"] == "measured"
    last_used = con.execute("SELECT value FROM samples WHERE metric = 'kv_blocks_used' "
                            "ORDER BY ts_ns DESC LIMIT 1").fetchone()[0]
    assert last_used == 0  # no block still held at the end of the run


def test_session_reuses_its_prefix_and_the_tool_call_sits_between_turns(scenario):
    _, _, con = scenario
    hits = _rows(con, "SELECT attempt_id, value FROM events WHERE name = 'kv.prefix_hit' AND task_id = 'T0001'")
    assert any(h["attempt_id"] == "T0001:R2:A1" and h["value"] >= 2 for h in hits)  # turn 2 reuses turn 1's blocks
    sessions = _rows(con, "SELECT DISTINCT source, session_id FROM events WHERE task_id = 'T0001' "
                          "AND name NOT LIKE 'step.%'")
    assert {s["session_id"] for s in sessions} == {"T0001:S"}
    assert {"client", "server", "engine", "tool"} <= {s["source"] for s in sessions}
    ts = {r["name"]: r["ts_ns"] for r in _rows(
        con, "SELECT name, ts_ns FROM events WHERE task_id = 'T0001' AND name IN ('tool.start', 'tool.end') "
             "UNION ALL SELECT name || ':' || attempt_id, ts_ns FROM events WHERE task_id = 'T0001' "
             "AND name IN ('attempt.done', 'attempt.sent')")}
    assert ts["attempt.done:T0001:R1:A1"] <= ts["tool.start"] < ts["tool.end"] <= ts["attempt.sent:T0001:R2:A1"]
    assert ts["tool.end"] - ts["tool.start"] >= 200e6
    t = _rows(con, "SELECT * FROM tasks WHERE task_id = 'T0001'")[0]
    assert (t["n_requests"], t["n_attempts"], t["n_required"]) == (2, 2, 2)
    assert t["e2e_ms"] >= 200 + (ts["attempt.done:T0001:R1:A1"] - ts["attempt.sent:T0001:R1:A1"]) / 1e6
    created = _rows(con, "SELECT attrs FROM events WHERE name = 'attempt.created' AND attempt_id = 'T0001:R1:A1'")
    assert json.loads(created[0]["attrs"])["prompt_tokens"] == 48
    usage = _rows(con, "SELECT attrs FROM events WHERE name = 'attempt.done' AND attempt_id = 'T0001:R1:A1'")
    assert json.loads(usage[0]["attrs"])["usage"]["prompt_tokens"] == 48  # the server counted what we built


def test_parallel_branches_follow_their_contract(scenario):
    _, _, con = scenario
    acc = {r["request_id"]: r for r in _rows(con, "SELECT * FROM accounts WHERE task_id = 'T0002'")}
    assert set(acc) == {"T0002:R1", "T0002:R2", "T0002:R3"}
    assert acc["T0002:R3"]["client_status"] == "cancelled"
    assert acc["T0002:R1"]["client_status"] == acc["T0002:R2"]["client_status"] == "completed"
    t = _rows(con, "SELECT * FROM tasks WHERE task_id = 'T0002'")[0]
    correct = _rows(con, "SELECT count(*) AS n FROM request_metrics WHERE task_id = 'T0002' AND correct")[0]["n"]
    assert t["n_required"] == 3 and t["on_missing"] == "partial_success"
    assert t["outcome"] == ("partial_success" if correct else "failure")


def test_separate_clocks_map_within_epsilon_and_uplink_is_derived(bundle, tmp_path):
    (tmp_path / "arrivals.txt").write_text("0\n30\n")
    wl = Workload.from_dict(_spec(tmp_path, generation={"max_tokens": 4}), base=tmp_path)
    run = tmp_path / "run"
    capture(wl, run, CaptureOptions(separate_clocks=True), bundle=bundle)
    rows = [r for r in pq.read_table(run / "clocks.parquet").to_pylist() if r["from_clock"]]
    maps = [r for r in rows if r["method"] == "round-trip"]
    assert len(maps) == 2 and all(r["to_clock"].startswith("client-mono:") for r in maps)  # start and end
    # both domains also map to Unix time (one process, one CLOCK_MONOTONIC under two names)
    walls = [r for r in rows if r["to_clock"].startswith("wall:")]
    assert sorted(r["from_clock"].split(":")[0] for r in walls) == ["client-mono", "mono"]
    assert len({(r["offset_ns"], r["epsilon_ns"]) for r in walls}) == 1 and len(rows) == 4
    for r in maps:  # both sides read the same CLOCK_MONOTONIC here: the true offset is 0
        assert abs(r["offset_ns"]) <= r["epsilon_ns"]
    con = _ledger(run)
    up = _rows(con, "SELECT uplink_ms, uplink_eps_ms, uplink_label FROM request_metrics")
    assert up and all(u["uplink_label"] == "derived" and u["uplink_eps_ms"] > 0 and u["uplink_ms"] is not None
                      for u in up)


class _Stub:
    """A tiny OpenAI-ish server on loopback: /v1/models and streaming /v1/chat/completions; the first
    attempt of the first task gets a 429."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        self.thread = ServerThread(app)

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "stub-model"}]})

    async def chat(self, request):
        body = await request.json()
        self.seen.append({"headers": dict(request.headers), "body": body})
        if request.headers.get("x-inferledger-attempt-id") == "T0000:R1:A1":
            return web.json_response({"error": {"message": "busy"}}, status=429, headers={"Retry-After": "0.2"})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for piece in ("Paris", " is", " the answer."):
            await asyncio.sleep(0.01)
            await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]}).encode()
                             + b"\n\n")
        await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                         .encode() + b"\n\n")
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}})
                         .encode() + b"\n\ndata: [DONE]\n\n")
        return resp


def test_warmups_are_sent_before_the_run_and_are_no_attempts(tmp_path):
    (tmp_path / "arrivals.txt").write_text("0\n20\n")
    wl = Workload.from_dict(_spec(tmp_path), base=tmp_path)
    stub = _Stub()
    with stub.thread as srv:
        capture(wl, tmp_path / "run", CaptureOptions(target=srv.url, warmups=2))
    sent = [s["headers"]["x-inferledger-attempt-id"] for s in stub.seen]
    assert sent[:2] == ["warmup-0", "warmup-1"] and sorted(sent[2:]) == ["T0000:R1:A1", "T0000:R1:A2", "T0001:R1:A1"]
    assert Manifest.read(tmp_path / "run").block("client")["warmups"]["n"] == 2
    assert Manifest.read(tmp_path / "run").block("client")["warmups"]["output_tokens"] == 10  # the stub's usage
    con = _ledger(tmp_path / "run")
    assert _rows(con, "SELECT count(*) AS n FROM events WHERE attempt_id LIKE 'warmup%'")[0]["n"] == 0
    assert [a["attempt_id"] for a in _rows(con, "SELECT attempt_id FROM attempts ORDER BY 1")] == [
        "T0000:R1:A1", "T0000:R1:A2", "T0001:R1:A1"]


def test_black_box_target_has_unknown_server_and_a_gap(tmp_path):
    (tmp_path / "arrivals.txt").write_text("0\n20\n")
    wl = Workload.from_dict(_spec(tmp_path), base=tmp_path)
    stub = _Stub()
    with stub.thread as srv:
        assert srv.host == "127.0.0.1"
        result = capture(wl, tmp_path / "run", CaptureOptions(target=srv.url))
    assert stub.seen[0]["body"]["model"] == "stub-model" and stub.seen[0]["body"]["stream"] is True
    assert stub.seen[0]["headers"]["x-inferledger-task-id"] == "T0000"
    con = _ledger(tmp_path / "run")
    acc = _rows(con, "SELECT * FROM accounts ORDER BY attempt_id")
    assert [a["attempt_id"] for a in acc] == ["T0000:R1:A1", "T0000:R1:A2", "T0001:R1:A1"]
    assert {a["server_status"] for a in acc} == {"unknown"}
    assert [a["client_status"] for a in acc] == ["error", "completed", "completed"]  # the 429 was retried
    err = _rows(con, "SELECT ts_ns, attrs FROM events WHERE name = 'attempt.error'")[0]
    assert json.loads(err["attrs"])["status"] == 429 and json.loads(err["attrs"])["retry_after_s"] == 0.2
    retry = _rows(con, "SELECT ts_ns FROM events WHERE name = 'attempt.sent' AND attempt_id = 'T0000:R1:A2'")[0]
    assert retry["ts_ns"] - err["ts_ns"] >= 200e6  # the server's Retry-After, not the 20 ms backoff
    gaps = _rows(con, "SELECT * FROM gaps WHERE scope = 'run'")
    bb = [g for g in gaps if g["gap_id"] == "collector:black-box"]
    assert bb and "only the client's events" in bb[0]["detail"] and "server_status" in bb[0]["affects"]
    rm = _rows(con, "SELECT n_output_tokens, correct FROM request_metrics WHERE attempt_id = 'T0000:R1:A2'")[0]
    assert rm["n_output_tokens"] == 5 and rm["correct"] is True  # usage, not the 3 chunks; checker ran
    assert result.manifest["target"]["kind"] == "url" and "model" not in result.manifest


def test_in_process_target_counts_tokens_per_chunk(bundle, tmp_path):
    """The in-process transport (no HTTP): chunks carry the engine's token counts, so a cancellation
    after N tokens counts tokens, not chunks, and the session id reaches the engine."""
    from inferledger.collectors.load.in_process import EmbeddedTarget
    from inferledger.collectors.load.loadgen import LoadClient
    from inferledger.engine import AsyncEngine, EngineConfig, LLMEngine
    from inferledger.probes.probe import ListSink, Probe

    (tmp_path / "arrivals.txt").write_text("0\n10\n")
    wl = Workload.from_dict(_spec(tmp_path, inject={"cancel_tasks": [2], "cancel_after_tokens": 3},
                                  classes=[{"name": "s", "shape": "session", "turns": 1, "ignore_eos": True}]),
                            base=tmp_path)
    sink = ListSink()
    engine = AsyncEngine(LLMEngine(bundle, EngineConfig(max_num_seqs=4), sink=sink, run_id="t"))
    try:
        client = LoadClient(wl, EmbeddedTarget(engine, bundle.tokenizer), Probe(sink, "client", run_id="t"))
        result = asyncio.run(client.run())
    finally:
        engine.close()
    assert result.completed == 1 and result.cancelled == 1
    cancel = [json.loads(r["attrs"]) for r in sink.rows if r["name"] == "attempt.cancel"][0]
    assert cancel["counted"] == "tokens" and cancel["after_tokens"] >= 3
    chunks = [r for r in sink.rows if r["name"] == "attempt.chunk" and r["attempt_id"] == "T0000:R1:A1"]
    assert sum(r["value"] for r in chunks) == 12  # max_tokens, counted by the engine
    assert {r["session_id"] for r in sink.rows if r["source"] == "engine" and r["task_id"] == "T0000"} == {"T0000:S"}


def test_peer_views_agree_with_our_own_columns_on_a_real_run(scenario):
    _, _, con = scenario
    done = "attempt_id IN (SELECT attempt_id FROM attempts WHERE client_status = 'completed')"
    ours = {
        "TTFT": con.execute(f"SELECT count(ttft_client_ms), avg(ttft_client_ms), quantile_cont(ttft_client_ms, 0.9) "
                            f"FROM request_metrics WHERE {done}").fetchone(),
        "TPOT": con.execute(f"SELECT count(tpot_ms), avg(tpot_ms), quantile_cont(tpot_ms, 0.9) "
                            f"FROM request_metrics WHERE {done}").fetchone(),
        "ITL": con.execute(f"SELECT count(*), avg(gap_ms), quantile_cont(gap_ms, 0.9) FROM itl "
                           f"WHERE layer = 'client' AND {done}").fetchone(),
    }
    rows = {(m, t): (n, mean, p90) for m, t, n, mean, p90 in
            con.execute("SELECT metric, tool, n, mean_ms, p90_ms FROM peer_views").fetchall()}
    for metric, (n, mean, p90) in ours.items():
        got = rows[(metric, "inferledger")]
        assert n > 0 and got[0] == n and got[1] == pytest.approx(mean, rel=1e-12) and got[2] == pytest.approx(p90, rel=1e-12)
    # every per-request row covers the same completed attempts
    assert rows[("TTFT", "vLLM bench")][0] == rows[("TTFT", "inferledger")][0] == rows[("TTFT", "MLPerf-style")][0]


def test_a_clock_that_stops_answering_at_the_end_costs_one_mapping_not_the_run(tmp_path, monkeypatch):
    from inferledger.collectors.capture import clocksync

    monkeypatch.setattr(clocksync, "ROUND_TIMEOUT_S", 0.3)
    (tmp_path / "arrivals.txt").write_text("0\n20\n")
    wl = Workload.from_dict(_spec(tmp_path), base=tmp_path)
    stub = _Stub()
    answered = []

    async def clock(request):
        if len(answered) >= 16:  # the start estimate's rounds, then silence
            await asyncio.sleep(30)
        answered.append(1)
        return web.json_response({"clock": "stub-mono", "t_ns": time.monotonic_ns()})

    stub.thread.app.router.add_get("/clock", clock)
    with stub.thread as srv:
        capture(wl, tmp_path / "run", CaptureOptions(target=srv.url, separate_clocks=True))
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["state"] == "complete"
    assert [m["label"] for m in manifest["clock_mappings"]] == ["start"]
    assert [f["label"] for f in manifest["clock_mappings_failed"]] == ["end"]
    con = _ledger(tmp_path / "run")
    gap = _rows(con, "SELECT * FROM gaps WHERE gap_id = 'collector:clock-sync:end'")
    assert gap and "/clock: no clock reading within 0.3 s" in gap[0]["detail"]
    assert [a["client_status"] for a in _rows(con, "SELECT client_status FROM attempts ORDER BY attempt_id")] == \
        ["error", "completed", "completed"]


def test_a_capture_records_contention_the_host_and_the_client_thread(scenario):
    """On this Linux host: every engine step has its contention and uncontended time, adding up to the
    step; the host's samples are on the engine's clock; the client's loop thread has its CPU and wait."""
    run, _, con = scenario
    if not Path("/proc/self/task").joinpath(str(os.getpid()), "schedstat").exists():
        pytest.skip("this kernel hides schedstat")
    rows = con.execute("SELECT measured_ms, contention_ms, cpu_ms FROM step_model").fetchall()
    assert rows and all(c is not None and 0 <= c <= m and cpu + c == pytest.approx(m, abs=1e-9) for m, c, cpu in rows)
    m = json.loads((run / "manifest.json").read_text())
    host = m["host_samples"]
    assert host["applies_to_server"] is True and host["files"]["stat"] == "read" and host["started"] is True
    thread = m["client"]["thread"]
    assert thread["cpu_ms"] > 0 and thread["wait_ms"] >= 0 and 0 < thread["cpu_share"] <= 1
    assert thread["wait_share"] == pytest.approx(thread["wait_ms"] / thread["wall_ms"], abs=1e-3)
    samples = duckdb.connect().execute(f"SELECT DISTINCT clock, metric FROM '{run}/samples/*.parquet' "
                                       "WHERE source = 'host'").fetchall()
    assert {c for c, _ in samples} == {m["host_samples"]["clock"]}
    assert {"host_cpu_busy_ns", "host_other_cpu_ns", "host_cpu_steal_ns", "host_load1"} <= {x for _, x in samples}
