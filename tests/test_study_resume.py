"""A study stopped by Ctrl-C keeps its finished runs and says how to continue; `study NAME --resume DIR`
continues it: finished runs kept as they are (not produced again), a half-done one moved aside and run
again, the recorded options held (a different one refused with exit 2), the result the same as a
fresh study's."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.cli.output import command_name
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.probes.run_folder import Manifest, StudyIndex
from inferledger.probes.study_dir import read_comparison
from inferledger.studies import registry
from inferledger.studies.framework import Option, Study, StudyError, StudyRun, Table, kept_runs, run_study

from test_progress import _run

E0 = Path(__file__).resolve().parent.parent / "samples" / "e0"
ARCHIVES = ("cancel_release", "preemption")


def _compare(runs) -> list[Table]:
    rows = [[name, runs.one(name, "SELECT e2e_server_ms FROM request_metrics")["e2e_server_ms"]] for name in runs.names]
    return [Table("key", "server E2E per run", ["run", "e2e_server_ms"], rows)]


def _study(stop_at: str | None = None, produced: list | None = None) -> Study:
    """Two imported runs; with `stop_at`, that run writes half a folder (a manifest still `running`)
    and Ctrl-C comes."""
    def produce_for(archive: str):
        def produce(run_dir: Path, run_id: str) -> None:
            if produced is not None:
                produced.append(archive)
            if archive == stop_at:
                run_dir.mkdir(parents=True)
                Manifest({"run_id": run_id, "state": "running"}).write(run_dir)
                raise KeyboardInterrupt
            import_archive(E0 / archive / "archive.jsonl", run_dir, run_id=run_id)
        return produce

    def runs(options):
        return [StudyRun(a, {"archive": a}, produce_for(a)) for a in ARCHIVES]
    return Study("e0-pair", "do the two archives differ in server E2E?", "archive", runs, _compare,
                 options={"scale": Option(1, "a multiplier")})


def _stamp(run_dir: Path) -> tuple:
    return (Manifest.read(run_dir).run_id, Manifest.file(run_dir).stat().st_mtime_ns,
            (run_dir / "ledger.duckdb").stat().st_mtime_ns)


def test_an_interrupted_study_resumes_keeping_its_finished_run_and_redoing_the_half_done_one(tmp_path):
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        run_study(_study(stop_at="preemption"), out, {"scale": 3})
    doc = StudyIndex.read(out).doc
    assert doc["state"] == "interrupted"
    assert doc["interrupted"] == "SIGINT with 1 of 2 runs finished (cancel_release)"
    assert kept_runs(out) == ["cancel_release"]
    before = _stamp(out / "runs" / "cancel_release")

    produced: list[str] = []
    result = run_study(_study(produced=produced), out, {}, resume=True)
    assert produced == ["preemption"]  # the finished run was not produced again
    assert _stamp(out / "runs" / "cancel_release") == before  # same run_id, manifest and ledger untouched
    aside = out / "interrupted" / "preemption"
    assert Manifest.read(aside).body == {"run_id": "e0-pair.preemption", "state": "running"}
    doc = StudyIndex.read(out).doc
    assert doc["state"] == "complete" and doc["options"] == {"scale": 3} and "interrupted" not in doc

    fresh = run_study(_study(), tmp_path / "fresh", {"scale": 3})
    assert [t.as_dict() for t in result.tables] == [t.as_dict() for t in fresh.tables]
    assert result.tables[0].rows == [["cancel_release", 1017.0], ["preemption", 892.0]]
    assert read_comparison(out) == read_comparison(tmp_path / "fresh")

    again = run_study(_study(produced=produced), out, {}, resume=True)  # complete: its comparison, nothing run
    assert produced == ["preemption"] and again.tables[0].rows == result.tables[0].rows


def test_a_kept_run_whose_ledger_this_code_did_not_build_is_rebuilt_on_resume(tmp_path, monkeypatch):
    """A study interrupted, the project upgraded, then resumed: the finished run is kept, but its ledger
    was built by the ledger code before (another `ledger_build`): rebuilt, so the comparison is this
    code's, not a refusal naming a file inside the study (a fit or a report would refuse that ledger)."""
    from inferledger.ledger import modules
    from inferledger.ledger.query import open_ledger

    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        run_study(_study(stop_at="preemption"), out, {"scale": 3})
    kept = out / "runs" / "cancel_release"
    monkeypatch.setattr(modules, "modules_sha256", lambda: "0" * 64)  # the upgraded code's modules
    with open_ledger(kept) as led:
        assert len(led.stale) == 1
    produced: list[str] = []
    result = run_study(_study(produced=produced), out, {}, resume=True)
    assert produced == ["preemption"]  # kept: not produced again, only its ledger rebuilt
    with open_ledger(kept) as led:
        assert led.stale == []
    assert result.tables[0].rows == [["cancel_release", 1017.0], ["preemption", 892.0]]


