"""`reconstruct --follow` / `summary --follow`: the ledger of a run still recording, rebuilt as its parts
arrive; attempts without an end are in flight (not failed) while the manifest says the run records; the
last rebuild equals a fresh reconstruct; readers never fail; Ctrl-C leaves the last ledger whole."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import inferledger
from inferledger.cli.app import app
from inferledger.ledger.follow import FollowOptions, follow
from inferledger.ledger.reconstruct import BuildOptions, RunDirError, reconstruct
from inferledger.probes.run_folder import Manifest
from scale_util import ledger_differences
from test_scale_memory import bench_module

PARTS = 3
ATTEMPTS, TOKENS = 40, 16


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A synthetic run's events in time order, cut into PARTS parts as a capture would flush them, with
    its other files: what `grow` copies into a run folder one flush at a time."""
    src = tmp_path_factory.mktemp("follow") / "src"
    bench_module().phase_import(src, ATTEMPTS, TOKENS, 5)
    events = pq.read_table(src / "events").sort_by([("ts_ns", "ascending"), ("event_id", "ascending")])
    step = -(-events.num_rows // PARTS)
    parts = [events.slice(i * step, step) for i in range(PARTS)]
    return src, parts


def start_run(recorded, run: Path) -> None:
    """A run folder as a capture leaves it after its start: files, no event part, the state running."""
    src, _parts = recorded
    (run / "events").mkdir(parents=True)
    for name in ("clocks.parquet", "tasks.parquet"):
        shutil.copy(src / name, run / name)
    Manifest(Manifest.read(src).body).write(run)
    set_state(run, "running")


def set_state(run: Path, state: str) -> None:
    Manifest({**Manifest.read(run).body, "state": state}).write(run)


def flush(recorded, run: Path, i: int) -> None:
    """Part i written as the capture writes it: under a dot name, renamed in whole."""
    tmp = run / "events" / f".part-{i:05d}.parquet.tmp"
    pq.write_table(recorded[1][i], tmp)
    os.replace(tmp, run / "events" / f"part-{i:05d}.parquet")


def test_an_attempt_without_an_end_is_in_flight_while_the_run_records_and_unterminated_after(recorded, tmp_path):
    run = tmp_path / "run"
    start_run(recorded, run)
    flush(recorded, run, 0)
    flush(recorded, run, 1)  # half the run: some attempts ended, the rest still going
    reconstruct(run, BuildOptions(live=True))  # as --follow rebuilds a run it watches
    with inferledger.open(str(run)) as led:
        _c, statuses = led.rows("SELECT client_status, server_status, count(*) FROM attempts GROUP BY ALL ORDER BY ALL")
        _c, rec = led.rows("SELECT completed, unterminated, in_flight, p_fail FROM reconciliation")
        _c, gaps = led.rows("SELECT count(*) FROM gaps WHERE affects LIKE 'client_status, server_status%' "
                            "AND detail LIKE 'in flight at the last flush%'")
        _c, good = led.rows("SELECT count(*) FILTER (WHERE good IS NULL), count(*) FILTER (WHERE good = false) "
                            "FROM request_metrics JOIN attempts USING (attempt_id) WHERE client_status = 'in_flight'")
    completed = dict(((c, s), n) for c, s, n in statuses)[("completed", "completed")]
    in_flight = sum(n for c, s, n in statuses if "in_flight" in (c, s))
    assert completed > 0 and in_flight > 0  # the cut falls inside the run
    assert {(c, s) for c, s, _n in statuses} == {("completed", "completed"), ("in_flight", "in_flight")}
    # not failed: p_fail counts the attempts that ended (all of which completed), not the ones in flight
    assert rec == [(completed, 0, in_flight, 0.0)]
    assert gaps == [(in_flight,)] and good == [(in_flight, 0)]
    # a plain rebuild of the same files: a manifest saying running may be a capture killed with SIGKILL,
    # whose unended attempts never end: unterminated, as once the run says it is over
    for state in ("running", "interrupted"):
        set_state(run, state)
        reconstruct(run)
        with inferledger.open(str(run)) as led:
            _c, rec = led.rows("SELECT completed, unterminated, in_flight, p_fail FROM reconciliation")
        assert rec == [(completed, in_flight, 0, in_flight / (completed + in_flight))], state


def test_follow_rebuilds_per_flush_only_and_ends_with_a_fresh_reconstruct(recorded, tmp_path):
    run = tmp_path / "run"
    start_run(recorded, run)
    # the capture's flushes, then its last word; each lands while the loop waits between two looks
    # (its `sleep`), after three looks at unchanged files, so each look sees a flush whole
    steps = [lambda i=i: flush(recorded, run, i) for i in range(PARTS)] + [lambda: set_state(run, "complete")]
    refreshes, errors, reads, idle = [], [], [], [0]
    stop = threading.Event()

    def on_refresh(r):
        refreshes.append(r)
        idle[0] = 0

    def between_looks(_seconds):
        idle[0] += 1
        if idle[0] >= 3 and steps:
            steps.pop(0)()
            idle[0] = 0
        time.sleep(0.01)

    def read():  # another terminal's `inferledger query`, over and over while the ledger is replaced
        while not stop.is_set():
            if (run / "ledger.duckdb").exists():
                try:
                    with inferledger.open(str(run)) as led:
                        led.rows("SELECT count(*) FROM attempts JOIN request_metrics USING (attempt_id)")
                    reads.append(True)
                except Exception as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)
            time.sleep(0.01)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        summary = follow(run, following=FollowOptions(every_s=0.05), on_refresh=on_refresh, sleep=between_looks)
    finally:
        stop.set()
        reader.join(60)
    assert errors == [] and reads and steps == []
    assert [r.n for r in refreshes] == list(range(1, PARTS + 2))  # one per flush and the final one, none idle
    assert [r.recording for r in refreshes] == [True] * PARTS + [False]
    assert [r.final for r in refreshes] == [False] * PARTS + [True]
    assert refreshes[0].in_flight > 0 and refreshes[-1].in_flight == 0
    # the first and the final refresh whole, those between only the tasks their part touched
    assert [r.how.split(":")[0] for r in refreshes] == ["whole"] + ["incremental"] * (PARTS - 1) + ["whole"]
    assert refreshes[-1].summary.n_attempts == ATTEMPTS
    fresh = reconstruct(run, out=tmp_path / "fresh.duckdb")
    assert summary.path == run / "ledger.duckdb"
    assert ledger_differences(run / "ledger.duckdb", fresh.path) == []
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no build left behind


