"""The report's workload-model panels: the roofline, the residuals, the step fit, the registered
prediction against the run (docs/REPORT.md). Every figure is a ledger column; nothing is computed here."""
from __future__ import annotations

from inferledger.probes.run_dir import PREDICTION_FILE
from inferledger.probes.run_folder import MANIFEST_FILE
from inferledger.report.page import esc, fmt, kv_table, note, section, table
from inferledger.report.sections import missing

KIND_COLORS = {"prefill": "#ff7f0e", "decode": "#1f77b4", "mixed": "#9467bd"}
ROOF_DASH = {"peak": "solid", "sustained": "dash", "effective": "dot"}


def _layout(height: int, **kw) -> dict:
    return {"height": height, "margin": {"l": 70, "r": 20, "t": 30, "b": 50}, **kw}


def _points(rv, x: str, y: str, by: str, table_name: str, where: str = "TRUE") -> list[dict]:
    rows = rv.all(f"SELECT {by}, {x}, {y}, step_id FROM {table_name} WHERE {x} IS NOT NULL AND {y} IS NOT NULL "
                  f"AND {where} ORDER BY step_id LIMIT 20000")
    groups: dict = {}
    for g, xv, yv, sid in rows:
        d = groups.setdefault(g, {"x": [], "y": [], "text": []})
        d["x"].append(xv)
        d["y"].append(yv)
        d["text"].append(f"step {sid}")
    return [{"type": "scatter", "mode": "markers", "name": esc(str(g)), "x": d["x"], "y": d["y"], "text": d["text"],
             "marker": {"size": 5, "opacity": 0.65, "color": KIND_COLORS.get(g)}} for g, d in sorted(groups.items())]


def roofline(rv, page, p: str) -> str:
    title = "Roofline: each step's intensity against the FLOP rate it reached"
    if not rv.has("roofline_points"):
        return section(f"{p}-roofline", title, missing("roofline_points", "the roofline"))
    data = _points(rv, "intensity", "achieved_tflops", "kind", "roofline_points")
    roofs = rv.all("SELECT roof, statistic, value, unit, source, label FROM roofline_roofs ORDER BY statistic, roof")
    if not data:
        return section(f"{p}-roofline", title, note("no step has both work and a measured time (step_model)")
                       + (table(["roof", "statistic", "value", "unit", "source", "label"], roofs) if roofs else ""),
                       "roofline_points, roofline_roofs")
    xs = [v for d in data for v in d["x"] if v]
    lo, hi = min(xs) / 2, max(xs) * 2
    by_stat: dict = {}
    for roof, stat, value, _unit, source, _label in roofs:
        by_stat.setdefault(stat, {})[roof] = (value, source)
    for stat, r in sorted(by_stat.items()):
        if "compute" not in r or "memory" not in r:
            continue
        (tflops, src_c), (gbps, src_m) = r["compute"], r["memory"]
        ridge = tflops * 1e3 / gbps  # the roof's corner, FLOP per byte: drawn, not a ledger figure of the run
        x = sorted({lo, hi, min(max(ridge, lo), hi)})
        name = f"{stat} roof: {fmt(tflops, 4)} TFLOP/s ({src_c}), {fmt(gbps, 4)} GB/s ({src_m})"
        data.append({"type": "scatter", "mode": "lines", "name": esc(name), "x": x,
                     "y": [min(tflops, gbps * v / 1e3) for v in x], "hoverinfo": "name",
                     "line": {"color": "#444", "width": 1.4, "dash": ROOF_DASH.get(stat, "solid")}})
    fig = {"data": data, "layout": _layout(
        420, xaxis={"type": "log", "title": {"text": "arithmetic intensity, FLOP per byte (step_model.intensity)"}},
        yaxis={"type": "log", "title": {"text": "achieved TFLOP/s (roofline_points.achieved_tflops)"}},
        legend={"orientation": "h", "y": -0.25})}
    body = page.figure(f"{p}-roofline-fig", fig)
    body += "<h3>The roofs, each with its source</h3>" + (
        table(["roof", "statistic", "value", "unit", "source", "label"], roofs) if roofs
        else note("no roofs: no spec entry for the device and no microbenchmarks (see the gap register)"))
    return section(f"{p}-roofline", title, body,
                   "roofline_points (intensity, achieved_tflops, kind), roofline_roofs (roof, statistic, value, source, label)")


def residuals(rv, page, p: str) -> str:
    title = "Residuals: measured step time above the bound, by batch size and by context"
    if not rv.has("step_model"):
        return section(f"{p}-residuals", title, missing("step_model", "the residuals"))
    figs = ""
    for x, label in (("num_seqs", "batch size (sequences)"), ("context_tokens", "context before the step, tokens")):
        data = _points(rv, x, "residual_ms", "CASE WHEN prefill_tokens = 0 THEN 'decode' WHEN prefill_tokens = tokens "
                       "THEN 'prefill' ELSE 'mixed' END", "step_model")
        if data:
            figs += "<div>" + page.figure(f"{p}-resid-{x}", {"data": data, "layout": _layout(
                340, xaxis={"title": {"text": f"{label} (step_model.{x})"}},
                yaxis={"title": {"text": "residual_ms (measured − bound)"}})}) + "</div>"
    body = _beaten(rv) + (f'<div class="cols">{figs}</div>' if figs else note("no step has a bound and a measured time"))
    if rv.has("model_residuals"):
        cols, rows = rv.dicts("SELECT num_seqs, context_lo, context_hi, mode, n_steps, median_measured_ms, "
                              "median_bound_ms, median_residual_ms, median_residual_pct, median_gap_after_ms, "
                              "n_beats_bound FROM model_residuals")
        body += "<h3>By batch size, context bucket and step mode</h3>" + f'<div class="scroll">{table(cols, rows)}</div>'
    if rv.has("residual_sources"):
        cols, rows = rv.dicts("SELECT source, ms_per_step, dominant, detail FROM residual_sources ORDER BY ms_per_step DESC")
        body += "<h3>Where the residual points</h3>" + table(cols, rows)
    return section(f"{p}-residuals", title, body, "step_model (residual_ms), model_residuals, residual_sources")