def test_a_study_folder_moved_before_its_resume_has_its_kept_ledger_rebuilt(tmp_path):
    """A kept run's ledger reads its events in place, from where the run was: the study folder moved
    (copied to another disk, renamed) before the resume, that ledger is rebuilt where it is now."""
    from inferledger.ledger.query import LedgerError, open_ledger

    with pytest.raises(KeyboardInterrupt):
        run_study(_study(stop_at="preemption"), tmp_path / "s", {"scale": 3})
    out = (tmp_path / "s").rename(tmp_path / "moved")
    with pytest.raises(LedgerError, match="moved"):
        open_ledger(out / "runs" / "cancel_release").close()
    result = run_study(_study(), out, {}, resume=True)
    with open_ledger(out / "runs" / "cancel_release") as led:
        assert led.stale == [] and led.rows("SELECT count(*) FROM events")[1][0][0] > 0
    assert result.tables[0].rows == [["cancel_release", 1017.0], ["preemption", 892.0]]


def test_a_second_half_done_folder_is_set_aside_under_a_new_name(tmp_path):
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        run_study(_study(stop_at="preemption"), out)
    assert not (out / "interrupted").exists()
    with pytest.raises(KeyboardInterrupt):
        run_study(_study(stop_at="preemption"), out, resume=True)
    assert sorted(p.name for p in (out / "interrupted").iterdir()) == ["preemption"]
    assert Manifest.read(out / "runs" / "preemption").body["state"] == "running"  # half-done again
    with pytest.raises(KeyboardInterrupt):
        run_study(_study(stop_at="preemption"), out, resume=True)
    assert sorted(p.name for p in (out / "interrupted").iterdir()) == ["preemption", "preemption-2"]


def test_a_resume_with_another_option_or_study_or_folder_is_refused(tmp_path):
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        run_study(_study(stop_at="preemption"), out, {"scale": 3})
    with pytest.raises(StudyError, match=r"--set scale=2 differs from the study's recorded scale=3"):
        run_study(_study(), out, {"scale": 2}, resume=True)
    assert StudyIndex.read(out).doc["state"] == "interrupted"  # a refusal changes nothing
    assert not (out / "interrupted").exists()
    with pytest.raises(StudyError, match=r"holds study 'e0-pair', not 'other'"):
        run_study(Study("other", "?", "k", _study().runs, _compare), out, resume=True)
    with pytest.raises(StudyError, match=r"--resume .*nowhere: no such folder"):
        run_study(_study(), tmp_path / "nowhere", resume=True)


@pytest.fixture
def pair_study(monkeypatch):
    """The e0 pair registered as a study the command knows; `stop` names the run Ctrl-C comes in."""
    state = {"stop": None, "produced": []}

    def study() -> Study:
        return _study(stop_at=state["stop"], produced=state["produced"])
    monkeypatch.setattr(registry, "get_study", lambda name: study())
    return state


