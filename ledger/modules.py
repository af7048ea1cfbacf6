"""The ledger's modules: what each stage reads and creates, checked, and the order derived from that.

A SQL module is a file `ledger/<name>.sql` whose header declares its inputs and outputs:

    -- reads: marks, clock_conv, point_of
    -- creates: figures

(a list may go on over lines that start with `--` and more blanks), and its scope, the unit its rows
are computed over (docs/SCALE.md), which the sharded executor (`ledger/sharded.py`) runs it by:

    -- scope: task

`run` (the run-level inputs: every shard computes it over what it is handed, the final ledger over
the whole run), `engine` (per engine instance: engine steps), `task` (per task bucket: a row of one
attempt or task depends only on that task's events, the run-level inputs and engine outputs) or
`rollup` (over the whole run, from the other scopes' outputs). A Python stage declares the same as
`READS`, `CREATES`, `PUBLIC` and `SCOPE` beside its `build(con, run)`. Reads and creates name tables and
macros; a table created `TEMP` stays inside the rebuild, any other is public (part of the ledger).

A Python stage creates the tables it builds from rows through `ledger/tables.py` `StageTable`s, declared
beside it: each is checked against its CREATES and PUBLIC.

Gaps: a module that can leave a figure NULL declares why in one TEMP table named `<module>_gaps`, in the
one gap shape (`ledger/tables.py` GAP_COLUMNS: a SQL module creates it with exactly that column list,
`CREATE OR REPLACE TEMP TABLE <module>_gaps (scope VARCHAR, ...)`, then fills it); the register
(`ledger/gaps.sql`, creating `gaps`) reads every gap table and nothing else but the collectors' rows
(`gaps_file`, the run's gaps.parquet): it numbers the union, it derives no gap of its own.

Checked whenever the modules are loaded, each error naming the module: every table or macro is created
by exactly one module; every read is created by some module; a SQL module creates exactly what it
declares and alters no other module's table; no module names another module's table or macro
without declaring it as a read, nor declares a read it never names; the gap rules above. The order is
then a topological sort of the read -> creator edges (`graphlib`), ties by module name; a cycle is an
error naming it.
"""
from __future__ import annotations

import ast
import graphlib
import hashlib
import inspect
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Callable

from inferledger.ledger.tables import GAP_COLUMNS, GAP_SUFFIX, StageTable

_CREATE = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(TEMP\s+|TEMPORARY\s+)?(TABLE|MACRO|VIEW)\s+(\w+)", re.IGNORECASE)
_CHANGE = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|ALTER\s+TABLE)\s+(\w+)", re.IGNORECASE)
_SQL_WORD = re.compile(r"\b(SELECT|CREATE|INSERT|DELETE|DESCRIBE|DROP|FROM)\b")
_DECLARED = re.compile(r"^--\s*(reads|creates|scope):(.*)$")
SCOPES = ("run", "engine", "task", "rollup")
# what a module of each scope may read: a shard has the run-level inputs, engine outputs are handed
# to task shards (and an engine shard computes the task-scope working sets over its own events)
_MAY_READ = {"run": {"run"}, "engine": {"run", "task", "engine"}, "task": {"run", "task", "engine"},
             "rollup": set(SCOPES)}
_SCOPE_HELP = ("add a header line `-- scope: run | engine | task | rollup` (a Python stage: SCOPE = ...): "
               "task when each row depends only on one task's events (attempts, per-request figures), engine "
               "for per-engine-step tables, rollup for anything over the whole run (percentiles, run totals, "
               "gaps), run for run-level inputs (docs/SCALE.md)")
# a gap table's DDL: CREATE OR REPLACE TEMP TABLE <module>_gaps (<its column list>)
_GAP_DDL = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP|TEMPORARY)\s+TABLE\s+(\w+)\s*\(([^()]*)\)",
                      re.IGNORECASE)
GAP_DDL = ", ".join(f"{c} VARCHAR" for c, _ in GAP_COLUMNS)
REGISTER = "gaps"             # the gap register's table
COLLECTED_GAPS = "gaps_file"  # the collectors' gap rows (gaps.parquet), which the register keeps as written
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
    scope: str | None             # run, engine, task or rollup (None: undeclared, refused by check)
    text: str                     # what it names: its SQL, or a Python stage's SQL strings, without comments
    sql: str = ""                 # SQL modules: the statements to run
    build: Callable | None = None  # Python stages: build(con, run)
    gap_columns: tuple[str, ...] | None = None  # the declared columns of its <name>_gaps table, if it has one


