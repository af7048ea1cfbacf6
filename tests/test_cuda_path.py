"""The CUDA path's parts that run without a GPU: the device timer's arithmetic and device guard (on a
fake `torch.cuda` that rounds like CUDA events), the runner's lifetime (graphs and caches freed by
`close()` or by reference counting, never waiting for the cyclic collector), buckets built before a
run, one argmax per step for the whole batch, and NVML readers matched to a CUDA device by UUID."""
from __future__ import annotations

import contextlib
import gc
import struct
import weakref

import pytest
import torch

from inferledger.engine import EngineConfig, LLMEngine, SamplingParams
from inferledger.engine.runner import ModelRunner, RunnerOptions, SeqChunk
from inferledger.engine.sampler import Sampler
from inferledger.engine.sequence import Sequence
from inferledger.probes import ListSink
from inferledger.probes.cuda_timer import CudaStepTimer
from inferledger.probes.nvml import NvmlReader
from inferledger.probes.probe import Probe


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


class Fake32Cuda:
    """torch.cuda's surface for the timer: events on a device clock that reads the host's, whose
    elapsed_time is float32 milliseconds as cudaEventElapsedTime's is; `device(i)` switches the
    current device, and each event remembers the device it was recorded on."""

    def __init__(self, host_now, uuid: str = "5f1c2a9e-0000-4000-8000-00000000abcd") -> None:
        self.host_now, self.t0, self.current, self.uuid = host_now, host_now(), 0, uuid
        self.synced_on: list[int] = []

    @contextlib.contextmanager
    def device(self, index: int):
        prev, self.current = self.current, index
        try:
            yield
        finally:
            self.current = prev

    def synchronize(self) -> None:
        self.synced_on.append(self.current)

    def get_device_properties(self, index: int):
        return type("Props", (), {"uuid": self.uuid})()

    def Event(self, enable_timing: bool = False):
        cuda = self

        class _Event:
            t = device = None

            def record(self):
                self.t, self.device = cuda.host_now() - cuda.t0, cuda.current

            def query(self):
                return True

            def elapsed_time(self, other):
                return _f32((other.t - self.t) / 1e6)

        return _Event()


class Clock:
    def __init__(self) -> None:
        self.t = 10**12

    def __call__(self) -> int:
        return self.t


def test_a_step_is_timed_as_its_own_interval_not_as_a_difference_of_float32_anchor_distances():
    host = Clock()
    sink = ListSink()
    cuda = Fake32Cuda(host)
    timer = CudaStepTimer(Probe(sink, "engine", host="h", now_ns=host), sink, cuda=cuda, now_ns=host)
    host.t += 100_000_000_000  # 100 s after the anchor: a float32 ms count there moves in 7.8 us steps
    timer.start(1)
    host.t += 12_300  # a 12.3 us graph replay
    timer.end(1, mode="graph", padded_tokens=8)
    assert timer.poll() == 1
    (row,) = [r for r in sink.rows if r["name"] == "device.step"]
    assert row["value"] == pytest.approx(0.0123, rel=1e-6)
    # placed on the run's axis from the anchor (float32 rounding there), its end = start + its length
    assert abs(row["ts_ns"] - 100_000_000_000) <= 8_000
    import json

    assert json.loads(row["attrs"])["end_ns"] - row["ts_ns"] == 12_300


def test_the_timer_records_and_synchronises_on_its_own_device_whatever_is_current():
    host = Clock()
    sink = ListSink()
    cuda = Fake32Cuda(host)
    recorded = []
    event = cuda.Event

    def spy(enable_timing=False):
        ev = event(enable_timing)
        recorded.append(ev)
        return ev
    cuda.Event = spy
    timer = CudaStepTimer(Probe(sink, "engine", host="h", now_ns=host), sink, cuda=cuda, device_index=1,
                          now_ns=host)
    assert cuda.current == 0  # the engine's thread has device 0 current
    timer.start(1)
    host.t += 1000
    timer.end(1)
    timer.close()
    assert len(recorded) == 4 and {ev.device for ev in recorded} == {1}  # anchor, start, end, close probe
    assert cuda.synced_on and set(cuda.synced_on) == {1}
    assert timer.clock == "cuda:h:1"