def test_the_command_says_what_was_kept_and_how_to_continue_then_resumes(tmp_path, pair_study):
    out = tmp_path / "s"
    pair_study["stop"] = "preemption"
    runner = CliRunner()
    res = runner.invoke(app, ["study", "e0-pair", "-o", str(out), "--set", "scale=3"])
    assert res.exit_code == 130, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)  # no traceback
    lines = [line for line in res.output.splitlines() if line.startswith("interrupted")]
    assert lines == [f"interrupted: study e0-pair kept 1 finished run (cancel_release) in {out}; continue it with: "
                     f"{command_name()} study e0-pair --resume {out}"]
    assert "run 1/2 cancel_release: 1 attempts, " in res.output  # the point's line as it finished ...
    # ... with its figures (samples/e0/cancel_release/expected.json: TTFT 163 ms at the client, not good)
    assert "goodput0req/s,TTFTp50163.0ms(client),ITLp5020.0ms(client)" in "".join(res.output.split())

    res = runner.invoke(app, ["study", "e0-pair", "--resume", str(out), "--set", "scale=2"])
    assert res.exit_code == 2 and "--set scale=2 differs from the study's recorded scale=3" in res.output, res.output


    pair_study["stop"] = None
    res = runner.invoke(app, ["study", "e0-pair", "--resume", str(out)])
    assert res.exit_code == 0, res.output
    def unwrapped(text: str) -> str:  # a narrow terminal may wrap a line, a long path even inside it
        return "".join(text.split())

    assert unwrapped("run 1/2 cancel_release: kept (finished before the resume)") in unwrapped(res.output)
    assert unwrapped(f"run 2/2 preemption: half-done, set aside: {out / 'interrupted' / 'preemption'}") in \
        unwrapped(res.output)
    assert pair_study["produced"] == ["cancel_release", "preemption", "preemption"]  # cancel_release once
    res = runner.invoke(app, ["study", "e0-pair", "--resume", str(out), "--format", "json"])  # complete: exit 0
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"key": [{"run": "cancel_release", "e2e_server_ms": 1017.0},
                                              {"run": "preemption", "e2e_server_ms": 892.0}]}
    assert pair_study["produced"] == ["cancel_release", "preemption", "preemption"]  # nothing run again

    res = runner.invoke(app, ["study", "e0-pair", "--resume", str(out), "-o", str(tmp_path / "t")])
    assert res.exit_code == 2 and "not both" in res.output
    res = runner.invoke(app, ["study", "e0-pair", "--resume", str(tmp_path / "none")])
    assert res.exit_code == 2 and "--resume" in res.output and "no such folder" in res.output


@pytest.fixture(scope="module")
def fresh_book(tmp_path_factory) -> tuple[Path, int, bytes, bytes]:
    """A fresh `study schedule-book -f json`, stdout piped and stderr not a terminal: (folder, exit code,
    stdout, stderr); what a resumed study must equal, and what the bar drawn on a terminal must not change."""
    out = tmp_path_factory.mktemp("fresh") / "book"
    return (out, *_run(["study", "schedule-book", "-o", str(out), "-f", "json"], terminal=False))


@pytest.mark.slow  # the command in processes of its own
def test_a_study_prints_the_same_json_with_its_bar_on_a_terminal_or_without(fresh_book, tmp_path):
    _, rc, piped_out, piped_err = fresh_book
    assert rc == 0, piped_err
    rc, tty_out, tty_err = _run(["study", "schedule-book", "-o", str(tmp_path / "b"), "-f", "json"], terminal=True)
    assert rc == 0, tty_err
    assert tty_out == piped_out and piped_out.startswith(b'{"schedule"')
    assert b"study schedule-book: run 3/3 chunked" in tty_err
    assert piped_err == b""


def _inferledger() -> list[str]:
    return [str(Path(sys.executable).with_name("inferledger"))]  # the venv's command, beside its python


