"""The tokenizer a black-box capture counts its prompts with, from the workload's `[prompt] tokenizer`
(the workload itself takes a tokenizer object and loads none)."""
from __future__ import annotations

from pathlib import Path


def load_tokenizer(spec: str | None):
    """'bundled' / None: the bundled model's; else a GGUF file or a Hugging Face folder, read through
    the engine loader's checked path (a bad file is a ModelLoadError naming it)."""
    from inferledger.engine.loader import load_tokenizer as checkpoint_tokenizer

    return checkpoint_tokenizer(None if spec in (None, "", "bundled") else Path(spec))
