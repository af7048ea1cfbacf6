"""Two house rules, read from the code like the import test: no function or method takes more than
MAX_PARAMS parameters (what belongs together travels as one typed value), and no two classes anywhere
in the house share a name (one name, one thing). The house is every part pyproject.toml installs
(its package-dir) and benchmarks/; tests/ stay outside."""
from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_PARAMS = 8  # besides self / cls
# where a long parameter list is the interface itself: a command's flags are its parameters (typer),
# and the kernel bindings mirror the C++ operators' signatures
PARAM_EXEMPT = ("cli/", "engine/cpu_kernels.py")


def house_files() -> list[Path]:
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    folders = sorted({*package_dirs.values(), "benchmarks"})
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py")
                  if not {".venv", "__pycache__", "tests"} & set(p.relative_to(ROOT).parts))


@cache  # parsed once for the module's rules (they only read the trees)
def trees() -> dict[str, ast.AST]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in house_files()}


def n_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    positional = [x.arg for x in (*a.posonlyargs, *a.args)]
    n = len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return n - (positional[:1] in (["self"], ["cls"]))


def long_signatures(files: dict[str, ast.AST]) -> list[str]:
    return [f"{path}:{node.lineno} {node.name} ({n_params(node)} parameters)"
            for path, tree in files.items() if not path.startswith(PARAM_EXEMPT)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and n_params(node) > MAX_PARAMS]


def shared_class_names(files: dict[str, ast.AST]) -> dict[str, list[str]]:
    where = defaultdict(list)
    for path, tree in files.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path}:{node.lineno}")
    return {name: places for name, places in where.items() if len(places) > 1}


def test_the_house_is_read_whole():
    files = {str(p.relative_to(ROOT)) for p in house_files()}
    assert {"collectors/capture/run.py", "ledger/reconstruct.py", "benchmarks/cuda_check.py",
            "inferledger/__init__.py", "cli/app.py"} <= files
    assert not any(f.startswith("tests/") or "/.venv/" in f for f in files)


def test_no_function_takes_more_than_eight_parameters():
    assert long_signatures(trees()) == [], (
        f"group what belongs together into one typed value (a frozen dataclass or a NamedTuple), at most "
        f"{MAX_PARAMS} parameters besides self / cls")


def test_no_two_classes_share_a_name():
    assert shared_class_names(trees()) == {}, "give each class a name of its own: one name, one thing"


def test_the_rules_see_a_violation():
    planted = ast.parse("class StepRow:\n    def f(self, a, b, c, d, e, f, *g, h=1):\n        pass\n"
                        "def g(a, b, c, d, e, f, g, h, **kw):\n    pass\n"
                        "def ok(cls, a, b, c, d, e, f, g, h):\n    pass\n")
    assert long_signatures({"planted.py": planted}) == ["planted.py:4 g (9 parameters)"]
    assert long_signatures({"cli/planted.py": planted}) == []
    two = {"a.py": planted, "b.py": ast.parse("def f():\n    class StepRow:\n        pass\n")}
    assert shared_class_names(two) == {"StepRow": ["a.py:1", "b.py:2"]}
