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
