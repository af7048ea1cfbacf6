"""A request as the engine tracks it: its samples (sequences), cancellation and KV release state,
the checks that refuse a request the engine can never serve, and its final RequestOutput."""
from __future__ import annotations

from .block_manager import BlockManager
from .outputs import CompletionOutput, RequestOutput
from .params import EngineConfig, SamplingParams
from .sequence import Sequence


class Request:
    def __init__(self, seq: Sequence) -> None:
        self.seqs = [seq]  # sample 0 first; siblings join when the prompt is computed (n > 1)
        self.prompt_token_ids = seq.prompt_token_ids
        self.abort_requested = False
        self.finished = False
        self.forward_passes = 0  # engine steps that computed anything for it
        self.last_step = -1
        self.dropped_blocks: set[int] = set()  # references dropped since the last kv.release
        self.ever_released = False

    @property
    def seq(self) -> Sequence:
        return self.seqs[0]

    @property
    def holds_blocks(self) -> bool:
        return any(s.block_table for s in self.seqs)

    def to_output(self) -> RequestOutput:
        seqs = sorted(self.seqs, key=lambda s: s.sample_index)
        s0 = seqs[0]
        total = lambda attr: sum(getattr(s, attr) for s in seqs)  # noqa: E731
        return RequestOutput(
            s0.request_id, s0.attempt_id, self.prompt_token_ids, s0.output_token_ids, s0.output_text,
            s0.finish_reason,
            [CompletionOutput(s.sample_index, s.output_token_ids, s.output_text, s.finish_reason) for s in seqs],
            forward_passes=self.forward_passes, decode_steps=s0.decode_steps,
            computed_prompt_tokens=total("num_computed_prompt_tokens"), cached_tokens=total("num_cached_tokens"),
            preemptions=total("preemptions"), recomputed_tokens=total("recomputed_tokens"),
            spec_rounds=total("spec_rounds"), drafted_tokens=total("drafted_tokens"),
            accepted_tokens=total("accepted_tokens"))


def validate_request(prompt: list[int], params: SamplingParams, *, vocab_size: int, max_model_len: int,
                     config: EngineConfig, block_manager: BlockManager) -> None:
    """Raise ValueError, naming what is wrong, for a request the engine could never finish."""
    if not prompt:
        raise ValueError("prompt_token_ids is empty: the prompt needs at least one token")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt_token_ids has ids outside [0, {vocab_size}): {bad[:5]}")
    total = len(prompt) + params.max_tokens
    if total > max_model_len:
        raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                         f"max_model_len {max_model_len}; shorten the prompt or lower max_tokens")
    if params.n > config.max_num_seqs:
        raise ValueError(f"n={params.n} exceeds max_num_seqs={config.max_num_seqs}")
    bm = block_manager
    if config.admission == "reserve":
        need = Sequence(prompt, params, request_id="-").reserved_blocks(bm.block_size)
    else:
        need = bm.blocks_for(total)
    if need > bm.num_blocks:
        raise ValueError(f"the request needs {need} KV blocks but the cache has {bm.num_blocks}; "
                         "lower max_tokens or n, or give the engine more KV memory")