def test_a_run_whose_files_stop_changing_while_it_says_recording_is_said_once_to_be_perhaps_killed(recorded, tmp_path):
    """A capture killed with SIGKILL never writes its last state, so --follow would look on in silence: once
    no file changed for `silent_s` it says so, once, and goes on following."""
    run = tmp_path / "run"
    start_run(recorded, run)
    flush(recorded, run, 0)
    said, looks = [], []

    def look_again(seconds):  # the capture "dies" after its first flush; the run is declared over later
        time.sleep(seconds)
        looks.append(seconds)
        if len(looks) == 12:
            set_state(run, "interrupted")

    follow(run, following=FollowOptions(every_s=0.05, silent_s=0.3), say=said.append, sleep=look_again)
    quiet = [line for line in said if "may have been killed" in line]
    assert len(quiet) == 1 and quiet[0].startswith(f"{run}: no file of the run changed for "), said


def test_a_folder_without_a_manifest_is_waited_for_a_bounded_time(tmp_path):
    said = []
    with pytest.raises(RunDirError, match=r"no manifest after 0.2 s: not a run being captured"):
        follow(tmp_path / "not_yet", following=FollowOptions(every_s=0.05, wait_s=0.2), say=said.append)
    assert said == [f"{tmp_path / 'not_yet'}: no manifest yet; waiting up to 0.2 s for the capture to start"]


