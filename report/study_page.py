"""`inferledger report STUDY_DIR`: one HTML page for a study folder (probes/study_dir.py).

The page says what the study asked and how to read it, shows every table of its comparison (computed
from the runs' ledgers when the study ran), draws the figures study.json names from each run's own
ledger (report/study_figs.py), and lists the runs, each a run folder that `inferledger report` and
`inferledger query` open alone. Like the run report it inlines plotly.js and loads nothing.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from inferledger.ledger.query import LEDGER_FILE, LedgerError
from inferledger.probes.run_folder import Manifest, RunFolderError, StudyIndex
from inferledger.probes.study_dir import read_comparison, run_dirs
from inferledger.report import study_figs as sf
from inferledger.report.build import ReportResult, plotly_js
from inferledger.report.page import Page, kv_table, note, section, table
from inferledger.report.read import open_run


def _per_run(runs: dict[str, Path], names: list[str], query: str) -> dict[str, list[tuple]]:
    out = {}
    for name in names:
        if name not in runs:
            raise LedgerError(f"the study's figure names run {name!r}, which the study does not list")
        rv = open_run(runs[name])
        try:
            out[name] = rv.all(query)
        finally:
            rv.close()
    return out


def _ready(run_dir: Path) -> bool:
    """A run of the study that the page can draw: finished (its manifest `complete`, or a folder written
    whole with no state) and its ledger built."""
    try:
        state = Manifest.read(run_dir).body.get("state") if Manifest.exists(run_dir) else "missing"
    except RunFolderError:
        return False
    return state in (None, "complete") and (run_dir / LEDGER_FILE).is_file()


def _figure(page: Page, i: int, fig: dict, runs: dict[str, Path], comparison: dict) -> str:
    kind, title = fig["kind"], fig.get("title", fig["kind"])
    names = fig.get("runs") or list(runs)
    if not comparison:  # an unfinished study: the runs that finished
        names = [n for n in names if n in runs]
    if not names:
        return section(f"fig{i}", title, note("none of the runs this figure draws has finished"), "")
    parts = []
    if kind == "timeline":
        steps = _per_run(runs, names, sf.STEPS_SQL)
        arrivals = _per_run(runs, names, sf.ARRIVALS_SQL)
        x_max = max([r[4] for rows in steps.values() for r in rows] or [1.0]) * 1.02
        for j, name in enumerate(names):
            parts.append(page.figure(f"study-fig{i}-{j}", sf.timeline_fig(name, steps[name], arrivals[name], x_max,
                                                                          legend=j == 0)))
        source = "step_attribution (a bar per step a request was in), attempts.enqueued_ns (arrivals)"
    elif kind == "kv_blocks":
        holds = _per_run(runs, names, sf.HOLDS_SQL)
        x_max = max([h[4] for rows in holds.values() for h in rows] or [1.0]) * 1.02
        seen: set = set()
        for j, name in enumerate(names):
            parts.append(page.figure(f"study-fig{i}-{j}", sf.kv_blocks_fig(name, holds[name], x_max, seen)))
        source = "kv_holds (a bar per request's hold of a physical block)"
    else:
        t = comparison.get(fig.get("table", ""))
        if t is None and not comparison:
            return section(f"fig{i}", title, note("drawn from the study's comparison, which an unfinished study "
                                                  "has not written"), "")
        if t is None:
            raise LedgerError(f"the study's curve names table {fig.get('table')!r}, which its comparison lacks")
        parts.append(page.figure(f"study-fig{i}", sf.curve_fig(title, t, fig["x"], list(fig.get("y", [])))))
        source = f"comparison table {fig['table']}"
    return section(f"fig{i}", title, "".join(parts), source)


TIMELINE_ROWS = 100  # a study's own timeline draws a run of at most this many attempts (a row each)


def _default_timeline(doc: dict, runs: dict[str, Path]) -> list[dict]:
    """A timeline of the runs small enough to read row by row, where the study names no timeline of its
    own (a curve or the KV blocks alone): each bigger run's own report samples its requests."""
    if any(f["kind"] == "timeline" for f in doc.get("figures", [])):
        return []
    small, big = [], []
    for name, run in runs.items():
        rv = open_run(run)
        try:
            (n,), = rv.all("SELECT count(*) FROM attempts")
        finally:
            rv.close()
        (small if n <= TIMELINE_ROWS else big).append(name)
    if not small:
        return []
    title = "each run's requests, on one time scale"
    if big:
        title += f" (not drawn, over {TIMELINE_ROWS} attempts: {', '.join(big)}; each run's own report samples them)"
    return [{"kind": "timeline", "title": title, "runs": small}]


def build_study_report(study_dir, out=None) -> ReportResult:
    """Write the report of a study folder to `out` (default STUDY_DIR/report.html)."""
    t0 = time.perf_counter()
    study_dir = Path(study_dir)
    try:
        doc = StudyIndex.read(study_dir).doc
        complete = doc["state"] == "complete"
        comparison = read_comparison(study_dir) if complete else {}
        runs = dict(run_dirs(study_dir, doc))
    except RunFolderError as exc:
        raise LedgerError(str(exc)) from None
    if not complete:  # interrupted (or failed): the page of the runs that finished, without a comparison
        runs = {name: run for name, run in runs.items() if _ready(run)}
        if not runs:
            raise LedgerError(f"{study_dir}: the study is {doc['state']}"
                              + (f" ({doc.get('interrupted') or doc.get('error')})" if doc.get("interrupted")
                                 or doc.get("error") else "") + " and none of its runs has finished; nothing to report")
    page = Page(f"inferledger study: {doc['name']}")
    intro = kv_table([("question", doc["question"]), ("knob", doc["knob"]), ("how to read it", doc.get("reading")),
                      ("options", doc.get("options")), ("created", doc.get("created")), ("state", doc["state"])]
                     + [(key, doc[key]) for key in ("interrupted", "error") if doc.get(key)])
    if not complete:
        intro += note(f"this study is {doc['state']}: the page shows the {len(runs)} of {len(doc['runs'])} runs that "
                      f"finished and no comparison (the study writes it when every run is done; continue it with "
                      f"inferledger study {doc['name']} --resume {study_dir})")
    body = [section("study", "The study", intro)]
    table_names = doc.get("tables", list(comparison)) if complete else []
    for name in table_names:
        t = comparison[name]
        body.append(section(f"table-{name}", t.get("title", name),
                            table(t["columns"], t["rows"]) + (note(t["note"]) if t.get("note") else ""),
                            "the runs' ledgers (comparison.json)"))
    figures = list(doc.get("figures", [])) + _default_timeline(doc, runs)
    for i, fig in enumerate(figures):
        body.append(_figure(page, i, fig, runs, comparison))
    rows = [[r["name"], ", ".join(f"{k}={v}" for k, v in r["knob"].items()),
             "finished" if complete or r["name"] in runs else "not finished", str(study_dir / r["dir"])]
            for r in doc["runs"]]
    body.append(section("runs", "The runs", table(["run", "knob", "state", "folder"], rows)
                        + note("each is a normal run folder: inferledger report FOLDER, inferledger query FOLDER "
                               "\"select ...\"; inferledger query STUDY_DIR reads them all at once")))
    page.nav = [("study", "Study")] + [(f"table-{n}", n) for n in table_names] + \
               [(f"fig{i}", f.get("title", f["kind"])[:24]) for i, f in enumerate(figures)] + \
               [("runs", "Runs")]
    text = page.render("".join(body), plotly_js())
    target = Path(out) if out is not None else study_dir / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return ReportResult(target, target.stat().st_size, time.perf_counter() - t0, len(runs))
