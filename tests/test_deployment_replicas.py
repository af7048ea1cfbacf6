"""A deployment's replicas that are no `serve --out` folder (`capture --replica URL[=KIND]`, or the workload's
`[deployment]` section): the flags over the section, refusals that name the flag or key (exit 2, before any
run folder), and each replica's own /metrics scraped by its kind, apart from the others', with a gap naming
the replica and its kind for what its answers cannot say."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferledger.collectors.capture.deployment import (DeploymentFlags, Replicas, ReplicaSpec,
                                                       check_replicas, resolve)
from inferledger.collectors.workload import Workload
from inferledger.collectors.workload.flags import FlagError
from serve_util import static_http_server

TASKS = Path(__file__).resolve().parent.parent / "samples" / "tasks" / "basic.jsonl"
WORKLOAD = f"""
[taskset]
file = "{TASKS}"
[arrivals]
process = "closed"
n_tasks = 2
concurrency = 1
[contract]
deadline_ms = 1000
[client]
timeout_ms = 1000
[generation]
max_tokens = 4
"""


def _workload(tmp_path: Path, deployment: str) -> Path:
    path = tmp_path / "w.toml"
    path.write_text(WORKLOAD + "[deployment]\n" + deployment)
    return path


def test_the_deployment_section_is_read_and_the_flags_override_it(tmp_path):
    wl = Workload.load(_workload(tmp_path, 'router = "http://127.0.0.1:18200"\n'
                                           'router_metrics = "http://127.0.0.1:18201/metrics"\n'
                                           'servers = ["runs/r1"]\nreplicas = ["http://127.0.0.1:18113=llamacpp", '
                                           '"http://127.0.0.1:18114"]\n'))
    got = resolve(DeploymentFlags(), wl.deployment)
    assert got == DeploymentFlags("http://127.0.0.1:18200", "http://127.0.0.1:18201/metrics", (tmp_path / "runs/r1",),
                                  ("http://127.0.0.1:18113=llamacpp", "http://127.0.0.1:18114"))
    flags = DeploymentFlags("http://127.0.0.1:9", None, ("s",), ("http://127.0.0.1:7=vllm",))
    assert resolve(flags, wl.deployment) == DeploymentFlags("http://127.0.0.1:9", "http://127.0.0.1:18201/metrics",
                                                            ("s",), ("http://127.0.0.1:7=vllm",))
    assert resolve(DeploymentFlags(), None) == DeploymentFlags("embedded")
    assert Workload.load(_workload(tmp_path, "")).deployment is None  # an empty table declares nothing
    assert [(s.replica_id, s.kind) for s in check_replicas(got.replicas, {}, otlp=False)] == \
        [("127.0.0.1:18113", "llamacpp"), ("127.0.0.1:18114", "blackbox")]


def test_a_bad_deployment_key_is_refused_by_its_name(tmp_path):
    path = _workload(tmp_path, 'router = "127.0.0.1:18200"\nreplicas = ["http://127.0.0.1:1=vllm", "http://x:2=gpu", '
                               '"http://127.0.0.1:99999=ours"]\nrooter = 1\n')
    with pytest.raises(ValueError) as exc:
        Workload.load(path)
    assert str(exc.value).splitlines() == [
        f"{path}: [deployment].router: '127.0.0.1:18200' is not an http(s):// URL with a host "
        "(e.g. http://127.0.0.1:18200)",
        f"{path}: [deployment].replicas[1]: 'http://x:2=gpu': KIND 'gpu' is not one of ours, vllm, llamacpp, "
        "blackbox (URL[=KIND])",
        f"{path}: [deployment].replicas[2]: 'http://127.0.0.1:99999' is not a URL (Port out of range 0-65535) "
        "(a replica's base URL, e.g. http://127.0.0.1:18112=llamacpp)",
        f"{path}: [deployment].rooter: unknown key (did you mean router?)"]


def test_replica_and_router_metrics_refusals_name_the_flag_with_exit_2(tmp_path):
    from inferledger.cli.app import app

    def run(*args):
        return CliRunner().invoke(app, ["capture", "-o", str(tmp_path / "r"), "--num-prompts", "1", *args],
                                  env={"COLUMNS": "300"})

    res = run("--router-metrics", "http://127.0.0.1:9/metrics")
    assert res.exit_code == 2 and "--router-metrics" in res.output and "give its URL as --target" in res.output
    res = run("--target", "http://127.0.0.1:9", "--router-metrics", "127.0.0.1:9/metrics")
    assert res.exit_code == 2 and "expected the router's metrics URL" in res.output
    res = run("--replica", "http://127.0.0.1:9=vllm")
    assert res.exit_code == 2 and "--replica" in res.output and "give the router's URL as --target" in res.output
    res = run("--target", "http://127.0.0.1:9", "--replica", "http://127.0.0.1:7=gpu")
    assert res.exit_code == 2 and "KIND 'gpu' is not one of" in res.output
    res = run("--target", "http://127.0.0.1:9", "--replica", "http://127.0.0.1:7", "--replica", "http://127.0.0.1:7=vllm")
    assert res.exit_code == 2 and "127.0.0.1:7 is already a replica" in res.output
    res = run("--target", "http://127.0.0.1:9", "--replica", "http://127.0.0.1:9/=vllm")  # the router itself
    assert res.exit_code == 2 and "127.0.0.1:9 is --target, the router; a replica is a server behind it" in res.output
    res = run("--target", "http://127.0.0.1:9", "--replica", "http://127.0.0.1:7=llamacpp", "--otlp-port", "0")
    assert res.exit_code == 2 and "exactly one vLLM replica" in res.output
    res = run("-w", str(_workload(tmp_path, 'replicas = ["http://127.0.0.1:7=vllm"]\n')))
    assert res.exit_code == 2 and "give the router's URL as --target" in res.output
    res = run("--router-traces", str(tmp_path / "spans.jsonl"))
    assert res.exit_code == 2 and "--router-traces" in res.output and "give the router's URL as --target" in res.output
    res = run("--target", "http://127.0.0.1:9", "--router-traces", str(tmp_path))
    assert res.exit_code == 2 and f"{tmp_path}: a folder; give the file the router's span receiver writes" in res.output
    res = run("-w", str(_workload(tmp_path, 'router = "http://127.0.0.1:9"\nrouter_traces = "."\n')))
    assert res.exit_code == 2 and "a folder; give the file the router's span receiver writes" in res.output
    assert not (tmp_path / "r").exists()
    with pytest.raises(FlagError):
        check_replicas(["http://127.0.0.1:18111=llamacpp"], {"http://127.0.0.1:18111": "replica1"}, otlp=False)



def test_an_empty_router_metrics_is_refused_and_a_deployment_entry_is_named_by_its_file_and_key(tmp_path):
    from inferledger.cli.app import app

    def run(*args):
        return CliRunner().invoke(app, ["capture", "-o", str(tmp_path / "r"), "--num-prompts", "1", *args],
                                  env={"COLUMNS": "300"})

    res = run("--target", "http://127.0.0.1:9", "--router-metrics", "")  # given empty: not taken as left out
    assert res.exit_code == 2 and "--router-metrics" in res.output and "'': an empty value" in res.output, res.output
    # with the file's router_metrics, an empty flag still replaces the key and is refused, never the file's taken
    wl = _workload(tmp_path, 'router = "http://127.0.0.1:9"\nrouter_metrics = "http://127.0.0.1:8/metrics"\n')
    assert resolve(DeploymentFlags(router_metrics=""), Workload.load(wl).deployment).router_metrics == ""
    res = run("-w", str(wl), "--router-metrics", "")
    assert res.exit_code == 2 and "'': an empty value" in res.output
    res = run("--target", "", "--num-prompts", "1")  # an empty target is no URL, not the embedded engine
    assert res.exit_code == 2 and "--target" in res.output and "'' is not an http(s):// URL" in res.output
    # the router is the file's [deployment].router, the replica equal to it the file's replicas[1]
    wl = _workload(tmp_path, 'router = "http://127.0.0.1:9"\n'
                             'replicas = ["http://127.0.0.1:7=vllm", "http://127.0.0.1:9/=llamacpp"]\n')
    res = run("-w", str(wl))
    flat = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 2 and "--replica" not in flat, res.output
    assert (f"{wl}: [deployment].replicas[1]: 'http://127.0.0.1:9/=llamacpp': 127.0.0.1:9 is [deployment].router, "
            "the router; a replica is a server behind it") in flat, res.output
    res = run("-w", str(wl), "--target", "http://127.0.0.1:7")  # --target replaces the router: named as such
    assert "[deployment].replicas[0]: 'http://127.0.0.1:7=vllm': 127.0.0.1:7 is --target, the router" in \
        " ".join(res.output.replace("│", " ").split())
    wl = _workload(tmp_path, 'router = "http://127.0.0.1:9"\nreplicas = ["http://127.0.0.1:7", "http://127.0.0.1:7=vllm"]\n')
    res = run("-w", str(wl))
    assert (f"{wl}: [deployment].replicas[1]: 'http://127.0.0.1:7=vllm': 127.0.0.1:7 is already a replica "
            f"({wl}: [deployment].replicas[0])") in " ".join(res.output.replace("│", " ").split())
    assert not (tmp_path / "r").exists()


class _Sink:
    def __init__(self):
        self.rows = []

    def sample(self, **kw):
        self.rows.append(kw)


def test_each_replica_is_scraped_by_its_kind_apart_and_its_gap_names_it(tmp_path):
    vllm = static_http_server(b'vllm:num_requests_waiting{model_name="m"} 2\nvllm:prefix_cache_hits_total 64\n'
                           b'llamacpp:requests_deferred 9\n')
    llama = static_http_server(b'llamacpp:requests_deferred 1\nllamacpp:prompt_tokens_total 96\nvllm:x 1\n')
    specs = (ReplicaSpec(f"http://127.0.0.1:{vllm.server_port}", "vllm"),
             ReplicaSpec(f"http://127.0.0.1:{llama.server_port}", "llamacpp"), ReplicaSpec("http://127.0.0.1:9"))
    sink = _Sink()
    try:
        reps = Replicas(specs, tmp_path, sink, clock="c", host="h")
        for s in reps.scrapers.values():
            s.scrape_once()  # no thread: one scrape, and the last one at stop
        reps.stop()
    finally:
        for srv in (vllm, llama):
            srv.shutdown()
            srv.server_close()
    v, l = specs[0].replica_id, specs[1].replica_id
    got = sorted({(r["device"], r["source"], r["metric"], r["value"]) for r in sink.rows})
    assert got == sorted([(v, "vllm-metrics", "vllm:num_requests_waiting", 2.0),
                          (v, "vllm-metrics", "vllm:prefix_cache_hits_total", 64.0),
                          (l, "llamacpp-metrics", "llamacpp:requests_deferred", 1.0),
                          (l, "llamacpp-metrics", "llamacpp:prompt_tokens_total", 96.0)])
    assert len(sink.rows) == 8  # two scrapes each
    files = sorted(p.name for p in (tmp_path / "scrapes").iterdir())
    assert files == sorted(f"metrics-{r.replace(':', '_')}.jsonl" for r in (v, l))
    gaps = {g["gap_id"]: g for g in reps.gap_rows("run")}
    assert sorted(gaps) == sorted(f"collector:replica:{r}" for r in (v, l, "127.0.0.1:9"))
    assert "127.0.0.1:9 (blackbox, http://127.0.0.1:9)" in gaps["collector:replica:127.0.0.1:9"]["detail"]
    assert gaps[f"collector:replica:{l}"]["subject_id"] == l
    # which attempts each served: unknown but for the one llama.cpp replica (its timings) ...
    assert [r for r in (v, l, "127.0.0.1:9") if "attempts.replica_id" in gaps[f"collector:replica:{r}"]["affects"]] == \
        [v, "127.0.0.1:9"]
    # ... and, with the router's spans given to the capture, known for each: the spans name every try's replica
    spanned = {g["gap_id"]: g for g in reps.gap_rows("run", router_spans=True)}
    assert sorted(spanned) == sorted(gaps)
    assert not any("attempts.replica_id" in g["affects"] for g in spanned.values())
    assert spanned[f"collector:replica:{v}"]["detail"].endswith(
        "and its attempts are those whose try the router's spans (--router-traces) name it for, by the client's request "
        "id (an attempt without its spans is a gap of its own)")
    entries = {e["replica_id"]: e for e in reps.manifest()}
    assert (entries[v]["kind"], entries[v]["metrics"]["scrapes"], entries[v]["metrics"]["source"]) == \
        ("vllm", 2, "vllm-metrics")
    assert "metrics" not in entries["127.0.0.1:9"]
    json.dumps(reps.manifest())


def _server_folder(path: Path, salt: str, flushed_at: float) -> None:
    """A `serve --out` folder holding attempt A's whole server side, last flushed at `flushed_at` (Unix s)."""
    from inferledger.collectors.evidence.trace_context import trace_ids_for
    from inferledger.collectors.rundir.writer import RunWriter
    from inferledger.probes.run_folder import Manifest

    w = RunWriter(path, "s1")
    for seq, (name, ms) in enumerate((("server.received", 1), ("server.done", 5))):
        w.emit({"run_id": "s1", "event_id": f"s:{seq}", "seq": seq, "source": "server", "host": "h", "name": name,
                "ts_ns": ms * 1_000_000, "clock": "mono:h", "task_id": None, "session_id": None, "request_id": None,
                "attempt_id": "A", "step_id": None, "value": None,
                "attrs": json.dumps({"trace_id": trace_ids_for("A", salt)[0]})})
    w.close()
    Manifest({"source": "inferledger serve", "state": "running", "host": {"name": "h"},
              "flushed": {"at_unix_s": flushed_at, "events": 2, "samples": 0, "flushes": 1}}).write(path)


