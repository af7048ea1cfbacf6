"""A study: runs that differ in one knob, and one comparison that answers its question from their ledgers.

A study module (one per study, listed in studies/registry.py) defines one `Study`: its name, the
question it asks, the knob its runs differ in, the options a user may set, `runs(options)` (one
`StudyRun` per setting, each writing a normal run directory) and `compare(runs)` (the comparison's
tables, computed from each run's ledger by SQL, never beside it). `run_study` writes the study folder
(its format: probes/study_dir.py): each run into runs/<name>/, reconstructed, then the comparison.
study.json says `running` while it works and `complete` at the end; when a run or the comparison
fails it says `failed` with the error, and the runs already written stay. Stopped by Ctrl-C (SIGINT,
or SIGTERM in the command) it says `interrupted`, with what stopped it and the runs it kept.

`run_study(..., resume=True)` continues such a folder (`inferledger study NAME --resume DIR`): with the
options it recorded (an option given again must equal the recorded one), each run whose folder is
finished (its manifest says `complete`, or it has no state: a producer that writes its folder whole)
is kept as it is, its ledger rebuilt only if it has none; a run left half-done is moved aside into
`interrupted/<name>` (`-2`, `-3`, ... when taken) and produced again; then the comparison.

A study on the real engine (`needs_model`) gets the loaded model as a third argument of each run's
`produce`: `run_study` loads it once for all the runs, or takes one already loaded (`bundle=`: the
Python API, the tests' session model), so no run loads the model again.
"""
from __future__ import annotations

import csv
import io
import math
import os
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from inferledger.ledger.query import Ledger, ledger_current, open_ledger
from inferledger.ledger.reconstruct import BuildOptions, reconstruct
from inferledger.ledger.stages import query_interrupted
from inferledger.probes import study_dir as fmt
from inferledger.probes.run_folder import STUDY_FORMAT, Manifest, RunFolderError, StudyIndex, write_json_atomic


class StudyError(ValueError):
    """The study cannot run as asked (unknown study or option, an unusable folder); the message says which."""


@dataclass(frozen=True)
class Option:
    """A setting a user may change (`inferledger study NAME --set key=value`): its type is its
    default's, a number's meaning bounds it to `low`..`high` (None: unbounded on that side)."""
    default: object
    help: str
    low: float | None = None
    high: float | None = None

    def parse(self, key: str, text: str):
        kind = type(self.default)
        try:
            if kind is bool:
                if text.lower() not in ("true", "false"):
                    raise ValueError("expected true or false")
                return text.lower() == "true"
            value = kind(text)
        except ValueError as exc:
            raise StudyError(f"--set {key}={text}: {exc} ({kind.__name__} expected; {self.help})") from None
        self.check(key, value)
        return value

    def check(self, key: str, value) -> None:
        """StudyError naming the knob and its range unless `value` is a finite number within it."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        inside = math.isfinite(value) and (self.low is None or value >= self.low) and (
            self.high is None or value <= self.high)
        if not inside:
            low = "" if self.low is None else f">= {self.low:g}"
            high = "" if self.high is None else f"<= {self.high:g}"
            allowed = " and ".join(b for b in (low, high) if b) or "a finite number"
            raise StudyError(f"--set {key}={value}: must be {allowed} ({self.help})")


@dataclass(frozen=True)
class StudyRun:
    """One setting of the knob: `produce(run_dir, run_id)` writes a new run directory there
    (`produce(run_dir, run_id, bundle)` in a study that `needs_model`)."""
    name: str
    knob: dict
    produce: Callable[[Path, str], None]


@dataclass
class Table:
    name: str
    title: str
    columns: list[str]
    rows: list[list]
    note: str = ""

    def as_dict(self) -> dict:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, "note": self.note}


class StudyRuns:
    """What a comparison reads: the study's runs by name, each with its manifest and its ledger."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs
        self._ledgers: dict[str, Ledger] = {}

    @property
    def names(self) -> list[str]:
        return list(self.dirs)

    def manifest(self, name: str) -> dict:
        return Manifest.read(self.dirs[name]).body

    def ledger(self, name: str) -> Ledger:
        if name not in self._ledgers:
            self._ledgers[name] = open_ledger(self.dirs[name])
        return self._ledgers[name]

    def records(self, name: str, query: str, params=None) -> list[dict]:
        columns, rows = self.ledger(name).rows(query, params)
        return [dict(zip(columns, r)) for r in rows]

    def one(self, name: str, query: str, params=None) -> dict:
        rows = self.records(name, query, params)
        if len(rows) != 1:
            raise StudyError(f"run {name}: expected one row from the ledger, got {len(rows)}: {query}")
        return rows[0]

    def close(self) -> None:
        for led in self._ledgers.values():
            led.close()
        self._ledgers.clear()


