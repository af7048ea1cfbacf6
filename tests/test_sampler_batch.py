"""The step's batched argmax (Sampler.batched_greedy): which rows it takes, and their tokens."""
from __future__ import annotations

import torch

from inferledger.engine.params import SamplingParams
from inferledger.engine.sampler import Sampler
from inferledger.engine.scheduler import ScheduledSeq
from inferledger.engine.sequence import Sequence

EOS = 2


def _item(params: SamplingParams, rid: str) -> ScheduledSeq:
    seq = Sequence([5, 6, 7], params, request_id=rid)
    return ScheduledSeq(seq, "prefill", 0, 3)  # reaches the last prompt token: it samples


def test_batched_greedy_takes_plain_argmax_rows_only():
    rows = [torch.tensor([0.0, 1.0, 3.0, 2.0]), torch.tensor([4.0, 1.0, 0.5, 0.0]),
            torch.tensor([0.0, 0.0, 9.0, 1.0]), torch.tensor([0.0, 5.0, 0.0, 1.0])]
    items = [_item(SamplingParams(max_tokens=4), "a"), _item(SamplingParams(max_tokens=4), "b"),
             _item(SamplingParams(max_tokens=4, min_tokens=2), "masked"),   # EOS banned: its own path
             _item(SamplingParams(max_tokens=4, temperature=0.7), "sampled")]
    picks = Sampler([EOS]).batched_greedy(items, rows)
    assert picks == {id(items[0]): 2, id(items[1]): 0}
    # the masked row's own path does not pick EOS (index 2) though it is the row's maximum
    assert Sampler([EOS]).greedy_token(rows[2], items[2].seq) == 3


def test_a_single_row_is_left_to_the_per_sequence_path():
    item = _item(SamplingParams(max_tokens=4), "a")
    assert Sampler([EOS]).batched_greedy([item], [torch.tensor([0.0, 1.0])]) == {}
    assert Sampler([EOS]).batched_greedy([item, item], [None, torch.tensor([0.0, 1.0])]) == {}
