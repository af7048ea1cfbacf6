"""Choosing tokens from logits, and deciding when a sequence stops.

Greedy is argmax, one per step: `prepare` takes the argmax of every sequence's logits row at once
(the rows of one [batch, vocab] tensor) with one transfer to the host, and `greedy_token` uses it for
those rows; a per-row argmax + `.item()` is a launch and a device sync per sequence. Where the engine's
CPU kernels are loaded, fp32 rows on the CPU take engine/csrc/sampling.cpp's `argmax_rows`, which
chooses as torch.argmax does (the first of equal maxima, the first NaN) in 0.07 ms for 16 rows of
49,152 against torch's 0.65 ms on one core. Sampling
applies temperature, then top-k, then top-p, and draws with the sequence's own
`torch.Generator`, so a seed reproduces an output whatever else shares the batch. A draw
(`draw`) is one uniform number from that generator against the cumulative distribution (inverse
transform): torch.multinomial draws an exponential variate per vocabulary entry, measured at 0.87 ms
a row over a 49,152-token vocabulary on one core, 14 ms of a 16-sequence step. Rows that sample take
no part in the step's argmax. Where the engine's CPU kernels are loaded, `prepare_draws` draws every
plain sampled row of a step (temperature only: no top-k, no top-p, nothing masked) in one call of
engine/csrc/sampling.cpp, each with a uniform number from its own generator as `draw` takes one: the
softmax, float64 cumulative sum and search per row in torch cost about 0.13 ms a row.
Before min_tokens outputs, EOS and stop_token_ids are masked out. Stop strings are matched on the
detokenized text and cut from it; the token ids stay as generated.
"""
from __future__ import annotations

import torch

from . import cpu_kernels
from .sequence import Sequence


# how `Sampler.sample` chose a token: greedy from the step's batch argmax (`prepare`: the CPU kernel's, or torch's
# where the kernels are not loaded or the rows are not fp32 on the CPU) or by its own argmax (a lone or masked row,
# a draft position), sampled by the CPU kernel's draw (`prepare_draws`) or by `draw` in torch (top-k, top-p, masked
# rows, no kernel)
TOKEN_PATHS = ("argmax_kernel", "argmax_batch", "argmax_row", "kernel_draw", "torch_draw")