def test_beside_replicas_declared_by_url_an_attempt_no_folder_holds_is_theirs_once_the_folder_flushed(tmp_path):
    """Client attempts A and B both answered through the router; the folder holds A only (B went to a
    replica declared by URL). Beside such replicas the wait ends once the folder flushed after the load, and B
    is no gap of the folder; without them B is a gap and the capture waits its whole bound."""
    import time

    from inferledger.collectors.capture.servers import ServerFolder, ServerJoin
    from inferledger.collectors.rundir.writer import RunWriter

    for deployment, flushed_at in ((True, time.time() + 3600), (False, time.time() + 3600), (True, 0.0)):
        run = tmp_path / f"run-{deployment}-{flushed_at > 0}"
        w = RunWriter(run, "c")
        for seq, (name, aid) in enumerate((("attempt.sent", "A"), ("attempt.first_byte", "A"),
                                           ("attempt.sent", "B"), ("attempt.first_byte", "B"))):
            w.emit({"run_id": "c", "event_id": f"c:{seq}", "seq": seq, "source": "client", "host": "h", "name": name,
                    "ts_ns": seq, "clock": "mono:h", "task_id": "T" + aid, "session_id": None, "request_id": "R" + aid,
                    "attempt_id": aid, "step_id": None, "value": None, "attrs": "{}"})
        folder = run.parent / f"s-{run.name}"
        join = ServerJoin([ServerFolder(folder, "s1", {"host": {"name": "h"}})],
                          host="h", client_clock="mono:h", target="http://router", deployment=deployment)
        _server_folder(folder, join.salt, flushed_at)
        t0 = time.monotonic()
        join.join(w, run, wait_s=1.0, say=lambda line: None)
        waited = time.monotonic() - t0
        w.close()
        gaps = sorted(g["gap_id"] for g in join.gap_rows("c"))
        if deployment and flushed_at:
            assert waited < 0.9 and gaps == [] and join.manifest()["servers"]["flushed_after_load"] is True
        else:  # B is in no folder: a gap, after the whole bound
            assert waited >= 1.0 and gaps == ["collector:server-attempt:B", "collector:server:s1"]
        assert (join.manifest()["servers"]["answered"], join.manifest()["servers"]["joined"]) == (2, 1)


