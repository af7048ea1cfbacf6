"""inferledger: trace-driven observability and diagnosis for LLM inference serving.

Public Python API:
    inferledger.open("runs/*")  -> a read-only ledger over one run or a glob of runs (`.sql(...)`)
    inferledger.LLM(...)        -> the reference engine for offline generation
    inferledger.study("schedule-book", "runs/book")  -> run a study into a study folder (docs/STUDIES.md)
"""
from __future__ import annotations

__version__ = "0.1.0"


def open(path_or_glob: str):  # noqa: A001 - the public name is `inferledger.open`
    from inferledger.ledger.query import open_ledger

    return open_ledger(path_or_glob)


def study(name: str, out, bundle=None, **options):
    """Run the study `name` into the new folder `out`; returns its result (tables, folder). A study on
    the real engine runs on `bundle` (a loaded model) when given, else loads the bundled model once."""
    from inferledger.studies.framework import run_study
    from inferledger.studies.registry import get_study

    return run_study(get_study(name), out, options, bundle=bundle)


def __getattr__(name: str):
    if name in ("LLM", "SamplingParams", "EngineConfig"):
        from inferledger import engine

        return getattr(engine, name)
    raise AttributeError(name)