def test_summary_follow_prints_one_json_object_per_rebuild_and_reconstruct_one_csv_row(recorded, tmp_path):
    run = tmp_path / "run"
    start_run(recorded, run)
    for i in range(PARTS):
        flush(recorded, run, i)
    set_state(run, "complete")  # a finished run: one rebuild, then the command ends
    res = CliRunner().invoke(app, ["summary", str(run), "--follow", "--every", "0.05", "--format", "json"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["follow"]["refresh"] == 1 and doc["follow"]["final"] is True and doc["follow"]["in_flight"] == 0
    assert doc["follow"]["n_attempts"] == ATTEMPTS and "run" in doc and "verdict_time" in doc
    res = CliRunner().invoke(app, ["reconstruct", str(run), "--follow", "--format", "csv"])
    assert res.exit_code == 0, res.output
    head, row = res.stdout.strip().splitlines()
    assert head.startswith("refresh,final,recording,seconds,run_id,n_events,n_attempts,in_flight")
    assert row.startswith("1,True,False,")


def test_a_capture_killed_before_its_first_flush_is_said_to_be_perhaps_killed_too(recorded, tmp_path):
    run = tmp_path / "run"
    start_run(recorded, run)  # recording, no part ever flushed
    said, looks = [], []

    def look_again(seconds):
        time.sleep(seconds)
        looks.append(seconds)
        if len(looks) == 12:
            set_state(run, "interrupted")

    with pytest.raises(RunDirError, match="no event parts"):  # declared over with nothing recorded: refused
        follow(run, following=FollowOptions(every_s=0.05, silent_s=0.3), say=said.append, sleep=look_again)
    assert said[0] == f"{run}: recording, no events flushed yet; waiting for the first part"
    assert len([line for line in said if "may have been killed" in line]) == 1, said


@pytest.mark.parametrize("args, message", [
    (["--engine", "ray"], "--follow: the Ray engine needs a partitioned run"),
    (["--out", "x.duckdb", "--every", "0"], "--every"),
])
def test_follow_refusals_exit_2(tmp_path, args, message):
    (tmp_path / "run").mkdir()
    res = CliRunner().invoke(app, ["reconstruct", str(tmp_path / "run"), "--follow", *args])
    assert res.exit_code == 2 and message in res.output


@pytest.mark.parametrize("command", ["reconstruct", "summary"])
@pytest.mark.parametrize("every", ["1e12", "inf", "nan", "-1"])  # 1e12 s overflowed sleep: a traceback
def test_every_past_its_range_exits_2_naming_it(tmp_path, command, every):
    (tmp_path / "run").mkdir()
    res = CliRunner().invoke(app, [command, str(tmp_path / "run"), "--follow", "--every", every])
    assert res.exit_code == 2 and "Invalid value for '--every'" in res.output, res.output


def test_a_file_named_as_the_run_folder_is_refused_at_once_not_waited_for(tmp_path):
    (tmp_path / "ledger.duckdb").write_bytes(b"")
    t0 = time.monotonic()
    with pytest.raises(RunDirError, match=r"ledger.duckdb: a file, not a run folder"):
        follow(tmp_path / "ledger.duckdb", following=FollowOptions(every_s=0.05, wait_s=30.0))
    assert time.monotonic() - t0 < 5.0


@pytest.mark.slow  # the command in a process of its own
@pytest.mark.parametrize("signum, code, said", [(signal.SIGINT, 130, "interrupted: stopped following"),
                                                (signal.SIGTERM, 143, "terminated (SIGTERM): stopped following")])
def test_ctrl_c_leaves_the_last_ledger_whole_and_exits_130(recorded, tmp_path, signum, code, said):
    """Started as a background job is (SIGINT ignored: `cmd &` in a script), `--follow` still stops on
    `kill -INT`, and on SIGTERM, as Ctrl-C stops it: the last ledger whole, no rebuild left behind."""
    run = tmp_path / "run"
    start_run(recorded, run)
    flush(recorded, run, 0)
    flush(recorded, run, 1)
    cli = Path(sys.executable).with_name("inferledger")
    proc = subprocess.Popen([str(cli), "reconstruct", str(run), "--follow", "--every", "0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        first = proc.stdout.readline()  # the first rebuild is in place
        assert first.startswith("refresh 1 (recording"), first
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err and said in err
    assert not list(run.glob(".ledger.duckdb.tmp-*"))
    fresh = reconstruct(run, BuildOptions(live=True), out=tmp_path / "fresh.duckdb")  # the same files, still recording
    assert ledger_differences(run / "ledger.duckdb", fresh.path) == []


@pytest.mark.parametrize("state, outcome", [("running", "unknown"), ("complete", "failure")])
def test_a_required_turn_not_yet_sent_is_unknown_while_the_run_records_and_failed_after(tmp_path, state, outcome):
    from ledger_util import build_run, event

    contract = {"required": ["RA1", "RA2"]}  # two turns; the first done and good, the second never sent
    con = build_run(tmp_path / state, [
        event("task.start", 0, None, task="T", attrs=contract),
        event("attempt.created", 1, "A1", task="T"), event("attempt.sent", 2, "A1", task="T"),
        event("attempt.done", 9, "A1", task="T"),
        event("verdict", 10, "A1", source="checker", task="T", attrs={"correct": True}),
    ], manifest={"state": state}, live=True)
    try:
        assert con.execute("SELECT outcome, n_required, n_required_succeeded FROM tasks").fetchall() == [(outcome, 2, 1)]
    finally:
        con.close()
