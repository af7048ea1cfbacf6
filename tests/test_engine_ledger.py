"""The engine's own events, written to a run directory and rebuilt by the ledger: a mixed run of 20
requests puts every attempt in every account; device.step events from the CUDA timer (driven here by
a fake device the real timer code accepts) land on their own clock with a checked mapping."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from ledger_util import dict_rows as _rows
from engine_checks import assert_no_leak

from inferledger.collectors.rundir.writer import RunWriter
from inferledger.engine import EngineConfig, LLMEngine, SamplingParams
from inferledger.ledger.reconstruct import reconstruct
from inferledger.probes.cuda_timer import CudaStepTimer


def _chat(tok, q: str) -> list[int]:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))


QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Name three primes.",
             "Why is the sky blue? Answer briefly.", "Say hello.", "Count from one to five.",
             "What colour is grass?", "Give me a word that rhymes with cat."]


def _mixed_run(bundle, run_dir, engine_config: EngineConfig, *, device_timer=None):
    """20 requests: greedy chats (shared template prefix: cache hits), seeded samples, two with n=2,
    a stop string, fixed lengths (ignore_eos), three cancelled mid-decode and one cancelled while
    queued, in a KV pool small enough to preempt. -> {attempt id: expected server status}."""
    tok = bundle.tokenizer
    expected: dict[str, str] = {}
    with RunWriter(run_dir, run_id="mixed") as writer:
        engine = LLMEngine(bundle, engine_config, sink=writer, run_id="mixed")
        writer.write_manifest({"run_id": "mixed", "source": "engine only", **engine.manifest()})
        if device_timer is not None:
            engine.device_timer = device_timer(engine, writer)
        add = lambda i, prompt, params: engine.add_request(prompt, params, request_id=f"r{i:02d}")
        i = 0
        for q in QUESTIONS:
            expected[add(i, _chat(tok, q), SamplingParams(max_tokens=12))] = "completed"
            i += 1
        for seed in range(3):
            p = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=seed)
            expected[add(i, _chat(tok, QUESTIONS[seed]), p)] = "completed"
            i += 1
        for q in QUESTIONS[3:5]:
            expected[add(i, _chat(tok, q), SamplingParams(max_tokens=8, n=2, temperature=1.0, seed=7))] = "completed"
            i += 1
        expected[add(i, tok.encode("one, two, three, four, five, six"), SamplingParams(max_tokens=20, stop=[","]))] = "completed"
        i += 1
        for n in (6, 14):
            expected[add(i, tok.encode("The weather today"), SamplingParams(max_tokens=n, ignore_eos=True))] = "completed"
            i += 1
        cancel = [add(i + k, _chat(tok, QUESTIONS[k]), SamplingParams(max_tokens=64, ignore_eos=True)) for k in range(4)]
        expected.update({a: "cancelled" for a in cancel})
        assert len(expected) == 20
        steps = 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
            if steps == 6:
                for a in cancel:
                    engine.abort(a)
        assert_no_leak(engine)
        engine.close()
    return expected


@pytest.fixture(scope="module")
def mixed(bundle, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("mixed") / "run"
    cfg = EngineConfig(num_blocks=24, max_num_seqs=12, max_num_batched_tokens=256,
                       speculative={"k": 3})
    expected = _mixed_run(bundle, run_dir, cfg)
    reconstruct(run_dir)
    return run_dir, expected


def test_mixed_engine_run_puts_every_attempt_in_every_account(mixed):
    run_dir, expected = mixed
    con = duckdb.connect(str(run_dir / "ledger.duckdb"), read_only=True)
    accounts = {r["attempt_id"]: r for r in _rows(con, "SELECT * FROM accounts")}
    assert set(accounts) == set(expected)
    for aid, status in expected.items():
        row = accounts[aid]
        assert row["server_status"] == status, (aid, row)
        assert row["client_status"] is None, (aid, row)  # no client in this run: unknown, not a guess
        assert row["resource_status"] == "reallocatable", (aid, row)
    counts = dict(con.execute("SELECT name, count(*) FROM events GROUP BY name").fetchall())
    assert counts["engine.enqueued"] == counts["engine.finished"] == 20
    assert counts["engine.preempted"] >= 1  # the pool is small enough that someone was recomputed
    assert counts["spec.round"] >= 1 and counts["kv.prefix_hit"] >= 1
    # no client in this run: one run-wide gap says which figures that leaves unknown
    gaps = _rows(con, "SELECT * FROM gaps")
    assert [g["scope"] for g in gaps if "client_status" in g["affects"]] == ["run"]
    assert not [g for g in gaps if "kv_gib_s" in g["affects"]]  # the manifest declares the KV block bytes
    kv = _rows(con, "SELECT attempt_id, kv_gib_s FROM accounts")
    assert all(r["kv_gib_s"] is not None and r["kv_gib_s"] >= 0 for r in kv)
    assert sum(r["kv_gib_s"] > 0 for r in kv) >= 16  # all but those cancelled while still queued hold KV
    # the server's token count per attempt equals the engine.token values, samples of n=2 included
    tokens = dict(con.execute("SELECT attempt_id, sum(value) FROM events WHERE name = 'engine.token' "
                              "GROUP BY attempt_id").fetchall())
    # the observation window of an engine-only run: first enqueued to last server end, and it says so
    m = _rows(con, "SELECT t_obs_s, \"window\", n_completed FROM run_metrics")[0]
    # from the raw events, not the ledger's own attempts table: the engine-only run ends at engine.finished
    t0, t1 = con.execute("SELECT min(ts_ns) FILTER (WHERE name = 'engine.enqueued'), "
                         "max(ts_ns) FILTER (WHERE name = 'engine.finished') FROM events").fetchone()
    assert m["window"] == "first engine.enqueued → last server end (no client events)"
    assert m["t_obs_s"] == (t1 - t0) / 1e9 and m["n_completed"] is None  # the client's view: unknown, not 0
    n_out = dict(con.execute("SELECT attempt_id, n_output_tokens FROM attempts").fetchall())
    assert n_out == {aid: tokens.get(aid, 0) for aid in expected}


class FakeCuda:
    """The `torch.cuda` surface CudaStepTimer uses, on a fake device clock: the device runs `skew`
    times as fast as the host's clock (drift); recorded events complete at the next synchronize()."""

    def __init__(self, host_now, skew: float = 1.0) -> None:
        """host_now: reads the host clock without advancing it."""
        self.host_now, self.skew, self.t0 = host_now, skew, host_now()
        self.pending: list = []

    def device_ns(self) -> float:
        return (self.host_now() - self.t0) * self.skew

    def synchronize(self) -> None:
        for ev in self.pending:
            ev.done = True
        self.pending.clear()

    def Event(self, enable_timing: bool = False):
        assert enable_timing
        cuda = self

        class _Event:
            t = None
            done = False

            def record(self):
                self.t = cuda.device_ns()
                cuda.pending.append(self)

            def query(self):
                return self.done

            def elapsed_time(self, other):
                assert self.done and other.done, "elapsed_time on an event that has not completed"
                return (other.t - self.t) / 1e6

        return _Event()


