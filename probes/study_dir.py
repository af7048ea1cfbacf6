"""The study folder's format: a set of run directories that differ in one knob, and their comparison.

    STUDY_DIR/
      study.json        the study: its name, question, knob, state, its runs (name, folder, knob
                        setting), the comparison's tables (the key table first) and the figures to draw
      comparison.csv    the key table: one row per run (or per point of the knob)
      comparison.json   every table of the comparison: {name: {title, columns, rows}}
      runs/<name>/      each a normal run directory (reconstruct, query and report open it alone)
      report.html       derived (`inferledger report STUDY_DIR`)

The studies write it (studies/framework.py); the report, the query surface and the command line read
it through `read_study` and `read_comparison`, which name the file and the key that is wrong.
"""
from __future__ import annotations

import json
from pathlib import Path

STUDY_FILE = "study.json"
RUNS_DIR = "runs"
COMPARISON_CSV = "comparison.csv"
COMPARISON_JSON = "comparison.json"
FORMAT_VERSION = 1
STATES = ("running", "complete", "failed")
FIGURE_KINDS = ("timeline", "curve", "kv_blocks")  # what the report knows how to draw

# study.json: key -> (type, required)
_KEYS = {"format": (int, True), "name": (str, True), "question": (str, True), "knob": (str, True),
         "state": (str, True), "runs": (list, True), "tables": (list, False), "figures": (list, False),
         "options": (dict, False), "reading": (str, False), "error": (str, False), "created": (str, False)}
_RUN_KEYS = {"name": str, "dir": str, "knob": dict}


class StudyDirError(ValueError):
    """A study folder cannot be read as one; the message names the file and the key."""


def is_study_dir(path: str | Path) -> bool:
    return (Path(path) / STUDY_FILE).is_file()


def _load_json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudyDirError(f"{path}: no {what} (is {path.parent} a study folder written by `inferledger study`?)") from None
    except ValueError as exc:
        raise StudyDirError(f"{path}: not valid JSON ({exc})") from None


def read_study(path: str | Path) -> dict:
    """study.json, checked: every required key present with its type, each run named with its folder."""
    path = Path(path)
    file = path / STUDY_FILE
    doc = _load_json(file, STUDY_FILE)
    if not isinstance(doc, dict):
        raise StudyDirError(f"{file}: expected a JSON object")
    for key, (kind, required) in _KEYS.items():
        if key not in doc:
            if required:
                raise StudyDirError(f"{file}: {key}: missing")
            continue
        if not isinstance(doc[key], kind) or isinstance(doc[key], bool):
            raise StudyDirError(f"{file}: {key}: expected {kind.__name__}, got {type(doc[key]).__name__}")
    if doc["format"] != FORMAT_VERSION:
        raise StudyDirError(f"{file}: format: {doc['format']} is not {FORMAT_VERSION}, the format this version reads")
    if doc["state"] not in STATES:
        raise StudyDirError(f"{file}: state: {doc['state']!r} is not one of {', '.join(STATES)}")
    for i, run in enumerate(doc["runs"]):
        for key, kind in _RUN_KEYS.items():
            if not isinstance(run, dict) or not isinstance(run.get(key), kind):
                raise StudyDirError(f"{file}: runs[{i}].{key}: expected {kind.__name__}")
    for i, fig in enumerate(doc.get("figures", [])):
        if not isinstance(fig, dict) or fig.get("kind") not in FIGURE_KINDS:
            raise StudyDirError(f"{file}: figures[{i}].kind: expected one of {', '.join(FIGURE_KINDS)}")
    return doc


def run_dirs(path: str | Path, study: dict | None = None) -> list[tuple[str, Path]]:
    """(run name, run folder) of every run the study lists, in its order."""
    path = Path(path)
    study = study or read_study(path)
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
