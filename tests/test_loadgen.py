"""The load client without a model: arrival processes, the closed loop, task shapes, timeouts, retries,
cancellations, tool calls, and the events it writes (every one complete by the event contract)."""
from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
from pathlib import Path

import pytest

from inferledger.collectors.load.loadgen import Chunk, LoadClient, check_answer
from inferledger.collectors.workload import Question, Workload, gamma_offsets, poisson_offsets, read_replay
from inferledger.probes.events import VOCABULARY, missing_requirements
from inferledger.probes.probe import ListSink, Probe

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = sorted((REPO / "samples" / "workloads").glob("*.toml"))


def _taskset(tmp_path: Path, n: int = 4) -> str:
    rows = [{"kind": "lookup", "prompt": f"question {i}?", "answer": f"answer{i}"} for i in range(n)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.name


def _workload(tmp_path: Path, **over) -> Workload:
    spec = {"name": "t", "seed": 3, "taskset": {"file": _taskset(tmp_path)},
            "arrivals": {"process": "poisson", "rate_rps": 200.0, "n_tasks": 4},
            "contract": {"deadline_ms": 60_000}, "client": {"timeout_ms": 2000, "max_attempts": 2, "backoff_ms": 5},
            "generation": {"max_tokens": 8}}
    for key, value in over.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return Workload.from_dict(spec, base=tmp_path)


class FakeTransport:
    """Answers every attempt with `answer<k>` in a few chunks; behaviour per attempt id can be scripted:
    'stall' (no output until closed; finishes after `stall_s` if left open), 429 / 500 (an HTTP error)."""

    def __init__(self, script: dict | None = None, *, chunk_s: float = 0.002, stall_s: float = 0.3,
                 delays: dict | None = None) -> None:
        self.script, self.chunk_s, self.stall_s = script or {}, chunk_s, stall_s
        self.delays = delays or {}
        self.in_flight = self.max_in_flight = 0
        self.finished_streams: list[str] = []
        self.closed_early: list[str] = []
        self.messages: dict[str, list[dict]] = {}

    async def stream(self, messages, params, *, ids, on_sent=None, on_first_byte=None):
        aid = ids["attempt_id"]
        self.messages[aid] = messages
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        done = False
        try:
            on_sent()
            await asyncio.sleep(0.001)
            how = self.script.get(aid)
            if isinstance(how, int):
                err = Exception(f"HTTP {how}")
                err.status = how
                raise err
            on_first_byte()
            if how == "stall":
                await asyncio.sleep(self.stall_s)
            await asyncio.sleep(self.delays.get(ids["task_id"], 0.0))
            q = int(messages[-1]["content"].split()[1].rstrip("?"))
            for piece in ("The ", "answer ", f"is answer{q}", "."):
                await asyncio.sleep(self.chunk_s)
                yield Chunk(kinds=["content"], text=piece)
            yield Chunk(kinds=["finish"], finish_reason="stop")
            yield Chunk(kinds=["usage"], usage={"prompt_tokens": 5, "completion_tokens": 6})
            done = True
            self.finished_streams.append(aid)
        finally:
            self.in_flight -= 1
            if not done:
                self.closed_early.append(aid)


def _run(wl: Workload, transport, plans=None) -> tuple[LoadClient, list[dict]]:
    sink = ListSink()
    client = LoadClient(wl, transport, Probe(sink, "client", run_id="t", host="h", clock="mono:h"), plans=plans)
    asyncio.run(client.run())
    return client, sink.rows


def _attrs(row: dict) -> dict:
    return json.loads(row["attrs"] or "{}")


def _events(rows, name, **ids):
    return [r for r in rows if r["name"] == name and all(r.get(k) == v for k, v in ids.items())]


# ---- arrival processes -------------------------------------------------------------------------------

def test_poisson_mean_rate_and_exponential_gaps():
    offs = poisson_offsets(5.0, 40_001, random.Random(1))
    gaps = [b - a for a, b in zip(offs, offs[1:])]
    assert offs[0] == 0.0
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.03)  # rate 5/s
    assert statistics.pvariance(gaps) / statistics.fmean(gaps) ** 2 == pytest.approx(1.0, rel=0.06)  # CV^2 = 1


@pytest.mark.parametrize("cv2", [0.25, 4.0])
def test_gamma_burstiness_is_the_cv2_of_gaps(cv2):
    offs = gamma_offsets(2.0, cv2, 60_001, random.Random(2))
    gaps = [b - a for a, b in zip(offs, offs[1:])]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.5, rel=0.03)
    assert statistics.pvariance(gaps) / mean ** 2 == pytest.approx(cv2, rel=0.1)


