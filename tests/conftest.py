"""Shared fixtures. The model is loaded once per test session, never per test.

Two bundles: `bundle` is fp32 whatever the CPU (the Hugging Face parity path, which exactness tests
use); `resolved_bundle` takes the dtype this run resolves ($INFERLEDGER_DTYPE, else "auto": bf16 where
the CPU multiplies bf16 natively, else fp32). A test that runs the model at the resolved dtype is
marked `dtype` (tests using `resolved_bundle` are marked here); `make test` runs the marked tests once
more with the dtype forced to bfloat16 and to float32, so both paths run on every kind of CPU."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# sleeping (not spinning) OpenMP workers: on a busy 2-core host spinning made steps ~10x slower
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Hugging Face's tokenizer (an oracle) reads the same local GGUF; nothing may be downloaded
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# the compiled CPU step costs a compile per process: only the tests of it ask for it (compile="on")
os.environ.setdefault("INFERLEDGER_COMPILE", "off")


@pytest.fixture(scope="session")
def bundle():
    """The bundled SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to fp32 on the CPU): fp32 whatever
    this CPU's 'auto' dtype is, because it is the Hugging Face parity path."""
    import torch

    from inferledger.engine.loader import load_model

    return load_model(dtype=torch.float32)


@pytest.fixture(scope="session")
def resolved_bundle():
    """The bundled model at the dtype this run resolves, as `serve`, `capture` and `LLM()` load it."""
    from inferledger.engine.loader import load_model

    return load_model()


def pytest_configure(config):
    config.addinivalue_line("markers", "dtype: runs the model at the resolved dtype; `make test` reruns "
                                       "these with INFERLEDGER_DTYPE=bfloat16 and =float32")
    config.addinivalue_line("markers", "isa: the result depends on the CPU's instruction set (native or "
                                       "emulated bf16); `make test` reruns these with oneDNN and ATen held "
                                       "to AVX2, as on an AVX2-only CPU")


# a test that needs one of these (directly or through another fixture) loads the model, Hugging Face's
# tokenizer or a Ray cluster: `slow`, left out of `make test-fast` (as are, marked by hand, those that drive
# Chromium, run the command in processes of their own, or parse the bundled GGUF whole)
SLOW_FIXTURES = {"bundle", "resolved_bundle", "hf_tokenizer", "local_ray"}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        needs = set(getattr(item, "fixturenames", ()))
        if "resolved_bundle" in needs:
            item.add_marker(pytest.mark.dtype)
        if needs & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def hf_oracle() -> dict:
    """Hugging Face transformers' answers on the same GGUF in fp32, the model tests' correctness oracle:
    recorded by benchmarks/peers/hf_oracle.py from transformers alone (the prompts' ids, 32 greedy
    tokens each, generate()'s output, one prompt's logits), so no test process pays transformers'
    GGUF dequantisation to ask them again."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "samples" / "peers" / "hf_oracle" / "smollm2_q4_1.json"
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    from inferledger.engine.loader import default_model_path

    path = default_model_path()
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of two workers for a test module (the sharded reconstruct), shut down after it."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()