@dataclass(frozen=True)
class Study:
    name: str
    question: str
    knob: str
    runs: Callable[[dict], list[StudyRun]]
    compare: Callable[[StudyRuns], list[Table]]
    reading: str = ""  # how to read the answer, in a sentence (docs/STUDIES.md says more)
    options: dict[str, Option] = field(default_factory=dict)
    figures: tuple[dict, ...] = ()  # what the report draws (probes/run_folder.py FIGURE_KINDS)
    needs_model: bool = False  # its runs run the real engine: each produce gets the loaded model

    def resolve_options(self, given: dict | None) -> dict:
        unknown = sorted(set(given or {}) - set(self.options))
        if unknown:
            known = ", ".join(sorted(self.options)) or "none"
            raise StudyError(f"study {self.name}: unknown option {unknown[0]!r} (its options: {known})")
        resolved = {k: (given or {}).get(k, o.default) for k, o in self.options.items()}
        for k, o in self.options.items():
            o.check(k, resolved[k])
        return resolved


@dataclass
class StudyResult:
    path: Path
    study: dict
    tables: list[Table]
    seconds: float


def parse_sets(study: Study, pairs: list[str]) -> dict:
    """`key=value` strings into typed options (each checked against the study's declared options)."""
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise StudyError(f"--set {pair!r}: expected key=value")
        study.resolve_options({key: None})
        if key in out:  # the last would silently win: a mistyped or doubled flag
            also = " (--workload is --set workload)" if key == "workload" else ""
            raise StudyError(f"--set {key}: given twice ({out[key]} and {text}){also}; give it once")
        out[key] = study.options[key].parse(key, text)
    return out


def finished(run_dir: Path) -> bool:
    """A study's run done and kept on a resume: its folder holds a manifest saying `complete`, or no
    state at all (an import or a simulation writes its folder whole, renamed into place at the end)."""
    if not Manifest.exists(run_dir):
        return False
    return Manifest.read(run_dir).body.get("state") in (None, "complete")


def kept_runs(out: str | Path) -> list[str]:
    """The runs of a study folder that are finished (what a resume keeps), in the study's order."""
    return [name for name, run in fmt.run_dirs(out) if finished(run)]


def _resumed_index(study: Study, out: Path, given: dict) -> tuple[dict, dict]:
    """The study index of the folder `out` to continue, and the options it runs with: those recorded,
    each given one checked equal to its record (StudyError naming the first that differs)."""
    if not out.is_dir():
        raise StudyError(f"--resume {out}: no such folder; a resume continues a study folder")
    try:
        doc = StudyIndex.read(out).doc
    except RunFolderError as exc:
        raise StudyError(f"--resume {out}: {exc}") from None
    if doc["name"] != study.name:
        raise StudyError(f"--resume {out}: the folder holds study {doc['name']!r}, not {study.name!r}; resume it "
                         f"with: inferledger study {doc['name']} --resume {out}")
    recorded = doc.get("options", {})
    for key, value in given.items():
        if key in recorded and recorded[key] != value:
            raise StudyError(f"--resume {out}: --set {key}={value} differs from the study's recorded "
                             f"{key}={recorded[key]}; leave it out (the recorded options are used) or start "
                             "a new study folder")
    return doc, study.resolve_options({**recorded, **given})


def _set_aside(out: Path, run_dir: Path, name: str) -> Path:
    """A half-done run's folder moved to `out/interrupted/<name>` (numbered when taken): kept for
    inspection, out of the study's runs."""
    aside = out / fmt.INTERRUPTED_DIR
    aside.mkdir(exist_ok=True)
    target, n = aside / name, 1
    while target.exists():
        n += 1
        target = aside / f"{name}-{n}"
    os.replace(run_dir, target)
    return target


def check_new_study_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a file" if not out.is_dir() else "a folder that is not empty"
        raise StudyError(f"{out} is {what}; a study writes into a new folder (choose another -o), "
                         "nothing was changed")