def test_the_timer_summary_names_the_device_by_uuid_and_records_the_drift_after_close():
    host = Clock()
    sink = ListSink()
    timer = CudaStepTimer(Probe(sink, "engine", host="h", now_ns=host), sink, cuda=Fake32Cuda(host), now_ns=host)
    before = timer.summary()
    assert before["device_uuid"] == "GPU-5f1c2a9e-0000-4000-8000-00000000abcd"
    assert before["drift_ns"] is None and before["mapped_epsilon_ns"] is None
    host.t += 5_000_000
    timer.close()
    after = timer.summary()
    assert after["drift_ns"] == 0  # this fake device keeps the host's time exactly
    # the host clock did not move during the brackets: no gap, no widening
    assert after["mapped_epsilon_ns"] == 0 == after["anchor_epsilon_ns"]


def _runner(bundle, graphs=(2, 4), num_blocks=16):
    return ModelRunner(bundle.model, bundle.config, num_blocks=num_blocks, block_size=16,
                       options=RunnerOptions(graph_batch_sizes=graphs))


def _decode_two(runner):
    runner.forward([SeqChunk([1, 2, 3], 0, [0]), SeqChunk([4, 5], 0, [1])])
    return runner.forward([SeqChunk([7], 3, [0]), SeqChunk([8], 2, [1])])


@pytest.mark.slow
def test_a_runner_dropped_without_close_is_freed_by_reference_counting(bundle):
    runner = _runner(bundle)
    _decode_two(runner)
    assert runner.last_step["mode"] == "padded" and len(runner._graphs) == 1  # a bucket was built
    cache = weakref.ref(runner.k_cache)
    gc.disable()
    try:
        del runner
        assert cache() is None  # no runner <-> graph cycle keeps the KV cache for the collector
    finally:
        gc.enable()


@pytest.mark.slow
def test_close_frees_graphs_and_caches_and_the_engine_closes_only_the_runner_it_made(bundle):
    runner = _runner(bundle)
    _decode_two(runner)
    runner.close()
    runner.close()  # idempotent
    assert runner._graphs == {} and runner.k_cache is None
    with pytest.raises(RuntimeError, match="after close"):
        runner.forward([SeqChunk([1], 0, [0])])
    given = _runner(bundle, graphs=None)
    engine = LLMEngine(given, EngineConfig(num_blocks=16, probes=False), tokenizer=bundle.tokenizer)
    engine.close()
    assert given.k_cache is not None  # the caller's runner is the caller's to close
    own = LLMEngine(bundle, EngineConfig(num_blocks=16, probes=False))
    own.close()
    assert own.runner.k_cache is None


@pytest.mark.slow
def test_capture_graphs_builds_every_bucket_before_the_run(bundle):
    runner = _runner(bundle, graphs=(1, 2, 4))
    # widths 1, 2 and 4 blocks cover 40 tokens (4 * 16 >= 40): 3 batch sizes x 3 widths
    assert runner.capture_graphs(40) == 9
    assert sorted(runner._graphs) == [(b, w) for b in (1, 2, 4) for w in (1, 2, 4)]
    _decode_two(runner)
    assert len(runner._graphs) == 9  # the measured steps build nothing
    assert runner.capture_graphs(40) == 0
    runner.close()


def _seq(min_tokens: int = 0) -> Sequence:
    return Sequence([1, 2], SamplingParams(temperature=0.0, min_tokens=min_tokens, max_tokens=4), request_id="r")


def _count_argmax(monkeypatch, key) -> list:
    """Every argmax taken, as key(its input): torch.argmax's and the CPU kernel's batch argmax (where the
    engine's kernels are loaded, a CPU step's fp32 rows take it instead of torch's)."""
    from inferledger.engine import cpu_kernels

    calls = []
    real, kernel = torch.argmax, cpu_kernels.argmax_rows
    monkeypatch.setattr(torch, "argmax", lambda *a, **k: calls.append(key(a[0])) or real(*a, **k))
    monkeypatch.setattr(cpu_kernels, "argmax_rows", lambda t: calls.append(key(t)) or kernel(t))
    return calls


def test_a_batch_of_greedy_rows_takes_one_argmax(monkeypatch):
    logits = torch.zeros(4, 6)
    for row, token in enumerate((5, 0, 3, 3)):
        logits[row, token] = 1.0
    logits[3, 2] = 0.5  # row 3's second best, picked when its best (EOS 3) is banned
    rows = [logits[i] for i in range(4)]
    sampler = Sampler(eos_ids=[3])
    calls = _count_argmax(monkeypatch, lambda t: t.shape)
    sampler.prepare(rows)
    got = [sampler.greedy_token(r, s) for r, s in zip(rows, [_seq(), _seq(), _seq(), _seq(min_tokens=1)])]
    assert got == [5, 0, 3, 2]
    # one argmax over the 4 x 6 batch, read in place; row 3 (EOS banned before min_tokens) alone again
    assert calls == [torch.Size([4, 6]), torch.Size([6])]
    # a row prepare() never saw (another tensor, even with equal values) is computed alone
    assert sampler.greedy_token(logits[0].clone(), _seq()) == 5 and len(calls) == 3
    scattered = [torch.tensor([0.0, 2.0]), torch.tensor([3.0, 1.0])]  # not one storage: stacked
    sampler.prepare(scattered)
    assert [sampler.greedy_token(r, _seq()) for r in scattered] == [1, 0] and len(calls) == 4