class Sampler:
    def __init__(self, eos_ids: list[int] | tuple[int, ...] = ()) -> None:
        self.eos_ids = list(eos_ids)
        self._argmax: dict[int, tuple[torch.Tensor, int]] = {}  # id(row) -> (row, its argmax)
        self._drawn: dict[int, tuple[torch.Tensor, int]] = {}  # id(seq) -> (its row, its token)
        # the tokens `sample` chose, by how (TOKEN_PATHS): the engine's manifest says whether the kernel drew any
        self.tokens = dict.fromkeys(TOKEN_PATHS, 0)
        self._argmax_path = "argmax_batch"  # how prepare() took the step's argmax (a TOKEN_PATHS name)

    def manifest(self) -> dict:
        """How this sampler chose its tokens so far: whether the engine's CPU kernels (its batch argmax and
        its draw among them) are loaded in this process, and the tokens per path (TOKEN_PATHS)."""
        return {"kernel": "loaded" if cpu_kernels.loaded() else "not loaded", "tokens": dict(self.tokens)}

    def prepare(self, logits: list) -> None:
        """The argmax of every 1-D logits row of a step, in one op and one host transfer; rows that
        lie back to back in one storage (as the runner returns them) are read in place, others stacked."""
        rows = [x for x in logits if x is not None and x.dim() == 1]
        self._argmax = {}
        if len(rows) < 2:
            return
        batch = _as_batch(rows)
        if cpu_kernels.loaded() and batch.dtype == torch.float32 and batch.device.type == "cpu":
            tokens, self._argmax_path = cpu_kernels.argmax_rows(batch), "argmax_kernel"  # torch.argmax's choice
        else:
            tokens, self._argmax_path = torch.argmax(batch, dim=-1), "argmax_batch"
        self._argmax = {id(r): (r, t) for r, t in zip(rows, tokens.tolist())}

    def prepare_draws(self, logits: list, seqs: list[Sequence]) -> None:
        """The tokens of a step's plain sampled rows (1-D fp32 CPU rows sampled at their temperature alone:
        no top-k, no top-p, nothing masked) in one call of the CPU kernel, when the engine's kernels are
        loaded; each row's uniform number comes from its sequence's generator, as `draw` takes it."""
        self._drawn = {}
        if not cpu_kernels.loaded():
            return
        picked = [(r, s) for r, s in zip(logits, seqs) if r is not None and self._plain(r, s)]
        if not picked:
            return
        rows = [r for r, _ in picked]
        inv_t = torch.tensor([1.0 / s.params.temperature for _, s in picked], dtype=torch.float32)
        u = torch.tensor([float(torch.rand((), generator=s.get_generator(), dtype=torch.float64)) for _, s in picked],
                         dtype=torch.float64)
        tokens = cpu_kernels.sample_rows(_as_batch(rows), inv_t, u).tolist()
        self._drawn = {id(s): (r, t) for (r, s), t in zip(picked, tokens)}

    def _plain(self, row: torch.Tensor, seq: Sequence) -> bool:
        p = seq.params
        return (row.dim() == 1 and row.dtype == torch.float32 and row.device.type == "cpu" and not p.greedy
                and not 0 < p.top_k < row.shape[0] and p.top_p >= 1.0 and not self._banned(seq, seq.num_output_tokens))

    def _banned(self, seq: Sequence, num_output: int) -> list[int]:
        p = seq.params
        if num_output >= p.min_tokens:
            return []
        return list(p.stop_token_ids) + ([] if p.ignore_eos else self.eos_ids)

    def probs(self, logits: torch.Tensor, seq: Sequence, num_output: int | None = None) -> torch.Tensor:
        """The distribution a sampled token is drawn from (fp32, on the CPU): temperature, top-k,
        top-p. num_output: outputs committed before this position (min_tokens masking)."""
        p = seq.params
        x = self._masked(logits, seq, num_output).float().cpu()
        if p.temperature != 1.0:  # 1.0, what clients send when they send none: no pass over the vocabulary
            x = x / p.temperature
        if 0 < p.top_k < x.numel():
            kth = torch.topk(x, p.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        probs = torch.softmax(x, dim=-1)
        if p.top_p < 1.0:
            sorted_p, idx = _descending(probs, p.top_p)
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

    def greedy_token(self, logits: torch.Tensor, seq: Sequence, num_output: int | None = None) -> int:
        if not self._banned(seq, seq.num_output_tokens if num_output is None else num_output):
            row, token = self._argmax.get(id(logits), (None, 0))
            if row is logits:  # the very row prepare() saw (an id alone could be a new tensor's)
                self.tokens[self._argmax_path] += 1
                return token
        self.tokens["argmax_row"] += 1
        return int(torch.argmax(self._masked(logits, seq, num_output)).item())

    def sample(self, logits: torch.Tensor, seq: Sequence, num_output: int | None = None) -> int:
        if seq.params.greedy:
            return self.greedy_token(logits, seq, num_output)
        if num_output is None:
            row, token = self._drawn.pop(id(seq), (None, 0))
            if row is logits:  # the very row prepare_draws() drew from for this sequence
                if token < 0:
                    raise ValueError("cannot draw a token from weights summing to nan (NaN, negative or no positive "
                                     "weight)")
                self.tokens["kernel_draw"] += 1
                return token
        self.tokens["torch_draw"] += 1
        return draw(self.probs(logits, seq, num_output), seq.get_generator())


def _as_batch(rows: list[torch.Tensor]) -> torch.Tensor:
    """1-D rows of one length as [len(rows), V]: read in place when they lie back to back in one storage
    (as the runner returns them), else stacked."""
    first, V = rows[0], rows[0].shape[0]
    ptr, off = first.untyped_storage().data_ptr(), first.storage_offset()
    in_place = all(r.shape[0] == V and r.stride(0) == 1 and r.storage_offset() == off + i * V
                   and r.untyped_storage().data_ptr() == ptr for i, r in enumerate(rows))
    return first.as_strided((len(rows), V), (V, 1)) if in_place else torch.stack(rows)


TOP_P_CANDIDATES = 1024  # top-p looks at the largest weights first; a full sort only when they hold too little


def _descending(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Enough of probs in descending order for top-p: the largest TOP_P_CANDIDATES when they hold
    at least top_p of the mass (every later token is then dropped anyway), else all of them. A full
    sort of a 49,152-token vocabulary measured 3.7 ms on one core, its top 1,024 0.5 ms."""
    if probs.numel() > TOP_P_CANDIDATES:
        vals, idx = torch.topk(probs, TOP_P_CANDIDATES)
        if vals.sum().item() >= top_p:
            return vals, idx
    return torch.sort(probs, descending=True)


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a 1-D distribution (unnormalised weights >= 0, some > 0): the first index whose
    cumulative weight exceeds u * total for one uniform u in [0, 1) from `generator`. A zero-weight
    token is never drawn: its cumulative weight equals its predecessor's, which already exceeded.
    Weights with a NaN, a negative or no positive total are refused (ValueError), as multinomial did."""
    cdf = torch.cumsum(probs.to(torch.float64), dim=0)
    total = float(cdf[-1])
    if not (0.0 < total < float("inf")) or float(probs.min()) < 0:  # a NaN makes the total NaN
        raise ValueError(f"cannot draw a token from weights summing to {total} (NaN, negative or no positive weight)")
    u = torch.rand((), generator=generator, dtype=torch.float64)
    i = int(torch.searchsorted(cdf, u * total, right=True).item())
    if i >= cdf.numel():  # u * total rounded up to the total: the last token with weight
        i = int(torch.nonzero(probs).max().item())
    return i


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
