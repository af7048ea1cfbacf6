"""The ledger's modules: what each stage reads and creates, checked, and the order derived from that.

A SQL module is a file `ledger/<name>.sql` whose header declares its inputs and outputs:

    -- reads: marks, clock_conv, point_of
    -- creates: figures

(a list may go on over lines that start with `--` and more blanks). A Python stage declares the same
as `READS`, `CREATES` and `PUBLIC` beside its `build(con, run)`. Reads and creates name tables and
macros; a table created `TEMP` stays inside the rebuild, any other is public (part of the ledger).

Checked whenever the modules are loaded, each error naming the module: every table or macro is created
by exactly one module; every read is created by some module; a SQL module creates exactly what it
declares and alters no other module's table; no module names another module's table or macro
without declaring it as a read, nor declares a read it never names. The order is then a topological
sort of the read -> creator edges (`graphlib`), ties by module name; a cycle is an error naming it.
"""
from __future__ import annotations

import ast
import graphlib
import inspect
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Callable

_CREATE = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(TEMP\s+|TEMPORARY\s+)?(TABLE|MACRO|VIEW)\s+(\w+)", re.IGNORECASE)
_CHANGE = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|ALTER\s+TABLE)\s+(\w+)", re.IGNORECASE)
_SQL_WORD = re.compile(r"\b(SELECT|CREATE|INSERT|DELETE|DESCRIBE|DROP|FROM)\b")
_DECLARED = re.compile(r"^--\s*(reads|creates):(.*)$")
_WORD = re.compile(r"(?<![.\w])([A-Za-z_]\w*)(?![\w.])")  # not a qualifier nor a field of one


class ModuleError(Exception):
    """The modules' declarations do not hold together; the message names the module."""


@dataclass(frozen=True)
class Module:
    name: str                     # "figures", "critical_path"
    source: str                   # the file it lives in, for messages
    reads: tuple[str, ...]
    creates: tuple[str, ...]
    public: tuple[str, ...]       # the created tables that are part of the ledger
    text: str                     # what it names: its SQL, or a Python stage's SQL strings, without comments
    sql: str = ""                 # SQL modules: the statements to run
    build: Callable | None = None  # Python stages: build(con, run)


def strip_sql(text: str) -> str:
    """SQL without comments and string literals (what is left names tables, columns and functions)."""
    # one left-to-right pass: a quote inside a comment or "--" inside a string is not a delimiter
    return re.sub(r"'(?:[^']|'')*'|--[^\n]*", lambda m: "''" if m.group(0).startswith("'") else "", text)


def _names(value: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in value.split(",") if n.strip())


def sql_module(name: str, text: str) -> Module:
    """A SQL module from its text: the declarations of its header, checked against its statements."""
    decl: dict[str, list[str]] = {"reads": [], "creates": []}
    current = None
    for line in text.splitlines():
        if not line.startswith("--"):
            if line.strip():
                break  # the header ends at the first statement
            continue
        m = _DECLARED.match(line)
        if m:
            current = m.group(1)
            decl[current] += _names(m.group(2))
        elif current and re.match(r"^--\s{2,}\S", line):
            decl[current] += _names(line[2:])
        else:
            current = None
    source = f"{name}.sql"
    code = strip_sql(text)
    made = {}
    for temp, kind, table in _CREATE.findall(code):
        made[table] = kind.upper() == "TABLE" and not temp
    if set(made) != set(decl["creates"]):
        raise ModuleError(f"ledger module {source} declares creates: {', '.join(decl['creates']) or '(none)'} "
                          f"but its statements create {', '.join(made) or 'nothing'}")
    for table in _CHANGE.findall(code):
        if table not in made:
            raise ModuleError(f"ledger module {source} changes {table}, a table it does not create "
                              "(each table is made whole by the one module that creates it)")
    return Module(name, source, tuple(decl["reads"]), tuple(decl["creates"]),
                  tuple(t for t in decl["creates"] if made[t]), code, sql=text)


def python_module(mod) -> Module:
    """A Python stage from its module: READS, CREATES, PUBLIC and build; its text is its SQL strings."""
    tree = ast.parse(inspect.getsource(mod))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    strings = [n.value for n in ast.walk(tree)  # the SQL it runs, not its messages
               if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
               and _SQL_WORD.search(n.value)]
    name = mod.__name__.rsplit(".", 1)[-1]
    return Module(name, f"{name}.py", tuple(mod.READS), tuple(mod.CREATES), tuple(mod.PUBLIC),
                  strip_sql("\n".join(strings)), build=mod.build)


def check(modules: list[Module]) -> list[Module]:
    """The modules in an order that runs every creator before its readers; ModuleError if none exists."""
    creator: dict[str, Module] = {}
    for m in modules:
        for name in m.creates:
            if name in creator:
                raise ModuleError(f"{name} is created by two ledger modules, {creator[name].source} and {m.source}")
            creator[name] = m
    for m in modules:
        words = set(_WORD.findall(m.text))
        for name in m.reads:
            if name not in creator:
                raise ModuleError(f"ledger module {m.source} reads {name}, which no module creates")
            if name not in words:
                raise ModuleError(f"ledger module {m.source} declares a read of {name} but never names it")
        undeclared = sorted(w for w in words if w in creator and creator[w] is not m and w not in m.reads)
        if undeclared:
            raise ModuleError(f"ledger module {m.source} reads {', '.join(undeclared)} without declaring it "
                              f"(created by {', '.join(sorted({creator[w].source for w in undeclared}))})")
    graph = {m.name: {creator[r].name for r in m.reads} - {m.name} for m in modules}
    sorter = graphlib.TopologicalSorter(graph)
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        raise ModuleError(f"ledger modules read each other in a cycle: {' -> '.join(exc.args[1])}") from None
    by_name = {m.name: m for m in modules}
    order = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        order += [by_name[n] for n in ready]
        sorter.done(*ready)
    return order


def _python_stages() -> list:
    from inferledger.ledger import critical_path, load, prediction_check, request_model, step_fit, step_model
    return [load, critical_path, step_model, step_fit, request_model, prediction_check]


@lru_cache(maxsize=1)
def ledger_modules() -> tuple[Module, ...]:
    """Every module of the ledger, in the derived order."""
    files = sorted(f for f in resources.files("inferledger.ledger").iterdir() if f.name.endswith(".sql"))
    modules = [sql_module(f.name[:-4], f.read_text()) for f in files]
    modules += [python_module(mod) for mod in _python_stages()]
    return tuple(check(modules))


def public_tables() -> tuple[str, ...]:
    """The ledger's public tables, in module order."""
    return tuple(t for m in ledger_modules() for t in m.public)
