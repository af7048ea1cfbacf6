"""The ledger's stages are declared modules: each says what it reads and creates, the order is derived
from that, and declarations that do not hold together are refused naming the module."""
from __future__ import annotations

import re
from importlib import resources

import pytest

from inferledger.ledger.modules import Module, ModuleError, check, ledger_modules, sql_module
from inferledger.ledger.reconstruct import PUBLIC_TABLES


def _sql(name: str, reads: str, creates: str, body: str, scope: str | None = "task") -> Module:
    head = f"-- scope: {scope}\n" if scope else ""
    return sql_module(name, f"-- {name}\n--\n{head}-- reads: {reads}\n-- creates: {creates}\n\n{body}")


def test_every_table_of_the_ledger_is_created_by_one_statement_in_one_file():
    created: dict[str, list[str]] = {}
    for f in resources.files("inferledger.ledger").iterdir():
        if f.name.endswith(".sql"):
            for table in re.findall(r"CREATE OR REPLACE (?:TEMP )?TABLE (\w+)", f.read_text()):
                created.setdefault(table, []).append(f.name)
    twice = {t: files for t, files in created.items() if len(files) > 1}
    assert twice == {}
    assert created["accounts"] == ["accounts.sql"] and created["reconciliation"] == ["reconciliation.sql"]
    for f in resources.files("inferledger.ledger").iterdir():  # and no module alters a table afterwards,
        if f.name.endswith(".sql"):  # but fills its own gap table, which its DDL gives the one gap shape
            changes = re.findall(r"\b(ALTER TABLE|INSERT INTO|UPDATE|DELETE FROM)\b\s*(\w*)", f.read_text())
            assert all(c == ("INSERT INTO", f"{f.name[:-4]}_gaps") for c in changes), (f.name, changes)


def test_the_order_runs_every_creator_before_its_readers():
    order = ledger_modules()
    position = {name: i for i, m in enumerate(order) for name in m.creates}
    for i, m in enumerate(order):
        for name in m.reads:
            assert position[name] < i, (m.source, name)
    assert {m.name for m in order} >= {"load", "critical_path", "marks", "gaps"}
    assert len(PUBLIC_TABLES) == len(set(PUBLIC_TABLES)) and {"accounts", "gaps", "critical_path"} <= set(PUBLIC_TABLES)


def test_the_order_follows_the_declarations_not_the_file_names():
    a = _sql("a_late", "zz_first_made", "late", "CREATE OR REPLACE TABLE late AS SELECT * FROM zz_first_made;")
    z = _sql("zz_first", "", "zz_first_made", "CREATE OR REPLACE TEMP TABLE zz_first_made AS SELECT 1 AS x;")
    assert [m.name for m in check([a, z])] == ["zz_first", "a_late"]
    assert a.public == ("late",) and z.public == ()


def test_a_table_created_by_two_modules_is_refused_naming_both():
    a = _sql("one", "", "t", "CREATE OR REPLACE TABLE t AS SELECT 1;")
    b = _sql("two", "", "t", "CREATE OR REPLACE TABLE t AS SELECT 2;")
    with pytest.raises(ModuleError, match=r"t is created by two ledger modules, one.sql and two.sql"):
        check([a, b])


def test_an_undeclared_read_is_refused_naming_the_module():
    a = _sql("maker", "", "made", "CREATE OR REPLACE TEMP TABLE made AS SELECT 1 AS x;")
    b = _sql("user", "", "used", "CREATE OR REPLACE TABLE used AS SELECT x FROM made;")
    with pytest.raises(ModuleError, match=r"user.sql reads made without declaring it \(created by maker.sql\)"):
        check([a, b])


def test_a_read_nobody_creates_or_never_used_is_refused():
    a = _sql("a", "ghost_table", "x", "CREATE OR REPLACE TABLE x AS SELECT * FROM ghost_table;")
    with pytest.raises(ModuleError, match="a.sql reads ghost_table, which no module creates"):
        check([a])
    m = _sql("m", "", "made", "CREATE OR REPLACE TEMP TABLE made AS SELECT 1 AS x;")
    b = _sql("b", "made", "y", "CREATE OR REPLACE TABLE y AS SELECT 1 AS x;")
    with pytest.raises(ModuleError, match="b.sql declares a read of made but never names it"):
        check([m, b])


