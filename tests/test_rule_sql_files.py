"""Rules between the parts that the import test cannot see, held as tests so parallel work cannot undo them.

SQL on another part's file. The ledger's file (ledger.duckdb) is the ledger's: every other part reads
it through the ledger, by a function of `inferledger.ledger` (the read-only query surface
`inferledger.open` / `ledger.query.open_ledger`, `ledger.fit_read.ledger_fit_points`,
`ledger.critical_path.ledger_dags`), so each such read is an import arrow `tests/test_architecture.py`
checks. DuckDB is the only SQL engine of the house, so the rule is: no module of an installed part
outside `ledger/` imports duckdb (lazily or not; a type-only import under TYPE_CHECKING runs nothing).
The one exception is `collectors/rundir/repartition.py`: it runs DuckDB on the run folder's own event
parts, the format its room writes (`collectors/rundir/` writes run folders; `probes/run_dir.py` names
the partitions), to rewrite them in the partitioned layout under a memory limit; it opens no ledger.
The run-folder writer (`collectors/rundir/writer.py`) writes Parquet through pyarrow and needs no
exception. Scripts outside the installed parts (`benchmarks/`, `tests/`) may open a ledger to time or
check it.

One gap register. Every gap is declared by exactly one module, in one shape: a module's TEMP table
`<module>_gaps` with exactly the columns of `ledger/tables.py` GAP_COLUMNS, and `gaps` (ledger/gaps.sql)
the union of those tables and the collectors' rows, deriving nothing itself (`ledger/modules.py`
refuses any other shape when the modules load).
"""
from __future__ import annotations

import ast
import tempfile
from pathlib import Path

import duckdb
import pytest
from test_architecture import PARTS, ROOT

from inferledger.ledger.load import RunFiles
from inferledger.ledger.modules import (COLLECTED_GAPS, GAP_DDL, REGISTER, ModuleError, check, ledger_modules,
                                        python_module, sql_module)
from inferledger.ledger.stages import run_modules, set_variables
from inferledger.ledger.tables import GAP_COLUMNS