def _beaten(rv) -> str:
    """Steps faster than their lower bound: each marks its roof as wrong (step_model.beats_bound, a gap row each)."""
    cols, rows = rv.dicts("SELECT step_id, measured_ms, bound_ms, bound_ms - measured_ms AS below_by_ms, "
                          "(bound_ms - measured_ms) / bound_ms * 100 AS below_by_pct, beaten_roof FROM step_model "
                          "WHERE beats_bound ORDER BY below_by_pct DESC, step_id")
    if not rows:
        return ""
    return (f'<p class="verdict"><b>{len(rows)} step(s) ran faster than their lower bound: the roof each names is '
            "wrong for it (a gap row per step in the gap register)</b></p>"
            + f'<div class="scroll">{table(cols, rows[:20])}</div>'
            + (note(f"the 20 furthest below their bound of {len(rows)}") if len(rows) > 20 else ""))


def calibration(rv, page, p: str) -> str:
    title = "Calibration: the step-time fit and its error on held-out shapes"
    if not rv.has("step_fit"):
        return section(f"{p}-calibration", title, missing("step_fit", "the calibration table"))
    cols, rows = rv.dicts("SELECT name, value, unit, source FROM step_fit")
    if not rows:
        return section(f"{p}-calibration", title, note("no fit: too few steps with a shape (see the gap register)"),
                       "step_fit")
    body = note("T = α + a_seq · sequences + max(e · F_lin / P, Q_lin / B) + max(e · F_att / P, Q_kv / B): the "
                "step's work at the run's measured rates P and B, with α, a_seq and the compute efficiency e fitted "
                "on the steps' own work (cpu_ms less blocked_ms); trained on some step shapes (batch size, tokens, context) and judged on the others; "
                "the held-out errors below are on shapes the fit never saw", "source")
    body += table(cols, rows)
    if rv.has("step_fit_points"):
        data = _points(rv, "measured_ms", "predicted_ms", "split", "step_fit_points")
        if data:
            hi = max(v for d in data for v in d["x"] + d["y"])
            data.append({"type": "scatter", "mode": "lines", "name": "predicted = measured", "x": [0, hi], "y": [0, hi],
                         "line": {"dash": "dash", "color": "#888", "width": 1}, "hoverinfo": "skip"})
            body += page.figure(f"{p}-fit-fig", {"data": data, "layout": _layout(
                360, xaxis={"title": {"text": "measured_ms"}}, yaxis={"title": {"text": "predicted_ms (the fit)"}})})
    return section(f"{p}-calibration", title, body, "step_fit (name, value, unit, source), step_fit_points")


def prediction(rv, p: str) -> str:
    title = "The registered prediction against the run"
    if not rv.has("prediction_registration"):
        return section(f"{p}-prediction", title, missing("prediction_registration", "the registered prediction"))
    cols, rows = rv.dicts("SELECT sha256, source, valid, predates_data, lead_ms, clock, registered_ns, "
                          "first_event_ns FROM prediction_registration")
    if not rows:
        why = ((rv.manifest or {}).get("prediction") or {}).get("skipped")
        return section(f"{p}-prediction", title, note("this run registered no prediction" + (f": {why}" if why else
                                                      " (capture registers one before its load; docs/MODEL.md "
                                                      "\"Registration\")")), f"prediction_registration, {MANIFEST_FILE}")
    reg = dict(zip(cols, rows[0]))
    if reg["predates_data"]:
        verdict = f"registered {fmt(reg['lead_ms'], 1)} ms before the run's first event on {esc(reg['clock'])}"
    elif reg["valid"]:
        verdict = "not registered before the data (or no event on its clock): it cannot count as a prediction"
    else:  # the gap row says why: missing, changed, malformed, or made for another run
        why = rv.all("SELECT detail FROM gaps WHERE subject_id = ? AND affects LIKE '%prediction_registration%'",
                     [PREDICTION_FILE]) if rv.has("gaps") else []
        verdict = ("not valid: " + esc(why[0][0]) if why else
                   "the registered file is missing, changed or malformed (see the gap register)") + ": nothing is checked"
    body = f'<p class="verdict"><b>{verdict}</b></p>' + kv_table(list(reg.items()))
    if rv.has("prediction_check"):
        cols, rows = rv.dicts("SELECT class, prompt_tokens, cached_tokens, output_tokens, n_attempts, ttft_lower_ms, "
                              "ttft_sustained_low_ms, ttft_sustained_high_ms, ttft_fit_low_ms, ttft_fit_high_ms, "
                              "ttft_p50_ms, ttft_min_ms, ttft_below_bound, ttft_in_sustained, tpot_lower_ms, "
                              "tpot_sustained_low_ms, tpot_sustained_high_ms, tpot_fit_low_ms, tpot_fit_high_ms, "
                              "tpot_p50_ms, tpot_min_ms, tpot_below_bound, tpot_in_sustained FROM prediction_check")
        body += ("<h3>Per request shape: predicted (ms) beside measured (server layer)</h3>"
                 + f'<div class="scroll">{table(cols, rows)}</div>' if rows else note("prediction_check is empty"))
    return section(f"{p}-prediction", title, body, "prediction_registration, prediction_check")
