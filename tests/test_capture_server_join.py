"""`inferledger serve --out S` in one process and `capture --target URL --server S` in another make one run with
the engine's account: every attempt sent, no other, with its steps, engine intervals and server status from
the server's own events; a folder that has not flushed them is a gap naming it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
from ledger_util import dict_rows as _rows
from serve_util import serve_out

import inferledger
from inferledger.collectors.capture import servers as server_join
from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.capture.run import capture
from inferledger.collectors.workload import Workload
from inferledger.ledger.reconstruct import reconstruct
from inferledger.probes.probe import host_id, mono_clock
from inferledger.probes.study_dir import read_comparison, run_dirs

N_TASKS = 3


def _workload(tmp: Path) -> Workload:
    (tmp / "tasks.jsonl").write_text(json.dumps({"kind": "lookup", "answer": "paris", "prompt":
                                                 "What is the capital of France? Answer in one word."}) + "\n")
    spec = {"name": "joined", "seed": 1, "taskset": {"file": "tasks.jsonl"},
            "arrivals": {"process": "closed", "concurrency": 2, "n_tasks": N_TASKS},
            "contract": {"deadline_ms": 300_000}, "client": {"timeout_ms": 300_000},
            "generation": {"max_tokens": 4, "temperature": 0.0}}
    return Workload.from_dict(spec, base=tmp)


def _ledger(run: Path):
    reconstruct(run)
    return duckdb.connect(str(run / "ledger.duckdb"), read_only=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A real `inferledger serve --out` in a process of its own, serving the captures of this module."""
    folder = tmp_path_factory.mktemp("serve") / "srv"
    with serve_out(folder, "--served-model-name", "m", "--flush-every", "0.5") as url:
        yield url, folder


def _check_joined(run: Path, server_clock: str) -> duckdb.DuckDBPyConnection:
    con = _ledger(run)
    attempts = _rows(con, "SELECT attempt_id, client_status, server_status, server_clock FROM attempts ORDER BY 1")
    assert [a["attempt_id"] for a in attempts] == [f"T{i:04d}:R1:A1" for i in range(N_TASKS)]  # these, no other
    assert {(a["client_status"], a["server_status"], a["server_clock"]) for a in attempts} == \
        {("completed", "completed", server_clock)}
    stepped = con.execute("SELECT count(DISTINCT attempt_id) FROM step_attribution WHERE attempt_id IN "
                          "(SELECT attempt_id FROM attempts)").fetchone()[0]
    assert stepped == N_TASKS  # every attempt in the engine's steps
    engine = con.execute("SELECT count(DISTINCT attempt_id) FROM intervals WHERE stream = 'engine'").fetchone()[0]
    assert engine == N_TASKS
    assert con.execute("SELECT count(*) FROM gaps WHERE gap_id LIKE 'collector:server%' "
                       "OR gap_id = 'collector:black-box'").fetchone()[0] == 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["servers"]["answered"], manifest["servers"]["joined"]) == (N_TASKS, N_TASKS)
    assert manifest["model"]["architecture"] and manifest["engine_config"]["block_size"]
    return con


@pytest.mark.slow
def test_one_host_one_clock_the_run_has_the_engines_account(served, tmp_path):
    url, folder = served
    run = tmp_path / "run"
    capture(_workload(tmp_path), run, CaptureOptions(target=url, servers=(folder,), server_wait_s=120))
    con = _check_joined(run, mono_clock(host_id()))
    entry = json.loads((run / "manifest.json").read_text())["servers"]["folders"][0]
    assert (entry["clock"]["same_domain"], entry["clock"]["mappings"]) == (True, [])
    assert con.execute("SELECT count(*) FROM clocks WHERE from_clock LIKE 'mono:%@%'").fetchone()[0] == 0


@pytest.mark.slow
def test_another_boot_is_another_clock_mapped_by_round_trips(served, tmp_path, monkeypatch):
    """The same attempt ids as the other capture (the server names them #2): this run's are picked by trace id;
    a server the manifest does not place on this boot is on a clock of its own, mapped with its epsilon."""
    url, folder = served
    monkeypatch.setattr(server_join, "boot_id", lambda: "another-boot")
    run = tmp_path / "run"
    capture(_workload(tmp_path), run, CaptureOptions(target=url, servers=(folder,), server_wait_s=120))
    theirs = f"{mono_clock(host_id())}@srv"
    con = _check_joined(run, theirs)
    maps = _rows(con, "SELECT to_clock, epsilon_ns, method FROM clocks WHERE from_clock = ? ORDER BY 1", theirs)
    assert len(maps) == 2 and {m["to_clock"] for m in maps} == {mono_clock(host_id())}
    assert all(m["epsilon_ns"] > 0 and m["method"] == "round-trip (srv's /clock)" for m in maps)
    entry = json.loads((run / "manifest.json").read_text())["servers"]["folders"][0]
    assert [m["label"] for m in entry["clock"]["mappings"]] == ["start", "end"]