def strip_sql(text: str) -> str:
    """SQL without comments and string literals (what is left names tables, columns and functions)."""
    # one left-to-right pass: a quote inside a comment or "--" inside a string is not a delimiter
    return re.sub(r"'(?:[^']|'')*'|--[^\n]*", lambda m: "''" if m.group(0).startswith("'") else "", text)


def _names(value: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in value.split(",") if n.strip())


def _header(text: str) -> dict[str, list[str]]:
    """A SQL module's declarations: the reads, creates and scope lines of its header."""
    decl: dict[str, list[str]] = {"reads": [], "creates": [], "scope": []}
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
        elif current in ("reads", "creates") and re.match(r"^--\s{2,}\S", line):
            decl[current] += _names(line[2:])
        else:
            current = None
    return decl


def sql_module(name: str, text: str) -> Module:
    """A SQL module from its text: the declarations of its header, checked against its statements."""
    decl = _header(text)
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
    if len(decl["scope"]) > 1:
        raise ModuleError(f"ledger module {source} declares scope twice ({', '.join(decl['scope'])}); keep one")
    ddl = {t: " ".join(cols.split()) for t, cols in _GAP_DDL.findall(code)}
    gap = f"{name}{GAP_SUFFIX}"
    return Module(name, source, tuple(decl["reads"]), tuple(decl["creates"]),
                  tuple(t for t in decl["creates"] if made[t]), (decl["scope"] or [None])[0], code, sql=text,
                  gap_columns=tuple(_column(c) for c in ddl[gap].split(",")) if gap in ddl else None)


def _column(text: str) -> str:
    """`name TYPE` as the gap shape spells it (the type upper-case)."""
    name, _, kind = text.strip().partition(" ")
    return f"{name} {kind.strip().upper()}"


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
    source = f"{name}.py"
    tables = [v for v in vars(mod).values() if isinstance(v, StageTable)]
    for t in tables:
        if t.name not in mod.CREATES or t.temp == (t.name in mod.PUBLIC):
            why = "lack it" if t.name not in mod.CREATES else "say otherwise"
            raise ModuleError(f"ledger module {source} declares the {'TEMP' if t.temp else 'public'} table {t.name} "
                              f"(a StageTable) but its CREATES / PUBLIC {why}")
    gap = next((t for t in tables if t.name == f"{name}{GAP_SUFFIX}"), None)
    return Module(name, source, tuple(mod.READS), tuple(mod.CREATES), tuple(mod.PUBLIC),
                  getattr(mod, "SCOPE", None), strip_sql("\n".join(strings)), build=mod.build,
                  gap_columns=tuple(f"{c} {'VARCHAR' if str(ty) == 'string' else ty}" for c, ty in gap.columns)
                  if gap is not None else None)


def check_gaps(modules: list[Module]) -> None:
    """The gap rules (module docstring): one `<module>_gaps` per module, TEMP, in the one shape; the
    register reads each of them and nothing else but the collectors' rows."""
    gap_tables = set()
    for m in modules:
        for t in m.creates:
            if t.endswith(GAP_SUFFIX) and t != f"{m.name}{GAP_SUFFIX}":
                raise ModuleError(f"ledger module {m.source} creates {t}: a module's gaps are one table named after "
                                  f"the module, {m.name}{GAP_SUFFIX} (ledger/tables.py)")
        gap = f"{m.name}{GAP_SUFFIX}"
        if gap not in m.creates:
            continue
        gap_tables.add(gap)
        if gap in m.public:
            raise ModuleError(f"ledger module {m.source} creates {gap} as a public table; gap tables are TEMP "
                              "(the register, gaps, is the public one)")
        if m.gap_columns != tuple(GAP_DDL.split(", ")):
            got = ", ".join(m.gap_columns) if m.gap_columns else "no column list"
            raise ModuleError(f"ledger module {m.source} creates {gap} with {got}; a gap table has exactly "
                              f"({GAP_DDL}) (SQL: CREATE OR REPLACE TEMP TABLE {gap} ({GAP_DDL}), then INSERT INTO it)")
    register = next((m for m in modules if REGISTER in m.creates), None)
    if register is None:
        return
    missing = sorted(gap_tables - set(register.reads))
    if missing:
        raise ModuleError(f"the gap register {register.source} does not read {', '.join(missing)}: every gap table "
                          "is part of the union (add it to its reads and its UNION ALL)")
    other = sorted(set(register.reads) - gap_tables - {COLLECTED_GAPS})
    if other:
        raise ModuleError(f"the gap register {register.source} reads {', '.join(other)}: it unions the modules' gap "
                          "tables and derives no gap itself; declare the condition in the module that computes "
                          f"the table (its {GAP_SUFFIX} table)")


