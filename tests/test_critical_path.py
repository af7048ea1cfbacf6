"""Critical paths and what-if on the book's chapter-1 case and the two-branch join."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.ledger.critical_path import Dag, DagError, load_dags, longest_path, what_if
from inferledger.ledger.reconstruct import reconstruct
from sample_runs import built_e0, copy_to



@pytest.fixture(scope="module")
def book_run(tmp_path_factory):
    """The critical-path book's run rebuilt (the session's shared build, tests/sample_runs.py), this module's copy."""
    return copy_to(built_e0(tmp_path_factory, "critical_path_book"), tmp_path_factory.mktemp("cp") / "book")


def _dag(run, task):
    con = duckdb.connect(str(run / "ledger.duckdb"), read_only=True)
    try:
        return load_dags(con, scope="task", scope_id=task)[0]
    finally:
        con.close()


def test_book_case_whatif_decode(book_run):
    dag = _dag(book_run, "T1")
    before, cut = what_if(dag, "S6_decode", shrink=0.30)
    assert before.e2e_ms == pytest.approx(6700.0)
    assert cut.e2e_ms == pytest.approx(5770.0)
    _, zero = what_if(dag, "S6_decode", to_ms=0.0)
    assert zero.e2e_ms == pytest.approx(3600.0)
    for res in (before, cut, zero):
        assert "tool_clause_lookup" not in res.path
    assert zero.path == ["S1_upload", "S2_parse", "S3_retrieve", "S4_rerank", "S5_prefill", "S6_decode", "S8_assemble"]


def test_two_branches_path_switches(book_run):
    dag = _dag(book_run, "T2")
    assert what_if(dag, "branch_short", to_ms=1000.0)[1].e2e_ms == pytest.approx(5000.0)
    long_cut = what_if(dag, "branch_long", to_ms=1000.0)[1]
    assert long_cut.e2e_ms == pytest.approx(2000.0)
    assert long_cut.path == ["branch_short", "join"]


def test_whatif_command_prints_the_new_end_to_end(book_run):
    result = CliRunner().invoke(app, ["whatif", str(book_run), "--node", "S6_decode", "--shrink", "30%"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "6700" in result.output and "5770" in result.output and "-930" in result.output
    bad = CliRunner().invoke(app, ["whatif", str(book_run), "--node", "nope", "--to", "0ms"])
    assert bad.exit_code == 2 and "no critical-path node named 'nope'" in bad.output


def test_cycle_and_negative_duration_are_refused():
    dag = Dag("task", "T", {"a": 1.0, "b": 2.0}, {"a": "span", "b": "span"}, {"a": ["b"], "b": ["a"]})
    with pytest.raises(DagError, match="cycle"):
        longest_path(dag)
    with pytest.raises(DagError, match="duration"):
        longest_path(Dag("task", "T", {"a": -1.0}, {"a": "span"}, {}))


def _rebuild(tmp_path, lines: list[dict]):
    """An E0 archive of `lines`, imported and reconstructed: a read-only connection to its ledger."""
    archive = tmp_path / "archive.jsonl"
    archive.write_text("".join(json.dumps(x) + "\n" for x in lines))
    import_archive(archive, tmp_path / "run")
    return duckdb.connect(str(reconstruct(tmp_path / "run").path), read_only=True)


def test_a_cycle_in_an_archive_becomes_a_gap(tmp_path):
    lines = [{"name": "clock.domain", "clock": "c", "source": "archive", "attrs": {"host": "h"}}]
    for name, after in (("a", ["b"]), ("b", ["a"])):
        lines.append({"name": "span.start", "source": "app", "task_id": "T9", "ts_ns": 0, "clock": "c",
                      "attrs": {"span": name, "after": after}})
        lines.append({"name": "span.end", "source": "app", "task_id": "T9", "ts_ns": 10, "clock": "c",
                      "attrs": {"span": name}})
    con = _rebuild(tmp_path, lines)
    assert con.execute("select count(*) from critical_path where scope_id = 'T9'").fetchone()[0] == 0
    detail = con.execute("select detail from gaps where affects = 'critical_path'").fetchone()[0]
    assert "cycle" in detail


def test_stages_in_clocks_that_cannot_be_compared_become_a_gap(tmp_path):
    lines = [{"name": "clock.domain", "clock": c, "source": "archive", "attrs": {"host": h}} for c, h in
             (("c1", "h1"), ("c2", "h2"))]
    for name, clock in (("a", "c1"), ("b", "c2")):
        lines.append({"name": "span.start", "source": "app", "task_id": "T8", "ts_ns": 0, "clock": clock,
                      "attrs": {"span": name}})
        lines.append({"name": "span.end", "source": "app", "task_id": "T8", "ts_ns": 10, "clock": clock,
                      "attrs": {"span": name}})
    con = _rebuild(tmp_path, lines)
    assert con.execute("select count(*) from critical_path where scope_id = 'T8'").fetchone()[0] == 0
    detail = con.execute("select detail from gaps where affects = 'critical_path' and subject_id = 'T8'").fetchone()[0]
    assert "clocks ['c1', 'c2']" in detail


def test_a_chain_of_1200_stages_has_its_longest_path_without_recursion():
    n = 1200
    name = [f"s{n - 1 - i:04d}" for i in range(n)]  # the last stage's name sorts first: the deepest walk
    dag = Dag("task", "T", {v: 1.0 for v in name}, {v: "span" for v in name},
              {v: [name[i - 1]] if i else [] for i, v in enumerate(name)})
    res = longest_path(dag)
    assert res.e2e_ms == 1200.0 and res.path == name
    assert set(res.slack_ms.values()) == {0.0}


def test_a_task_of_1200_sequential_spans_is_rebuilt(tmp_path):
    lines = [{"name": "clock.domain", "clock": "c", "source": "archive", "attrs": {"host": "h"}}]
    for i in range(1200):  # one stream, no `after`: each span follows the previous one in time
        for name, t in (("span.start", 10 * i), ("span.end", 10 * i + 4)):
            lines.append({"name": name, "source": "app", "task_id": "T1", "ts_ns": t * 1_000_000, "clock": "c",
                          "attrs": {"span": f"s{1199 - i:04d}"}})
    con = _rebuild(tmp_path, lines)
    n, on_path, e2e = con.execute("SELECT count(*), count(*) FILTER (WHERE on_path), max(e2e_ms) FROM critical_path "
                                  "WHERE scope_id = 'T1'").fetchone()
    assert (n, on_path, e2e) == (1200, 1200, 4800.0)
    assert con.execute("SELECT count(*) FROM gaps WHERE affects = 'critical_path'").fetchone()[0] == 0


def test_a_cycle_is_named_in_the_order_of_its_edges():
    dag = Dag("task", "T", {"a": 1.0, "b": 1.0, "c": 1.0}, {}, {"a": ["c"], "b": ["a"], "c": ["b"]})
    with pytest.raises(DagError) as err:
        longest_path(dag)
    cycle = str(err.value).split("dependency cycle ")[1].split(" -> ")
    assert len(cycle) == 4 and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    for waiter, waited_for in zip(cycle, cycle[1:]):  # each node waits for the next one named
        assert waited_for in dag.preds[waiter]