@pytest.mark.slow  # the command in processes of its own
def test_sigint_to_the_command_keeps_the_first_run_and_the_resume_does_not_capture_it_again(tmp_path, fresh_book):
    """A real Ctrl-C (SIGINT to the process) once the first run's folder is finished: exit 130, one line,
    no traceback; the resume keeps that run (its manifest untouched) and ends like a fresh study."""
    out = tmp_path / "book"
    first = out / "runs" / "fixed"
    proc = subprocess.Popen(_inferledger() + ["study", "schedule-book", "-o", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not Manifest.exists(first) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "Traceback" not in stdout
    said = [line for line in stderr.splitlines() if line.startswith("interrupted")]
    assert len(said) == 1 and said[0].endswith(f"study schedule-book --resume {out}"), stderr
    assert StudyIndex.read(out).doc["state"] == "interrupted"
    assert "fixed" in kept_runs(out)
    stamp = (Manifest.read(first).run_id, Manifest.file(first).stat().st_mtime_ns)

    res = subprocess.run(_inferledger() + ["study", "schedule-book", "--resume", str(out), "-f", "json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert (Manifest.read(first).run_id, Manifest.file(first).stat().st_mtime_ns) == stamp == (
        "schedule-book.fixed", stamp[1])
    fresh, rc, fresh_out, fresh_err = fresh_book
    assert rc == 0, fresh_err
    assert json.loads(res.stdout) == json.loads(fresh_out)
    assert read_comparison(out) == read_comparison(fresh)
    assert StudyIndex.read(out).doc["state"] == "complete"
    assert sorted(os.listdir(out / "runs")) == sorted(os.listdir(fresh / "runs"))


@pytest.mark.slow  # the command in processes of its own
def test_sigterm_stops_a_study_as_ctrl_c_does_with_its_own_exit_code(tmp_path):
    out = tmp_path / "book"
    proc = subprocess.Popen(_inferledger() + ["study", "schedule-book", "-o", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not Manifest.exists(out / "runs" / "fixed") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, (stdout, stderr)
    assert "Traceback" not in stderr and f"study schedule-book --resume {out}" in stderr
    assert StudyIndex.read(out).doc["interrupted"].startswith("SIGTERM with ")


def test_ctrl_c_inside_a_ledger_statement_is_given_back_as_an_interrupt(tmp_path, monkeypatch):
    """DuckDB's client turns a Ctrl-C that lands inside a statement into RuntimeError('Query
    interrupted'); the rebuild gives it back as KeyboardInterrupt (a study then says interrupted, not
    failed), and leaves no ledger behind."""
    from inferledger.ledger import stages
    from inferledger.ledger.reconstruct import reconstruct

    run = tmp_path / "r"
    import_archive(E0 / "preemption" / "archive.jsonl", run, run_id="r")
    real, killers = stages._run_module, []

    def slow_first(con, module, run_files, profile):
        if module.name == "load":  # statements long enough for the signal to land inside them (DuckDB
            # notices it as the statement ends); sent by another process, which no thread of this one, nor
            # a statement holding the interpreter lock, can hold up on a loaded host
            killers.append(subprocess.Popen(["sh", "-c", f"sleep 0.1; kill -INT {os.getpid()}"]))
            con.execute("CREATE TEMP TABLE slow AS SELECT count(*) FROM range(400000000) t(i) WHERE i % 7 = 3; "
                        "SELECT 1")
        return real(con, module, run_files, profile)
    monkeypatch.setattr(stages, "_run_module", slow_first)
    # Ctrl-C as a terminal delivers it, whatever this test process inherited
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            reconstruct(run)
    finally:
        signal.signal(signal.SIGINT, old)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    assert time.monotonic() - t0 < 60
    assert [k.wait(timeout=60) for k in killers] == [0]
    assert not (run / "ledger.duckdb").exists() and not list(run.glob(".ledger.duckdb.tmp-*"))


def test_report_of_an_interrupted_study_draws_the_runs_that_finished(tmp_path):
    """`report DIR` of a study Ctrl-C stopped: DIR/report.html with the finished run's timeline, the
    runs table saying which did not finish, no comparison (the study did not write one), exit 0."""
    import dataclasses

    out = tmp_path / "s"
    figures = ({"kind": "timeline", "title": "each run's steps"},
               {"kind": "curve", "title": "E2E per run", "table": "key", "x": "run", "y": ["e2e_server_ms"]})
    with pytest.raises(KeyboardInterrupt):
        run_study(dataclasses.replace(_study(stop_at="preemption"), figures=figures), out)
    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert "MiB, 1 run, " in res.output
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "SIGINT with 1 of 2 runs finished (cancel_release)" in html
    assert "the 1 of 2 runs that finished" in html and f"study e0-pair --resume {out}" in html
    assert html.count('id="study-fig0-') == 1  # the timeline of cancel_release alone
    assert "drawn from the study&#x27;s comparison, which an unfinished study has not written" in html or \
        "drawn from the study's comparison, which an unfinished study has not written" in html
    assert "<td>preemption</td><td>archive=preemption</td><td>not finished</td>" in html
    assert "<td>cancel_release</td><td>archive=cancel_release</td><td>finished</td>" in html

    (out / "runs" / "cancel_release" / "ledger.duckdb").unlink()  # no run with a ledger: a clear refusal
    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 2 and "none of its runs has finished" in res.output, res.output


def test_a_study_that_names_no_timeline_gets_one_of_its_small_runs(tmp_path, monkeypatch):
    """Its page draws every run of at most TIMELINE_ROWS attempts on one time scale; a bigger run is
    named in the title, not drawn."""
    from inferledger.report import study_page

    out = tmp_path / "s"
    run_study(_study(), out)
    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="study-fig0-0"' in html and 'id="study-fig0-1"' in html and 'id="study-fig0-2"' not in html
    assert "each run&#x27;s requests, on one time scale" in html or "each run's requests, on one time scale" in html

    monkeypatch.setattr(study_page, "TIMELINE_ROWS", 0)  # every run too big: no timeline, no empty section
    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 0 and 'id="study-fig0' not in (out / "report.html").read_text(encoding="utf-8")


def test_summary_of_an_interrupted_study_gives_the_finished_runs_and_names_the_rest(tmp_path):
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        run_study(_study(stop_at="preemption"), out)
    res = CliRunner().invoke(app, ["summary", str(out), "--table", "run"])
    assert res.exit_code == 0, res.output
    text = "".join(res.output.split())  # a narrow terminal wraps the line, a long path even inside it
    assert "cancel_release" in text and "preemption" in text.split("nocomparisonyet")[1]
    assert "".join(f"no comparison yet: the study is interrupted, not finished: preemption; continue it with: "
                   f"{command_name()} study e0-pair --resume {out}".split()) in text
    res = CliRunner().invoke(app, ["summary", str(out), "--format", "json"])
    assert res.exit_code == 0 and {k.split(".")[0] for k in json.loads(res.stdout)} == {"cancel_release"}

    (out / "runs" / "cancel_release" / "ledger.duckdb").unlink()  # a finished run without its ledger: rebuild it
    res = CliRunner().invoke(app, ["summary", str(out)])
    assert res.exit_code == 2 and "".join(f"no ledger; build them with: {command_name()} reconstruct {out}".split()) \
        in "".join(res.output.split()), res.output


def test_reconstruct_of_an_interrupted_study_builds_the_finished_runs_and_names_the_rest(tmp_path):
    """`reconstruct DIR` of a study Ctrl-C stopped: the finished run's ledger built again, the half-done
    run left alone and named with how to continue, no comparison, exit 0."""
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        run_study(_study(stop_at="preemption"), out)
    (out / "runs" / "cancel_release" / "ledger.duckdb").unlink()
    res = CliRunner().invoke(app, ["reconstruct", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [b["run"] for b in doc["ledgers"]] == ["cancel_release"] and doc["not_finished"] == [{"run": "preemption"}]
    assert (out / "runs" / "cancel_release" / "ledger.duckdb").exists()
    assert not (out / "runs" / "preemption" / "ledger.duckdb").exists()
    assert Manifest.read(out / "runs" / "preemption").body["state"] == "running"  # left as it was
    res = CliRunner().invoke(app, ["reconstruct", str(out)])
    assert res.exit_code == 0, res.output
    assert "".join(f"the comparison was left as it was: the study is interrupted, not finished: preemption; "
                   f"continue it with: {command_name()} study e0-pair --resume {out}".split()) \
        in "".join(res.output.split()), res.output
