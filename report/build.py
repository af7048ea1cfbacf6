"""`inferledger report`: one self-contained HTML file describing a run (or two, compared).

The file inlines plotly.js from the installed plotly package, so it opens with no network; a content
security policy forbids it to load anything at all. Panels and the ledger table each is drawn from
are listed in docs/REPORT.md; no figure is computed here that the ledger defines.

    from inferledger.report.build import build_report
    result = build_report("runs/r1", compare="runs/r0")    # -> runs/r1/report.html
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from inferledger.report import model_sections as msec
from inferledger.report import reported
from inferledger.report import sections as sec
from inferledger.report.clocks import build_timebase
from inferledger.report.compare import compare_section
from inferledger.report.data import headline
from inferledger.report.read import open_run
from inferledger.report.page import Page, esc

DETAIL_LIMIT = 300   # attempts drawn as timeline rows; beyond this the timeline shows a sample
DRILL_LIMIT = 120    # attempts with a drill-down (every event and output time embedded)
# the verdict first; the configuration and identity below the figures
PANELS = (("verdict", "Verdict"), ("headline", "Headline"), ("timeline", "Timeline"), ("itl", "ITL"),
          ("ttft", "TTFT"), ("kv", "KV blocks"), ("roofline", "Roofline"), ("residuals", "Residuals"),
          ("calibration", "Calibration"), ("prediction", "Prediction"), ("critical", "Critical path"), ("accounts", "Accounts"),
          ("diagnosis", "Reconciliation"), ("identity", "Identity"), ("gaps", "Gaps"))


@dataclass
class ReportResult:
    path: Path
    bytes: int
    seconds: float
    attempts: int


def plotly_js() -> str:
    """plotly.js as shipped in the plotly package (no CDN)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def run_panels(rv, page: Page, prefix: str, *, detail_limit: int, drill_limit: int, h: dict | None = None,
               with_verdict: bool = True) -> str:
    """Every panel of one run, the verdict first (unless the page put it above already); element ids
    start with `prefix` so two runs share a page."""
    tb = build_timebase(rv.led)
    h = h or headline(rv)
    parts = [sec.verdict(rv, prefix) if with_verdict else "", sec.headline(rv, prefix, h),
             sec.timeline(rv, page, prefix, tb, detail_limit, drill_limit), sec.itl(rv, page, prefix),
             sec.ttft(rv, page, prefix), sec.kv(rv, page, prefix, tb), reported.engine_account(rv, page, prefix, tb),
             msec.roofline(rv, page, prefix), msec.residuals(rv, page, prefix), msec.calibration(rv, page, prefix),
             msec.prediction(rv, prefix),
             sec.critical(rv, page, prefix),
             sec.accounts(rv, page, prefix), sec.diagnosis(rv, page, prefix), sec.identity(rv, prefix),
             sec.gaps(rv, prefix)]
    return "".join(parts)


def build_report(run, out=None, *, compare=None, detail_limit: int = DETAIL_LIMIT,
                 drill_limit: int = DRILL_LIMIT) -> ReportResult:
    """Write the report of `run` (a run folder with ledger.duckdb) to `out` (default RUN/report.html)."""
    t0 = time.perf_counter()
    a = open_run(run)
    b = None
    try:
        b = open_run(compare) if compare is not None else None
        title = f"inferledger report: {a.name}" + (f" compared with {b.name}" if b else "")
        page = Page(title)
        ha = headline(a)
        n_attempts = ha["counts"]["attempts"]
        if b is None:
            page.nav = [(f"a-{k}", label) for k, label in PANELS]
            body = run_panels(a, page, "a", detail_limit=detail_limit, drill_limit=drill_limit, h=ha)
        else:
            hb = headline(b)
            page.nav = ([("a-verdict", "Verdict"), ("compare", "Comparison")]
                        + [(f"a-{k}", label) for k, label in PANELS if k != "verdict"]
                        + [("b-verdict", f"Compared run: {b.name}")])
            body = (sec.verdict(a, "a") + compare_section(page, a, ha, b, hb)
                    + f'<h2 class="run">This run: {esc(a.name)}</h2>'
                    + run_panels(a, page, "a", detail_limit=detail_limit, drill_limit=drill_limit, h=ha,
                                 with_verdict=False)
                    + f'<h2 class="run">Compared run: {esc(b.name)}</h2>'
                    + run_panels(b, page, "b", detail_limit=detail_limit, drill_limit=drill_limit, h=hb))
        text = page.render(body, plotly_js())
    finally:
        a.close()
        if b is not None:
            b.close()
    target = Path(out) if out is not None else a.run_dir / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)  # never a half-written report
    return ReportResult(target, target.stat().st_size, time.perf_counter() - t0, n_attempts)
