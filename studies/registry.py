"""The studies `inferledger study NAME` knows, by name: one module each, listed here."""
from __future__ import annotations

from inferledger.studies import (chunked_prefill, fidelity, kv_layout, load, prefix_cache, routing,
                                 schedule_book, spec_decode)
from inferledger.studies.framework import Study, StudyError

STUDIES: dict[str, Study] = {s.name: s for s in (schedule_book.STUDY, kv_layout.STUDY, chunked_prefill.STUDY,
                                                 prefix_cache.STUDY, spec_decode.STUDY, load.STUDY,
                                                 fidelity.STUDY, routing.STUDY)}


def get_study(name: str) -> Study:
    study = STUDIES.get(name)
    if study is None:
        raise StudyError(f"no study named {name!r}; the studies are: {', '.join(STUDIES) or 'none'}")
    return study
