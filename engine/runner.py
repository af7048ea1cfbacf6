"""ModelRunner: one engine step over a paged KV cache; the orchestration around the kernels.

The runner owns the per-layer K and V caches ([layers, blocks, n_kv_heads, block_size, head_dim],
the layout engine/attention.py defines), checks each chunk, flattens all chunks' tokens into one
batch [T] for the embedding, projection and MLP matmuls, and picks the step's attention kernel:
`PagedAttention` for a step of arbitrary chunks, `DecodeAttention` for a batch of single-token
decodes. On the CPU with the paged kernel (`paged`), decode rows stay in order and are read in
place; otherwise the runner reorders them into width groups whose gathers go into one workspace
kept across steps. Optional: pure decode batches padded and replayed from CUDA graphs captured per
(batch, table-width) bucket (engine/cuda_graph.py); `close()` frees graphs and caches at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import cpu_kernels
from .attention import BatchedDecode, DecodeAttention, PagedAttention, decode_groups
from .compiled_step import CompiledStep
from .config import ModelConfig
from .cpu_linear import KINDS
from .cuda_graph import DecodeGraph, GraphCapture, device_guard, table_widths


@dataclass
class SeqChunk:
    token_ids: list[int]     # the new tokens to compute this step for one sequence
    start_pos: int           # tokens of this sequence already in the KV cache (= position of token_ids[0])
    block_table: list[int]   # physical block ids covering positions [0, start_pos + len(token_ids))
    logits: str = "last"     # "last": logits of the last token; "all": of every token; "none"


@dataclass(frozen=True)
class RunnerOptions:
    """How the runner's steps run, as EngineConfig resolves them (engine/params.py).

    graph_batch_sizes: pad pure decode batches up to these sizes and (on CUDA) replay them from
    captured CUDA graphs; None runs every step eagerly. compile (CPU): run the steps
    engine/compiled_step.py compiles through it, compiled at construction. paged (CPU, the kernel of
    engine/cpu_kernels.py loaded): attention reads the paged cache in place rather than gathering it
    (engine/attention.py). linear: how the linears run, "onednn", "kernels" or "torch"
    (engine/cpu_linear.py; None, or "onednn" without the reordered weights: oneDNN where bf16 is
    native, else torch's)."""
    graph_batch_sizes: tuple[int, ...] | None = None
    compile: bool = False
    paged: bool = False
    linear: str | None = None


class ModelRunner:
    def __init__(self, model, config: ModelConfig, *, num_blocks: int, block_size: int = 16,
                 device="cpu", dtype=None, options: RunnerOptions = RunnerOptions()):
        """A paged KV cache of `num_blocks` blocks of `block_size` tokens on `device`, and the steps
        run over it the `options` way."""
        linear = options.linear
        self.model, self.config = model, config
        self.num_blocks, self.block_size = num_blocks, block_size
        self.device = torch.device(device)
        self.dtype = dtype or next(model.parameters()).dtype
        self.graph_batch_sizes = tuple(sorted(options.graph_batch_sizes or ()))
        if linear not in (None, *KINDS):
            raise ValueError(f"linear={linear!r}: use one of {', '.join(KINDS)} (or None)")
        if linear == "kernels" and self.device.type != "cpu":
            raise ValueError(f"linear='kernels' is the CPU's; this runner is on {self.device}")
        if linear == "kernels" and not cpu_kernels.load()[0]:
            raise RuntimeError(f"linear='kernels' needs the CPU kernels: {cpu_kernels.load()[1]}")
        model.fuse(linear or "onednn")
        self.linear = ("onednn" if model.prepared("onednn") else "torch") if linear in (None, "onednn") else linear
        self.paged = bool(options.paged) and self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16)
        # padded decode rows write into one extra scratch block no block table may name
        shape = (config.shape.layers, num_blocks + bool(self.graph_batch_sizes or options.compile), config.shape.n_kv_heads,
                 block_size, config.shape.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._workspace = torch.empty(0, dtype=self.dtype, device=self.device)  # eager decode gathers
        self._graphs: dict[tuple[int, int], DecodeGraph] = {}
        self._capture = GraphCapture(self.device)
        self.last_step = {"mode": "eager", "padded_batch": 0}  # for step events: graph, compiled or eager
        self.compiled = CompiledStep(self) if options.compile else None  # compiled by its warm_up() or first step

    def kv_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    @torch.inference_mode()
    def copy_block(self, src: int, dst: int) -> None:
        self.k_cache[:, dst].copy_(self.k_cache[:, src])
        self.v_cache[:, dst].copy_(self.v_cache[:, src])

    def _check(self, c: SeqChunk) -> None:
        end = c.start_pos + len(c.token_ids)
        if not c.token_ids or c.start_pos < 0:
            raise ValueError(f"SeqChunk needs token_ids and start_pos >= 0 (got {len(c.token_ids)}, {c.start_pos})")
        if c.logits not in ("last", "all", "none"):
            raise ValueError(f"SeqChunk.logits must be 'last', 'all' or 'none', not {c.logits!r}")
        if end > self.config.max_position:
            raise ValueError(f"positions up to {end} exceed the model's max_position {self.config.max_position}")
        if len(c.block_table) * self.block_size < end:
            raise ValueError(f"block_table of {len(c.block_table)} blocks cannot hold positions [0, {end})")
        if any(not 0 <= b < self.num_blocks for b in c.block_table):
            raise ValueError(f"block_table {c.block_table} has ids outside [0, {self.num_blocks})")

    @torch.inference_mode()
    def forward(self, chunks: list[SeqChunk]) -> list[torch.Tensor | None]:
        """One engine step; per chunk fp32 logits [vocab] ("last"), [n, vocab] ("all") or None."""
        if not chunks:
            return []
        if self.k_cache is None:
            raise RuntimeError("ModelRunner.forward after close()")
        for c in chunks:
            self._check(c)
        bs, dev = self.block_size, self.device
        n_blocks = [-(-(c.start_pos + len(c.token_ids)) // bs) for c in chunks]
        if all(len(c.token_ids) == 1 for c in chunks):
            return self._decode(chunks, n_blocks)
        ids, positions, slots, seqs, rows = [], [], [], [], []
        for c, n in zip(chunks, n_blocks):
            q0, pos = len(ids), range(c.start_pos, c.start_pos + len(c.token_ids))
            ids += c.token_ids
            positions += pos
            slots += [c.block_table[p // bs] * bs + p % bs for p in pos]
            seqs.append((q0, len(c.token_ids), c.start_pos, c.block_table[:n]))
            rows += {"last": [len(ids) - 1], "all": list(range(q0, len(ids))), "none": []}[c.logits]
        self.last_step = {"mode": "eager", "padded_batch": 0}
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=dev)
        attn = PagedAttention(self.k_cache, self.v_cache, as_long(slots), seqs, self.paged)
        hidden = self._hidden(as_long(ids), as_long(positions), attn)
        logits = self.model.compute_logits(hidden[torch.tensor(rows, dtype=torch.long, device=dev)], self.linear) if rows else None
        out, i = [], 0
        for c in chunks:
            n = {"last": 1, "all": len(c.token_ids), "none": 0}[c.logits]
            out.append(None if n == 0 else logits[i] if c.logits == "last" else logits[i:i + n])
            i += n
        return out

    def _decode(self, chunks: list[SeqChunk], n_blocks: list[int]) -> list[torch.Tensor | None]:
        bs, B, dev = self.block_size, len(chunks), self.device
        bucket = next((b for b in self.graph_batch_sizes if b >= B), None)
        if bucket is None:
            self.last_step = {"mode": "eager", "padded_batch": B}
            logits = self._decode_eager(chunks, n_blocks)
        else:
            width = max(n_blocks)
            table = torch.tensor([c.block_table[:n] + [0] * (width - n) for c, n in zip(chunks, n_blocks)])
            pos = torch.tensor([c.start_pos for c in chunks])
            ids = torch.tensor([c.token_ids[0] for c in chunks])
            slots = torch.tensor([c.block_table[c.start_pos // bs] * bs + c.start_pos % bs for c in chunks])
            key = (bucket, 1 << (width - 1).bit_length())  # table widths bucketed to powers of two
            # a step that captures is labelled so: it also ran the capture's warm-up steps
            mode = "graph" if self.device.type == "cuda" else "padded"
            if key not in self._graphs:
                mode = self._new_graph(*key) or mode
            self.last_step = {"mode": mode, "padded_batch": bucket}
            with device_guard(dev):
                logits = self._graphs[key].run(self._decode_step, ids, pos, slots, table, pos + 1)[:B]
        return [None if c.logits == "none" else logits[i:i + 1] if c.logits == "all" else logits[i]
                for i, c in enumerate(chunks)]

    def _decode_eager(self, chunks: list[SeqChunk], n_blocks: list[int]) -> torch.Tensor:
        """Rows reordered so that each width group is consecutive; logits back in chunk order."""
        bs, dev = self.block_size, self.device
        tables = [c.block_table[:n] for c, n in zip(chunks, n_blocks)]
        ctx = [c.start_pos + 1 for c in chunks]
        bufs = (None, None)
        if not self.paged:
            bufs = self.workspace(max(len(t) for t in tables) * len(chunks) * self.config.shape.n_kv_heads)
        groups = decode_groups(tables, ctx, self.k_cache.shape[1:], self.dtype, dev, bufs, self.paged)
        order = [r for rows, _ in groups for r in rows]
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=dev)
        slots = as_long([chunks[r].block_table[chunks[r].start_pos // bs] * bs + chunks[r].start_pos % bs for r in order])
        attn = DecodeAttention(self.k_cache, self.v_cache, slots, [(len(rows), g) for rows, g in groups])
        hidden = self._hidden(as_long([chunks[r].token_ids[0] for r in order]), as_long([ctx[r] - 1 for r in order]), attn)
        logits = self.model.compute_logits(hidden, self.linear)
        if order == sorted(order):
            return logits
        return logits.index_select(0, as_long(sorted(range(len(order)), key=order.__getitem__)))

    def _hidden(self, ids: torch.Tensor, positions: torch.Tensor, attn) -> torch.Tensor:
        """The decoder stack over a step's tokens: compiled when this runner compiles (the step's
        mode then says so), else eager."""
        if self.compiled is not None:
            hidden = self.compiled.hidden(ids, positions, attn)
            if hidden is not None:
                self.last_step["mode"] = "compiling" if self.compiled.compiled_now else "compiled"
                return hidden
        return self.model(ids, positions, attn, self.linear)

    def workspace(self, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V gather buffers of n_rows (block, head) rows, grown as needed and kept."""
        row = self.block_size * self.config.shape.head_dim
        if self._workspace.numel() < 2 * n_rows * row:
            self._workspace = torch.empty(2 * n_rows * row, dtype=self.dtype, device=self.device)
        ws = self._workspace[:2 * n_rows * row].view(2, n_rows, row)
        return ws[0], ws[1]

    def _decode_step(self, g: DecodeGraph):
        """The padded decode step of one bucket over its static buffers, as CUDA graphs capture it."""
        group = BatchedDecode(self.k_cache.shape[1:], g.table, g.ctx_lens, self.dtype, *g.bufs, paged=self.paged)
        attn = DecodeAttention(self.k_cache, self.v_cache, g.slots, [(g.ids.shape[0], group)])
        return self.model.compute_logits(self.model(g.ids, g.pos, attn, self.linear), self.linear)

    def _new_graph(self, batch: int, width: int) -> str | None:
        """Static buffers for a bucket and, on CUDA, its graph; -> "graph_capture" when it captured."""
        c = self.config
        g = self._graphs[(batch, width)] = DecodeGraph(
            batch, width, scratch_block=self.num_blocks, block_size=self.block_size, n_kv_heads=c.shape.n_kv_heads,
            head_dim=c.shape.head_dim, dtype=self.dtype, device=self.device)
        if self.device.type != "cuda":
            return None
        self._capture.capture(g, self._decode_step)
        return "graph_capture"

    @torch.inference_mode()
    def capture_graphs(self, max_context: int) -> int:
        """Build every bucket (each batch size, each power-of-two table width up to `max_context`
        tokens) now, before a measured run: -> how many were new. On CUDA each is a graph capture."""
        widths = table_widths(max_context, self.block_size)
        new = [(b, w) for b in self.graph_batch_sizes for w in widths if (b, w) not in self._graphs]
        for key in new:
            self._new_graph(*key)
        return len(new)

    def close(self) -> None:
        """Free the graphs, their pool and the KV cache now rather than when the collector runs
        (idempotent); the runner cannot step afterwards."""
        for g in self._graphs.values():
            g.close()
        self._graphs.clear()
        self._capture.close()
        self.k_cache = self.v_cache = self._workspace = None
