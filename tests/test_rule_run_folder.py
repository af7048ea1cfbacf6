"""Rules of the run folder's schema, like the import test: the run folder's file names are spelled in
probes/run_folder.py alone (every other library module takes its constants or its models), and the
model's shape is one class (probes/model_shape.py), not a second one with the same fields."""
from __future__ import annotations

import ast
from pathlib import Path

from inferledger.probes.model_shape import ARCHITECTURE_KEYS, ModelShape
from inferledger.probes.run_folder import FILE_NAMES

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("probes", "costmodel", "engine", "serve", "collectors", "ledger", "report", "studies", "cli", "inferledger")
SCHEMA = ROOT / "probes" / "run_folder.py"
SHAPE = ROOT / "probes" / "model_shape.py"
# the shape's geometry under either of its spellings (the type's fields, the manifest's architecture keys)
GEOMETRY = {name for pair in ARCHITECTURE_KEYS.items() for name in pair} - {"tied_embeddings", "tie_embeddings"}


def library_files() -> list[Path]:
    return [p for part in LIBRARY for p in sorted((ROOT / part).rglob("*.py"))]


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def file_name_spellings(path: Path, source: str | None = None) -> list[str]:
    """`file:line: 'literal'` for each string constant of code (docstrings aside) naming a run-folder file."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"), str(path))
    skip = _docstrings(tree)
    return [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and any(name in node.value for name in FILE_NAMES)]


def shape_classes(path: Path, source: str | None = None) -> list[str]:
    """`file:Class` for each class whose annotated fields hold the shape's geometry."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            if len(fields & GEOMETRY) >= 5:
                out.append(f"{path.relative_to(ROOT)}:{node.name}")
    return out


def test_run_folder_file_names_are_spelled_only_in_the_schema_module():
    found = [hit for p in library_files() if p != SCHEMA for hit in file_name_spellings(p)]
    assert found == [], "spell these through probes/run_folder.py (its constants or its models):\n" + "\n".join(found)


def test_the_model_shape_is_one_class():
    found = [hit for p in library_files() for hit in shape_classes(p)]
    assert found == [f"{SHAPE.relative_to(ROOT)}:{ModelShape.__name__}"], found


def test_the_rules_find_a_planted_violation():
    plant = ROOT / "ledger" / "planted.py"
    source = ('"""Reads manifest.json (a docstring may name it)."""\n'
              'from dataclasses import dataclass\n\n'
              'PATH = "runs/x/manifest.json"\n\n'
              '@dataclass\nclass Shape2:\n    n_layers: int\n    d_model: int\n    n_heads: int\n'
              '    n_kv_heads: int\n    head_dim: int\n')
    assert file_name_spellings(plant, source) == ["ledger/planted.py:4: 'runs/x/manifest.json'"]
    assert shape_classes(plant, source) == ["ledger/planted.py:Shape2"]
