"""The read-only query surface: inferledger.open over runs, refusals, SQL errors, and the CLI."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

import inferledger
from inferledger.cli.app import app
from inferledger.ledger.query import LedgerError, QueryError, ReadOnlyError, open_ledger
from inferledger.ledger.modules import modules_sha256


def make_ledger(run: Path, ttfts: list[float], *, gaps_without_run_id: bool = False) -> None:
    run.mkdir(parents=True)
    con = duckdb.connect(str(run / "ledger.duckdb"))
    con.execute("CREATE TABLE attempts (run_id VARCHAR, attempt_id VARCHAR, client_status VARCHAR)")
    con.execute("CREATE TABLE request_metrics (run_id VARCHAR, attempt_id VARCHAR, ttft_client_ms DOUBLE)")
    for i, ttft in enumerate(ttfts):
        con.execute("INSERT INTO attempts VALUES (?, ?, 'completed')", [run.name, f"A{i}"])
        con.execute("INSERT INTO request_metrics VALUES (?, ?, ?)", [run.name, f"A{i}", ttft])
    # built by this code, as a ledger reconstruct writes records it (one written otherwise: a warning each)
    con.execute("CREATE TABLE ledger_build AS SELECT ? AS run_id, '0' AS inferledger_version, ? AS modules_sha256",
                [run.name, modules_sha256()])
    if gaps_without_run_id:
        con.execute("CREATE TABLE gaps (gap_id VARCHAR, needs VARCHAR)")
        con.execute("INSERT INTO gaps VALUES ('g1', 'an energy counter')")
    con.close()


@pytest.fixture()
def runs(tmp_path) -> Path:
    make_ledger(tmp_path / "runs" / "r0", [10.0, 30.0])
    make_ledger(tmp_path / "runs" / "r1", [20.0, None, 5.5], gaps_without_run_id=True)
    (tmp_path / "runs" / "notes.txt").write_text("not a run")
    return tmp_path / "runs"


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_glob_unions_runs_and_run_id_tells_them_apart(runs):
    with inferledger.open(str(runs / "*")) as led:
        assert led.runs == ["r0", "r1"]
        assert led.tables() == ["attempts", "gaps", "ledger_build", "request_metrics"]
        rows = led.sql("select run_id, count(*) from attempts group by run_id order by run_id").fetchall()
        assert rows == [("r0", 2), ("r1", 3)]
        top = led.sql("select run_id, attempt_id from request_metrics order by ttft_client_ms desc nulls last limit 2")
        assert top.fetchall() == [("r0", "A1"), ("r1", "A0")]
        # A table that lacks run_id gets it from the run folder's name.
        assert led.sql("select run_id, gap_id from gaps").fetchall() == [("r1", "g1")]


def test_one_run_folder_or_its_ledger_file(runs):
    for target in (runs / "r1", runs / "r1" / "ledger.duckdb"):
        with open_ledger(target) as led:
            assert led.sql("select count(*) from attempts").fetchall() == [(3,)]


def test_frames_params_and_arrow(runs):
    with open_ledger(str(runs / "*")) as led:
        rel = led.sql("select attempt_id, ttft_client_ms from request_metrics where run_id = ? order by attempt_id", ["r0"])
        assert rel.pl()["ttft_client_ms"].to_list() == [10.0, 30.0]
        assert rel.df()["attempt_id"].tolist() == ["A0", "A1"]
        assert rel.arrow().read_all().num_rows == 2  # duckdb 2: .arrow() is a RecordBatchReader


def test_missing_ledger_says_to_reconstruct(tmp_path):
    (tmp_path / "raw").mkdir()
    with pytest.raises(LedgerError, match=r"raw has no ledger.duckdb: run `inferledger reconstruct .*raw` first"):
        open_ledger(tmp_path / "raw")
    with pytest.raises(LedgerError, match="no such run"):
        open_ledger(tmp_path / "absent")
    with pytest.raises(LedgerError, match="no run matches"):
        open_ledger(str(tmp_path / "nothing-*"))


WRITES = {
    "UPDATE": "update attempts set client_status = 'x'",
    "DELETE": "delete from run_0.attempts",
    "DROP": "drop view attempts",
    "CREATE": "create table t as select 1",
    "COPY": "copy (select * from attempts) to 'out.csv'",
    "ATTACH": "attach 'other.duckdb' as o",
    "DETACH": "detach run_0",
    "INSTALL": "install httpfs",
    "LOAD": "load httpfs",
    "SET": "set enable_external_access = true",
    "PRAGMA": "pragma enable_profiling",
    "INSERT": "insert into attempts values ('r', 'A', 'x')",
    "ALTER": "alter table attempts add column x int",
    "EXPORT": "export database 'dump'",
}


@pytest.mark.parametrize("kind", sorted(WRITES))
def test_writes_are_refused_and_files_unchanged(runs, kind):
    before = digests(runs)
    with open_ledger(str(runs / "*")) as led:
        with pytest.raises(ReadOnlyError) as info:
            led.sql(WRITES[kind])
        assert str(info.value) == f"inferledger query is read-only: {kind} statements are refused"
        assert led.sql("select count(*) from attempts").fetchall() == [(5,)]  # still intact
    assert digests(runs) == before


@pytest.mark.parametrize("sql", ["select 1; drop view attempts", "explain analyze update attempts set run_id = 'x'",
                                 "-- sneaky\nEXPLAIN ANALYZE delete from attempts"])
def test_a_write_hidden_behind_a_read_is_refused(runs, sql):
    with open_ledger(runs / "r0") as led, pytest.raises(ReadOnlyError):
        led.sql(sql)


def test_reads_of_every_kind_pass(runs):
    with open_ledger(runs / "r0") as led:
        for sql in ("with a as (select * from attempts) select count(*) from a", "explain select * from attempts",
                    "show tables", "describe attempts", "summarize request_metrics", "from attempts"):
            assert led.sql(sql).fetchall()


def test_external_access_is_locked(runs, tmp_path):
    (tmp_path / "secret.csv").write_text("a\n1\n")
    with open_ledger(runs / "r0") as led, pytest.raises(QueryError, match="disabled by configuration"):
        led.sql(f"select * from read_csv('{tmp_path / 'secret.csv'}')")


def test_relation_methods_cannot_write_files_either(runs, tmp_path):
    before = digests(runs)
    with open_ledger(runs / "r0") as led:
        rel = led.sql("select * from attempts")
        with pytest.raises(duckdb.Error, match="disabled by configuration"):
            rel.to_csv(str(tmp_path / "out.csv"))
        with pytest.raises(duckdb.Error):
            led.sql("select * from run_0.main.attempts").update({"client_status": duckdb.ConstantExpression("x")})
    assert not (tmp_path / "out.csv").exists() and digests(runs) == before


def test_misspelled_column_error_keeps_the_sql_position(runs):
    with open_ledger(runs / "r0") as led:
        with pytest.raises(QueryError) as info:
            led.sql("select ttft_clinet_ms from request_metrics")
    msg = str(info.value)
    assert 'Referenced column "ttft_clinet_ms" not found' in msg
    assert "LINE 1: select ttft_clinet_ms from request_metrics\n               ^^^^" in msg
    with open_ledger(runs / "r0") as led, pytest.raises(QueryError, match="syntax error"):
        led.sql("selec 1")
    with open_ledger(runs / "r0") as led, pytest.raises(QueryError, match="empty query"):
        led.sql("  ")


runner = CliRunner()


def test_cli_query_csv_and_json(runs):
    res = runner.invoke(app, ["query", str(runs / "*"), "select run_id, attempt_id, ttft_client_ms from request_metrics "
                              "order by run_id, attempt_id", "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == ["run_id,attempt_id,ttft_client_ms", "r0,A0,10.0", "r0,A1,30.0",
                                       "r1,A0,20.0", "r1,A1,", "r1,A2,5.5"]
    res = runner.invoke(app, ["query", str(runs / "r1"), "select attempt_id, ttft_client_ms from request_metrics "
                              "order by attempt_id", "--format", "json", "--limit", "2"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == [{"attempt_id": "A0", "ttft_client_ms": 20.0},
                                      {"attempt_id": "A1", "ttft_client_ms": None}]


def test_cli_query_table(runs):
    res = runner.invoke(app, ["query", str(runs / "r0"), "select * from attempts order by attempt_id", "-n", "1"])
    assert res.exit_code == 0, res.output
    assert "attempt_id" in res.stdout and "A0" in res.stdout and "A1" not in res.stdout
    assert "more exist" in res.stdout


def test_cli_query_refusal_and_sql_error_exit_2(runs):
    before = digests(runs)
    res = runner.invoke(app, ["query", str(runs / "r0"), "delete from attempts"])
    assert res.exit_code == 2
    assert "inferledger query is read-only: DELETE statements are refused" in res.stderr
    res = runner.invoke(app, ["query", str(runs / "r0"), "select nope from attempts"])
    assert res.exit_code == 2
    assert "LINE 1: select nope from attempts" in res.stderr and "^^^^" in res.stderr
    res = runner.invoke(app, ["query", str(runs.parent / "missing"), "select 1"])
    assert res.exit_code == 2 and "no such run" in res.stderr
    assert digests(runs) == before


def test_cli_help_teaches(runs):
    res = runner.invoke(app, ["query", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for word in ("read-only", "Example", "--format"):
        assert word in res.stdout
    from inferledger.cli.cmd_data import SQL_SURFACE
    from inferledger.ledger.reconstruct import PUBLIC_TABLES

    assert [name for name, _ in SQL_SURFACE] and {name for name, _ in SQL_SURFACE} == set(PUBLIC_TABLES)
    for name in PUBLIC_TABLES:  # every public table is taught, and exists in a ledger
        assert f" {name} " in res.stdout, name
    res = runner.invoke(app, ["import", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "--lenient" in res.stdout and "Example" in res.stdout


def test_cli_import_strict_and_lenient(tmp_path):
    archive = tmp_path / "a.jsonl"
    archive.write_text("\n".join(json.dumps(x) for x in [
        {"name": "clock.domain", "clock": "cm", "attrs": {"host": "c1"}},
        {"name": "attempt.sent", "source": "client", "attempt_id": "A1", "ts_ns": 5, "clock": "cm"},
        {"name": "attempt.sent", "source": "client", "attempt_id": "A2", "ts_ns": 5.5, "clock": "cm"},
    ]) + "\n")
    res = runner.invoke(app, ["import", str(archive), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2
    assert f"{archive}:3: ts_ns must be an integer" in res.stderr
    assert not (tmp_path / "run").exists()
    res = runner.invoke(app, ["import", str(archive), "--out", str(tmp_path / "run"), "--lenient"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "gap register" in res.stderr and f"{archive}:3:" in res.stderr
    assert "events" in res.stdout and (tmp_path / "run" / "gaps.parquet").exists()
    res = runner.invoke(app, ["import", str(archive), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "already holds a run" in res.stderr


def test_a_glob_leaves_out_runs_without_a_ledger_with_one_warning_line(runs):
    (runs / "r2").mkdir()  # captured, not reconstructed yet
    res = runner.invoke(app, ["query", str(runs / "*"), "select run_id, count(*) as n from attempts group by 1 "
                              "order by 1", "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.stdout == "run_id,n\nr0,2\nr1,3\n"
    assert res.stderr == (f"warning: 1 run(s) without a ledger left out (build with `inferledger reconstruct RUN`): "
                          f"{runs / 'r2'}\n")
    with pytest.raises(LedgerError, match=r"no run folder with a ledger.duckdb \(run `inferledger reconstruct`"):
        open_ledger(str(runs / "r2*"))
    with pytest.raises(LedgerError, match="r2 has no ledger.duckdb"):  # named alone, it must have one
        open_ledger(runs / "r2")


def _in_place_run(run: Path, duplicate: bool = False) -> Path:
    """A run whose ledger is built inside its folder (events and samples read in place); `duplicate`: its
    part flushed twice under a second number."""
    from ledger_util import build_run

    build_run(run, [{"name": "attempt.sent", "ms": 0}, {"name": "attempt.first_byte", "ms": 12},
                    {"name": "attempt.done", "ms": 30}], samples=[(5, "gpu_power_w", 300.0, "W", "0")]).close()
    if duplicate:
        part = next((run / "events").glob("part-*.parquet"))
        (run / "events" / "part-00009.parquet").write_bytes(part.read_bytes())
        from inferledger.ledger.reconstruct import reconstruct
        reconstruct(run)
    return run


def test_a_ledger_in_its_run_folder_reads_its_parts_in_place_and_nothing_else(tmp_path):
    run = _in_place_run(tmp_path / "run")
    with duckdb.connect(str(run / "ledger.duckdb"), read_only=True) as con:  # a plain client opens it too
        assert {v for (v,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()} == {
            "events", "samples"}
        assert con.execute("SELECT count(*) FROM events").fetchone() == (3,)
        assert con.execute("SELECT part, table_name, rows FROM ledger_parts ORDER BY part").fetchall() == [
            ("events/part-00000.parquet", "events", 3), ("samples/part-00000.parquet", "samples", 1)]
    outside = tmp_path / "other"
    outside.mkdir()
    (outside / "p.parquet").write_bytes((run / "events" / "part-00000.parquet").read_bytes())
    with open_ledger(run) as led:
        assert led.sql("select count(*), max(ts_ns) from events").fetchall() == [(3, 30_000_000)]
        assert led.sql("select value from samples").fetchall() == [(300.0,)]
        for sql in (f"select * from read_parquet('{outside / 'p.parquet'}')",  # outside the run folder
                    f"select * from read_parquet('{run / 'events' / '..' / '..' / 'other' / 'p.parquet'}')",
                    f"select * from read_text('{run / 'manifest.json'}')",  # the run folder, outside its parts
                    "select * from read_csv('/etc/passwd')"):
            with pytest.raises(QueryError, match="disabled by configuration"):
                led.sql(sql).fetchall()
        for sql in ("SET enable_external_access = true", f"SET allowed_directories = ['{tmp_path}']",
                    "SET lock_configuration = false"):
            with pytest.raises(ReadOnlyError):
                led.sql(sql)
            with pytest.raises(duckdb.Error, match="configuration has been locked"):  # DuckDB's own lock
                led._con.execute(sql)
        with pytest.raises(duckdb.Error, match="disabled"):
            led._con.execute("LOAD httpfs")


def test_a_ledger_whose_run_folder_changed_or_moved_is_refused_naming_the_file(tmp_path):
    import pyarrow.parquet as pq

    run = _in_place_run(tmp_path / "run")
    part = run / "events" / "part-00000.parquet"
    original = part.read_bytes()
    pq.write_table(pq.read_table(part).slice(0, 2), part)  # rewritten: one event fewer
    with pytest.raises(LedgerError, match=f"{part}: rewritten since the ledger was built from it"):
        open_ledger(run)
    for args in (["query", str(run), "select count(*) from events"], ["report", str(run)], ["summary", str(run)]):
        res = CliRunner().invoke(app, args, env={"COLUMNS": "500"})
        assert res.exit_code == 2 and f"{part}: rewritten" in res.output and "Traceback" not in res.output, args
    part.unlink()
    with pytest.raises(LedgerError, match=f"{part}: missing, though the ledger was built from it"):
        open_ledger(run)
    part.write_bytes(original)
    with open_ledger(run) as led:  # restored: read again
        assert led.sql("select count(*) from events").fetchall() == [(3,)]
    run.rename(tmp_path / "moved")
    with pytest.raises(LedgerError, match=f"{run}: no such run folder .*inferledger reconstruct {tmp_path / 'moved'}"):
        open_ledger(tmp_path / "moved")


def test_a_ledger_written_elsewhere_keeps_its_copy_with_the_same_tables(tmp_path):
    from inferledger.ledger.reconstruct import PUBLIC_TABLES, reconstruct
    from scale_util import ledger_differences

    run = _in_place_run(tmp_path / "run", duplicate=True)  # the second copy of each event left out
    copied = reconstruct(run, out=tmp_path / "copied.duckdb").path
    assert ledger_differences(run / "ledger.duckdb", copied, tables=PUBLIC_TABLES) == []
    with duckdb.connect(str(copied), read_only=True) as con:
        assert not con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
        assert con.execute("SELECT part, file_row_number FROM event_copies_left_out ORDER BY 2").fetchall() == [
            ("events/part-00009.parquet", 0), ("events/part-00009.parquet", 1), ("events/part-00009.parquet", 2)]
    run.rename(tmp_path / "moved")
    with open_ledger(copied) as led:  # its own copy: the run folder is not read
        assert led.sql("select count(*) from events").fetchall() == [(3,)]
