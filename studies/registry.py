"""The studies `inferledger study NAME` knows, by name: one module each, listed here."""
from __future__ import annotations

from inferledger.studies.framework import Study, StudyError

STUDIES: dict[str, Study] = {}


def get_study(name: str) -> Study:
    study = STUDIES.get(name)
    if study is None:
        raise StudyError(f"no study named {name!r}; the studies are: {', '.join(STUDIES) or 'none'}")
    return study