def _captured_beside(bundle, tmp_path: Path, writer, wait_s: float) -> duckdb.DuckDBPyConnection:
    """A server in this process writing its run through `writer`, a capture against it joining that
    folder (waiting at most `wait_s` for it), and the run's ledger."""
    from inferledger.engine import EngineConfig
    from inferledger.serve.lifecycle import Serving

    life = Serving(bundle, EngineConfig(max_num_seqs=4), sink=writer, owns_run=True)
    url = life.start()
    try:
        run = tmp_path / "run"
        capture(_workload(tmp_path), run, CaptureOptions(target=url, servers=(writer.run_dir,), server_wait_s=wait_s))
    finally:
        life.stop()
    return _ledger(run)


@pytest.mark.slow
def test_a_folder_that_never_flushed_is_a_gap_naming_it(bundle, tmp_path):
    from inferledger.collectors.rundir.writer import RunWriter

    folder = tmp_path / "quiet"
    # no periodic flush: nothing of the load reaches the disk while it serves
    con = _captured_beside(bundle, tmp_path, RunWriter(folder), wait_s=0.5)
    assert [a["server_status"] for a in _rows(con, "SELECT server_status FROM attempts")] == ["unknown"] * N_TASKS
    gaps = _rows(con, "SELECT gap_id, scope, detail FROM gaps WHERE gap_id LIKE 'collector:server%' ORDER BY 1")
    assert [g["gap_id"] for g in gaps] == ["collector:server-attempt:T0000:R1:A1", "collector:server-attempt:T0001:R1:A1",
                                           "collector:server-attempt:T0002:R1:A1", "collector:server:quiet"]
    assert str(folder) in gaps[-1]["detail"] and f"and {N_TASKS} attempt(s) the server answered" in gaps[-1]["detail"]
    assert con.execute("SELECT count(*) FROM gaps WHERE gap_id = 'collector:black-box'").fetchone()[0] == 0


@pytest.mark.slow
def test_a_folder_lacking_the_last_attempts_end_is_a_gap_naming_it(bundle, tmp_path):
    """As a server killed before its last flush: the last attempt's ends never reach the folder. What the
    folder holds of it is joined (server side unterminated), the others whole, and the gaps name the folder
    and what the attempt lacks."""
    from inferledger.collectors.rundir.writer import RunWriter

    last, ends = "T0002:R1:A1", ("server.done", "engine.finished", "kv.free")

    class LosesTheLastEnd(RunWriter):
        def emit(self, row: dict) -> None:
            if not (row["attempt_id"] == last and row["name"] in ends):
                super().emit(row)

    folder = tmp_path / "killed"
    con = _captured_beside(bundle, tmp_path, LosesTheLastEnd(folder, autoflush_s=0.2), wait_s=3)
    assert [(a["attempt_id"], a["server_status"]) for a in _rows(con, "SELECT attempt_id, server_status FROM attempts "
                                                                      "ORDER BY 1")] == \
        [("T0000:R1:A1", "completed"), ("T0001:R1:A1", "completed"), (last, "unterminated")]
    gaps = _rows(con, "SELECT gap_id, detail FROM gaps WHERE gap_id LIKE 'collector:server%' ORDER BY 1")
    assert [g["gap_id"] for g in gaps] == [f"collector:server-attempt:{last}", "collector:server:killed"]
    assert gaps[0]["detail"] == f"{folder}: its flushed parts lack the attempt's server.done, engine.finished, kv.free"
    assert str(folder) in gaps[1]["detail"] and "lack the end of 1 of the 3 attempt(s)" in gaps[1]["detail"]


def _ev(name, aid=None, ts=0, step=None, attrs="{}", clock="mono:h"):
    return {"name": name, "attempt_id": aid, "ts_ns": ts, "step_id": step, "attrs": attrs, "clock": clock,
            "source": "engine", "event_id": f"e{ts}", "seq": ts}