def test_replay_plans_exactly_the_file_offsets(tmp_path):
    (tmp_path / "trace.txt").write_text("# ms\n0\n12.5\n12.5\n40\n250.25\n")
    (tmp_path / "trace.jsonl").write_text('{"t_ms": 0}\n{"t_ms": 7.75, "note": "x"}\n{"t_ms": 30}\n')
    assert read_replay(tmp_path / "trace.jsonl")[0] == [0.0, 7.75, 30.0]
    wl = _workload(tmp_path, arrivals={"process": "replay", "file": "trace.txt", "n_tasks": 5, "rate_rps": None})
    _, rows = _run(wl, FakeTransport())
    planned = sorted(r["ts_ns"] for r in _events(rows, "arrival.planned"))
    assert [t - planned[0] for t in planned] == [0, 12_500_000, 12_500_000, 40_000_000, 250_250_000]
    sent = {r["attempt_id"]: _attrs(r)["pacing_error_ms"] for r in _events(rows, "attempt.sent")}
    assert len(sent) == 5 and all(0 <= v < 1000 for v in sent.values())  # recorded on every send
    # n_tasks defaults to the file's length; a speed factor compresses time; bad files are refused
    wl2 = _workload(tmp_path, arrivals={"process": "replay", "file": "trace.txt", "speed": 2.0, "n_tasks": None,
                                        "rate_rps": None})
    assert wl2.n_tasks == 5 and wl2.arrival_offsets()[-1] == pytest.approx(0.125125)
    (tmp_path / "bad.txt").write_text("10\n5\n")
    with pytest.raises(ValueError, match="must not decrease"):
        _workload(tmp_path, arrivals={"process": "replay", "file": "bad.txt"})


def test_a_replay_file_is_read_as_a_stream_up_to_its_bound_and_refused_by_line(tmp_path):
    """A replay file is read for the arrivals used: n_tasks of them (a bad line after them is never read),
    or every one up to the bound of tasks; a number no double holds or a nesting the parser cannot take
    is refused by line, not a traceback."""
    replay = {"process": "replay", "file": "r.txt", "rate_rps": None}
    (tmp_path / "r.txt").write_text("0\n10\n20\nnot a number\n")
    assert _workload(tmp_path, arrivals={**replay, "n_tasks": 3}).arrival_offsets() == [0.0, 0.01, 0.02]
    assert read_replay(tmp_path / "r.txt", first=2)[0] == [0.0, 10.0]
    (tmp_path / "r.txt").write_text("".join(f"{i}\n" for i in range(6)))
    with pytest.raises(ValueError, match=r"r\.txt:6: more than 5 arrivals: at most 5 tasks in one workload; set "
                                         r"\[arrivals\]\.n_tasks \(at most 5\)"):
        read_replay(tmp_path / "r.txt", most=5)
    for line, problem in (("9" * 4000, "OverflowError"), ("[" * 100_000, "RecursionError")):
        (tmp_path / "r.txt").write_text(f"0\n{line}\n")
        with pytest.raises(ValueError, match=rf"r\.txt:2: expected a number of ms or a JSON object with t_ms "
                                             rf"\({problem}"):
            _workload(tmp_path, arrivals={**replay, "n_tasks": None})
    (tmp_path / "r.txt").write_bytes(b"0\n\xff\xfe\n")
    with pytest.raises(ValueError, match=r"r\.txt: not a text file of arrivals"):
        _workload(tmp_path, arrivals={**replay, "n_tasks": None})


def test_an_open_loops_concurrency_caps_the_tasks_in_flight(tmp_path):
    # 12 arrivals at 2000/s all land while the first are still streaming: without the cap all 12 overlap
    transport = FakeTransport(delays={f"T{i:04d}": 0.03 for i in range(12)})
    _run(_workload(tmp_path, arrivals={"rate_rps": 2000.0, "n_tasks": 12}), transport)
    assert transport.max_in_flight == 12
    transport = FakeTransport(delays={f"T{i:04d}": 0.03 for i in range(12)})
    client, rows = _run(_workload(tmp_path, arrivals={"rate_rps": 2000.0, "n_tasks": 12, "concurrency": 3}),
                        transport)
    assert transport.max_in_flight == 3 and client.result.completed == 12