def check(modules: list[Module]) -> list[Module]:
    """The modules in an order that runs every creator before its readers; ModuleError if none exists."""
    creator: dict[str, Module] = {}
    for m in modules:
        for name in m.creates:
            if name in creator:
                raise ModuleError(f"{name} is created by two ledger modules, {creator[name].source} and {m.source}")
            creator[name] = m
    for m in modules:
        if m.scope not in SCOPES:
            what = f"declares scope {m.scope!r}" if m.scope else "declares no scope"
            raise ModuleError(f"ledger module {m.source} {what}: {_SCOPE_HELP}")
    for m in modules:
        wider = sorted(r for r in m.reads if r in creator and creator[r].scope not in _MAY_READ[m.scope])
        if wider:
            raise ModuleError(f"ledger module {m.source} has scope {m.scope} but reads {', '.join(wider)} "
                              f"(scope {creator[wider[0]].scope}, {creator[wider[0]].source}): a {m.scope} shard "
                              f"never sees it; declare {m.source} `-- scope: rollup` or read a {m.scope}-scope "
                              "table instead")
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
    check_gaps(modules)
    return _ordered(modules, creator)


def _ordered(modules: list[Module], creator: dict[str, Module]) -> list[Module]:
    """The modules in the order their reads give (every creator before its readers), ties by name."""
    graph = {m.name: {creator[r].name for r in m.reads if r in creator} - {m.name} for m in modules}
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


def _sql_texts(folder=None) -> list[tuple[str, str]]:
    """(name, text) of every SQL module: the files `ledger/<name>.sql` (of `folder`, else the package)."""
    files = sorted(f for f in (folder or resources.files("inferledger.ledger")).iterdir() if f.name.endswith(".sql"))
    return [(f.name[:-4], f.read_text()) for f in files]


@lru_cache(maxsize=1)
def ledger_modules() -> tuple[Module, ...]:
    """Every module of the ledger, in the derived order."""
    modules = [sql_module(name, text) for name, text in _sql_texts()]
    modules += [python_module(mod) for mod in _python_stages()]
    return tuple(check(modules))


def _code(m: Module) -> str:
    return m.sql if m.build is None else inspect.getsource(inspect.getmodule(m.build))


def code_sha256(modules) -> str:
    """The sha256 of the modules' code (a SQL module's file, a Python stage's source), in their order."""
    h = hashlib.sha256()
    for m in modules:
        code = _code(m)
        h.update(f"{m.source}\0{len(code)}\0{code}".encode())
    return h.hexdigest()


def declared_sha256(folder=None) -> str:
    """`code_sha256` of the modules in the derived order, from their declarations alone (SQL headers, a
    Python stage's READS and CREATES): the order `ledger_modules` derives, without parsing every statement
    and checking it, a tenth of a second a reader has no need to spend. `folder`: another copy of the
    SQL modules."""
    modules = [Module(name, f"{name}.sql", tuple(d["reads"]), tuple(d["creates"]), (), None, "", sql=text)
               for name, text in _sql_texts(folder) for d in [_header(text)]]
    modules += [Module(mod.__name__.rsplit(".", 1)[-1], f"{mod.__name__.rsplit('.', 1)[-1]}.py", tuple(mod.READS),
                       tuple(mod.CREATES), (), None, "", build=mod.build) for mod in _python_stages()]
    creator = {name: m for m in modules for name in m.creates}
    return code_sha256(_ordered(modules, creator))


@lru_cache(maxsize=1)
def modules_sha256() -> str:
    """The sha256 of every module's code, in the derived order: what a ledger records it was built by
    (`ledger_build`), so that a reader can tell a ledger another version of these modules built (other
    columns, or the same columns computed another way) and ask for a rebuild. Read from the files once
    per process: a module edited in a source checkout changes it."""
    return declared_sha256()


def public_tables() -> tuple[str, ...]:
    """The ledger's public tables, in module order."""
    return tuple(t for m in ledger_modules() for t in m.public)