def test_an_attempt_is_covered_only_with_its_end_on_disk():
    """Found by its trace id; covered with a server terminal and, once enqueued, engine.finished, kv.free and
    the step.end of its last step; the one whose end is not flushed yet names what it lacks."""
    want = {"t1": "T0:R0:A1", "t2": "T1:R0:A1"}
    events = [_ev("server.received", "T0:R0:A1#2", 1, attrs='{"trace_id":"t1"}'),
              _ev("server.received", "T1:R0:A1", 2, attrs='{"trace_id":"t2"}'),
              _ev("server.received", "other", 3, attrs='{"trace_id":"tx"}'),
              _ev("engine.enqueued", "T0:R0:A1#2", 4), _ev("engine.enqueued", "T1:R0:A1", 5),
              _ev("engine.finished", "T0:R0:A1#2", 6, step=7), _ev("kv.free", "T0:R0:A1#2", 7, step=7),
              _ev("step.end", None, 8, step=7), _ev("server.done", "T0:R0:A1#2", 9),
              _ev("engine.finished", "T1:R0:A1", 10, step=8), _ev("server.done", "T1:R0:A1", 11)]
    found = server_join._find(events, want)
    assert found.ours == {"T0:R0:A1#2": "T0:R0:A1", "T1:R0:A1": "T1:R0:A1"}
    assert found.uncovered == {"T1:R0:A1": ["kv.free", "step.end of step 8"]}
    renamed = json.loads(server_join._batch_renamed('{"batch":[["T0:R0:A1#2","decode",1,5],["T0:R0:A1","decode",1,9]]}',
                                                    found.ours, "srv"))
    assert [b[0] for b in renamed["batch"]] == ["T0:R0:A1", "T0:R0:A1@srv"]  # another client's kept apart


def test_an_attempt_id_sent_again_is_a_new_attempt_on_the_server():
    """Two captures sending one attempt id stay two attempts, as a reused x-request-id already did."""
    from inferledger.serve.ids import IdAssigner

    ids = IdAssigner()
    sent = [ids.assign({"x-inferledger-attempt-id": "T0000:R1:A1", "x-request-id": "T0000:R1:A1"}) for _ in range(3)]
    assert [i.attempt_id for i in sent] == ["T0000:R1:A1", "T0000:R1:A1#2", "T0000:R1:A1#3"]
    assert {i.request_id for i in sent} == {"T0000:R1:A1"}
    assert ids.assign({"x-request-id": "other"}).attempt_id == "other"


def test_capture_refuses_a_server_folder_it_cannot_join_with_exit_2_naming_it(tmp_path):
    from typer.testing import CliRunner

    from inferledger.cli.app import app
    from inferledger.probes.run_folder import Manifest

    def run(*args):
        return CliRunner().invoke(app, ["capture", "-o", str(tmp_path / "r"), "--num-prompts", "1", *args],
                                  env={"COLUMNS": "300"})

    res = run("--target", "http://127.0.0.1:9", "--server", str(tmp_path / "none"))
    assert res.exit_code == 2 and "--server" in res.output and "no run manifest there" in res.output
    Manifest({"source": "inferledger capture"}).write(tmp_path / "cap")
    res = run("--target", "http://127.0.0.1:9", "--server", str(tmp_path / "cap"))
    assert res.exit_code == 2 and "not of `inferledger serve --out`" in res.output
    res = run("--target", "http://127.0.0.1:9", "--server", str(tmp_path / "cap" / "manifest.json"))
    assert res.exit_code == 2 and "manifest.json: a file, not a `serve --out` folder" in res.output
    Manifest({"run_id": "imported"}).write(tmp_path / "imp")  # a run folder of no command: said so, never "None"
    res = run("--target", "http://127.0.0.1:9", "--server", str(tmp_path / "imp"))
    assert res.exit_code == 2 and f"{tmp_path / 'imp'}: a run that names no source (an import?), not of" in res.output
    assert "None" not in res.output
    Manifest({"source": "inferledger serve"}).write(tmp_path / "srv")
    res = run("--server", str(tmp_path / "srv"))
    assert res.exit_code == 2 and "give its URL as --target" in res.output
    res = run("--target", "http://127.0.0.1:9", "--server", str(tmp_path / "srv"), "--separate-clocks")
    assert res.exit_code == 2 and "leave out --separate-clocks" in res.output
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_rate_sweep_against_a_url_offers_the_rates_asked_and_diagnoses_each_from_the_joined_engine(
        served, bundle, tmp_path):
    """`study load --set target=URL --set server=S --set rates=3,12` on this module's server (last: its
    captures send the attempt ids the tests above count on seeing first)."""
    url, folder = served
    out = tmp_path / "sweep"
    # (bundle: the model this worker holds already; a URL target's runs do not use it)
    inferledger.study("load", out, bundle=bundle, scale="tiny", rates="3,12", target=url, server=str(folder))
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


