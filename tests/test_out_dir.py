"""A new run folder is built aside and renamed into place: a failure part-way leaves nothing at --out."""
from __future__ import annotations

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
