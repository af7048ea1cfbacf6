"""Shared fixtures. The model is loaded once per test session, never per test."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def bundle():
    """The bundled SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to fp32 on the CPU)."""
    from inferledger.engine.loader import load_model

    return load_model()
