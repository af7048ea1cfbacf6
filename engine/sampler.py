"""Choosing tokens from logits, and deciding when a sequence stops.

Greedy is argmax. Sampling applies temperature, then top-k, then top-p, and draws with the
sequence's own `torch.Generator`, so a seed reproduces an output whatever else shares the batch.
Before min_tokens outputs, EOS and stop_token_ids are masked out. Stop strings are matched on the
detokenized text and cut from it; the token ids stay as generated.
"""
from __future__ import annotations

import torch

from .sequence import Sequence


class Sampler:
    def __init__(self, eos_ids: list[int] | tuple[int, ...] = ()) -> None:
        self.eos_ids = list(eos_ids)

    def _banned(self, seq: Sequence, num_output: int) -> list[int]:
        p = seq.params
        if num_output >= p.min_tokens:
            return []
        return list(p.stop_token_ids) + ([] if p.ignore_eos else self.eos_ids)

    def probs(self, logits: torch.Tensor, seq: Sequence, num_output: int | None = None) -> torch.Tensor:
        """The distribution a sampled token is drawn from (fp32, on the CPU): temperature, top-k,
        top-p. num_output: outputs committed before this position (min_tokens masking)."""
        p = seq.params
        x = self._masked(logits, seq, num_output).float().cpu() / p.temperature
        if 0 < p.top_k < x.numel():
            kth = torch.topk(x, p.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        probs = torch.softmax(x, dim=-1)
        if p.top_p < 1.0:
            sorted_p, idx = torch.sort(probs, descending=True)
            before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of strictly better tokens
            drop = before >= p.top_p  # keeps the smallest set whose mass reaches top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
            probs = probs / probs.sum()
        return probs

    def _masked(self, logits: torch.Tensor, seq: Sequence, num_output: int | None) -> torch.Tensor:
        banned = self._banned(seq, seq.num_output_tokens if num_output is None else num_output)
        if banned:
            logits = logits.clone()
            logits[banned] = float("-inf")
        return logits

    def batchable_greedy(self, seq: Sequence) -> bool:
        """True when the next token of seq is a plain argmax (greedy, nothing masked): it may be
        taken in one batched argmax with the others (`batched_greedy`)."""
        return seq.params.greedy and not self._banned(seq, seq.num_output_tokens)

    def batched_greedy(self, scheduled, logits) -> dict[int, int]:
        """{id(item): token} for a step's scheduled items whose next token is a plain argmax of one
        logits row (no draft to verify, no fork, nothing masked): one batched argmax and one
        transfer for all of them instead of one call and one .item() per sequence."""
        items = [(item, lg) for item, lg in zip(scheduled, logits)
                 if lg is not None and lg.dim() == 1 and item.samples and not item.draft_token_ids
                 and not item.seq.pending_forks and self.batchable_greedy(item.seq)]
        if len(items) < 2:
            return {}
        tokens = torch.stack([lg for _, lg in items]).argmax(-1).tolist()
        return {id(item): t for (item, _), t in zip(items, tokens)}

    def greedy_token(self, logits: torch.Tensor, seq: Sequence, num_output: int | None = None) -> int:
        return int(torch.argmax(self._masked(logits, seq, num_output)).item())

    def sample(self, logits: torch.Tensor, seq: Sequence, num_output: int | None = None) -> int:
        if seq.params.greedy:
            return self.greedy_token(logits, seq, num_output)
        probs = self.probs(logits, seq, num_output)
        return int(torch.multinomial(probs, 1, generator=seq.get_generator()).item())


def check_stop(seq: Sequence, token_id: int, eos_ids) -> str | None:
    """Finish reason after token_id was appended (text already updated), or None to go on."""
    p = seq.params
    if seq.num_output_tokens < p.min_tokens:
        seq.checked_text_len = len(seq.output_text)  # stop strings count only from min_tokens on
    else:
        if token_id in p.stop_token_ids or (not p.ignore_eos and token_id in eos_ids):
            return "stop"
        if p.stop and _cut_at_stop(seq):
            return "stop"
    if seq.num_output_tokens >= p.max_tokens:
        return "length"
    return None


def _cut_at_stop(seq: Sequence) -> bool:
    """Truncate output_text before the first stop string that appears; True when one did. Only the
    tail that the newest token could have completed is searched."""
    text = seq.output_text
    longest = max(len(s) for s in seq.params.stop)
    from_pos = max(0, seq.checked_text_len - longest + 1)
    seq.checked_text_len = len(text)
    best, which = -1, None
    for s in seq.params.stop:
        i = text.find(s, from_pos)
        if i >= 0 and (best < 0 or i < best):
            best, which = i, s
    if best < 0:
        return False
    seq.output_text = text[:best]
    seq.stop_string = which
    return True


def stop_holdback(seq: Sequence) -> int:
    """Characters at the end of the text not to stream yet: they may start a stop string."""
    if not seq.params.stop or seq.is_finished:
        return 0
    text = seq.output_text
    for k in range(min(len(text), max(len(s) for s in seq.params.stop) - 1), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in seq.params.stop):
            return k
    return 0
