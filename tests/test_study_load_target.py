"""`study load` against a server of its own (`--set target=URL`, `--set server=S`): the settings that
cannot work are refused before anything runs. (The sweep itself runs in tests/test_capture_server_join.py,
on that module's server.)"""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app


@pytest.mark.parametrize("sets, message", [
    (["rates=1,x"], "--set rates=1,x: expected request rates in req/s separated by commas"),
    (["rates=2,2"], "--set rates=2,2: each rate in 0.001..100000 req/s, none twice"),
    (["target=localhost:8000"], "--set target=localhost:8000: 'embedded' or a server's base URL"),
    (["server=srv"], "--set server=S joins a `serve --out S` folder to a URL target"),
])
def test_a_sweep_that_cannot_run_is_refused_before_anything_runs(tmp_path, sets, message):
    args = ["study", "load", "-o", str(tmp_path / "s")]
    for s in sets:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert not (tmp_path / "s").exists()


def test_a_server_folder_that_cannot_be_joined_is_refused_before_anything_runs(tmp_path):
    res = CliRunner().invoke(app, ["study", "load", "-o", str(tmp_path / "s"), "--set", "target=http://127.0.0.1:9",
                                   "--set", f"server={tmp_path / 'nothing'}"])
    assert res.exit_code == 2 and "not a `serve --out` folder" in " ".join(res.output.split()), res.output
    assert not (tmp_path / "s").exists()


def _said(res) -> str:  # the error's words, out of its box
    return " ".join(res.output.replace("│", " ").split())


def test_capture_sweep_refuses_bad_rates_and_the_flags_the_study_cannot_take(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["capture", "--sweep", "1,x", "--target", "http://127.0.0.1:9", "-o", str(tmp_path / "s")])
    assert res.exit_code == 2 and "--sweep" in res.output and \
        "1,x: expected request rates in req/s separated by commas" in _said(res), res.output
    res = runner.invoke(app, ["capture", "--sweep", "1,2", "--num-prompts", "5", "--input-len", "8",
                              "-o", str(tmp_path / "s")])
    assert res.exit_code == 2 and "leave out --num-prompts, --input-len" in _said(res), res.output
    res = runner.invoke(app, ["capture", "--sweep", "1", "--target", "", "-o", str(tmp_path / "s")])  # not embedded
    assert res.exit_code == 2 and "--set target=: 'embedded' or a server's base URL" in _said(res), res.output
    assert not (tmp_path / "s").exists()


def test_capture_sweep_is_the_load_study_against_the_target(tmp_path, monkeypatch):
    """`capture --sweep 1,2 --target URL --seed 3 -o S` runs `study load` with those options into S and
    prints its comparison (the study here imports a recorded run per rate instead of capturing)."""
    from pathlib import Path

    from inferledger.collectors.rundir.e0_import import import_archive
    from inferledger.probes.run_folder import StudyIndex
    from inferledger.studies import registry
    from inferledger.studies.framework import Option, Study, StudyRun, Table

    archive = Path(__file__).resolve().parent.parent / "samples" / "e0" / "preemption" / "archive.jsonl"
    asked = []

    def runs(options):
        asked.append(options)
        return [StudyRun(f"r{rate}", {"rate": rate}, lambda run_dir, run_id: import_archive(archive, run_dir,
                                                                                             run_id=run_id))
                for rate in options["rates"].split(",")]

    def compare(done):
        return [Table("load", "points", ["run"], [[name] for name in done.names])]
    study = Study("load", "where is the knee?", "rate", runs, compare,
                  options={"rates": Option("", "rates"), "target": Option("embedded", "target"),
                           "server": Option("", "server"), "seed": Option(7, "seed", 0, 100)})
    monkeypatch.setattr(registry, "get_study", lambda name: study)
    out = tmp_path / "s"
    res = CliRunner().invoke(app, ["capture", "--sweep", "1,2", "--target", "http://127.0.0.1:9", "--seed", "3",
                                   "-o", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert asked == [{"rates": "1,2", "target": "http://127.0.0.1:9", "server": "", "seed": 3}]
    assert StudyIndex.read(out).doc["state"] == "complete"
    flat = " ".join(res.output.split())  # the console's width is the first test's in this process, not COLUMNS
    assert "load: where is the knee?" in flat and f"study folder: {out} (2 runs, " in flat
