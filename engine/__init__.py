"""inferledger.engine: the compact reference engine.

    from inferledger.engine import LLM, SamplingParams, EngineConfig
    LLM().generate(["Hello"], SamplingParams(max_tokens=8))

Names load lazily, so `import inferledger.engine` stays cheap (no torch until one is used).
"""
from __future__ import annotations

_EXPORTS = {
    "LLM": ".llm",
    "LLMEngine": ".llm_engine",
    "EngineStepError": ".llm_engine",
    "AsyncEngine": ".async_engine",
    "SamplingParams": ".params",
    "EngineConfig": ".params",
    "SpeculativeConfig": ".params",
    "RequestOutput": ".outputs",
    "RequestDelta": ".outputs",
    "CompletionOutput": ".outputs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