class FakeClock:
    """A host monotonic clock that advances a fixed step per reading."""

    def __init__(self, start: int = 10**12, step: int = 1000) -> None:
        self.t, self.step = start, step

    def __call__(self) -> int:
        self.t += self.step
        return self.t


def test_cuda_timer_maps_its_clock_and_widens_epsilon_by_the_drift():
    from inferledger.probes import ListSink
    from inferledger.probes.probe import Probe

    class Sink(ListSink):
        def __init__(self):
            super().__init__()
            self.domains, self.maps = [], []

        def clock_domain(self, clock, **kw):
            self.domains.append(clock)

        def clock_map(self, *args):
            self.maps.append(args)

    host = FakeClock()
    sink = Sink()
    probe = Probe(sink, "engine", host="h", now_ns=host)
    cuda = FakeCuda(lambda: host.t, skew=1.001)  # the device clock runs 1000 ppm fast
    timer = CudaStepTimer(probe, sink, cuda=cuda, now_ns=host)
    assert sink.domains == ["cuda:h:0"]
    # anchor bracket: synchronize, t0 (1 reading), record, synchronize, t1: gap 1000 ns
    assert timer.epsilon_ns == 500
    for step in (1, 2, 3):
        timer.start(step)
        host.t += 2_000_000  # 2 ms of host time for the forward
        timer.end(step, mode="eager", padded_tokens=4)
        assert timer.poll() == 0  # not complete until the device is synchronised
    cuda.synchronize()
    assert timer.poll() == 3
    steps = [r for r in sink.rows if r["name"] == "device.step"]
    assert [r["step_id"] for r in steps] == [1, 2, 3]
    assert all(r["clock"] == "cuda:h:0" for r in steps)
    for r in steps:
        a = json.loads(r["attrs"])
        assert a["end_ns"] - r["ts_ns"] == round(r["value"] * 1e6)
        assert r["value"] == pytest.approx(2.0 * 1.001, rel=1e-6)  # device ms at the device's rate
        assert a["mode"] == "eager" and a["padded_tokens"] == 4
    assert sink.maps == []  # written only at close, once the drift is known
    host.t += 1_000_000_000
    timer.close()
    timer.close()  # idempotent
    assert len(sink.maps) == 1
    frm, to, offset, eps, method = sink.maps[0]
    assert (frm, to, method) == ("cuda:h:0", probe.clock, "cuda-event-anchor")
    assert {r["source"] for r in steps} == {"device"}
    # the device ran 1000 ppm fast over ~1.006 s of host time: ~1.006 ms of drift, inside epsilon
    assert timer.drift_ns < 0 and abs(timer.drift_ns) == pytest.approx(1.006e6, rel=0.01)
    assert eps >= abs(timer.drift_ns) and eps - abs(timer.drift_ns) <= 500
    with pytest.raises(RuntimeError, match="without a matching start"):
        timer.end(9)