@pytest.mark.slow
def test_an_engine_decode_step_of_four_greedy_sequences_runs_one_argmax(bundle, monkeypatch):
    engine = LLMEngine(bundle, EngineConfig(num_blocks=32, max_num_seqs=4, probes=False))
    for i in range(4):
        engine.add_request([1, 2, 3 + i], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True),
                           request_id=f"r{i}")
    engine.step()  # the prefills
    calls = _count_argmax(monkeypatch, lambda t: tuple(t.shape))
    deltas = engine.step()  # one decode step for all four
    assert len(deltas) == 4 and calls == [(4, bundle.config.shape.vocab)]
    engine.close()


def test_nvml_reader_for_a_cuda_device_is_matched_by_uuid_not_by_index():
    from test_energy import FakeNvml

    readers = NvmlReader.open_all(FakeNvml(n_gpus=2))
    assert NvmlReader.for_uuid(readers, "GPU-0000-1").index == 1
    assert NvmlReader.for_uuid(readers, "gpu-0000-1").index == 1  # CUDA's spelling is lower case
    assert NvmlReader.for_uuid(readers, "0000-0") is readers[0]  # CUDA's properties omit "GPU-"
    assert NvmlReader.for_uuid(readers, "GPU-9999") is None and NvmlReader.for_uuid(readers, None) is None


class _FakeCudaRuntime:
    """The torch.cuda calls GraphCapture makes, recording the current stream and device as a CUDA
    runtime would see them; torch.cuda.graph makes its `stream` current, as the real one does."""

    def __init__(self, monkeypatch) -> None:
        self.current_device, self.made = 0, []
        self.graph_calls, self.waits = [], []
        rt = self

        class Stream:
            def __init__(self, side=True):
                if side:
                    rt.made.append(self)

            def wait_stream(self, other):
                rt.waits.append((self, other))

        self.default = self.current = Stream(side=False)

        @contextlib.contextmanager
        def switch(attr, value):
            prev = getattr(rt, attr)
            setattr(rt, attr, value)
            try:
                yield
            finally:
                setattr(rt, attr, prev)

        @contextlib.contextmanager
        def graph(g, pool=None, stream=None):
            rt.graph_calls.append((g, pool, stream))
            with switch("current", stream if stream is not None else object()), switch("capturing", True):
                yield

        self.capturing = False
        for name, value in {"Stream": Stream, "graph_pool_handle": lambda: "pool",
                            "device": lambda d: switch("current_device", d.index),
                            "stream": lambda s: switch("current", s), "graph": graph,
                            "current_stream": lambda: rt.current,
                            "CUDAGraph": lambda: object()}.items():
            monkeypatch.setattr(torch.cuda, name, value)


def test_graph_warm_up_and_capture_run_on_one_side_stream_of_the_runners_device(monkeypatch):
    from types import SimpleNamespace

    from inferledger.engine.cuda_graph import WARMUP_STEPS, GraphCapture

    rt = _FakeCudaRuntime(monkeypatch)
    calls = []

    def step(g):
        calls.append((g.name, rt.current, rt.current_device, rt.capturing))
        return f"logits of {g.name}"
    capture = GraphCapture(torch.device("cuda", 1))
    buckets = [SimpleNamespace(name=n, graph=None, logits=None) for n in ("b1", "b2")]
    for g in buckets:
        capture.capture(g, step)
    (side,) = rt.made  # one side stream for the runner, made once
    assert calls == [(g.name, side, 1, i == WARMUP_STEPS) for g in buckets for i in range(WARMUP_STEPS + 1)]
    assert [(pool, stream) for _, pool, stream in rt.graph_calls] == [("pool", side)] * 2  # one pool, that stream
    assert [g.logits for g in buckets] == ["logits of b1", "logits of b2"] and all(g.graph for g in buckets)
    # the side stream waits for the buffers' fills; the default stream waits for the capture
    assert rt.waits == [(side, rt.default), (rt.default, side)] * 2
    assert rt.current is rt.default and rt.current_device == 0 and capture.captured == 2