def table_csv(table: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(table.columns)
    w.writerows(["" if v is None else v for v in row] for row in table.rows)
    return buf.getvalue()


@dataclass(frozen=True)
class StudyWatch:
    """What the caller is told as a study goes (the command's progress): `on_start(name, i, n, what)`
    as the i-th of n runs starts (`what`: producing, kept: finished before a resume, set aside: its
    half-done folder moved to interrupted/), `on_task(done, total)` after each task of a run being
    produced (where its producer says: a capture's), `on_stage(name, i, n)` per ledger stage of the run
    being rebuilt, `on_run(name, i, n, seconds, summary)` after each run's ledger (summary None for a
    kept run whose ledger was there). `signal()`: the name of the signal that stopped the study where
    the caller caught it (SIGTERM), else None (the study.json record says SIGINT)."""
    on_start: Callable | None = None
    on_stage: Callable | None = None
    on_run: Callable | None = None
    on_task: Callable | None = None
    signal: Callable | None = None


_TASK_TICKS: ContextVar[Callable | None] = ContextVar("study_task_ticks", default=None)


def task_ticks() -> Callable | None:
    """For a study's producer: `tick(done, total)` to call after each task of the run it produces (the
    command's progress), None when nobody watches."""
    return _TASK_TICKS.get()


def run_study(study: Study, out: str | Path, options: dict | None = None, *, bundle=None,
              resume: bool = False, watch: StudyWatch | None = None) -> StudyResult:
    """Produce and reconstruct every run of `study` into `out`, then write its comparison. A study
    that `needs_model` runs on `bundle` (a loaded model), else on the bundled model loaded once here.
    `watch` is told each step (the command's progress). `resume`: continue the study folder `out` (the
    module docstring); a complete one returns its recorded comparison."""
    t0 = time.perf_counter()
    out = Path(out)
    watch = watch or StudyWatch()
    if resume:
        doc, opts = _resumed_index(study, out, options or {})
    else:
        opts = study.resolve_options(options)
        check_new_study_dir(out)
    plan = study.runs(opts)
    names = [r.name for r in plan]
    if len(set(names)) != len(names) or not names:
        raise StudyError(f"study {study.name}: its runs need distinct names, got {names}")
    runs_doc = [{"name": r.name, "dir": f"{fmt.RUNS_DIR}/{r.name}", "knob": r.knob} for r in plan]
    if resume:
        if [(r["name"], r["dir"]) for r in doc["runs"]] != [(r["name"], r["dir"]) for r in runs_doc]:
            raise StudyError(f"--resume {out}: the folder's runs ({', '.join(r['name'] for r in doc['runs'])}) are "
                             f"not the ones this version of {study.name} plans ({', '.join(names)}); start a new "
                             "study folder")
        if doc["state"] == "complete":
            tables = [Table(name, t["title"], t["columns"], t["rows"], t.get("note", ""))
                      for name, t in fmt.read_comparison(out).items()]
            return StudyResult(out, doc, tables, time.perf_counter() - t0)
        for key in ("error", "interrupted"):
            doc.pop(key, None)
        doc.update(state="running", options=opts)
    else:
        doc = {"format": STUDY_FORMAT, "name": study.name, "question": study.question, "knob": study.knob,
               "reading": study.reading, "options": opts, "state": "running",
               "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "figures": list(study.figures), "runs": runs_doc}
        out.mkdir(parents=True, exist_ok=True)
    StudyIndex(doc).write(out)
    runs = StudyRuns({r.name: out / fmt.RUNS_DIR / r.name for r in plan})
    try:
        if study.needs_model and bundle is None and not all(finished(d) for d in runs.dirs.values()):
            from inferledger.engine.loader import load_model

            if watch.on_start is not None:
                watch.on_start("the model", 0, len(plan), "loading")
            bundle = load_model()
        for i, r in enumerate(plan, 1):
            _one_run(study, r, out, (i, len(plan)), watch, bundle)
        tables = study.compare(runs)
        if not tables:
            raise StudyError(f"study {study.name}: its comparison returned no table")
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) or query_interrupted(exc):  # Ctrl-C (SIGTERM in the command)
            kept = [name for name, d in runs.dirs.items() if finished(d)]
            doc.update(state="interrupted", interrupted=f"{_signal_name(exc, watch)} with {len(kept)} of {len(plan)} "
                       "runs finished" + (f" ({', '.join(kept)})" if kept else ""))
            StudyIndex(doc).write(out)
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise KeyboardInterrupt("SIGINT") from None  # (in the comparison's SQL)
        doc.update(state="failed", error=f"{type(exc).__name__}: {exc}")
        StudyIndex(doc).write(out)
        raise
    finally:
        runs.close()
    _write_comparison(out, doc, tables)
    return StudyResult(out, doc, tables, time.perf_counter() - t0)


def _signal_name(exc: BaseException, watch: StudyWatch) -> str:
    signum = getattr(exc, "signum", None)  # a capture's Interrupted says which signal
    if signum is not None:
        import signal

        return signal.Signals(signum).name
    caught = watch.signal() if watch.signal is not None else None  # (DuckDB's client drops which one)
    return caught or (str(exc) if str(exc).startswith("SIG") else "SIGINT")


def _one_run(study: Study, r: StudyRun, out: Path, at: tuple[int, int], watch: StudyWatch, bundle) -> None:
    """One run of the plan into the study folder `out` (`at`: its place i of n): kept when finished (its
    ledger rebuilt if it has none, or one this code does not read as built: an upgrade, a moved folder), else
    its half-done folder set aside and the run produced, then its ledger built."""
    i, n = at
    run_dir = out / fmt.RUNS_DIR / r.name
    t_run = time.perf_counter()
    say = watch.on_start or (lambda *a: None)
    stage = watch.on_stage
    if finished(run_dir):
        say(r.name, i, n, "kept")
        summary = None if ledger_current(run_dir) else reconstruct(run_dir, on_stage=stage)
    else:
        if run_dir.exists():
            say(r.name, i, n, f"set aside: {_set_aside(out, run_dir, r.name)}")
        say(r.name, i, n, "producing")
        token = _TASK_TICKS.set(watch.on_task)
        try:
            r.produce(run_dir, f"{study.name}.{r.name}", *((bundle,) if study.needs_model else ()))
        finally:
            _TASK_TICKS.reset(token)
        say(r.name, i, n, "reconstructing")
        summary = reconstruct(run_dir, on_stage=stage)
    if watch.on_run is not None:
        watch.on_run(r.name, i, n, time.perf_counter() - t_run, summary)


def _write_comparison(out: Path, doc: dict, tables: list[Table]) -> None:
    write_json_atomic({t.name: t.as_dict() for t in tables}, out / fmt.COMPARISON_JSON)
    csv_tmp = out / f".{fmt.COMPARISON_CSV}.tmp-{os.getpid()}"
    csv_tmp.write_text(table_csv(tables[0]), encoding="utf-8")
    os.replace(csv_tmp, out / fmt.COMPARISON_CSV)  # never a half-written table
    doc.update(state="complete", tables=[t.name for t in tables])
    StudyIndex(doc).write(out)


def rebuild_study(out: str | Path, study: Study | None, build=None, on_run: Callable | None = None,
                  on_stage: Callable | None = None) -> list[Table] | None:
    """Rebuild the ledger of every finished run a study folder keeps (a run Ctrl-C stopped halfway is
    left as it is, for a resume to redo), then its comparison from the new ledgers (`study`: the study
    that wrote the folder). The comparison is left as it was, and None returned,
    where the study is not given (not one this version knows) or did not complete (its comparison
    needs every run). `build`: the ledger's BuildOptions; `on_run(name, summary)` after each run's ledger,
    `on_stage(name, stage, i, n)` as each of its ledger stages starts."""
    out = Path(out)
    doc = StudyIndex.read(out).doc
    dirs = {name: run for name, run in fmt.run_dirs(out, doc) if finished(run)}
    for name, run in dirs.items():
        ticks = (lambda module, i, n, name=name: on_stage(name, module, i, n)) if on_stage is not None else None
        summary = reconstruct(run, build if build is not None else BuildOptions(), on_stage=ticks)
        if on_run is not None:
            on_run(name, summary)
    if study is None or doc["state"] != "complete":
        return None
    runs = StudyRuns(dirs)
    try:
        tables = study.compare(runs)
    finally:
        runs.close()
    _write_comparison(out, doc, tables)
    return tables