def test_a_cycle_is_refused_naming_its_modules():
    a = _sql("a", "y", "x", "CREATE OR REPLACE TEMP TABLE x AS SELECT * FROM y;")
    b = _sql("b", "x", "y", "CREATE OR REPLACE TEMP TABLE y AS SELECT * FROM x;")
    with pytest.raises(ModuleError, match=r"cycle: (a -> b -> a|b -> a -> b)"):
        check([a, b])


def test_statements_must_create_what_the_header_declares_and_change_nothing_else():
    with pytest.raises(ModuleError, match=r"s.sql declares creates: x but its statements create x, extra"):
        _sql("s", "", "x", "CREATE OR REPLACE TABLE x AS SELECT 1; CREATE OR REPLACE TEMP TABLE extra AS SELECT 2;")
    with pytest.raises(ModuleError, match=r"s.sql changes other_table, a table it does not create"):
        _sql("s", "other_table", "x", "CREATE OR REPLACE TABLE x AS SELECT 1; "
                                       "ALTER TABLE other_table ADD COLUMN c INTEGER;")


def test_names_in_comments_and_strings_are_not_reads():
    a = _sql("maker", "", "made", "CREATE OR REPLACE TEMP TABLE made AS SELECT 1 AS x;")
    b = _sql("user", "", "used", "-- made is mentioned here only\n"
                                 "CREATE OR REPLACE TABLE used AS SELECT 'made' AS what, m.made AS f FROM (SELECT 1) m;")
    assert [m.name for m in check([a, b])] == ["maker", "user"]


def test_every_module_declares_a_scope_and_the_message_says_what_to_add():
    scopes = {m.name: m.scope for m in ledger_modules()}
    assert scopes["load"] == "run" and scopes["steps"] == "engine" and scopes["request_metrics"] == "task"
    assert scopes["gaps"] == "rollup" and scopes["latency"] == "rollup" and scopes["critical_path"] == "task"
    bare = _sql("new_stage", "", "x", "CREATE OR REPLACE TABLE x AS SELECT 1;", scope=None)
    with pytest.raises(ModuleError, match=r"new_stage.sql declares no scope: add a header line "
                                          r"`-- scope: run \| engine \| task \| rollup`"):
        check([bare])
    odd = _sql("odd", "", "x", "CREATE OR REPLACE TABLE x AS SELECT 1;", scope="cluster")
    with pytest.raises(ModuleError, match=r"odd.sql declares scope 'cluster'"):
        check([odd])


def test_a_task_module_that_reads_a_rollup_is_refused_naming_both():
    total = _sql("total", "", "run_total", "CREATE OR REPLACE TABLE run_total AS SELECT 1 AS n;", scope="rollup")
    share = _sql("share", "run_total", "share_of", "CREATE OR REPLACE TABLE share_of AS SELECT n FROM run_total;")
    with pytest.raises(ModuleError, match=r"share.sql has scope task but reads run_total \(scope rollup, total.sql\)"
                                          r".*declare share.sql `-- scope: rollup`"):
        check([total, share])
    per_task = _sql("per_task", "", "t", "CREATE OR REPLACE TABLE t AS SELECT 1 AS n;")
    base = _sql("base", "t", "b", "CREATE OR REPLACE TABLE b AS SELECT n FROM t;", scope="run")
    with pytest.raises(ModuleError, match=r"base.sql has scope run but reads t \(scope task"):
        check([per_task, base])
    rollup = _sql("sum_up", "t", "s", "CREATE OR REPLACE TABLE s AS SELECT sum(n) FROM t;", scope="rollup")
    assert [m.name for m in check([per_task, rollup])] == ["per_task", "sum_up"]


def test_every_quantile_of_our_figures_goes_through_the_one_rule():
    """The ledger's modules take percentiles and medians through the macros of ledger/macros.sql, so the
    rule is defined once; only the peers' views (each peer tool's own rule) call DuckDB's functions."""
    allowed = {"macros.sql", "peer_views.sql"}
    direct = re.compile(r"\b(quantile_cont|quantile_disc|quantile|median|percentile_cont|percentile_disc)\s*\(", re.I)
    found = []
    for m in ledger_modules():
        if m.source not in allowed:
            found += [f"{m.source}: {hit.group(0)}" for hit in direct.finditer(m.text)]
    assert not found, found
