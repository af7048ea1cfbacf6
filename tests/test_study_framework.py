"""A study writes a folder that keeps every run (each a normal run directory) and a comparison computed
from the runs' ledgers; a failing run leaves what was done and says failed; bad options are refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.ledger.query import open_ledger
from inferledger.probes.run_folder import RunFolderError, StudyIndex
from inferledger.probes.study_dir import read_comparison, run_dirs
from inferledger.studies.framework import Option, Study, StudyError, StudyRun, Table, parse_sets, run_study

E0 = Path(__file__).resolve().parent.parent / "samples" / "e0"


def _imported(archive: str):
    def produce(run_dir: Path, run_id: str) -> None:
        import_archive(E0 / archive / "archive.jsonl", run_dir, run_id=run_id)
    return produce


def _compare(runs) -> list[Table]:
    rows = [[name, runs.one(name, "SELECT ttft_server_ms, e2e_server_ms FROM request_metrics")["e2e_server_ms"]]
            for name in runs.names]
    return [Table("key", "server E2E per run", ["run", "e2e_server_ms"], rows),
            Table("runs", "run ids", ["run", "run_id"],
                  [[n, runs.one(n, "SELECT DISTINCT run_id FROM attempts")["run_id"]] for n in runs.names])]


def _study(archives=("cancel_release", "preemption"), fail_on: str | None = None) -> Study:
    def runs(options):
        out = [StudyRun(a, {"archive": a}, _imported(a)) for a in archives]
        if fail_on:
            def broken(run_dir, run_id):
                raise RuntimeError("the engine fell over")
            out.append(StudyRun(fail_on, {"archive": None}, broken))
        return out
    return Study("e0-pair", "do the two archives differ in server E2E?", "archive", runs, _compare,
                 options={"scale": Option(1, "a multiplier")}, figures=({"kind": "curve", "table": "key",
                                                                          "x": "run", "y": ["e2e_server_ms"]},))


def test_a_study_folder_keeps_every_run_and_the_comparison_from_their_ledgers(tmp_path):
    out = tmp_path / "s"
    result = run_study(_study(), out)
    doc = StudyIndex.read(out).doc
    assert doc["state"] == "complete" and doc["tables"] == ["key", "runs"]
    assert [r["name"] for r in doc["runs"]] == ["cancel_release", "preemption"]
    assert doc["options"] == {"scale": 1}
    # the values the archives' own expected ledgers give (samples/e0/*/expected.json)
    assert result.tables[0].rows == [["cancel_release", 1017.0], ["preemption", 892.0]]
    assert read_comparison(out)["runs"]["rows"] == [["cancel_release", "e0-pair.cancel_release"],
                                                     ["preemption", "e0-pair.preemption"]]
    assert (out / "comparison.csv").read_text() == "run,e2e_server_ms\ncancel_release,1017.0\npreemption,892.0\n"
    for name, run in run_dirs(out):
        with open_ledger(run) as led:  # each run opens alone
            assert led.rows("SELECT count(*) FROM attempts")[1] == [(1,)]
    with open_ledger(out) as led:  # and the study folder opens as all of its runs
        assert led.rows("SELECT run_id, count(*) FROM attempts GROUP BY ALL ORDER BY 1")[1] == [
            ("e0-pair.cancel_release", 1), ("e0-pair.preemption", 1)]


def test_a_failing_run_marks_the_study_failed_and_keeps_the_runs_already_written(tmp_path):
    out = tmp_path / "s"
    with pytest.raises(RuntimeError, match="fell over"):
        run_study(_study(archives=("cancel_release",), fail_on="broken"), out)
    doc = StudyIndex.read(out).doc
    assert doc["state"] == "failed" and doc["error"] == "RuntimeError: the engine fell over"
    assert (out / "runs" / "cancel_release" / "ledger.duckdb").is_file()
    assert not (out / "comparison.json").exists()


def test_options_and_folders_are_checked_before_anything_runs(tmp_path):
    study = _study()
    assert parse_sets(study, ["scale=3"]) == {"scale": 3}
    with pytest.raises(StudyError, match=r"unknown option 'scael' \(its options: scale\)"):
        parse_sets(study, ["scael=3"])
    with pytest.raises(StudyError, match=r"--set scale=x: .*int expected"):
        parse_sets(study, ["scale=x"])
    with pytest.raises(StudyError, match="expected key=value"):
        parse_sets(study, ["scale"])
    with pytest.raises(StudyError, match=r"--set scale: given twice \(3 and 4\); give it once"):  # never the last silently
        parse_sets(study, ["scale=3", "scale=4"])
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(StudyError, match="not empty"):
        run_study(study, tmp_path / "busy")
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("pair, refusal", [
    ("chunk=0", "--set chunk=0: must be >= 1 and <= 65536"),
    ("chunk=-1", "--set chunk=-1: must be >= 1 and <= 65536"),
    ("budget=1", "--set budget=1: must be >= 2 and <= 65536"),
])
def test_a_knob_of_the_right_type_but_no_meaning_is_refused_naming_its_range(tmp_path, pair, refusal):
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    res = CliRunner().invoke(app, ["study", "schedule-book", "--set", pair, "-o", str(tmp_path / "s")])
    assert res.exit_code == 2 and refusal in res.output, res.output
    assert not (tmp_path / "s").exists()


def test_a_non_finite_or_out_of_range_float_knob_is_refused():
    from inferledger.studies.framework import StudyError, parse_sets
    from inferledger.studies.registry import get_study

    for text in ("nan", "inf", "0", "-2"):
        with pytest.raises(StudyError, match=f"--set deadline_batches={text}"):
            parse_sets(get_study("load"), [f"deadline_batches={text}"])
    with pytest.raises(StudyError, match="budget=1: must be >= 2"):
        get_study("schedule-book").resolve_options({"budget": 1})


def test_a_broken_study_json_is_named_with_its_key(tmp_path):
    run_study(_study(archives=("cancel_release",)), tmp_path / "s")
    doc = json.loads((tmp_path / "s" / "study.json").read_text())
    del doc["knob"]
    (tmp_path / "s" / "study.json").write_text(json.dumps(doc))
    with pytest.raises(RunFolderError, match=r"study.json: knob: missing"):
        StudyIndex.read(tmp_path / "s").doc
    doc["knob"], doc["runs"][0]["dir"] = "archive", 7
    (tmp_path / "s" / "study.json").write_text(json.dumps(doc))
    with pytest.raises(RunFolderError, match=r"study.json: runs\[0\]\.dir: expected str"):
        StudyIndex.read(tmp_path / "s").doc


def test_the_command_refuses_an_unknown_study_with_exit_2():
    res = CliRunner().invoke(app, ["study", "no-such-study"])
    assert res.exit_code == 2
    assert "no study named 'no-such-study'" in res.output


@pytest.mark.slow  # several studies' ledgers rebuilt
def test_summary_and_reconstruct_take_a_study_folder_per_run_and_the_comparison(tmp_path):
    import json as _json

    from typer.testing import CliRunner

    from inferledger.cli.app import app

    out = tmp_path / "s"
    run_study(_study(), out)
    runner = CliRunner()
    res = runner.invoke(app, ["summary", str(out), "--table", "accounts", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = _json.loads(res.stdout)
    assert list(doc) == ["cancel_release.accounts", "preemption.accounts", "comparison.key", "comparison.runs"]
    assert doc["comparison.key"] == [{"run": "cancel_release", "e2e_server_ms": 1017.0},
                                     {"run": "preemption", "e2e_server_ms": 892.0}]
    res = runner.invoke(app, ["summary", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "cancel_release" in res.stdout and "server E2E per run" in res.stdout
    # reconstruct: each run's ledger again; this study is not one the command knows, so its comparison stays
    (out / "runs" / "preemption" / "ledger.duckdb").unlink()
    res = runner.invoke(app, ["reconstruct", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert [b["run"] for b in _json.loads(res.stdout)["ledgers"]] == ["cancel_release", "preemption"]
    assert (out / "runs" / "preemption" / "ledger.duckdb").exists()
    res = runner.invoke(app, ["reconstruct", str(out)], env={"COLUMNS": "200"})
    assert "the comparison was left as it was (study 'e0-pair': not one this version knows)" in res.stdout


@pytest.mark.slow  # several studies' ledgers rebuilt
def test_a_known_study_gets_its_comparison_again_from_the_rebuilt_ledgers(tmp_path):
    from inferledger.studies.framework import rebuild_study

    out = tmp_path / "s"
    run_study(_study(), out)
    (out / "comparison.json").unlink()
    seen = []
    tables = rebuild_study(out, _study(), on_run=lambda name, summary: seen.append((name, summary.n_attempts)))
    assert seen == [("cancel_release", 1), ("preemption", 1)]
    assert tables[0].rows == [["cancel_release", 1017.0], ["preemption", 892.0]]
    assert read_comparison(out)["key"]["rows"] == [["cancel_release", 1017.0], ["preemption", 892.0]]


def test_generated_knobs_plan_or_are_refused_with_exit_2_naming_the_knob(tmp_path, monkeypatch):
    """`--set` pairs of every study's knobs (and unknown ones) with hostile values (0, negative, huge,
    non-finite, fractional for an integer, empty, a scale no study has): the study plans its runs, each
    of the values given, or `inferledger study` exits 2 naming the knob, with no folder written; never
    a traceback or a hang. (The runs themselves are not produced: only the plan.)"""
    import time

    from hypothesis import HealthCheck, example, given, settings
    from hypothesis import strategies as st

    from inferledger.studies import framework
    from inferledger.studies.registry import STUDIES

    class Planned(Exception):
        pass

    def plan_only(study, out, options=None, **kw):  # run_study up to its plan: options, folder, runs
        opts = study.resolve_options(options)
        framework.check_new_study_dir(Path(out))
        plans = study.runs(opts)
        raise Planned(opts, [r.knob for r in plans])

    monkeypatch.setattr(framework, "run_study", plan_only)
    keys = sorted({k for s in STUDIES.values() for k in s.options} | {"chunks", ""})
    texts = st.sampled_from(["0", "-1", "1", "2", "3", "7", "65536", "65537", "1e3", "1e308", "nan", "inf", "-inf",
                             "", "1.5", "9" * 30, "true", "tiny", "default", "huge", " 4 ", "1_000", "0.01",
                             "1000", "1000.5", str(2 ** 63)]) | st.integers(-10, 10 ** 6).map(str)
    out = tmp_path / "s"

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(sorted(STUDIES)), st.lists(st.tuples(st.sampled_from(keys), texts), max_size=3))
    @example("fidelity", [("workload", "0")])  # a file knob given by --set: the error names --set
    def check(name, pairs):
        args = [a for k, v in pairs for a in ("--set", f"{k}={v}")]
        t0 = time.perf_counter()
        res = CliRunner().invoke(app, ["study", name, "-o", str(out), *args])
        assert time.perf_counter() - t0 < 10
        assert not out.exists()
        if isinstance(res.exception, Planned):
            opts, knobs = res.exception.args
            given_ = {k: v for k, v in pairs}
            for k, v in given_.items():  # no silently different plan: each knob is the value given
                assert str(opts[k]) == v.strip() or opts[k] == type(opts[k])(v), (k, v, opts[k])
            return
        assert res.exit_code == 2, (res.output, repr(res.exception))
        assert "error: " in res.output and ("--set " in res.output or "unknown option" in res.output), res.output

    check()