def _folder_rows(path: Path, events: list[tuple[str, str, int, dict]], manifest: dict) -> None:
    """A `serve --out` folder as a server leaves it: `events` (name, attempt id, ts_ns, attrs) in one part and
    `manifest` (its state and last flush)."""
    from inferledger.collectors.rundir.writer import RunWriter

    w = RunWriter(path, path.name)
    for seq, (name, aid, ts, attrs) in enumerate(events):
        w.emit({"run_id": path.name, "event_id": f"server:{seq}", "seq": seq, "source": "server", "host": "h",
                "name": name, "ts_ns": ts, "clock": "mono:h", "task_id": None, "session_id": None,
                "request_id": aid, "attempt_id": aid, "step_id": None, "value": None, "attrs": json.dumps(attrs)})
    w.flush()
    w.write_manifest({"source": server_join.SERVE_SOURCE, "host": {"name": "h"}, **manifest})


def test_a_replica_killed_before_its_last_flush_is_a_gap_naming_its_folder(tmp_path):
    """Two replicas behind a router; `dead` was killed after its last flush (state still running, no flush after
    the load): it holds none of this run's attempts, `live` answered both. The tries the router sent `dead` since
    its last flush are nowhere: the join waits its bound for it, then a gap names the folder, not a silent 0."""
    import time

    from inferledger.collectors.capture.servers import ServerFolder, ServerJoin
    from inferledger.collectors.evidence.trace_context import trace_ids_for
    from inferledger.collectors.rundir.writer import RunWriter

    run, attempts = tmp_path / "run", ("T0:R1:A1", "T1:R1:A1")
    client = RunWriter(run, "run")
    for seq, (name, aid) in enumerate((n, a) for a in attempts for n in ("attempt.sent", "attempt.first_byte")):
        client.emit({"run_id": "run", "event_id": f"client:{seq}", "seq": seq, "source": "client", "host": "h",
                     "name": name, "ts_ns": seq, "clock": "mono:h", "task_id": None, "session_id": None,
                     "request_id": aid, "attempt_id": aid, "step_id": None, "value": None, "attrs": "{}"})
    client.flush()
    join = ServerJoin([ServerFolder(tmp_path / n, n, {"host": {"name": "h"}}) for n in ("dead", "live")], host="h",
                      client_clock="mono:h", target="http://router")
    join.salt = "s"
    received = [(n, a, i + 1, {"trace_id": trace_ids_for(a, "s")[0]}) for i, a in enumerate(attempts)
                for n in ("server.received", "server.done")]
    # `dead` flushed the arrival of T0's first try, killed before it ended: the router retried it on `live`
    _folder_rows(tmp_path / "dead", received[:1], {"state": "running", "flushed": {"at_unix_s": time.time() - 5}})
    _folder_rows(tmp_path / "live", received, {"state": "complete"})
    t0 = time.monotonic()
    join.join(client, run, wait_s=0.6, say=lambda *_: None)
    assert time.monotonic() - t0 >= 0.6  # both attempts found at once, but `dead` never flushed after the load
    assert (join.answered, join.found) == (set(attempts), set(attempts))
    gaps = join.gap_rows("run")
    assert [(g["gap_id"], g["subject_id"]) for g in gaps] == [
        ("collector:server:dead", None),  # the unended try is the row `T0…@dead#1`, not the attempt `live` answered
        ("collector:server-attempt:T0:R1:A1@dead#1", "T0:R1:A1@dead#1")]
    assert re.fullmatch(re.escape(f"{tmp_path / 'dead'}: after ") + r"[\d.]+ s \(--server-wait 0\.6\) its flushed "
                        r"parts lack the end of 1 of the 1 attempt\(s\) of this run it holds, and it did not flush "
                        r"after the load \(its last flush 5\.\d s before the load's end\): what it received after its "
                        r"last flush is not in the run \(server state running\): "
                        r"the server was killed, stopped flushing, or ended them later than the bound", gaps[0]["detail"])
    assert "the tries the router sent dead after its last flush" in gaps[0]["affects"]
    # flushed after the load: no gap, and the wait ends as soon as both folders have
    _folder_rows(tmp_path / "flushed", [], {"state": "running", "flushed": {"at_unix_s": time.time() + 60}})
    join = ServerJoin([ServerFolder(tmp_path / n, n, {"host": {"name": "h"}}) for n in ("flushed", "live")], host="h",
                      client_clock="mono:h", target="http://router")
    join.salt = "s"
    join.join(client, run, wait_s=5, say=lambda *_: None)
    assert join.waited_s < 2 and join.gap_rows("run") == []
