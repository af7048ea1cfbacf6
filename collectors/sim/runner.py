"""SimRunner: the engine's runner interface without a model; each step lasts what the step model says.

It satisfies what `LLMEngine` needs of a runner (`forward`, `copy_block`, `block_size`, `num_blocks`,
`config`), checks each chunk as the real runner does, and instead of computing it advances the
simulated clock by the step model's duration for the step's chunks. The logits it returns pick a
deterministic token (a function of the position, never an end-of-sequence id), so an output's length
comes from its max_tokens alone.
"""
from __future__ import annotations

import torch

from inferledger.engine.config import ModelConfig

from .clock import SimClock
from .step_time import SimStepRow, StepModel


def emitted_token(position: int, vocab: int, eos_ids) -> int:
    """The token the simulation emits after `position` (deterministic, never an id of `eos_ids`): a
    sequence's token at position p + 1 is emitted_token(p), whatever its prompt."""
    t = 1 + (position * 7919) % (vocab - 1)
    while t in eos_ids:
        t = 1 + t % (vocab - 1)
    return t


class SimRunner:
    def __init__(self, config: ModelConfig, *, num_blocks: int, block_size: int, clock: SimClock,
                 step_model: StepModel, kv_dtype: torch.dtype = torch.bfloat16) -> None:
        self.config, self.num_blocks, self.block_size = config, num_blocks, block_size
        self.clock, self.step_model = clock, step_model
        self.dtype = kv_dtype  # the declared KV dtype (the engine's manifest records it)
        self.last_step = {"mode": "simulated", "padded_batch": 0}
        self.steps = 0
        self.copies = 0
        self._eos = set(config.eos_ids or [])

    def copy_block(self, src: int, dst: int) -> None:
        self.copies += 1  # no KV to copy; the engine's copy-on-write events stand as they are

    def _check(self, c) -> None:
        end = c.start_pos + len(c.token_ids)
        if not c.token_ids or c.start_pos < 0:
            raise ValueError(f"SeqChunk needs token_ids and start_pos >= 0 (got {len(c.token_ids)}, {c.start_pos})")
        if end > self.config.max_position:
            raise ValueError(f"positions up to {end} exceed the declared max_position {self.config.max_position}")
        if len(c.block_table) * self.block_size < end:
            raise ValueError(f"block_table of {len(c.block_table)} blocks cannot hold positions [0, {end})")
        if any(not 0 <= b < self.num_blocks for b in c.block_table):
            raise ValueError(f"block_table {c.block_table} has ids outside [0, {self.num_blocks})")

    def token_at(self, position: int) -> int:
        return emitted_token(position, self.config.shape.vocab, self._eos)

    def forward(self, chunks) -> list[torch.Tensor | None]:
        for c in chunks:
            self._check(c)
        self.clock.advance(self.step_model.step_ns([SimStepRow(c.start_pos, len(c.token_ids)) for c in chunks]))
        self.steps += 1
        positions = []  # per chunk, the positions whose logits it wants
        for c in chunks:
            end = c.start_pos + len(c.token_ids)
            positions.append({"last": [end - 1], "all": list(range(c.start_pos, end)), "none": []}[c.logits])
        n = sum(len(p) for p in positions)
        logits = torch.zeros((n, self.config.shape.vocab)) if n else None
        out, i = [], 0
        for c, pos in zip(chunks, positions):
            for j, p in enumerate(pos):
                logits[i + j, self.token_at(p)] = 1.0
            out.append(None if not pos else logits[i] if c.logits == "last" else logits[i:i + len(pos)])
            i += len(pos)
        return out
