"""The import arrows between the parts are the ones docs/ARCHITECTURE.md allows, and no module
imports itself through a cycle. The table is read from the doc, so the doc and the code cannot drift."""
from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("probes", "costmodel", "engine", "serve", "collectors", "ledger", "report", "studies", "cli", "inferledger")


def allowed_arrows(doc: str, marker: str = "arrows") -> dict[str, set[str]]:
    """part (or room) -> what it may import, from the table between the doc's markers."""
    block = re.search(rf"<!-- {marker}:.*?-->(.*?)<!-- /{marker} -->", doc, re.S)
    assert block, f"docs/ARCHITECTURE.md has no {marker} table between its markers"
    table = {}
    for line in block.group(1).strip().splitlines()[2:]:  # past the header and its rule
        part, targets = (c.strip() for c in line.strip().strip("|").split("|"))
        table[part] = {t.strip() for t in targets.split(",") if t.strip()}
    return table


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "inferledger":
        parts = parts[1:]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["inferledger", *parts])


def modules() -> dict[str, Path]:
    found = {}
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ours that `path` imports, at any depth of the file (lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known}
    return {m for m in out if m and (m == "inferledger" or m.startswith("inferledger.")) and m != name}


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PARTS else "inferledger"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_the_doc_names_every_part_once():
    table = allowed_arrows((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    assert set(table) == set(PARTS)
    assert all(targets <= set(PARTS) for targets in table.values())


def test_every_import_between_parts_is_an_arrow_the_doc_allows(graph):
    table = allowed_arrows((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    wrong = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                   if part_of(t) != part_of(m) and part_of(t) not in table[part_of(m)])
    assert wrong == []


def room_of(module: str) -> str | None:
    """The collectors' sub-package a module is in; None for anything else (and the package itself)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "collectors" else None


def test_every_collectors_room_is_a_folder_the_doc_names():
    table = allowed_arrows((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8"), "rooms")
    folders = {p.name for p in (ROOT / "collectors").iterdir() if (p / "__init__.py").is_file()}
    assert set(table) == folders
    assert all(targets <= folders for targets in table.values())
    assert sorted(p.name for p in (ROOT / "collectors").glob("*.py")) == ["__init__.py"]


def test_every_import_between_collectors_rooms_is_one_the_doc_allows(graph):
    table = allowed_arrows((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8"), "rooms")
    wrong = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                   if room_of(m) and room_of(t) and room_of(t) != room_of(m) and room_of(t) not in table[room_of(m)])
    assert wrong == []


def test_nothing_imports_the_command_line(graph):
    assert sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if part_of(t) == "cli" and part_of(m) != "cli") == []


def test_no_import_cycle_between_modules(graph):
    known = set(graph)
    edges = {m: {t for t in targets if t in known} for m, targets in graph.items()}
    try:
        list(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_the_checker_sees_a_forbidden_arrow_and_a_cycle(tmp_path):
    # the rules above must be able to fail: a ledger module importing a collector, and a two-module circle
    doc = "<!-- arrows: -->\n| part | may import |\n| --- | --- |\n| ledger | probes |\n<!-- /arrows -->"
    assert allowed_arrows(doc) == {"ledger": {"probes"}}
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from inferledger.collectors.rundir import writer\nimport inferledger.x.b\n")
    b.write_text("def f():\n    from inferledger.x import a\n")
    known = {"inferledger.x.a": a, "inferledger.x.b": b, "inferledger.collectors.rundir.writer": a}
    assert imports("inferledger.x.a", a, known) == {"inferledger.collectors.rundir", "inferledger.collectors.rundir.writer",
                                                           "inferledger.x.b"}
    assert imports("inferledger.x.b", b, known) == {"inferledger.x", "inferledger.x.a"}
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).static_order())


def test_the_report_the_exports_and_the_summary_share_only_the_read_helpers(graph):
    # the HTML report does not read the terminal summary, and the exports do not read the report's panels
    report = {m for m in graph if m.startswith("inferledger.report.")}
    exports = {m for m in report if m.rpartition(".")[2].startswith("export")}
    summary = {"inferledger.report.summary"}
    panels = report - exports - summary - {"inferledger.report.read", "inferledger.report.clocks",
                                           "inferledger.report.tables"}
    assert sorted(f"{m} -> {t}" for m in panels for t in graph[m] if t in summary) == []
    assert sorted(f"{m} -> {t}" for m in exports for t in graph[m] if t in panels | summary) == []
    assert sorted(f"{m} -> {t}" for m in summary for t in graph[m] if t in panels | exports) == []


def test_commands_are_registered_by_app_and_import_neither_it_nor_each_other(graph):
    commands = {m for m in graph if m.rpartition(".")[2].startswith("cmd_")}
    assert sorted(f"{m} -> {t}" for m in commands for t in graph[m]
                  if t == "inferledger.cli.app" or t in commands) == []
    assert commands <= graph["inferledger.cli.app"]  # each one imported by name, none dropped quietly
