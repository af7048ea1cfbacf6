"""A new run folder is built aside and renamed into place: a failure part-way leaves nothing at --out."""
from __future__ import annotations

from pathlib import Path

import pytest

from inferledger.collectors.rundir.out_dir import RunExistsError, building_run_dir


def test_success_renames_the_built_folder_into_place(tmp_path):
    out = tmp_path / "runs" / "r1"
    with building_run_dir(out) as staging:
        assert staging.parent == out.parent and staging != out
        (staging / "manifest.json").write_text("{}")
    assert (out / "manifest.json").read_text() == "{}"
    assert sorted(p.name for p in out.parent.iterdir()) == ["r1"]  # no staging folder left


def test_failure_part_way_leaves_nothing(tmp_path):
    out = tmp_path / "r1"
    with pytest.raises(RuntimeError, match="late refusal"):
        with building_run_dir(out) as staging:
            (staging / "events").mkdir()
            raise RuntimeError("late refusal")
    assert list(tmp_path.iterdir()) == []


def test_failure_takes_away_the_parent_folders_it_made(tmp_path):
    out = tmp_path / "new" / "deeper" / "r1"
    with pytest.raises(RuntimeError):
        with building_run_dir(out):
            raise RuntimeError("refused")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_folder_made_for_the_run_is_used(tmp_path):
    out = tmp_path / "r1"
    out.mkdir()
    with building_run_dir(out) as staging:
        (staging / "manifest.json").write_text("{}")
    assert (out / "manifest.json").exists()


def test_a_run_written_there_meanwhile_is_kept(tmp_path):
    out = tmp_path / "r1"
    with pytest.raises(RunExistsError):
        with building_run_dir(out) as staging:
            (staging / "manifest.json").write_text('{"mine": true}')
            out.mkdir()
            (out / "manifest.json").write_text('{"theirs": true}')
    assert (out / "manifest.json").read_text() == '{"theirs": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["r1"]


# ---- every command that writes checks its output first -------------------------------------------------

def _cli(*args):
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def places(tmp_path):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-folder" / "kept").write_text("x")
    return tmp_path


@pytest.mark.parametrize("command", [
    lambda t, out: ["predict", "-w", t / "no-such-workload.toml", "-o", out],
    lambda t, out: ["report", t / "no-such-run", "-o", out],
    lambda t, out: ["export", t / "no-such-run", "--as", "perfetto", "-o", out],
    lambda t, out: ["reconstruct", t / "no-such-run", "-o", out],
], ids=["predict", "report", "export", "reconstruct"])
@pytest.mark.parametrize("where, why", [
    ("a-folder", "is a folder; give a file name"),
    ("a-file/out.json", "cannot create or write this folder ({t}/a-file is a file, not a folder)"),
], ids=["a folder", "under a file"])
def test_an_output_file_that_cannot_be_written_is_refused_before_any_work(places, command, where, why):
    res = _cli(*command(places, places / where))
    why = why.format(t=places)
    assert res.exit_code == 2 and "error: --out" in res.output and why in res.output, res.output
    if where == "a-folder":  # the name offered is one the command takes
        name = {"reconstruct": "ledger.duckdb", "report": "report.html"}.get(command(places, "")[0], "out.json")
        assert f"(e.g. {places / 'a-folder' / name})" in res.output, res.output
    assert "no-such" not in res.output  # the output was checked before the input was even read
    assert sorted(p.name for p in places.iterdir()) == ["a-file", "a-folder"]


@pytest.mark.parametrize("where, why", [
    ("a-file", "is a file, not a folder"), ("a-folder", "a folder that is not empty"),
    ("a-file/study", "cannot create or write this folder ({t}/a-file is a file, not a folder)"),
])
def test_a_study_folder_that_cannot_be_written_is_refused_before_any_work(places, where, why):
    res = _cli("study", "no-such-study", "-o", places / where)
    why = why.format(t=places)
    assert res.exit_code == 2 and why in res.output and "no-such-study" not in res.output, res.output


def test_an_existing_output_file_is_replaced_and_nothing_is_left_by_the_check(tmp_path):
    from inferledger.collectors.rundir.out_dir import check_out_file

    (tmp_path / "pred.json").write_text("old")
    check_out_file(tmp_path / "pred.json", "--out")
    check_out_file(tmp_path / "new" / "deeper" / "pred.json", "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.json"]


def test_a_ledger_written_under_a_name_no_reader_knows_is_refused_before_the_rebuild(places):
    """reconstruct -o ledger.db built the ledger, then its summary could not open it (a traceback after
    the work): a ledger file is named *.duckdb, checked first."""
    res = _cli("reconstruct", places / "no-such-run", "-o", places / "ledger.db")
    assert res.exit_code == 2 and "error: --out" in res.output and "ends in .duckdb" in res.output, res.output
    assert "no-such" not in res.output and sorted(p.name for p in places.iterdir()) == ["a-file", "a-folder"]
    from inferledger.collectors.rundir.e0_import import import_archive

    run = places / "run"
    import_archive(Path(__file__).resolve().parent.parent / "samples" / "e0" / "r1_sample_b0" / "archive.jsonl", run)
    res = _cli("reconstruct", run, "-o", places / "built.duckdb")
    assert res.exit_code == 0 and (places / "built.duckdb").is_file(), res.output


def test_reconstruct_writes_its_ledger_into_a_folder_it_creates(tmp_path):
    """--out in a folder that does not exist yet passes the check (it can be created): the build creates it."""
    from inferledger.collectors.rundir.e0_import import import_archive

    import_archive(Path(__file__).resolve().parent.parent / "samples" / "e0" / "black_box" / "archive.jsonl", tmp_path / "run")
    out = tmp_path / "new" / "sub" / "x.duckdb"
    res = _cli("reconstruct", tmp_path / "run", "-o", out)
    assert res.exit_code == 0, res.output
    assert out.is_file() and sorted(p.name for p in out.parent.iterdir()) == ["x.duckdb"]
