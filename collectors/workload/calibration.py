"""Calibration: an open-loop workload tuned on one machine, scaled to a slower (or busier) one by the
engine speed measured there, so the run keeps its load relative to capacity and its duration."""
from __future__ import annotations

SCALED = ("rate_rps", "n_tasks", "timeout_ms", "deadline_ms")  # what the manifest shows before and after


def calibrate(wl, measured_tok_s: float) -> dict:  # wl: a load.Workload (not imported: load imports this)
    """Scale `wl` in place by f = measured / calibrate_tok_s (never above 1): rate and task count times
    f, client timeouts and task deadlines divided by f (injected faults and tool delays unchanged);
    [slo] thresholds stretch like the deadlines. Closed loops and replays are left alone. Returns
    what was done (for the manifest)."""
    f = min(1.0, measured_tok_s / wl.calibrate_tok_s)
    before = {k: getattr(wl, k) for k in SCALED}
    before_slo = dict(wl.slo)
    if wl.process in ("poisson", "gamma") and f < 1.0:
        wl.rate_rps *= f
        wl.n_tasks = max(1, round(wl.n_tasks * f))
        wl.timeout_ms /= f
        wl.deadline_ms /= f
        wl.slo = {k: v / f for k, v in wl.slo.items()}
        for c in wl.classes:
            c.timeout_ms = c.timeout_ms / f if c.timeout_ms else c.timeout_ms
            c.deadline_ms = c.deadline_ms / f if c.deadline_ms is not None else None
    after = {k: round(v, 4) if isinstance(v, float) else v for k in SCALED for v in [getattr(wl, k)]}
    if wl.slo:
        before["slo"], after["slo"] = before_slo, {k: round(v, 4) for k, v in wl.slo.items()}
    return {"measured_tok_s": round(measured_tok_s, 2), "reference_tok_s": wl.calibrate_tok_s,
            "factor": round(f, 3), "before": before, "after": after}
