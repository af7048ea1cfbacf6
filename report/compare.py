"""`report --compare`: two runs side by side, headline figures with Δ and Δ%, overlaid distributions.

Δ = this run − the compared run; Δ% is relative to the compared run. Every figure is the one the
single-run report shows (report/data.py), read from each run's own ledger.
"""
from __future__ import annotations

from inferledger.report import data as rd
from inferledger.report import figs, tables
from inferledger.report.read import num
from inferledger.report.page import esc, flatten, fmt, note, section

IDENTITY_PARTS = (("model", ("path", "sha256", "format", "quantization")), ("engine_config", None),
                  ("workload", ("name", "sha256", "hash")), ("host", None), ("evidence", None), ("source", None))


def _identity_rows(m: dict | None) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, keep in IDENTITY_PARTS:
        v = (m or {}).get(key)
        if isinstance(v, dict):
            sub = {k: v[k] for k in keep if k in v} if keep else v
            out.update({f"{key}.{k}": x for k, x in flatten(sub)})
        elif v is not None:
            out[key] = v
    return out


def metric_rows(rv, h: dict) -> list[tuple[str, object, str, str | None]]:
    """(label, value, unit, better) for the comparison table, in display order. `better` is the
    figure's direction: "higher" (goodput, good results), "lower" (latencies, energy per good result) or
    None where a change is neither better nor worse (how many attempts were sent, the window)."""
    c = h["counts"]
    rows = [("attempts", c["attempts"], "", None), ("tasks", c["tasks"], "", None),
            ("client-completed attempts", c["completed"], "", "higher"),
            ("good results (attempts)", h["n_good"], "", "higher"), ("T_obs", h["t_obs_s"], "s", None),
            ("goodput", h["goodput_rps"], "req/s", "higher"),
            ("completed throughput", h["completed_rps"], "req/s", "higher"),
            ("energy per good result", h["energy_per_good_j"], "J", "lower")]
    for r in tables.latency(rv):
        for q, v in zip(("p50", "p99"), (r["values"][0], r["values"][2])):
            rows.append((f"{r['metric']} {q} · {r['layer']}", v, "ms", "lower"))
    return rows


def _delta_cells(a, b, better: str | None) -> str:
    """Δ and Δ% coloured by the figure's direction: green where this run is better, red where worse."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or isinstance(a, bool):
        return "<td>—</td><td>—</td>"
    d = a - b
    pct = f"{100.0 * d / b:+.1f}%" if b else "—"
    up = {"higher": "better", "lower": "worse"}.get(better, "")
    down = {"higher": "worse", "lower": "better"}.get(better, "")
    cls = up if d > 0 else down if d < 0 else ""
    return f'<td class="num {cls}">{esc(f"{d:+,.3f}")}</td><td class="num {cls}">{esc(pct)}</td>'


def compare_section(page, a, ha: dict, b, hb: dict) -> str:
    ia, ib = _identity_rows(a.manifest), _identity_rows(b.manifest)
    rows = []
    for k in sorted(set(ia) | set(ib)):
        va, vb = ia.get(k), ib.get(k)
        mark = ' class="differs"' if va != vb else ""
        rows.append(f"<tr{mark}><th>{esc(k)}</th><td>{esc(fmt(va))}</td><td>{esc(fmt(vb))}</td></tr>")
    ident = (f'<table class="grid"><thead><tr><th>identity</th><th>{esc(a.name)}</th><th>{esc(b.name)}</th></tr>'
             f"</thead><tbody>{''.join(rows)}</tbody></table>")
    ma, mb = metric_rows(a, ha), metric_rows(b, hb)
    by_b = {label: v for label, v, _u, _d in mb}
    trs = []
    for label, va, unit, better in ma + [(lbl, None, u, d) for lbl, _v, u, d in mb if lbl not in {x[0] for x in ma}]:
        vb = by_b.get(label)
        trs.append(f"<tr><th>{esc(label)}</th><td>{esc(unit)}</td><td class=\"num\">{esc(fmt(va, 3))}</td>"
                   f"<td class=\"num\">{esc(fmt(vb, 3))}</td>{_delta_cells(va, vb, better)}</tr>")
    head = (f"<thead><tr><th>figure</th><th>unit</th><th>{esc(a.name)} (this run)</th><th>{esc(b.name)} (compared)"
            "</th><th>Δ</th><th>Δ%</th></tr></thead>")
    body = ('<div class="cols"><div>' + f'<table class="grid">{head}<tbody>{"".join(trs)}</tbody></table>'
            + note("Δ = this run − the compared run; Δ% is relative to the compared run.", "source")
            + "</div><div>" + ident + "</div></div>")
    body += "<h3>Completed throughput and goodput</h3>" + page.figure(
        "cmp-goodput", figs.goodput_bars([(a.name, ha), (b.name, hb)]))
    for r, h in ((a, ha), (b, hb)):
        if h["energy_per_good_j"] is None:
            body += note(f"{r.name}: energy per good result unknown: {h['energy_reason']}")
    hists = [(a.name, rd.itl_histogram(a)), (b.name, rd.itl_histogram(b))]
    if any(h for _, h in hists):
        body += "<h3>ITL distribution (solid: this run; dotted: compared)</h3>" + page.figure(
            "cmp-itl", figs.itl_fig(hists))
    peaks = []
    for r, h in ((a, ha), (b, hb)):
        peak = r.one("SELECT max(value) FROM samples WHERE metric = 'kv_blocks_used'")[0]
        peaks.append((r.name, num(peak), h["t_obs_s"]))
    if any(p[1] is not None for p in peaks):
        body += "<h3>Peak KV blocks used against T_obs</h3>" + page.figure("cmp-kv", figs.kv_vs_makespan(peaks))
    return section("compare", f"{a.name} compared with {b.name}", body,
                   "each run's own ledger: the same columns as the single-run panels below")
