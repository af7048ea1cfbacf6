"""From sampled tokens to what a client sees: commit tokens one by one (detokenizing and checking
the stop conditions after each, so a stop inside a speculative run cuts it there), and the text
delta to stream (never a stop string, nor a tail that may become one)."""
from __future__ import annotations

from .outputs import RequestDelta
from .sampler import check_stop, stop_holdback
from .sequence import Sequence


def commit_tokens(seq: Sequence, tokens: list[int], tokenizer, eos_ids) -> tuple[list[int], str | None]:
    """Append tokens until one finishes the sequence; returns (committed, finish reason or None)."""
    committed: list[int] = []
    for t in tokens:
        seq.append_token(t)
        committed.append(t)
        if tokenizer is not None:
            if seq.detok_state is None:
                from .tokenizer import DetokState

                seq.detok_state = DetokState(tokenizer)
            seq.output_text += seq.detok_state.add(t)
        reason = check_stop(seq, t, eos_ids)
        if reason:
            return committed, reason
    return committed, None


def flush_text(seq: Sequence, reason: str) -> None:
    """At the end, text held back for an incomplete character is final (unless cut or cancelled)."""
    if seq.detok_state is not None and reason != "cancelled" and seq.stop_string is None:
        seq.output_text += seq.detok_state.flush()


def make_delta(seq: Sequence, new_ids: list[int]) -> RequestDelta:
    end = len(seq.output_text) - stop_holdback(seq)
    text = seq.output_text[seq.sent_text_len:end] if end > seq.sent_text_len else ""
    seq.sent_text_len = max(seq.sent_text_len, end)
    return RequestDelta(seq.request_id, seq.attempt_id, seq.sample_index, list(new_ids), text,
                        seq.is_finished, seq.finish_reason, False, seq.num_output_tokens)
