"""What a request asks for (`SamplingParams`) and how the engine is set up (`EngineConfig`).

Both validate on construction and refuse out-of-range values with a `ValueError` that names the
parameter and the allowed range, so the HTTP front end can turn the message into a 400 as it is.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field


MAX_N = 16  # parallel samples of one prompt
LINEAR_CHOICES = ("auto", "kernels", "onednn", "torch")  # EngineConfig.linear, $INFERLEDGER_LINEAR
OLD_LINEAR_NAMES = {"gemv": "kernels"}  # the name the engine's kernels had first: configs and results files hold it


def _fail(name: str, value, allowed: str) -> None:
    raise ValueError(f"{name}={value!r} is out of range: {name} must be {allowed}")


def _int(name: str, value, lo: int, hi: int | None = None, *, allowed: str | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi)
    if not ok:
        _fail(name, value, allowed or (f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"))


def _float(name: str, value, lo: float, hi: float, *, lo_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        _fail(name, value, f"a number in {'(' if lo_open else '['}{lo}, {hi}]")


@dataclass
class SamplingParams:
    """Generation settings of one request. temperature 0 means greedy; top_k 0 (or -1) and top_p 1
    switch those filters off; seed makes a sampled output reproducible whatever the batch."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        _int("max_tokens", self.max_tokens, 1)
        _int("min_tokens", self.min_tokens, 0, self.max_tokens,
             allowed=f"an integer in [0, max_tokens={self.max_tokens}]")
        _float("temperature", self.temperature, 0.0, 2.0)
        _float("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        if self.top_k == -1:
            self.top_k = 0
        _int("top_k", self.top_k, 0, allowed="an integer >= 0 (0 or -1 disables it)")
        if self.seed is not None:
            _int("seed", self.seed, 0, 2**63 - 1)
        _int("n", self.n, 1, MAX_N)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                _fail("stop", s, "a list of non-empty strings")
        for t in self.stop_token_ids:
            _int("stop_token_ids", t, 0, allowed="a list of token ids >= 0")
        if not isinstance(self.ignore_eos, bool):
            _fail("ignore_eos", self.ignore_eos, "true or false")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SpeculativeConfig:
    """Speculative decoding by prompt lookup: drafts of up to k tokens copied from the context after
    the longest matching n-gram (ngram_max down to ngram_min tokens)."""

    method: str = "prompt_lookup"
    k: int = 4
    ngram_max: int = 3
    ngram_min: int = 1

    def __post_init__(self) -> None:
        if self.method != "prompt_lookup":
            _fail("speculative.method", self.method, "'prompt_lookup'")
        _int("speculative.k", self.k, 1, 32)
        _int("speculative.ngram_min", self.ngram_min, 1, 16)
        _int("speculative.ngram_max", self.ngram_max, self.ngram_min, 16,
             allowed=f"an integer in [ngram_min={self.ngram_min}, 16]")


@dataclass
class EngineConfig:
    """How the engine batches, caches and admits. num_blocks wins over kv_cache_bytes; with neither,
    the KV cache gets DEFAULT_KV_BYTES."""

    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_bytes: int | None = None
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None
    chunked_prefill: bool = True
    # The most prompt tokens one prefill chunk takes in a step (vLLM's name); None: a chunk takes all the
    # token budget the step has left. Needs chunked_prefill.
    long_prefill_token_threshold: int | None = None
    enable_prefix_caching: bool = True
    admission: str = "on_demand"  # "reserve": prompt + max_tokens blocks per request, never preempts
    batching: str = "continuous"  # "fixed": admit a batch, admit more only when all of it finished
    speculative: SpeculativeConfig | dict | None = None
    device: str | None = None  # None: where the model is
    dtype: str | None = None
    probes: bool = True
    # Pure decode batches padded up to these sizes; on CUDA each (size, table width) bucket is captured
    # once as a CUDA graph and replayed. "auto": powers of two up to max_num_seqs on CUDA, none on the
    # CPU. () or None: every step eager. An explicit tuple on the CPU runs the padded path eagerly.
    graph_batch_sizes: tuple[int, ...] | str | None = "auto"
    # device.step events from CUDA events (a cuda:<host>:<device> clock); "auto": on CUDA when probes are on
    device_timing: bool | str = "auto"
    # The step thread's intra-op threads when it runs behind a front end (AsyncEngine): "auto" one fewer
    # than the CPUs (a core's worth left to the front end and the client), not pinned; "pinned" the same
    # pinned to all CPUs but the first; an int n: n threads, not pinned; None: torch as it is.
    cpu_threads: int | str | None = "auto"
    # The CPU step's decoder stack as one inductor-compiled graph (engine/compiled_step.py): "on", "off",
    # or "auto" = $INFERLEDGER_COMPILE when set, else compiled for bf16 on a CPU with native bf16 (where it
    # was measured faster) and eager otherwise. Never on CUDA, which replays CUDA graphs instead.
    compile: str = "auto"
    # How attention reads the paged KV cache on the CPU: "paged" (the C++ kernel of engine/cpu_kernels.py,
    # built once per machine, reads the blocks in place), "gather" (a contiguous copy per layer and step,
    # then SDPA), or "auto" = $INFERLEDGER_ATTENTION when set, else paged when the kernel builds and
    # loads, gather otherwise. CUDA always gathers (its CUDA graphs capture the gather).
    attention: str = "auto"
    # How the CPU step's linears run: "kernels" (the C++ kernels of engine/cpu_kernels.py: in fp32 the gemv
    # kernel for steps of up to 16 token rows, reading each weight row from memory once, more rows going to
    # torch; in bf16, where the CPU has the AVX-512 BF16 dot product, the panel kernel for every step over
    # panel copies of the weights), "onednn" (bf16: oneDNN over its own reordered copies, where bf16 is
    # native), "torch" (F.linear throughout), or "auto": kernels when they build and load and take the
    # dtype, else onednn for native bf16, else torch. $INFERLEDGER_LINEAR when unset here. "gemv", the
    # old name of "kernels", means the same. CUDA always uses torch's.
    linear: str = "auto"

    DEFAULT_KV_BYTES = 256 * 2**20

    def __post_init__(self) -> None:
        _int("block_size", self.block_size, 1, 1024)
        if self.num_blocks is not None:
            _int("num_blocks", self.num_blocks, 1)
        if self.kv_cache_bytes is not None:
            _int("kv_cache_bytes", self.kv_cache_bytes, 1)
        _int("max_num_seqs", self.max_num_seqs, 1, 4096)
        _int("max_num_batched_tokens", self.max_num_batched_tokens, self.max_num_seqs,
             allowed=f"an integer >= max_num_seqs={self.max_num_seqs} (every running sequence decodes each step)")
        if self.max_model_len is not None:
            _int("max_model_len", self.max_model_len, 1)
        if self.long_prefill_token_threshold is not None:
            _int("long_prefill_token_threshold", self.long_prefill_token_threshold, 1,
                 allowed="None or an integer >= 1 (tokens per prefill chunk)")
            if not self.chunked_prefill:
                raise ValueError(f"long_prefill_token_threshold={self.long_prefill_token_threshold} caps prefill "
                                 "chunks, but chunked_prefill=False never splits a prefill; enable chunked_prefill "
                                 "or leave the threshold None")
        if self.admission not in ("reserve", "on_demand"):
            _fail("admission", self.admission, "'reserve' or 'on_demand'")
        if self.batching not in ("continuous", "fixed"):
            _fail("batching", self.batching, "'continuous' or 'fixed'")
        if isinstance(self.speculative, dict):
            self.speculative = SpeculativeConfig(**self.speculative)
        elif isinstance(self.speculative, str):
            self.speculative = SpeculativeConfig(method=self.speculative)
        if isinstance(self.graph_batch_sizes, list):
            self.graph_batch_sizes = tuple(self.graph_batch_sizes)
        if self.graph_batch_sizes is not None and self.graph_batch_sizes != "auto":
            if not isinstance(self.graph_batch_sizes, tuple) or not all(
                    isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 4096 for b in self.graph_batch_sizes):
                _fail("graph_batch_sizes", self.graph_batch_sizes, "'auto', None or a tuple of integers in [1, 4096]")
        if self.device_timing not in (True, False, "auto"):
            _fail("device_timing", self.device_timing, "True, False or 'auto'")
        if self.cpu_threads not in (None, "auto", "pinned"):
            _int("cpu_threads", self.cpu_threads, 1, 4096, allowed="'auto', 'pinned', None or an integer in [1, 4096]")
        if self.compile not in ("auto", "on", "off"):
            _fail("compile", self.compile, "'auto', 'on' or 'off'")
        if self.attention not in ("auto", "paged", "gather"):
            _fail("attention", self.attention, "'auto', 'paged' or 'gather'")
        self.linear = OLD_LINEAR_NAMES.get(self.linear, self.linear)
        if self.linear not in LINEAR_CHOICES:
            _fail("linear", self.linear, "'auto', 'kernels', 'onednn' or 'torch'")
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeConfig):
            _fail("speculative", self.speculative, "None, a SpeculativeConfig or a dict of its fields")

    def resolve_num_blocks(self, kv_bytes_per_token: int) -> int:
        """Blocks that fit the KV budget (num_blocks when given)."""
        if self.num_blocks is not None:
            return self.num_blocks
        budget = self.kv_cache_bytes or self.DEFAULT_KV_BYTES
        n = budget // (kv_bytes_per_token * self.block_size)
        if n < 1:
            raise ValueError(f"kv_cache_bytes={budget} holds no block of {self.block_size} tokens "
                             f"({kv_bytes_per_token} bytes each); raise kv_cache_bytes or set num_blocks")
        return int(n)

    def resolve_graph_batch_sizes(self, device_type: str) -> tuple[int, ...]:
        """The decode buckets on this device ("auto": powers of two covering max_num_seqs on CUDA)."""
        if self.graph_batch_sizes == "auto":
            if device_type != "cuda":
                return ()
            sizes, b = [], 1
            while b < self.max_num_seqs:
                sizes.append(b)
                b *= 2
            return tuple(sizes + [self.max_num_seqs])
        return tuple(sorted(set(self.graph_batch_sizes or ())))

    def _choice(self, field: str, env: str, allowed: tuple[str, ...], old_names: dict | None = None) -> tuple[str, str]:
        """(the setting, where it came from): the field, or when it is "auto" the environment variable
        that overrides it (checked against the same choices; an old name read as its new one)."""
        choice = getattr(self, field)
        if choice != "auto" or not os.environ.get(env):
            return choice, f"EngineConfig.{field}"
        value = (old_names or {}).get(os.environ[env], os.environ[env])
        if value not in allowed:
            raise ValueError(f"${env}={os.environ[env]!r}: use {', '.join(allowed[:-1])} or {allowed[-1]}")
        return value, f"${env}"

    def resolve_compile(self, device_type: str, dtype) -> tuple[bool, str]:
        """(compile the CPU step?, why)."""
        choice, source = self._choice("compile", "INFERLEDGER_COMPILE", ("auto", "on", "off"))
        if device_type != "cpu":
            return False, f"{device_type}: no compiled step (CUDA graphs instead)"
        if choice != "auto":
            return choice == "on", f"{choice} ({source})"
        import torch

        from .cpu_host import native_bf16

        if dtype == torch.bfloat16 and native_bf16()[0]:
            return True, ("auto: compiled (bf16 on a CPU that multiplies it natively, where the compiled stack "
                          "measured faster than eager at batch 1 and 16; docs/BENCHMARKS.md, Decode step account)")
        return False, ("auto: eager (the compiled step was measured faster only in bf16 on a CPU with native bf16; "
                       "docs/BENCHMARKS.md, Decode step account)")

    def resolve_attention(self, device_type: str, dtype) -> tuple[bool, str]:
        """(attend through the paged kernel?, why); on the CPU this builds or loads the kernel."""
        choice, source = self._choice("attention", "INFERLEDGER_ATTENTION", ("auto", "paged", "gather"))
        if device_type != "cpu":
            return False, f"{device_type}: gather (the CUDA graphs capture it; the paged kernel is CPU-only)"
        if choice == "gather":
            return False, f"gather ({source})"
        import torch

        if dtype not in (torch.float32, torch.bfloat16):
            return False, f"gather: the paged kernel takes float32 and bfloat16, not {dtype}"
        from .cpu_kernels import load

        ok, why = load()
        if not ok:
            return False, f"gather: {why}"
        return True, f"{choice} ({source}): {why}" if choice == "paged" else f"auto: {why}"

    def resolve_linear(self, device_type: str, dtype) -> tuple[str, str]:
        """(how the linears run: "onednn", "kernels" or "torch", why); on the CPU this builds or loads the
        kernels."""
        choice, source = self._choice("linear", "INFERLEDGER_LINEAR", LINEAR_CHOICES, OLD_LINEAR_NAMES)
        if device_type != "cpu":
            return "torch", f"{device_type}: torch's linear"
        if choice == "torch":
            return "torch", f"torch ({source})"
        import torch

        from .cpu_host import native_bf16
        from .cpu_kernels import GEMV_MAX_ROWS, load, panel_kernel

        head = "auto" if choice == "auto" else f"{choice} ({source})"  # who chose, as the reason starts
        if dtype == torch.bfloat16 and native_bf16()[0]:
            onednn = "oneDNN over prepacked weights (bf16 on a CPU that multiplies it natively)"
            if choice == "onednn":
                return "onednn", f"{head}: {onednn}"
            ok, why = load()
            if ok and panel_kernel():
                return "kernels", f"{head}: the panel kernel for bf16: {why}"
            return "onednn", f"{head}: {onednn}; no panel kernel here: {why if not ok else 'built without AVX-512 BF16'}"
        if choice == "onednn":
            return "torch", f"torch: oneDNN's prepacked linear is for bf16 on a CPU that multiplies it natively, not {dtype}"
        if dtype != torch.float32:
            return "torch", f"torch: the kernels take float32, or bf16 where the CPU multiplies it natively, not {dtype}"
        ok, why = load()
        if not ok:
            return "torch", f"torch: {why}"
        return "kernels", f"{head}: {why}" if choice != "auto" else \
            f"auto: the gemv kernel for up to {GEMV_MAX_ROWS} token rows: {why}"

    def to_dict(self) -> dict:
        d = asdict(self)
        return d