MAY_RUN_SQL = {"ledger"}  # the parts (or part/room folders) whose modules may import duckdb
MAY_RUN_SQL_FILES = {"collectors/rundir/repartition.py"}  # the run folder's own parts (module docstring)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (they run nothing)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def duckdb_imports(path: Path) -> list[int]:
    """The lines where `path` imports duckdb, at any depth (lazy imports included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    typing_only = _type_checking_only(tree)
    lines = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "duckdb" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "duckdb":
            lines.append(node.lineno)
    return lines


def sql_outside_the_ledger(root: Path = ROOT) -> list[str]:
    """`file:line` of every duckdb import in an installed part outside the ledger and its exceptions."""
    found = []
    for part in PARTS:
        if part in MAY_RUN_SQL:
            continue
        for path in sorted((root / part).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel not in MAY_RUN_SQL_FILES:
                found += [f"{rel}:{line}" for line in duckdb_imports(path)]
    return found


def test_no_part_outside_the_ledger_runs_sql_on_a_file():
    assert sql_outside_the_ledger() == []


def test_the_rule_finds_sql_on_the_ledgers_file_in_another_part(tmp_path):
    """The cost model as it was: a lazy import and duckdb.connect on ledger.duckdb inside a function."""
    for part in PARTS:
        (tmp_path / part).mkdir()
    (tmp_path / "costmodel" / "fit.py").write_text(
        "def points_from_ledger(ledger_path):\n"
        "    import duckdb\n\n"
        "    with duckdb.connect(str(ledger_path), read_only=True) as con:\n"
        "        return con.execute('SELECT flops FROM step_model').fetchall()\n")
    (tmp_path / "report" / "read.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import duckdb\n")  # type-only: runs nothing
    (tmp_path / "cli" / "cmd_x.py").write_text("from duckdb import connect\n")
    (tmp_path / "ledger" / "query.py").write_text("import duckdb\n")  # the ledger's own
    (tmp_path / "collectors" / "rundir").mkdir()
    (tmp_path / "collectors" / "rundir" / "repartition.py").write_text("import duckdb\n")
    assert sql_outside_the_ledger(tmp_path) == ["costmodel/fit.py:2", "cli/cmd_x.py:1"]


# -- one gap register ------------------------------------------------------------------------------

_GAPS_DDL = f"CREATE OR REPLACE TEMP TABLE {{}} ({GAP_DDL});"


def _sql(name: str, reads: str, creates: str, body: str, scope: str = "rollup"):
    return sql_module(name, f"-- {name}\n--\n-- scope: {scope}\n-- reads: {reads}\n-- creates: {creates}\n\n{body}")


def _register(reads: str):
    union = " UNION ALL ".join(f"SELECT * FROM {t}" for t in reads.split(", "))
    body = f"CREATE OR REPLACE TABLE gaps AS {union};"
    return _sql("gaps", reads, "gaps", body)


def _figures(gap_ddl: str | None = None):
    ddl = gap_ddl or _GAPS_DDL.format("figures_gaps")
    return _sql("figures", "", "figures, figures_gaps",
                "CREATE OR REPLACE TEMP TABLE figures AS SELECT 1 AS x;\n"
                f"{ddl}\nINSERT INTO figures_gaps SELECT 'run', NULL, 'x', 'y', 'z' FROM figures;", scope="task")


def _collector():
    return _sql("load", "", COLLECTED_GAPS, f"CREATE OR REPLACE TEMP TABLE {COLLECTED_GAPS} AS SELECT 1 AS gap_id;",
                scope="run")


def test_every_gap_table_is_declared_by_one_module_in_the_one_shape():
    modules = ledger_modules()
    gap_tables = {t: m for m in modules for t in m.creates if t.endswith("_gaps")}
    assert gap_tables, "no module declares gaps"
    for table, m in gap_tables.items():
        assert table == f"{m.name}_gaps" and table not in m.public, m.source
        assert m.gap_columns == tuple(GAP_DDL.split(", ")), m.source
    register = next(m for m in modules if REGISTER in m.creates)
    assert set(register.reads) == set(gap_tables) | {COLLECTED_GAPS}
    declaring = {m.name for m in gap_tables.values()}
    assert {"figures", "layers", "load", "window", "step_model", "critical_path"} <= declaring


def test_a_well_formed_register_passes():
    assert [m.name for m in check([_collector(), _figures(), _register(f"figures_gaps, {COLLECTED_GAPS}")])] \
        == ["figures", "load", "gaps"]


def test_a_gap_table_not_named_after_its_module_is_refused():
    odd = _sql("window", "", "window_points, model_gaps",
               f"CREATE OR REPLACE TEMP TABLE window_points AS SELECT 1 AS x;\n{_GAPS_DDL.format('model_gaps')}")
    with pytest.raises(ModuleError, match=r"window.sql creates model_gaps: .* window_gaps"):
        check([odd])


def test_a_gap_table_of_another_shape_is_refused_naming_the_shape():
    three = _figures("CREATE OR REPLACE TEMP TABLE figures_gaps (affects VARCHAR, needs VARCHAR, detail VARCHAR);")
    with pytest.raises(ModuleError, match=r"figures.sql creates figures_gaps with affects VARCHAR, needs VARCHAR, "
                                          r"detail VARCHAR; a gap table has exactly \(scope VARCHAR, subject_id"):
        check([_collector(), three, _register(f"figures_gaps, {COLLECTED_GAPS}")])
    untyped = _sql("figures", "", "figures_gaps", "CREATE OR REPLACE TEMP TABLE figures_gaps AS SELECT 'run' AS scope;")
    with pytest.raises(ModuleError, match=r"figures_gaps with no column list"):
        check([untyped])


def test_a_public_gap_table_is_refused():
    public = _sql("figures", "", "figures_gaps", f"CREATE OR REPLACE TABLE figures_gaps ({GAP_DDL});")
    with pytest.raises(ModuleError, match=r"figures.sql creates figures_gaps as a public table"):
        check([public])


def test_a_register_that_derives_a_gap_or_misses_a_gap_table_is_refused():
    derives = _register(f"figures_gaps, figures, {COLLECTED_GAPS}")
    with pytest.raises(ModuleError, match=r"gaps.sql reads figures: it unions the modules' gap tables and derives "
                                          r"no gap itself"):
        check([_collector(), _figures(), derives])
    with pytest.raises(ModuleError, match=r"gaps.sql does not read figures_gaps: every gap table is part of the union"):
        check([_collector(), _figures(), _register(COLLECTED_GAPS)])


def _stage(tmp_path: Path, creates: str, public: str):
    """A Python stage written to a file and imported (python_module reads its source)."""
    import importlib.util

    path = tmp_path / "planted_stage.py"
    path.write_text("import pyarrow as pa\n\nfrom inferledger.ledger.tables import StageTable, gap_table\n\n"
                    f"READS = ()\nCREATES = {creates}\nPUBLIC = {public}\nSCOPE = 'rollup'\n"
                    "PLANTED = StageTable('planted', (('x', pa.string()),))\nGAPS = gap_table('planted_stage')\n\n\n"
                    "def build(con, run):\n    PLANTED.store(con, [])\n    GAPS.store(con, [])\n")
    spec = importlib.util.spec_from_file_location("planted_stage", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return python_module(mod)


def test_a_python_stages_tables_are_its_declared_ones(tmp_path):
    stage = _stage(tmp_path, "('planted', 'planted_stage_gaps')", "('planted',)")
    assert stage.gap_columns == tuple(GAP_DDL.split(", ")) and stage.public == ("planted",)
    with pytest.raises(ModuleError, match=r"planted_stage.py declares the TEMP table planted_stage_gaps \(a StageTable\) "
                                          r"but its CREATES / PUBLIC say otherwise"):
        _stage(tmp_path, "('planted', 'planted_stage_gaps')", "('planted', 'planted_stage_gaps')")
    with pytest.raises(ModuleError, match=r"declares the TEMP table planted_stage_gaps \(a StageTable\) but its CREATES / "
                                          r"PUBLIC lack it"):
        _stage(tmp_path, "('planted',)", "('planted',)")


def test_the_register_is_the_union_of_the_modules_gap_tables():
    """Built from a sample run: every gap table has the one shape in DuckDB, and `gaps` holds exactly
    their rows and the collectors' (nothing added, nothing lost)."""
    run_dir = ROOT / "samples" / "peers" / "vllm-0.32-cpu"
    from inferledger.collectors.evidence.vllm_rejoin import rejoin
    from inferledger.ledger.reconstruct import run_variables
    from inferledger.probes.events import EVENT_SCHEMA
    from inferledger.probes.run_dir import list_parts
    from inferledger.probes.run_folder import Manifest

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "run"
        rejoin(run_dir, d)
        con = duckdb.connect()
        manifest = Manifest.read(d)
        set_variables(con, run_variables(manifest, "r"))
        run_modules(con, ledger_modules(), RunFiles(d, list_parts(d / "events", EVENT_SCHEMA), manifest=manifest))
        tables = [t for m in ledger_modules() for t in m.creates if t.endswith("_gaps")]
        union = []
        for t in tables:
            assert con.execute(f"DESCRIBE {t}").fetchall() == [
                (c, "VARCHAR", "YES", None, None, None) for c, _ in GAP_COLUMNS], t
            union += con.execute(f"SELECT scope, subject_id, affects, needs, detail FROM {t}").fetchall()
        ledger_rows = con.execute("SELECT scope, subject_id, affects, needs, detail FROM gaps "
                                  "WHERE origin = 'ledger'").fetchall()
        n_collected = con.execute(f"SELECT count(*) FROM {COLLECTED_GAPS}").fetchone()[0]
        n_collector = con.execute("SELECT count(*) FROM gaps WHERE origin = 'collector'").fetchone()[0]
        con.close()
    assert sorted(ledger_rows, key=repr) == sorted(union, key=repr) and len(union) > 0
    assert n_collector == n_collected