def test_closed_loop_never_exceeds_n_in_flight(tmp_path):
    wl = _workload(tmp_path, arrivals={"process": "closed", "concurrency": 3, "n_tasks": 12, "think_ms": 1})
    rng = random.Random(5)
    transport = FakeTransport(delays={f"T{i:04d}": rng.uniform(0.0, 0.03) for i in range(12)})
    client, rows = _run(wl, transport)
    assert transport.max_in_flight == 3 and client.result.max_in_flight == 3
    assert client.result.completed == 12 and len(_events(rows, "task.end")) == 12
    # each worker starts its next task only after its previous one ended: planned >= some earlier end
    starts = sorted(r["ts_ns"] for r in _events(rows, "arrival.planned"))
    ends = sorted(r["ts_ns"] for r in _events(rows, "task.end"))
    for k, t in enumerate(starts[3:]):
        assert t >= ends[k]


# ---- task shapes, faults and the event contract ------------------------------------------------------

def test_shapes_faults_and_every_event_is_complete(tmp_path):
    (tmp_path / "tasks.jsonl").write_text("".join(
        json.dumps({"kind": "lookup", "prompt": f"question {i}?", "answer": f"answer{i}"}) + "\n" for i in range(9)))
    wl = _workload(tmp_path, arrivals={"n_tasks": 5},
                   inject={"timeout_tasks": [1], "timeout_ms": 50, "cancel_tasks": [2], "cancel_after_tokens": 2,
                           "abandon_tasks": [5], },
                   classes=[{"name": "one", "weight": 3},
                            {"name": "sess", "shape": "session", "turns": 3, "tool_ms": 30, "tool_before": [2]},
                            {"name": "par", "shape": "parallel", "branches": 3, "on_missing": "partial_success"}])
    plans = wl.plan()
    assert [p.cls.name for p in plans] == ["one", "sess", "one", "par", "one"]  # smooth weighted round robin
    script = {"T0000:R1:A1": "stall", "T0002:R1:A1": 503, "T0002:R1:A2": 503, "T0004:R1:A1": "stall"}
    plans[4].first_timeout_ms = 50  # task 5 times out too, and abandons its connection
    transport = FakeTransport(script)
    client, rows = _run(wl, transport, plans)
    r = client.result

    for row in rows:  # the contract: known names, required ids and attrs present
        assert row["name"] in VOCABULARY, row["name"]
        assert missing_requirements(row) == [], (row["name"], missing_requirements(row))
    assert {r["source"] for r in rows} == {"client", "checker", "tool"}
    start = {x["task_id"]: _attrs(x) for x in _events(rows, "task.start")}
    assert start["T0003"]["required"] == ["T0003:R1", "T0003:R2", "T0003:R3"]
    assert start["T0003"]["on_missing"] == "partial_success" and start["T0000"]["on_missing"] == "failure"
    assert all({"deadline_ms", "required", "on_missing", "max_attempts"} <= set(a) for a in start.values())

    # T0000: injected timeout (connection closed) then a retry that completes, attempt index 2
    assert _events(rows, "attempt.timeout", attempt_id="T0000:R1:A1")
    assert _attrs(_events(rows, "attempt.created", attempt_id="T0000:R1:A2")[0])["attempt_index"] == 2
    assert _events(rows, "attempt.done", attempt_id="T0000:R1:A2")
    assert "T0000:R1:A1" in transport.closed_early
    # T0001: a session of three turns; the tool call sits between turn 1 and turn 2; the last turn is
    # cancelled after 2 tokens (chunks here); every event of it carries the session id
    sess = [x for x in rows if x["task_id"] == "T0001"]
    assert {x["session_id"] for x in sess} == {"T0001:S"}
    t_done1 = _events(rows, "attempt.done", attempt_id="T0001:R1:A1")[0]["ts_ns"]
    t_tool0 = _events(rows, "tool.start", task_id="T0001")[0]["ts_ns"]
    t_tool1 = _events(rows, "tool.end", task_id="T0001")[0]["ts_ns"]
    t_sent2 = _events(rows, "attempt.sent", attempt_id="T0001:R2:A1")[0]["ts_ns"]
    assert t_done1 <= t_tool0 < t_tool1 <= t_sent2 and t_tool1 - t_tool0 >= 30e6
    turn3 = transport.messages["T0001:R3:A1"]
    assert [m["role"] for m in turn3] == ["user", "assistant", "user", "assistant", "user"]
    assert turn3[1]["content"] == "The answer is answer1."  # the previous answer is carried
    cancel = _attrs(_events(rows, "attempt.cancel", attempt_id="T0001:R3:A1")[0])
    assert cancel["trigger"] == "after_tokens" and cancel["after_tokens"] == 2
    assert not _events(rows, "attempt.created", attempt_id="T0001:R3:A2")  # a cancel is not retried
    # T0003: three branches in parallel, each its own request, all sent before any finished
    assert len({x["request_id"] for x in _events(rows, "attempt.done", task_id="T0003")}) == 3
    sent = [x["ts_ns"] for x in _events(rows, "attempt.sent", task_id="T0003")]
    assert max(sent) < min(x["ts_ns"] for x in _events(rows, "attempt.done", task_id="T0003"))
    # T0002: 503 twice: two errors, then the request gives up (max_attempts = 2)
    errs = _events(rows, "attempt.error", task_id="T0002")
    assert [_attrs(e)["status"] for e in errs] == [503, 503] and all(_attrs(e)["retryable"] for e in errs)
    # T0004: timed out and abandoned: no close, the stream ran to its end, the retry completed
    assert _attrs(_events(rows, "attempt.timeout", attempt_id="T0004:R1:A1")[0])["on_timeout"] == "abandon"
    assert "T0004:R1:A1" in transport.finished_streams and not _events(rows, "attempt.chunk", attempt_id="T0004:R1:A1")
    assert r.abandoned == 1 and r.late_chunks == 6 and r.timeouts == 2 and r.cancelled == 1 and r.errors == 2
    assert r.tool_calls == 1
    # verdicts: every completed attempt judged, against its own question
    verdicts = {x["attempt_id"]: _attrs(x)["correct"] for x in _events(rows, "verdict")}
    assert len(verdicts) == r.completed and all(verdicts.values())
    assert r.retries == 3 and set(r.pacing_summary()) == {"arrival", "retry", "turn"}