def test_device_steps_from_an_engine_run_reach_the_ledger(bundle, tmp_path):
    host_now = __import__("time").monotonic_ns

    def timer(engine, writer):
        return CudaStepTimer(engine.probe, writer, cuda=FakeCuda(host_now), now_ns=host_now)

    run_dir = tmp_path / "run"
    cfg = EngineConfig(num_blocks=64, max_num_seqs=8, graph_batch_sizes=(2, 4, 8))
    _mixed_run(bundle, run_dir, cfg, device_timer=timer)
    reconstruct(run_dir)
    con = duckdb.connect(str(run_dir / "ledger.duckdb"), read_only=True)
    ends = dict(con.execute("SELECT step_id, attrs FROM events WHERE name = 'step.end'").fetchall())
    dev = _rows(con, "SELECT step_id, clock, value, attrs FROM events WHERE name = 'device.step' ORDER BY step_id")
    assert [d["step_id"] for d in dev] == sorted(ends)  # one device.step per engine step
    modes = {json.loads(a)["mode"] for a in ends.values()}
    assert modes == {"eager", "padded"}  # prefill / mixed steps eager, pure decodes padded to a bucket
    for d in dev:
        end = json.loads(ends[d["step_id"]])
        assert json.loads(d["attrs"])["mode"] == end["mode"]
        assert end["padded_tokens"] >= 1 and d["value"] >= 0
    padded = [json.loads(a) for a in ends.values() if json.loads(a)["mode"] == "padded"]
    assert all(a["padded_tokens"] in (2, 4, 8) and a["padded_tokens"] >= a["num_seqs"] for a in padded)
    maps = _rows(con, "SELECT * FROM clocks WHERE from_clock IS NOT NULL")
    assert [(m["from_clock"], m["method"]) for m in maps] == [(dev[0]["clock"], "cuda-event-anchor")]
    affects = [g[0] for g in con.execute("SELECT affects FROM gaps").fetchall()]
    assert not [a for a in affects if "gpu_s_per_good" in a]  # device time is known in this run
    con.close()
    # the Perfetto trace draws every device step on the cuda clock's own track, mapped onto the run's axis
    from test_export import validate_trace

    from inferledger.report.export import export_run

    trace = json.loads(Path(export_run(run_dir, "perfetto", tmp_path / "t.json").destination).read_text())
    validate_trace(trace)
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "device"]
    assert sorted(int(e["name"].split()[-1]) for e in slices) == [d["step_id"] for d in dev]


def test_n2_engine_run_counts_tokens_itl_and_tpot_per_choice(mixed):
    """The two n=2 requests: each engine.token names its choice; the ledger keeps the choices apart.
    Expected values come from the raw events here, not from the ledger's tables."""
    run_dir, _ = mixed
    con = duckdb.connect(str(run_dir / "ledger.duckdb"), read_only=True)
    toks = con.execute("SELECT attempt_id, CAST(json_extract_string(attrs, '$.choice') AS INTEGER), ts_ns, value "
                       "FROM events WHERE name = 'engine.token' ORDER BY attempt_id, ts_ns, seq").fetchall()
    finished = dict(con.execute("SELECT attempt_id, ts_ns FROM events WHERE name = 'engine.finished'").fetchall())
    by: dict = {}
    for aid, choice, ts, value in toks:
        by.setdefault(aid, {}).setdefault(choice, []).append((ts, value))
    two = {aid: ch for aid, ch in by.items() if len(ch) == 2}
    assert len(two) == 2 and all(set(ch) == {0, 1} for ch in two.values())
    for aid, choices in two.items():
        rows = dict(con.execute("SELECT choice, n_output_tokens FROM choice_metrics WHERE attempt_id = ?",
                                [aid]).fetchall())
        assert rows == {c: sum(v for _, v in ts) for c, ts in choices.items()}
        n_itl = con.execute("SELECT count(*) FROM itl WHERE attempt_id = ? AND layer = 'engine'", [aid]).fetchone()[0]
        assert n_itl == sum(len(ts) - 1 for ts in choices.values())  # gaps within a choice only
        # engine only: every choice ends at engine.finished; TPOT token-weighted over the choices
        span = sum(finished[aid] - ts[0][0] for ts in choices.values() if sum(v for _, v in ts) > 1)
        per_token = sum(sum(v for _, v in ts) - 1 for ts in choices.values() if sum(v for _, v in ts) > 1)
        tpot = con.execute("SELECT tpot_server_ms FROM request_metrics WHERE attempt_id = ?", [aid]).fetchone()[0]
        assert tpot == pytest.approx(span / 1e6 / per_token)
        assert con.execute("SELECT n_choices FROM request_metrics WHERE attempt_id = ?", [aid]).fetchone()[0] == 2
