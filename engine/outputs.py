"""What the engine hands back: per-step deltas while a request runs, and whole outputs at the end."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestDelta:
    """What one step added to one sample of one request."""

    request_id: str
    attempt_id: str
    index: int  # sample index (n > 1)
    new_token_ids: list[int]
    text: str  # newly final text (stop strings never appear; a possible stop prefix is held back)
    finished: bool = False  # this sample is done
    finish_reason: str | None = None  # stop | length | cancelled | error
    request_finished: bool = False  # every sample of the request is done
    num_output_tokens: int = 0
    output: "RequestOutput | None" = None  # set on the delta that finishes the request


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None


@dataclass
class RequestOutput:
    """A finished request. token_ids/text/finish_reason are sample 0's; `outputs` has all n."""

    request_id: str
    attempt_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    outputs: list[CompletionOutput] = field(default_factory=list)
    forward_passes: int = 0  # engine steps that computed anything for the request
    decode_steps: int = 0  # steps that committed output tokens (sample 0)
    computed_prompt_tokens: int = 0  # tokens prefilled (recompute included), all samples
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    preemptions: int = 0
    recomputed_tokens: int = 0
    spec_rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