def test_give_up_when_a_retry_could_only_be_late(tmp_path):
    wl = _workload(tmp_path, arrivals={"n_tasks": 1}, contract={"deadline_ms": 60},
                   client={"timeout_ms": 40, "max_attempts": 3, "backoff_ms": 50})
    _, rows = _run(wl, FakeTransport({"T0000:R1:A1": "stall"}))
    assert len(_events(rows, "attempt.created")) == 1
    assert _attrs(_events(rows, "task.end")[0])["gave_up"] == ["T0000:R1"]


def test_cancel_after_ms(tmp_path):
    wl = _workload(tmp_path, arrivals={"n_tasks": 1}, inject={"cancel_tasks": [1], "cancel_after_ms": 20})
    transport = FakeTransport({"T0000:R1:A1": "stall"})
    _, rows = _run(wl, transport)
    cancel = _attrs(_events(rows, "attempt.cancel")[0])
    assert cancel["trigger"] == "after_ms" and cancel["after_ms"] >= 20
    assert not _events(rows, "attempt.timeout") and transport.closed_early == ["T0000:R1:A1"]


def test_checker_exact_and_regex():
    assert check_answer(Question("q", "Paris", "exact"), " paris. ")
    assert not check_answer(Question("q", "Paris", "exact"), "It is Paris.")
    assert check_answer(Question("q", r"\b5\b"), "2 + 3 = 5")
    assert not check_answer(Question("q", r"\b5\b"), "2 + 3 = 15")


# ---- workload files ----------------------------------------------------------------------------------

def test_workload_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"arrival: unknown key \(did you mean arrivals\?\)"):
        _workload(tmp_path, arrival={"rate_rps": 1})
    with pytest.raises(ValueError, match=r"\[arrivals\]\.rate_rps: required for process = 'poisson'"):
        _workload(tmp_path, arrivals={"rate_rps": None})
    with pytest.raises(ValueError, match=r"\[arrivals\]\.process: must be one of 'poisson', 'gamma', 'replay', 'closed' or 'trace', not 'uniform'"):
        _workload(tmp_path, arrivals={"process": "uniform"})
    with pytest.raises(ValueError, match=r"\[arrivals\]\.concurrency: required for process = 'closed'"):
        _workload(tmp_path, arrivals={"process": "closed", "rate_rps": None})
    with pytest.raises(ValueError, match=r"\[\[classes\]\]\[0\]\.shape: must be one of"):
        _workload(tmp_path, classes=[{"name": "x", "shape": "tree"}])
    with pytest.raises(ValueError, match=r"\[inject\]\.timeout_ms: required by timeout_every"):
        _workload(tmp_path, inject={"timeout_every": 2})
    with pytest.raises(ValueError, match="need the model's tokenizer"):
        _workload(tmp_path, classes=[{"name": "x", "prompt_tokens": 64}]).plan()