def test_the_one_vllm_replicas_span_events_carry_its_replica():
    from inferledger.collectors.evidence.engine_evidence import with_replica

    rows = [{"name": "server.received", "attrs": '{"trace_id":"t"}'}, {"name": "engine.finished", "attrs": None}]
    assert [r["attrs"] for r in with_replica(rows, "127.0.0.1:18114")] == \
        ['{"replica_id":"127.0.0.1:18114","trace_id":"t"}', '{"replica_id":"127.0.0.1:18114"}']
    assert with_replica(rows, None) is rows


def test_a_replica_folders_server_is_scraped_under_its_replica_and_a_failed_scrape_is_its_gap(tmp_path):
    """Beside a router, each `serve --out` folder's server (its manifest's server.port) has its /metrics scraped
    as a `--replica URL=ours` is, apart per replica; one that never answers is a gap naming the replica; a
    folder whose manifest names no port is not scraped."""
    from inferledger.collectors.capture.servers import ServerFolder, ServerJoin

    srv = static_http_server(b'vllm:prefix_cache_hits_total{model_name="m"} 32\n'
                             b'vllm:prefix_cache_queries_total{model_name="m"} 80\ninferledger_sse_events_total 3\n')
    folders = [ServerFolder(tmp_path / "s1", "s1", {"host": {"name": "h"}, "server": {"port": srv.server_port}}),
               ServerFolder(tmp_path / "s2", "s2", {"host": {"name": "h"}, "server": {"port": 9}}),
               ServerFolder(tmp_path / "s3", "s3", {"host": {"name": "h"}})]
    join = ServerJoin(folders, host="h", client_clock="c", target="http://127.0.0.1:1")
    sink = _Sink()
    try:
        join.start_scrapes(tmp_path, sink)
        join.stop_scrapes()
    finally:
        srv.shutdown()
        srv.server_close()
    assert {(r["device"], r["source"], r["metric"], r["value"]) for r in sink.rows} == {
        ("s1", "inferledger-metrics", "vllm:prefix_cache_hits_total", 32.0),
        ("s1", "inferledger-metrics", "vllm:prefix_cache_queries_total", 80.0)}
    assert len(sink.rows) >= 4  # before the load and after it
    assert sorted(p.name for p in (tmp_path / "scrapes").iterdir() if not p.name.endswith("-refused.jsonl")) == \
        ["metrics-s1.jsonl"]
    entries = {e["server_id"]: e for e in join.manifest()["servers"]["folders"]}
    assert entries["s1"]["metrics"]["source"] == "inferledger-metrics" and entries["s1"]["metrics"]["failures"] == 0
    assert entries["s2"]["metrics"]["scrapes"] == 0 and "metrics" not in entries["s3"]
    gaps = [g for g in join.gap_rows("c") if g["gap_id"].startswith(("collector:metrics", "metrics:"))]
    assert {(g["gap_id"].rsplit("@", 1)[-1], g["subject_id"]) for g in gaps} == {("s2", "s2")}
    assert all(g["affects"].startswith("replica s2's ") for g in gaps)
