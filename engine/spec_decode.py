"""Speculative decoding by prompt lookup: draft by copying, verify in one forward, accept exactly.

Drafting: the last n tokens of the sequence (n from ngram_max down to ngram_min) are looked up in
the earlier context (prompt and output); the tokens that followed their most recent earlier
occurrence, up to k, are the draft. No draft model, no extra KV.

Verification: the runner computes [last token] + draft in one chunk with logits for every position.
Row i is the target distribution p_i for the token after position i. The draft is deterministic
(q is one-hot), so exact speculative sampling reduces to: accept draft token x with probability
p_i(x); on the first rejection draw from p_i with x removed and renormalised (max(0, p - q)
normalised); if every draft token is accepted, draw a bonus token from the last row. Greedy requests
accept x iff it is the argmax. Either way the output has the distribution of plain decoding.
Rejected draft tokens wrote KV at positions the sequence no longer has: the engine resets
num_computed_tokens to the accepted length and trims the blocks beyond it.
"""
from __future__ import annotations

import torch

from .params import SpeculativeConfig
from .sampler import Sampler, draw
from .sequence import Sequence


def propose_ngram(token_ids: list[int], k: int, ngram_max: int, ngram_min: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest suffix n-gram."""
    n_tokens = len(token_ids)
    if k <= 0:
        return []
    for n in range(min(ngram_max, n_tokens - 1), ngram_min - 1, -1):
        pattern = token_ids[n_tokens - n:]
        first = pattern[0]
        # the occurrence must end before the suffix itself, leaving at least one token after it
        for i in range(n_tokens - n - 1, -1, -1):
            if token_ids[i] == first and token_ids[i:i + n] == pattern:
                return token_ids[i + n:i + n + k]
    return []


class PromptLookupProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    def __call__(self, seq: Sequence, k: int) -> list[int]:
        return propose_ngram(seq.token_ids, min(k, self.config.k), self.config.ngram_max,
                             self.config.ngram_min)


def verify(sampler: Sampler, seq: Sequence, logits: torch.Tensor, drafts: list[int]) -> tuple[list[int], int]:
    """Tokens to commit (accepted drafts, then one corrected or bonus token) and how many drafts
    were accepted. logits: [1 + len(drafts), vocab], row i after position start + i."""
    out: list[int] = []
    n0 = seq.num_output_tokens
    for i, x in enumerate(drafts):
        if seq.params.greedy:
            t = sampler.greedy_token(logits[i], seq, n0 + i)
            out.append(t)
            if t != x:
                return out, i
            continue
        p = sampler.probs(logits[i], seq, n0 + i)
        g = seq.get_generator()
        if torch.rand((), generator=g).item() < p[x].item():
            out.append(x)
            continue
        residual = p.clone()
        residual[x] = 0.0
        out.append(draw(residual, g))
        return out, i
    out.append(sampler.sample(logits[len(drafts)], seq, n0 + len(drafts)))
    return out, len(drafts)