def test_a_workload_number_that_is_nan_or_infinite_is_refused_by_its_key(tmp_path):
    # TOML allows nan and inf; a NaN deadline is an unreadable contract, wherever it is declared
    with pytest.raises(ValueError, match=r"\[contract\]\.deadline_ms: must be a finite number, not nan"):
        _workload(tmp_path, contract={"deadline_ms": float("nan")})
    with pytest.raises(ValueError, match=r"\[\[classes\]\]\[0\]\.deadline_ms: must be a finite number, not inf"):
        _workload(tmp_path, classes=[{"name": "x", "deadline_ms": float("inf")}])
    path = tmp_path / "nan.toml"
    path.write_text('[arrivals]\nrate_rps = nan\n')
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: \[arrivals\]\.rate_rps: must be a finite number, not nan"):
        Workload.load(path)


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.name)
def test_sample_workloads_build_exact_prompts(path, bundle):
    wl = Workload.load(path)
    wl.n_tasks = min(wl.n_tasks, 12)
    tok = bundle.tokenizer
    plans = wl.plan(tok)
    heads: dict[str, list[int]] = {}
    for p in plans:
        for r in p.requests:
            if r.prompt_tokens is None:
                continue
            msgs = ([{"role": "system", "content": r.system}] if r.system else []) + [{"role": "user", "content": r.user}]
            ids = tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True), add_special=False)
            assert len(ids) == r.prompt_tokens == p.cls.prompt_tokens
            if p.cls.shared_prefix_tokens:  # the shared prefix is the same tokens in every request of the class
                head = ids[: p.cls.shared_prefix_tokens]
                assert heads.setdefault(p.cls.name, head) == head
    assert wl.plan(tok)[0].requests[0].system == plans[0].requests[0].system  # deterministic from the seed


def test_calibration_only_slows_open_loop_arrivals(tmp_path):
    wl = _workload(tmp_path, arrivals={"rate_rps": 2.0, "n_tasks": 40, "calibrate_tok_s": 50.0})
    done = wl.calibrate(25.0)  # a machine at half the speed the workload was tuned on
    assert (wl.rate_rps, wl.n_tasks, done["factor"]) == (1.0, 20, 0.5)
    assert (wl.timeout_ms, wl.deadline_ms) == (4000, 120_000)  # time limits stretch with the machine
    assert done["before"] == {"rate_rps": 2.0, "n_tasks": 40, "timeout_ms": 2000, "deadline_ms": 60_000}
    wl2 = _workload(tmp_path, arrivals={"rate_rps": 2.0, "n_tasks": 40, "calibrate_tok_s": 50.0})
    assert wl2.calibrate(80.0)["factor"] == 1.0 and (wl2.rate_rps, wl2.n_tasks) == (2.0, 40)  # never faster


def test_slo_section_is_checked_and_stretches_with_calibration(tmp_path):
    wl = _workload(tmp_path, slo={"ttft_ms": 500, "e2e_ms": 4000},
                   arrivals={"rate_rps": 2.0, "n_tasks": 40, "calibrate_tok_s": 50.0})
    assert wl.slo == {"ttft_ms": 500.0, "e2e_ms": 4000.0}  # tpot_ms not declared: not checked
    done = wl.calibrate(25.0)
    assert wl.slo == {"ttft_ms": 1000.0, "e2e_ms": 8000.0}
    assert done["before"]["slo"] == {"ttft_ms": 500.0, "e2e_ms": 4000.0} and done["after"]["slo"] == wl.slo
    assert _workload(tmp_path).slo == {}
    with pytest.raises(ValueError, match=r"\[slo\]\.ttft: unknown key \(did you mean ttft_ms\?\)"):
        _workload(tmp_path, slo={"ttft": 500})
    with pytest.raises(ValueError, match=r"\[slo\]\.tpot_ms: must be > 0\.0, not -1"):
        _workload(tmp_path, slo={"tpot_ms": -1})


def test_the_idle_hook_runs_only_with_no_task_in_flight_and_is_told_the_next_arrival(tmp_path):
    """Replayed arrivals at 0, 150 and 300 ms, each task a few ms: the client is idle after each one; the
    hook sees no task in flight and the next planned arrival (none after the last)."""
    (tmp_path / "trace.txt").write_text("0\n150\n300\n")
    wl = _workload(tmp_path, arrivals={"process": "replay", "file": "trace.txt", "n_tasks": 3, "rate_rps": None})
    transport = FakeTransport()
    sink = ListSink()
    client = LoadClient(wl, transport, Probe(sink, "client", run_id="t", host="h", clock="mono:h"))
    seen = []

    async def on_idle(next_ns):
        seen.append((transport.in_flight, client._in_flight, next_ns))
        await asyncio.sleep(0.01)

    client.on_idle = on_idle
    asyncio.run(client.run())
    planned = sorted(r["ts_ns"] for r in _events(sink.rows, "arrival.planned"))
    assert [(t, c) for t, c, _ in seen] == [(0, 0)] * 3
    assert [n for _, _, n in seen] == [planned[1], planned[2], None]
