"""`study load` against a server of its own (`--set target=URL`, `--set server=S`), at the rates asked
(`--set rates=...`): every run a capture of that URL with the server's folder joined, so each point has
the engine's account and its diagnosis; and the settings that cannot work refused before anything runs."""
from __future__ import annotations

import json

import pytest
from serve_util import serve_out
from typer.testing import CliRunner

import inferledger
from inferledger.cli.app import app
from inferledger.probes.study_dir import read_comparison, run_dirs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A real `inferledger serve --out` in a process of its own."""
    folder = tmp_path_factory.mktemp("serve") / "srv"
    with serve_out(folder, "--flush-every", "0.5") as url:
        yield url, folder


def test_a_rate_sweep_against_a_url_offers_the_rates_asked_and_diagnoses_each_from_the_joined_engine(
        served, tmp_path):
    url, folder = served
    out = tmp_path / "sweep"
    inferledger.study("load", out, scale="tiny", rates="3,12", target=url, server=str(folder))
    comp = read_comparison(out)
    rows = {r[0]: dict(zip(comp["load"]["columns"], r)) for r in comp["load"]["rows"]}
    assert list(rows) == ["saturated", "r3", "r12"]
    assert (rows["r3"]["offered_rps"], rows["r12"]["offered_rps"]) == (3.0, 12.0)
    for name in ("r3", "r12"):
        # the server's folder joined: the engine's queue is measured at every point, not unknown
        assert rows[name]["server_queue_share"] is not None and rows[name]["n_attempts"] == 4
    for name, run in run_dirs(out):
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["target"] == {"kind": "url", "url": url}
        assert manifest["servers"]["joined"] == 4
    sat = rows["saturated"]["completed_rps"]
    for name, run in run_dirs(out)[1:]:
        point = json.loads((run / "manifest.json").read_text())["study_point"]
        assert point["offered_rps"] == {"r3": 3.0, "r12": 12.0}[name]
        assert point["multiple_of_capacity"] == pytest.approx(point["offered_rps"] / sat, rel=1e-3)
        assert point["probe_tok_s"] is None  # the embedded engine's speed probe says nothing of a URL
    assert "speed probe" not in comp["load"]["note"]


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
