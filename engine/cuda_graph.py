"""CUDA graphs of the padded decode step: one per (batch, table width) bucket, and their capture.

A `DecodeGraph` owns the static input buffers of one bucket (token ids, positions, write slots,
block tables, context lengths), its own K/V gather buffers at fixed addresses and, on CUDA, the
graph captured over them. Padding rows point at the runner's scratch block, which no block table
names. On the CPU `run` executes the same padded step eagerly, which is how tests check the padding
without a GPU.

A graph holds no reference to the runner (the step to capture or run is passed in), so a runner
dropped without `close()` is freed by reference counting, not left with its KV cache for the cyclic
collector to find during some later capture. `GraphCapture` is the runner's one side stream and one
memory pool: warm-up and capture both run on that stream, under `torch.cuda.device` of the runner's
device (not whichever device is current), and every bucket shares the pool because graphs replay one
at a time and their outputs are cloned at once.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

WARMUP_STEPS = 2  # eager runs on the capture stream before capture: lazy inits and autotuning happen outside the graph


def device_guard(device: torch.device):
    """`torch.cuda.device(device)` on CUDA, nothing elsewhere: every stream, event and capture of
    a runner on cuda:1 must be made on cuda:1 whatever the current device is."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def table_widths(max_context: int, block_size: int) -> list[int]:
    """The power-of-two block-table widths a bucket is keyed by, up to the first that holds
    `max_context` tokens."""
    widths = [1]
    while widths[-1] * block_size < max_context:
        widths.append(widths[-1] * 2)
    return widths


class GraphCapture:
    """The side stream and memory pool every bucket of one runner is captured with."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = None
        self.pool = None
        self.captured = 0  # graphs captured so far (each costs WARMUP_STEPS + 1 steps of work)

    def capture(self, graph: "DecodeGraph", step: Callable[["DecodeGraph"], torch.Tensor]) -> None:
        with device_guard(self.device):
            if self.stream is None:
                self.stream, self.pool = torch.cuda.Stream(), torch.cuda.graph_pool_handle()
            self.stream.wait_stream(torch.cuda.current_stream())  # the buffers' fills are on the current stream
            with torch.cuda.stream(self.stream):  # warm-up writes only the scratch block
                for _ in range(WARMUP_STEPS):
                    step(graph)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool, stream=self.stream):  # the same stream as the warm-up
                graph.logits = step(graph)
            torch.cuda.current_stream().wait_stream(self.stream)
            graph.graph = g
        self.captured += 1

    def close(self) -> None:
        self.stream = self.pool = None


class DecodeGraph:
    """Static buffers of one decode bucket (batch B, table width W) and, once captured, its graph."""

    def __init__(self, batch: int, width: int, *, scratch_block: int, block_size: int, n_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.batch, self.width = batch, width
        self.scratch_slot = scratch_block * block_size
        self.scratch_block = scratch_block
        long = dict(dtype=torch.long, device=device)
        with device_guard(device):
            self.ids, self.pos = torch.zeros(batch, **long), torch.zeros(batch, **long)
            self.slots = torch.full((batch,), self.scratch_slot, **long)
            self.table = torch.full((batch, width), scratch_block, **long)
            self.ctx_lens = torch.ones(batch, **long)
            n_rows = batch * width * n_kv_heads  # the graph's own gather buffers, at fixed addresses
            self.bufs = tuple(torch.empty(n_rows, block_size * head_dim, dtype=dtype, device=device) for _ in range(2))
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def load(self, ids, pos, slots, table, ctx_lens) -> None:
        """Copy a batch of B <= batch rows into the static buffers; the rest become padding rows."""
        B, W = table.shape
        for buf, val, pad in ((self.ids, ids, 0), (self.pos, pos, 0), (self.slots, slots, self.scratch_slot),
                              (self.ctx_lens, ctx_lens, 1)):
            buf[B:].fill_(pad)
            buf[:B].copy_(val, non_blocking=True)
        self.table.fill_(self.scratch_block)
        self.table[:B, :W].copy_(table, non_blocking=True)

    def run(self, step: Callable[["DecodeGraph"], torch.Tensor], ids, pos, slots, table, ctx_lens) -> torch.Tensor:
        """Logits [batch, vocab] of the loaded batch: the graph replayed, or `step` run eagerly when
        there is no graph (the CPU)."""
        self.load(ids, pos, slots, table, ctx_lens)
        if self.graph is None:
            return step(self)
        self.graph.replay()
        return self.logits.clone()

    def close(self) -> None:
        if self.graph is not None:
            self.graph.reset()
        self.graph = self.logits = None
        self.bufs = ()
