"""The tokenizer a black-box capture counts its prompts with, from the workload's `[prompt] tokenizer`
(the workload itself takes a tokenizer object and loads none)."""
from __future__ import annotations

from pathlib import Path


def load_tokenizer(spec: str | None):
    """'bundled' / None: the bundled model's; else a GGUF file or a Hugging Face folder."""
    from inferledger.engine.tokenizer import Tokenizer

    if spec in (None, "", "bundled"):
        from inferledger.engine.loader import default_model_path

        path = default_model_path()
    else:
        path = Path(spec)
    if path.is_dir():
        return Tokenizer.from_hf_dir(path)
    import gguf

    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    return Tokenizer.from_gguf_metadata(meta)
