"""The study folder's format: a set of run directories that differ in one knob, and their comparison.

    STUDY_DIR/
      (the index)       the study: its name, question, knob, state, its runs (name, folder, knob
                        setting), the comparison's tables (the key table first) and the figures to draw
                        (probes/run_folder.py `StudyIndex`, which names the file)
      comparison.csv    the key table: one row per run (or per point of the knob)
      comparison.json   every table of the comparison: {name: {title, columns, rows}}
      runs/<name>/      each a normal run directory (reconstruct, query and report open it alone)
      interrupted/<name>/  a run a resumed study found half-done, moved aside before it was run again
      report.html       derived (`inferledger report STUDY_DIR`)

The studies write it (studies/framework.py); the report, the query surface and the command line read
it through `StudyIndex.read` and `read_comparison`, which name the file and the key that is wrong.
"""
from __future__ import annotations

import json
from pathlib import Path

from inferledger.probes.run_folder import RunFolderError, StudyIndex

RUNS_DIR = "runs"
COMPARISON_CSV = "comparison.csv"
COMPARISON_JSON = "comparison.json"
INTERRUPTED_DIR = "interrupted"


class StudyDirError(RunFolderError):
    """A study folder's comparison cannot be read; the message names the file and the key."""


def is_study_dir(path: str | Path) -> bool:
    return StudyIndex.exists(path)


def not_a_run(path: str | Path) -> str | None:
    """Why a folder given where one run is wanted is not one (a study folder: its runs are), else None."""
    return f"{path}: a study folder; name one of its runs ({Path(path) / RUNS_DIR}/NAME)" if is_study_dir(path) else None


def _load_json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudyDirError(f"{path}: no {what} (is {path.parent} a study folder written by `inferledger study`?)") from None
    except ValueError as exc:
        raise StudyDirError(f"{path}: not valid JSON ({exc})") from None


def run_dirs(path: str | Path, study: dict | None = None) -> list[tuple[str, Path]]:
    """(run name, run folder) of every run the study lists, in its order."""
    path = Path(path)
    study = study or StudyIndex.read(path).doc
    return [(r["name"], path / r["dir"]) for r in study["runs"]]


def read_comparison(path: str | Path) -> dict[str, dict]:
    """comparison.json: {table name: {"title", "columns", "rows"}}, in the study's order."""
    file = Path(path) / COMPARISON_JSON
    doc = _load_json(file, COMPARISON_JSON)
    if not isinstance(doc, dict):
        raise StudyDirError(f"{file}: expected a JSON object of tables")
    for name, t in doc.items():
        if not isinstance(t, dict) or not isinstance(t.get("columns"), list) or not isinstance(t.get("rows"), list):
            raise StudyDirError(f"{file}: {name}: expected an object with a columns list and a rows list")
        width = len(t["columns"])
        for i, row in enumerate(t["rows"]):
            if not isinstance(row, list) or len(row) != width:
                raise StudyDirError(f"{file}: {name}.rows[{i}]: expected a list of {width} values")
    return doc
