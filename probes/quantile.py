"""The one quantile rule for the figures inferledger computes in Python: linear interpolation between
the closest ranks (Hyndman and Fan's type 7; NumPy's default, DuckDB's `quantile_cont`), so a
percentile the client writes into the manifest and one the ledger computes in SQL mean the same.
"""
from __future__ import annotations

import math
from collections.abc import Iterable


def quantile(values: Iterable[float], q: float) -> float | None:
    """The q-quantile (0 <= q <= 1) of `values`: at rank h = (n - 1)·q of the sorted values,
    interpolated linearly between the two ranks around it. None for no values (unknown, not 0)."""
    if not 0.0 <= q <= 1.0:  # also refuses a NaN q
        raise ValueError(f"quantile: q must be within 0..1, not {q}")
    ordered = sorted(values)
    if any(math.isnan(v) for v in ordered):  # NaN has no rank: sorting would place it arbitrarily
        raise ValueError("quantile: values must not contain NaN")
    if not ordered:
        return None
    h = (len(ordered) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])
