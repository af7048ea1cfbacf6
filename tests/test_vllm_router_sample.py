"""The recorded deployment runs (samples/peers/vllm_router/): two `inferledger serve --out` replicas
behind the real vllm-router 0.1.17, one capture through the router joining both folders and its
counters. Rebuilt without the router installed and held to exact values: every attempt has its
replica; each replica's rows in `attempts` equal the router's own per-worker count of what it sent;
a router's retries the client never saw are rows of their own, tied to the client attempt; a replica killed or
slowed during the load is named, with what the router did and what the client saw, and no attempt lost; two
llama.cpp replicas, whose answers cannot say which of them answered, are told apart by the router's spans."""
from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inferledger.collectors.evidence.metrics_scrape import parse_prometheus
from inferledger.collectors.evidence.router_metrics import PREFIX, split_worker, worker_key
from inferledger.ledger.query import open_ledger
from inferledger.ledger.reconstruct import reconstruct
from sample_runs import built_samples, copy_to

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "peers" / "vllm_router"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each recorded run rebuilt (the session's shared builds, tests/sample_runs.py), this module's own copy."""
    names = ("round_robin", "retries", "llamacpp_replica", "replica_killed", "replica_slowed", "router_record",
             "router_abandoned", "llamacpp_pair")
    built = built_samples(tmp_path_factory, [("copy", SAMPLES / name / "run" if (SAMPLES / name / "run").is_dir()
                                              else SAMPLES / name, "run") for name in names])
    return {name: copy_to(run, tmp_path_factory.mktemp(name) / "run") for name, run in zip(names, built)}


def rows(run, sql):
    with open_ledger(run) as led:
        return led.rows(sql)[1]


def router_counts(name: str) -> dict[str, int]:
    """The router's processed_requests_total per replica, read from the raw scrapes (last − first; a
    worker absent from the first scrape had not been counted yet), mapped by the manifest's replicas."""
    manifest = json.loads((SAMPLES / name / "manifest.json").read_text())
    scrapes = [json.loads(line) for line in (SAMPLES / name / "scrapes" / "router.jsonl").read_text().splitlines()]
    assert len(scrapes) == 2  # before and after the load
    counts = {}
    for series, value in scrapes[-1]["values"].items():
        metric, worker = split_worker(series)
        if metric == "vllm_router_processed_requests_total":
            counts[manifest["router"]["replicas"][worker_key(worker)]] = int(value - scrapes[0]["values"].get(series, 0))
    return counts


def test_every_attempt_has_a_replica_and_each_replica_equals_the_routers_count(runs):
    for name, want in (("round_robin", {"replica1": 10, "replica2": 10}), ("retries", {"replica1": 19, "replica2": 18})):
        assert rows(runs[name], "select count(*) filter (where replica_id is null) from attempts") == [(0,)]
        ledger = dict(rows(runs[name], "select replica_id, count(*) from attempts group by 1"))
        assert ledger == router_counts(name) == want
        assert rows(runs[name], "select replica_id, attempts, router_sent, router_agrees from replicas order by 1") == \
            [(r, n, n, True) for r, n in sorted(want.items())]


def test_round_robin_splits_twenty_attempts_evenly_and_each_is_joined_once(runs):
    run = runs["round_robin"]
    assert rows(run, "select count(*), count(distinct attempt_id), count(parent_attempt_id), "
                     "count(*) filter (where client_status = 'completed' and server_status = 'completed') "
                     "from attempts") == [(20, 20, 0, 20)]
    # each replica's own engine: its steps apart (ids offset per folder), its queue and busy time its own
    assert rows(run, "select replica_id, count(distinct step_id), min(step_id) // 1000000000000 from step_attribution "
                     "group by 1 order by 1")[0][2] == 1
    assert rows(run, "select count(*) from replicas where busy_ms > 0 and queue_p50_ms is not null "
                     "and balance between 0.5 and 1.5") == [(2,)]
    assert rows(run, "select count(*) filter (where replica_id is null) from request_metrics") == [(0,)]
    assert rows(run, "select count(*) filter (where replica_id is null) from intervals") == [(0,)]


def test_router_retries_the_client_never_saw_are_their_own_attempts(runs):
    run = runs["retries"]
    # replica1 admitted one request at a time (--max-queue 1): the router's 17 tries it refused with 429 were
    # retried on the next worker; the client saw 20 attempts, all completed
    assert rows(run, "select replica_id, count(*) filter (where parent_attempt_id is null), "
                     "count(*) filter (where parent_attempt_id is not null) from attempts group by 1 order by 1") == \
        [("replica1", 2, 17), ("replica2", 18, 0)]
    tries = rows(run, "select attempt_id, parent_attempt_id, client_status, server_status, replica_id from attempts "
                      "where parent_attempt_id is not null")
    clients = {a for (a,) in rows(run, "select attempt_id from attempts where client_status is not null")}
    assert len(clients) == 20
    for attempt_id, parent, client_status, server_status, replica in tries:
        assert re.fullmatch(re.escape(parent) + r"@replica1#\d+", attempt_id) and parent in clients
        assert (client_status, server_status, replica) == (None, "rejected", "replica1")
    # numbered by arrival from 1 per client attempt
    per_parent = Counter(p for _, p, *_ in tries)
    assert {a for a, *_ in tries} == {f"{p}@replica1#{n}" for p, k in per_parent.items() for n in range(1, k + 1)}
    assert rows(run, "select count(*) filter (where client_status = 'completed') from attempts") == [(20,)]
    assert rows(run, "select unseen_tries from replicas order by replica_id") == [(17,), (0,)]
    # the client's 20 attempts, each completed and judged: the router's 17 refused tries are no attempt of the
    # client's left unjudged
    assert rows(run, "select n_completed, n_unjudged from run_metrics") == [(20, 0)]
    # the summary's and the report's client account: the router's 17 tries named as such, not as a capture
    # that lost their client events
    from inferledger.report.read import open_run
    from inferledger.report.tables import account_counts

    rv = open_run(run)
    try:
        assert account_counts(rv)["client"] == [("(a router's try)", 17), ("completed", 20)]
    finally:
        rv.close()


def test_an_unseen_try_is_no_missing_client_layer(runs):
    """A try the client never saw has no client events by what it is, not by a gap in the capture."""
    assert rows(runs["retries"], "select count(*) from gaps where gap_id like 'attempt:%@replica1#%'") == [(0,)]


def test_the_reports_timeline_is_grouped_by_replica_first(runs, tmp_path):
    """A deployment's run: the timeline's groups are replica, then class, then outcome; every row of a
    group was served by its replica (the router's unseen tries on replica1 rejected, as it said)."""
    from inferledger.report.build import build_report
    from inferledger.report.clocks import build_timebase
    from inferledger.report.read import open_run
    from inferledger.report.timeline import arrange, attempt_index, choose_sample

    rv = open_run(runs["retries"])
    try:
        atts = attempt_index(rv, build_timebase(rv.led))
    finally:
        rv.close()
    rows = arrange(atts, choose_sample(atts, 300))
    assert [(g["label"], g["n"]) for g in rows["groups"]] == [
        ("replica1 · random · completed", 2), ("replica1 · random · server rejected", 17),
        ("replica2 · random · completed", 18)]
    replica = {a["id"]: a["replica"] for a in atts}
    for g in rows["groups"]:
        members = rows["orders"]["slowest"][g["first"]:g["first"] + g["n"]]
        assert {replica[a] for a in members} == {g["label"].split(" · ")[0]}
    html = build_report(runs["round_robin"], tmp_path / "r.html").path.read_text(encoding="utf-8")
    assert "grouped by replica, then task class, then outcome" in html
    groups = re.findall(r'"label": ?"([^"]*)", ?"first": ?\d+, ?"n": ?(\d+)', html)  # the page's data, ASCII-escaped
    assert [(json.loads(f'"{label}"'), int(n)) for label, n in groups] == [
        ("replica1 · random · completed", 10), ("replica2 · random · completed", 10)]


def test_events_carry_their_replica_and_a_single_server_run_none(runs, tmp_path):
    assert rows(runs["round_robin"], "select count(*) filter (where json_extract_string(attrs, '$.replica_id') "
                                     "is null) from events where source in ('server', 'engine')") == [(0,)]
    # no copied replica: the column is NULL and the replicas table empty
    one = tmp_path / "one"
    shutil.copytree(SAMPLES / "round_robin", one)
    import pyarrow.parquet as pq

    for part in (one / "events").rglob("*.parquet"):
        t = pq.read_table(part).to_pylist()
        for r in t:
            if r["attrs"] and '"replica_id"' in r["attrs"]:
                a = json.loads(r["attrs"])
                a.pop("replica_id")
                r["attrs"] = json.dumps(a)
        pq.write_table(pq.read_table(part).from_pylist(t, schema=pq.read_schema(part)), part)
    (one / "scrapes" / "router.jsonl").unlink()
    shutil.rmtree(one / "samples")
    reconstruct(one)
    assert rows(one, "select count(replica_id) from attempts") == [(0,)]
    assert rows(one, "select count(*) from replicas") == [(0,)]


def test_the_routers_labels_are_kept_apart_per_worker():
    body = ('# TYPE vllm_router_processed_requests_total counter\n'
            'vllm_router_processed_requests_total{worker="http://127.0.0.1:18111"} 3\n'
            'vllm_router_processed_requests_total{worker="http://127.0.0.1:18112"} 4\n'
            'vllm_router_policy_decisions_total{policy="round_robin",worker="http://127.0.0.1:18111"} 3\n')
    values = parse_prometheus(body, PREFIX, keep_labels=True).values
    assert values == {'vllm_router_processed_requests_total{worker="http://127.0.0.1:18111"}': 3.0,
                      'vllm_router_processed_requests_total{worker="http://127.0.0.1:18112"}': 4.0,
                      'vllm_router_policy_decisions_total{policy="round_robin",worker="http://127.0.0.1:18111"}': 3.0}
    assert parse_prometheus(body, PREFIX).values["vllm_router_processed_requests_total"] == 7.0  # summed, as before
    assert split_worker('vllm_router_policy_decisions_total{policy="round_robin",worker="http://h:1"}') == \
        ('vllm_router_policy_decisions_total{policy="round_robin"}', "http://h:1")
    assert worker_key("http://127.0.0.1:18111/") == "127.0.0.1:18111"


def test_a_client_attempts_tries_are_named_by_arrival_the_latest_keeps_its_id():
    """The naming rule on its own: tries of one client attempt across two folders and twice in one (`#2`),
    ordered by server.received; a foreign folder's arrivals on the client's clock through its mapping."""
    from inferledger.collectors.capture.clocksync import ClockMapping
    from inferledger.collectors.capture.servers import STEP_STRIDE, ServerFolder, ServerJoin

    folders = [ServerFolder(Path(f"/x/r{i}"), f"r{i}", {"host": {"name": "h"}}) for i in (1, 2)]
    join = ServerJoin(folders, host="h", client_clock="mono:h", target="http://router")
    a, b = join.joined
    a.same_domain, b.same_domain = True, False
    b.mappings = [ClockMapping(b.clock, "mono:h", 1_000, 10, "round-trip", 16, "start")]
    a.found.ours = {"A": "A", "A#2": "A", "B": "B"}
    a.found.received = {"A": 100, "A#2": 5_000, "B": 50}
    b.found.ours = {"A": "A", "C": "C"}
    b.found.received = {"A": 2_500, "C": 10}  # + 1000 on the client's clock: 3500, between r1's two tries
    join._name_tries()
    assert a.names == {"A": "A@r1#1", "A#2": "A", "B": "B"} and b.names == {"A": "A@r2#2", "C": "C"}
    assert a.parents == {"A": "A"} and b.parents == {"A": "A"}
    assert a.attrs("A") == {"replica_id": "r1", "parent_attempt_id": "A"} and b.attrs(None) == {"replica_id": "r2"}
    assert (a.step_id(7), b.step_id(7), a.step_id(None)) == (STEP_STRIDE + 7, 2 * STEP_STRIDE + 7, None)
    one = ServerJoin(folders[:1], host="h", client_clock="mono:h", target="http://router").joined[0]
    assert (one.attrs("A"), one.step_id(7)) == ({}, 7)  # a single server: no replica, step ids as written


def test_reconciliation_counts_the_routers_unseen_tries(runs):
    assert rows(runs["retries"], "select replica_id, kv_blocks_used_max from replicas order by 1") == \
        [("replica1", 5), ("replica2", 10)]  # the most KV blocks each engine held: its own samples
    assert rows(runs["retries"], "select sent, received, unseen_tries, attempts_per_request from reconciliation") == \
        [(20, 37, 17, 37 / 20)]
    assert rows(runs["round_robin"], "select unseen_tries, attempts_per_request from reconciliation") == [(0, 1.0)]
    # the router's own counts beside them: what it sent upstream and its retries, equal to the rows here
    assert rows(runs["retries"], "select router_tries, router_retries from reconciliation") == [(37, 17)]
    assert rows(runs["retries"], "select router_failures, breaker_opens from replicas") == [(0, 0), (0, 0)]


def test_a_join_the_request_id_does_not_agree_with_is_counted_and_a_gap():
    from inferledger.collectors.capture.servers import ServerFolder, ServerJoin

    join = ServerJoin([ServerFolder(Path("/x/r1"), "r1", {"host": {"name": "h"}})], host="h",
                      client_clock="mono:h", target="http://router")
    j = join.joined[0]
    j.found.ours = {"A": "A", "A#2": "A", "Z": "B"}  # Z carries B's trace id: the ids disagree
    join._name_tries()
    assert join.manifest()["servers"]["folders"][0]["attempts"]["id_disagrees"] == 1
    assert [g["gap_id"] for g in join.gap_rows("run")] == ["collector:server-id:r1:Z"]
    assert all(json.loads(line)["values"] for line in (SAMPLES / "retries" / "scrapes" / "router.jsonl").read_text().splitlines())
    for name in ("round_robin", "retries"):  # the recorded runs: every join agreed
        folders = json.loads((SAMPLES / name / "manifest.json").read_text())["servers"]["folders"]
        assert [f["attempts"]["id_disagrees"] for f in folders] == [0, 0]


def test_partitioned_each_engine_is_one_replica_and_a_tasks_tries_share_its_bucket(tmp_path):
    import pyarrow.dataset as ds

    from inferledger.collectors.rundir.repartition import repartition

    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "retries", run)
    repartition(run, 4)
    engines = sorted(p for p in (run / "events").iterdir() if p.name.startswith("engine-"))
    seen = []
    for folder in engines:
        attrs = ds.dataset(str(folder), format="parquet").to_table(columns=["attrs"]).column("attrs").to_pylist()
        seen.append({json.loads(a).get("replica_id") for a in attrs})
    assert sorted(map(sorted, seen)) == [["replica1"], ["replica2"]]
    assert [f.name for f in engines] == ["engine-replica1", "engine-replica2"]  # each named by its replica
    buckets = {}
    for folder in (run / "events").glob("bucket-*"):
        for r in ds.dataset(str(folder), format="parquet").to_table(columns=["task_id"]).to_pylist():
            buckets.setdefault(r["task_id"], set()).add(folder.name)
    assert len(buckets) == 20 and all(len(b) == 1 for b in buckets.values())


def test_the_router_scraper_names_each_workers_replica_and_a_dead_router_is_a_gap(tmp_path):
    from serve_util import static_http_server

    from inferledger.collectors.evidence.router_metrics import RouterScraper

    body = ('vllm_router_processed_requests_total{worker="http://127.0.0.1:18111"} 3\n'
            'vllm_router_processed_requests_total{worker="http://10.0.0.9:8000"} 1\n'
            'vllm_router_retries_total{route="/v1/chat/completions"} 2\n').encode()

    class Sink:
        def __init__(self):
            self.rows = []

        def sample(self, **kw):
            self.rows.append(kw)

    server = static_http_server(body)
    try:
        sink = Sink()
        scraper = RouterScraper(f"http://127.0.0.1:{server.server_port}/metrics", tmp_path, sink, clock="c", host="h")
        scraper.replicas = {"127.0.0.1:18111": "replica1"}
        scraper.scrape_once()
        scraper.stop()  # no thread was started: the scrape after the load alone
    finally:
        server.shutdown()
        server.server_close()
    got = sorted((r["metric"], r["device"], r["value"], r["unit"], r["source"]) for r in sink.rows)
    assert got == 2 * [("vllm_router_processed_requests_total", "http://10.0.0.9:8000", 1.0, "count", "vllm-router")] + \
        2 * [("vllm_router_processed_requests_total", "replica1", 3.0, "count", "vllm-router")] + \
        2 * [('vllm_router_retries_total{route="/v1/chat/completions"}', None, 2.0, "count", "vllm-router")]
    assert len((tmp_path / "scrapes" / "router.jsonl").read_text().splitlines()) == 2 and scraper.gap_rows("r") == []
    dead = RouterScraper("http://127.0.0.1:9/metrics", tmp_path / "dead", Sink(), clock="c", host="h", timeout_s=0.5)
    dead.scrape_once()
    dead.stop()
    assert [g["gap_id"] for g in dead.gap_rows("r")] == ["collector:router-metrics"]
    assert "vllm-router --prometheus-port" in dead.gap_rows("r")[0]["needs"]


def test_a_llamacpp_replica_beside_ours_is_placed_by_its_timings_and_counted_by_the_router(runs):
    """replica1 is a `serve --out` folder, the second replica llama.cpp's own server declared by URL
    (`--replica http://127.0.0.1:18210=llamacpp`): each attempt llama.cpp answered carries its timings and is
    in no folder, so it is the llama.cpp replica's; both replicas' counts equal the router's."""
    run = runs["llamacpp_replica"]
    ledger = dict(rows(run, "select replica_id, count(*) from attempts group by 1"))
    assert ledger == router_counts("llamacpp_replica") == {"replica1": 10, "127.0.0.1:18210": 10}
    assert rows(run, "select replica_id, kind, attempts, router_sent, router_agrees, busy_evidence, "
                     "waiting_max, prefix_hit_blocks, prefix_hit_tokens, kv_blocks_used_max from replicas order by 1") == [
        ("127.0.0.1:18210", "llamacpp", 10, 10, True, "reported", 6, None, 36, None),
        ("replica1", "ours", 10, 10, True, "observed", None, 0, None, 10)]
    # every llama.cpp attempt joined with its timings inside the client's interval; their cached tokens are its counter's
    assert rows(run, "select a.replica_id, count(t.attempt_id), count(*) filter (where t.inside_client), "
                     "sum(t.cached_tokens) from attempts a left join reported_timings t using (attempt_id) "
                     "group by 1 order by 1") == [("127.0.0.1:18210", 10, 10, 36), ("replica1", 0, 0, None)]
    gaps = dict(rows(run, "select gap_id, affects from gaps where subject_id = '127.0.0.1:18210'"))
    assert sorted(gaps) == ["collector:replica:127.0.0.1:18210", "run:127.0.0.1:18210:1"]
    assert gaps["run:127.0.0.1:18210:1"] == "replicas kv_blocks_used_max, kv_usage_max of 127.0.0.1:18210"  # busy known
    # no attempt of the folder lacked its end, and the folder flushed after the load at once
    manifest = json.loads((SAMPLES / "llamacpp_replica" / "manifest.json").read_text())
    assert (manifest["servers"]["answered"], manifest["servers"]["joined"], manifest["servers"]["flushed_after_load"]) \
        == (20, 10, True)
    assert rows(run, "select count(*) from gaps where gap_id like 'collector:server%'") == [(0,)]


# llama.cpp's answers in llamacpp_replica/ as recorded (its events' attempt.done): attempt -> (the client's done, ns on
# mono:vm; timings.prompt_ms; timings.predicted_ms)
LLAMACPP_DONE = {
    "T0000:R1:A1": (22239018903157, 1409.334, 5040.475), "T0002:R1:A1": (22240585623576, 1398.75, 5216.546),
    "T0004:R1:A1": (22241616171402, 2867.512, 3377.383), "T0006:R1:A1": (22241615706199, 2867.522, 3377.544),
    "T0008:R1:A1": (22244306368866, 1571.282, 3720.442), "T0010:R1:A1": (22245396879946, 1028.443, 3778.43),
    "T0012:R1:A1": (22246542150725, 2140.337, 2779.099), "T0014:R1:A1": (22246541983746, 2140.258, 2779.021),
    "T0016:R1:A1": (22247201546964, 1089.48, 1804.009), "T0018:R1:A1": (22247220093679, 1135.21, 679.585)}


def _llamacpp_answers(run: Path) -> dict:
    import pyarrow.parquet as pq

    out = {}
    for path in sorted((run / "events").rglob("*.parquet")):
        for r in pq.read_table(path).to_pylist():
            timings = json.loads(r["attrs"] or "{}").get("server_timings") if r["name"] == "attempt.done" else None
            if timings:
                out[r["attempt_id"]] = (r["ts_ns"], timings["prompt_ms"], timings["predicted_ms"])
    return out


def test_a_llamacpp_replicas_busy_time_is_the_union_of_its_reported_prefill_and_decode(runs):
    """Each llama.cpp answer's prefill + decode (its timings) ends at the client's done: T0000's starts
    6449.809 ms before its done at 22239018903157, and every later one (by start) begins before all earlier
    ones have ended (T0002 at 22240585623576 − 6615.296 ms = 22233970327576, ...), so the union is one
    stretch from T0000's start to the last end, T0018's done at 22247220093679: 14650.999522 ms. Reported by
    llama.cpp, said so; the balance beside replica1's observed steps says it mixes both."""
    assert _llamacpp_answers(SAMPLES / "llamacpp_replica") == LLAMACPP_DONE
    spans = sorted((done - round((p + d) * 1e6), done) for done, p, d in LLAMACPP_DONE.values())
    assert all(start <= max(end for _, end in spans[:i]) for i, (start, _) in enumerate(spans) if i)  # one stretch
    assert spans[0] == (22239018903157 - 6449809000, 22239018903157)
    assert max(end for _, end in spans) == 22247220093679
    busy = (22247220093679 - (22239018903157 - 6449809000)) / 1e6
    assert busy == 14650.999522
    got = rows(runs["llamacpp_replica"], "select replica_id, busy_ms, busy_evidence, balance, balance_evidence "
                                         "from replicas order by 1")
    observed = got[1][1]  # replica1's: its engine's steps (Σ step_ms)
    assert observed == pytest.approx(6795.547343, abs=1e-6)
    mean = (busy + observed) / 2
    assert got == [("127.0.0.1:18210", pytest.approx(busy, abs=1e-9), "reported", pytest.approx(busy / mean),
                    "observed and reported"),
                   ("replica1", observed, "observed", pytest.approx(observed / mean), "observed and reported")]
    assert rows(runs["llamacpp_replica"], "select replica_balance, replica_balance_evidence from run_diagnosis "
                                         "where scope = 'run'") == \
        [(pytest.approx(busy / mean), "observed and reported")]


def test_a_llamacpp_replica_with_an_answer_its_timings_cannot_place_has_no_busy_time_and_a_gap(tmp_path):
    """One answer's timings made longer than the client waited for it (predicted_ms 1e6): that attempt cannot be
    placed, so the replica's busy time (and every balance) is unknown, not the union of the other nine."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "llamacpp_replica", run)
    path = next((run / "events").rglob("*.parquet"))
    table = pq.read_table(path)
    rows_ = table.to_pylist()
    for r in rows_:
        if r["name"] == "attempt.done" and r["attempt_id"] == "T0008:R1:A1":
            attrs = json.loads(r["attrs"])
            attrs["server_timings"]["predicted_ms"] = 1e6
            r["attrs"] = json.dumps(attrs)
    pq.write_table(pa.Table.from_pylist(rows_, schema=table.schema), path)
    reconstruct(run)
    assert rows(run, "select replica_id, busy_ms, busy_evidence, balance, balance_evidence from replicas order by 1") == [
        ("127.0.0.1:18210", None, None, None, None), ("replica1", pytest.approx(6795.547343, abs=1e-6), "observed",
                                                      None, None)]
    (affects, detail), = rows(run, "select affects, detail from gaps where gap_id = 'run:127.0.0.1:18210:1'")
    assert affects.startswith("replicas busy_ms, balance (every replica's), kv_blocks_used_max")
    assert detail.endswith("its busy time is unknown: 1 of its 10 attempt(s) have no reported prefill and decode "
                           "placed inside the client's interval")


def _scrape_deltas(run: Path, replica: str) -> dict[str, float]:
    """A declared replica's own /metrics counters over the load, from its raw scrapes: last − first."""
    scrapes = [json.loads(line) for line in
               (run / "scrapes" / f"metrics-{replica.replace(':', '_')}.jsonl").read_text().splitlines()]
    return {k: v - scrapes[0]["values"].get(k, 0) for k, v in scrapes[-1]["values"].items() if k.endswith("_total")}


def _span_workers(run: Path) -> dict[str, str]:
    """Each request id of the router's spans (its SERVER span) -> the host:port of the worker its one try went to
    (the CLIENT span under it), read from the export file as written."""
    spans = [s for line in (run / "router-spans.jsonl").read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]

    def attrs(s):
        return {a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", [])}

    request = {s["spanId"]: attrs(s)["request_id"] for s in spans if s["kind"] == "SPAN_KIND_SERVER"}
    tries = [(request[s["parentSpanId"]], attrs(s)["url.full"]) for s in spans if s["kind"] == "SPAN_KIND_CLIENT"]
    assert len(tries) == len(request) == len({r for r, _ in tries})  # one try per request: nothing failed
    return {r: re.match(r"http://([^/]+)/", url).group(1) for r, url in tries}


def test_two_llamacpp_replicas_are_told_apart_by_the_routers_spans(runs):
    """llamacpp_pair/: two llama.cpp servers (18210, 18211, one thread each) behind the traced router, no replica
    of ours, 20 requests at 4/s. Their answers' timings cannot say which of them answered: each attempt is placed
    on the worker its try's CLIENT span names, by the client's request id. Held to what the router and the two
    servers say themselves: the spans' worker per request, the router's processed counter per worker (10 and 10),
    and each server's own /metrics over the load: its cached prompt tokens (36 each) and its decode seconds
    (tokens_predicted_seconds_total 34.7335 and 33.6054 s, which tell the two apart: the Σ predicted_ms of the
    timings of the attempts placed on each is its own counter's, to its 4 printed decimals)."""
    name, run = "llamacpp_pair", runs["llamacpp_pair"]
    recorded = SAMPLES / name / "run"
    workers = _span_workers(recorded)
    assert len(workers) == 20 and Counter(workers.values()) == {"127.0.0.1:18210": 10, "127.0.0.1:18211": 10}
    assert dict(rows(run, "select attempt_id, replica_id from attempts")) == workers
    assert router_counts(f"{name}/run") == {"127.0.0.1:18210": 10, "127.0.0.1:18211": 10}
    counters = {r: _scrape_deltas(recorded, r) for r in ("127.0.0.1:18210", "127.0.0.1:18211")}
    assert {r: (c["llamacpp:prompt_tokens_cached_total"], c["llamacpp:tokens_predicted_seconds_total"])
            for r, c in counters.items()} == {"127.0.0.1:18210": (36, 34.7335), "127.0.0.1:18211": (36, 33.6054)}
    assert rows(run, "select replica_id, kind, attempts, router_sent, router_agrees, busy_evidence, prefix_hit_tokens "
                     "from replicas order by 1") == [
        (r, "llamacpp", 10, 10, True, "reported", int(c["llamacpp:prompt_tokens_cached_total"]))
        for r, c in sorted(counters.items())]
    # each attempt's timings joined as reported evidence, inside the client's interval; per replica its cached
    # tokens its own counter's, and its timings' decode time its own counter's (the other's differs by 1.1 s)
    assert rows(run, "select a.replica_id, count(t.attempt_id), count(*) filter (where t.inside_client), "
                     "sum(t.cached_tokens) from attempts a left join reported_timings t using (attempt_id) "
                     "group by 1 order by 1") == [("127.0.0.1:18210", 10, 10, 36), ("127.0.0.1:18211", 10, 10, 36)]
    decode = {r: 0.0 for r in counters}
    for attempt, (_, _, predicted_ms) in _llamacpp_answers(recorded).items():
        decode[workers[attempt]] += predicted_ms
    assert {r: round(ms / 1000, 4) for r, ms in decode.items()} == \
        {r: c["llamacpp:tokens_predicted_seconds_total"] for r, c in counters.items()}
    # no gap says which attempts a replica served is unknown; the ledger says how they were placed
    gaps = dict(rows(run, "select gap_id, affects from gaps where gap_id like 'collector:%'"))
    assert sorted(gaps) == ["collector:black-box", "collector:replica:127.0.0.1:18210", "collector:replica:127.0.0.1:18211"]
    assert not any("attempts.replica_id" in a for a in gaps.values())
    assert [d for (d,) in rows(run, "select detail from gaps where gap_id like 'run:127.0.0.1:1821%:1' order by 1")] == [
        f"replica 127.0.0.1:1821{i} (llamacpp) is declared by URL: its engine's steps are not in the run (its 10 "
        "attempt(s) are placed by the router's spans of their tries); its /metrics have no KV usage gauge; its busy_ms "
        "is the union of the prefill and decode its engine reported (busy_evidence reported)" for i in (0, 1)]
    manifest = json.loads((recorded / "manifest.json").read_text())
    assert (manifest["router_traces"]["attempts_without_spans"], manifest["router_traces"]["events"]) == (0, 20)


def test_an_attempt_no_span_places_has_no_replica_not_one_guessed(tmp_path):
    """llamacpp_pair/ with one attempt's router.try event taken out (as if its spans never came): two llama.cpp
    replicas, so its timings place it on neither; its replica is NULL, and the replica the router sent it to
    holds 9 rows against the router's 10."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "llamacpp_pair" / "run", run)
    dropped = 0
    for path in (run / "events").rglob("*.parquet"):
        table = pq.read_table(path)
        kept = [r for r in table.to_pylist() if not (r["name"] == "router.try" and r["attempt_id"] == "T0005:R1:A1")]
        dropped += table.num_rows - len(kept)
        pq.write_table(pa.Table.from_pylist(kept, schema=table.schema), path)
    assert dropped == 1
    reconstruct(run)
    assert _span_workers(SAMPLES / "llamacpp_pair" / "run")["T0005:R1:A1"] == "127.0.0.1:18211"
    assert rows(run, "select replica_id from attempts where attempt_id = 'T0005:R1:A1'") == [(None,)]
    assert rows(run, "select replica_id, attempts, router_sent, router_agrees from replicas order by 1") == [
        ("127.0.0.1:18210", 10, 10, True), ("127.0.0.1:18211", 9, 10, False)]
    assert rows(run, "select needs, detail from gaps where subject_id = '127.0.0.1:18211' and detail like "
                     "'the router sent%'") == [(
        "the router's spans of every try (capture --router-traces): they name each try's replica",
        "the router sent 127.0.0.1:18211 10 tries over the load (0 failed there, its breaker opened 0 time(s)); the run "
        "holds 9 attempt(s) of it: 1 are not placed on it (1 attempt(s) of the run name no replica: no span of the "
        "router names theirs)")]


def test_a_killed_replica_loses_no_client_attempt_and_its_missing_tries_are_counted_and_a_gap(runs):
    """replica1 (flushing every 0.1 s) was killed (SIGKILL) once the router had sent 19 requests. The two it was
    streaming were cut: the client saw errors, their server side never ended (gaps name what the folder lacks).
    The router's 10 tries it refused afterwards were retried on replica2, its breaker opened, and the rest went
    to replica2. Every client attempt is a row with its client status; the router's 19 tries to replica1 stand
    beside the 9 rows its folder held, the 10 missing a gap naming the replica and one naming its folder (it never
    flushed after the load); the unseen-try figures the rows cannot give are NULL, the router's counts beside."""
    run = runs["replica_killed"]
    assert rows(run, "select count(*), count(distinct attempt_id), count(parent_attempt_id) from attempts") == \
        [(60, 60, 0)]
    assert rows(run, "select replica_id, client_status, server_status, count(*) from attempts group by all "
                     "order by all") == [("replica1", "completed", "completed", 7),
                                         ("replica1", "error", "unterminated", 2),
                                         ("replica2", "completed", "completed", 51)]
    assert rows(run, "select sent, completed, errored, unterminated from reconciliation") == [(60, 58, 2, 2)]
    assert rows(run, "select replica_id, attempts, client_attempts, unseen_tries, server_completed, router_sent, "
                     "router_agrees, router_failures, breaker_opens from replicas order by 1") == [
        ("replica1", 9, 9, 0, 7, 19, False, 10, 1), ("replica2", 51, 51, 0, 51, 51, True, 0, 0)]
    assert router_counts("replica_killed") == {"replica1": 19, "replica2": 51}
    assert rows(run, "select unseen_tries, attempts_per_request, router_tries, router_retries from reconciliation") == \
        [(None, None, 70, 10)]
    gaps = {g: (subject, detail) for g, subject, detail in rows(
        run, "select gap_id, subject_id, detail from gaps where gap_id like 'collector:server%' or subject_id = "
             "'replica1'")}
    cut = [a for (a,) in rows(run, "select attempt_id from attempts where client_status = 'error' order by 1")]
    # run:replica1:2: the sample's folders' servers were not scraped (recorded before the capture scraped them)
    assert sorted(gaps) == sorted([f"collector:server-attempt:{a}" for a in cut] + ["collector:server:replica1",
                                                                                     "run:replica1:1", "run:replica1:2"])
    assert all(gaps[f"collector:server-attempt:{a}"][0] == a for a in cut)
    assert re.search(r"/replica1: after [\d.]+ s \(--server-wait 30\) its flushed parts lack the end of 2 of the 9 "
                     r"attempt\(s\) of this run it holds, and it did not flush after the load \(its last flush [\d.]+ s "
                     r"before the load's end\)", gaps["collector:server:replica1"][1])
    router_gap = next(d for _, d in gaps.values() if d.startswith("the router sent"))
    assert router_gap == "the router sent replica1 19 tries over the load (10 failed there, its " \
        "breaker opened 1 time(s)); the run holds 9 attempt(s) of it: 10 are in no folder (refused by a dead " \
        "replica, or received after its last flush)"


def test_a_slowed_replica_is_named_by_the_diagnosis_and_the_router_saw_nothing_wrong(runs):
    """replica1 pinned to one core beside two CPU burners that outweigh it (nice 5 against 0), replica2 on the
    other core; 60 attempts at 1/s, a 5 s deadline. Round robin kept sending each half; nothing failed, so the
    router's counters see no fault: the ledger's busy time, queue and late attempts name replica1."""
    run = runs["replica_slowed"]
    assert rows(run, "select replica_id, attempts, router_sent, router_agrees, router_failures, breaker_opens, "
                     "round(balance, 3), queue_p50_ms > 30000 from replicas order by 1") == [
        ("replica1", 30, 30, True, 0, 0, 1.424, True), ("replica2", 30, 30, True, 0, 0, 0.576, False)]
    assert rows(run, "select a.replica_id, count(*) filter (where a.client_status = 'completed'), count(*) filter "
                     "(where c.late) from attempts a join attempt_causes c using (attempt_id) group by 1 order by 1") == \
        [("replica1", 30, 30), ("replica2", 30, 6)]
    assert rows(run, "select replica_id, round(replica_balance, 3), n_late, first_cause from run_diagnosis "
                     "where scope = 'run'") == [("replica1", 1.424, 36, "server_queue")]
    assert rows(run, "select evidence like '%replica replica1 served 30 of the 36 late attempts (30 of the 60 "
                     "attempts); its busy time 1.4× the mean' from run_diagnosis where scope = 'run'") == [(True,)]
    assert rows(run, "select unseen_tries, attempts_per_request, router_tries, router_retries from reconciliation") == \
        [(0, 1.0, 60, 0)]
    # none but the counter's: the sample's folders' servers were not scraped (recorded before the capture scraped them)
    assert rows(run, "select count(*) from gaps where (gap_id like 'collector:server%' or subject_id like 'replica%') "
                     "and affects not like 'replicas prefix_hit_tokens, prefix_query_tokens, %'") == [(0,)]



def test_the_routers_own_spans_make_each_try_the_client_never_saw_a_row(runs):
    """router_record/: the killed-replica fault again (30 requests at 2/s, replica1 killed once the router had
    sent 9), the router run with its tracing on and the capture given its spans (--router-traces; run/ holds
    the copy). Its log names the request of a try only inside its tracing span, and the worker only for a try
    that could not be sent (router.log, ten such lines: T0009 twice, T0011 to T0018):
      ERROR http_request{... request_id="T0011:R1:A1"}: ... router.rs:2006: Failed to send typed request
        worker_url=http://127.0.0.1:18111 route=/v1/chat/completions error=error sending request for url (...)
    Its spans name every try (a CLIENT span per try under the SERVER span of its request; the router primed
    with one GET /v1/models, so the first request's are there too). Worked by hand from them: 30 SERVER spans,
    40 CLIENT spans; replica1 (18111) 4 tries answered 200 (two of them the streams the kill cut: T0005, T0007)
    and 10 refused (T0009 twice, then replica2; T0011..T0018 once, then replica2), replica2 26 answered. So
    the rows: the 30 client attempts, each joined to its router try, and the 10 refused tries no folder holds,
    as router.try rows numbered by the router's order (T0009's are #1 and #2); replica1 14 rows against the
    router's 14, replica2 26 and 26; retry amplification 40 / 30; no gap about the router's spans."""
    run = runs["router_record"]
    assert rows(run, "select replica_id, client_status, server_status, parent_attempt_id is not null, count(*) "
                     "from attempts group by all order by all") == [
        ("replica1", "completed", "completed", False, 2), ("replica1", "error", "unterminated", False, 2),
        ("replica1", None, "unknown", True, 10), ("replica2", "completed", "completed", False, 26)]
    refused = ["T0009:R1:A1@replica1#1", "T0009:R1:A1@replica1#2"] + [f"T{i:04d}:R1:A1@replica1#1" for i in range(11, 19)]
    assert rows(run, "select attempt_id, parent_attempt_id from attempts where parent_attempt_id is not null "
                     "order by 1") == [(a, a.split("@")[0]) for a in refused]
    assert rows(run, "select replica_id, attempts, client_attempts, unseen_tries, router_sent, router_agrees, "
                     "router_failures from replicas order by 1") == [
        ("replica1", 14, 4, 10, 14, True, 10), ("replica2", 26, 26, 0, 26, True, 0)]
    assert router_counts("router_record/run") == {"replica1": 14, "replica2": 26}
    assert rows(run, "select sent, unseen_tries, round(attempts_per_request, 4), router_tries, router_retries, "
                     "round(retry_amplification, 4), ghost_attempts from reconciliation") == \
        [(30, 10, 1.3333, 40, 10, 1.3333, 0)]
    # every try of the router's spans is a router.try event, on the router's clock (this host's wall clock,
    # mapped); the refused ones are the rows no folder holds
    tries = rows(run, "select attempt_id, json_extract_string(attrs, '$.error'), json_extract_string(attrs, '$.worker'), "
                      "clock from events where name = 'router.try' and attrs like '%\"error\"%' order by 1")
    assert [t[0] for t in tries] == refused
    assert {t[1:] for t in tries} == {("error sending request for url (http://127.0.0.1:18111/v1/chat/completions)",
                                       "http://127.0.0.1:18111/v1/chat/completions", "wall:vm")}
    assert rows(run, "select count(*), count(distinct attempt_id) from events where name = 'router.try'") == [(40, 40)]
    spans = _span_kinds(SAMPLES / "router_record" / "run")
    assert (spans["SPAN_KIND_SERVER"], spans["SPAN_KIND_CLIENT"]) == (30, 40)
    # every client attempt has its router try (the first request's too), and the capture waited for none
    assert rows(run, "select count(distinct a.attempt_id) from attempts a join events e on e.attempt_id = a.attempt_id "
                     "and e.name = 'router.try' where a.client_status is not null") == [(30,)]
    assert rows(run, "select count(*) filter (where client_status = 'error'), string_agg(attempt_id, ' ' order by "
                     "attempt_id) filter (where client_status = 'error') from attempts") == [(2, "T0005:R1:A1 T0007:R1:A1")]
    assert rows(run, "select count(*) from attempts where attempt_index is null") == [(0,)]
    logged = re.findall(r'ERROR http_request\{[^}]*request_id="([^"]+)"\}: vllm_router_rs::routers::http::router: '
                        r"src/routers/http/router.rs:2006: Failed to send typed request "
                        r"worker_url=http://127.0.0.1:18111 ", (SAMPLES / "router_record" / "router.log").read_text())
    assert Counter(logged) == Counter(a.split("@")[0] for a in refused)
    gaps = rows(run, "select gap_id, detail from gaps where gap_id like 'collector:router%' or detail like "
                     "'the router sent%'")
    assert gaps == []
    manifest = json.loads((SAMPLES / "router_record" / "run" / "manifest.json").read_text())
    assert (manifest["router_traces"]["attempts_without_spans"], manifest["router_traces"]["spans"]) == (0, 70)
    # the spans had all come: no wait for them (the killed replica's folder, which never flushed, had its 30 s)
    assert (manifest["router_traces"]["waited_s"], manifest["servers"]["waited_s"]) == (0.021, 30.176)


def _span_kinds(run: Path) -> Counter:
    """The spans of the router's export file as written (OTLP/JSON lines), counted by kind."""
    return Counter(s["kind"] for line in (run / "router-spans.jsonl").read_text().splitlines()
                   for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"])


def test_a_try_the_router_gave_up_on_is_ghost_load_of_the_replica_it_abandoned(runs):
    """router_abandoned/: 30 requests at 2/s through the router with --request-timeout-secs 3, replica1 slowed
    (FAULT=slow: pinned beside two CPU burners), the router's spans given to the capture. The router gave up on
    15 tries (its log: 15 ERROR lines `Failed to send typed request worker_url=... error=error sending request for
    url (...)`, 13 to replica1: 1 for T0010, 2 for T0012, 1 for T0014, 3 for T0015, one each for T0017, T0020,
    T0022, T0025, 2 for T0021; once replica1's breaker had opened, 2 to replica2, one each for T0028 and T0029)
    and sent each request on; the replica had received every one (its folder holds them) and kept it queued
    until it saw the connection gone: each is a row the client never saw, server_status cancelled, and its time
    on the replica after the router's span ended is ghost load, Σ 27 322.8 ms on replica1 and 1 341.1 ms on
    replica2, worked out below from the router.try end and the try's server end on the one clock pair; with the
    10 client attempts the router's timeout cut mid-stream (client error), 25 ghost attempts. The router's
    counters: replica1 18 tries, replica2 27, 15 retries, 30 requests."""
    run = runs["router_abandoned"]
    assert rows(run, "select replica_id, client_status, server_status, parent_attempt_id is not null, count(*) "
                     "from attempts group by all order by all") == [
        ("replica1", "error", "cancelled", False, 5), ("replica1", None, "cancelled", True, 13),
        ("replica2", "completed", "completed", False, 20), ("replica2", "error", "cancelled", False, 5),
        ("replica2", None, "cancelled", True, 2)]
    assert rows(run, "select replica_id, attempts, client_attempts, unseen_tries, router_sent, router_agrees, "
                     "router_failures from replicas order by 1") == [
        ("replica1", 18, 5, 13, 18, True, 13), ("replica2", 27, 25, 2, 27, True, 2)]
    assert router_counts("router_abandoned/run") == {"replica1": 18, "replica2": 27}
    logged = re.findall(r'ERROR http_request\{[^}]*request_id="([^"]+)"\}: vllm_router_rs::routers::http::router: '
                        r"src/routers/http/router.rs:2006: Failed to send typed request worker_url=http://127.0.0.1:(1811\d) ",
                        (SAMPLES / "router_abandoned" / "router.log").read_text())
    unseen = rows(run, "select parent_attempt_id, replica_id from attempts where parent_attempt_id is not null")
    port = {"replica1": "18111", "replica2": "18112"}
    assert Counter(logged) == Counter((a, port[r]) for a, r in unseen) == {
        ("T0010:R1:A1", "18111"): 1, ("T0012:R1:A1", "18111"): 2, ("T0014:R1:A1", "18111"): 1,
        ("T0015:R1:A1", "18111"): 3, ("T0017:R1:A1", "18111"): 1, ("T0020:R1:A1", "18111"): 1,
        ("T0021:R1:A1", "18111"): 2, ("T0022:R1:A1", "18111"): 1, ("T0025:R1:A1", "18111"): 1,
        ("T0028:R1:A1", "18112"): 1, ("T0029:R1:A1", "18112"): 1}
    by_router = rows(run, "select a.replica_id, round(sum(a.server_end_ns - (json_extract(e.attrs, '$.end_ns')::BIGINT "
                          "- c.offset_ns)) / 1e6, 1), count(*) from attempts a join events e on e.attempt_id = "
                          "a.attempt_id and e.name = 'router.try' join clocks c on c.from_clock = a.server_clock and "
                          "c.to_clock = e.clock where a.parent_attempt_id is not null and e.attrs like '%\"error\"%' "
                          "group by 1 order by 1")
    assert by_router == [("replica1", 27322.8, 13), ("replica2", 1341.1, 2)]
    assert rows(run, "select sent, unseen_tries, router_tries, router_retries, round(retry_amplification, 4), "
                     "ghost_attempts, round(ghost_ms, 1) from reconciliation") == [(30, 15, 45, 15, 1.5, 25, 32878.8)]
    # every client attempt joined to its router try: the first request's spans came too (the router primed)
    spans = _span_kinds(SAMPLES / "router_abandoned" / "run")
    assert (spans["SPAN_KIND_SERVER"], spans["SPAN_KIND_CLIENT"]) == (30, 45)
    assert rows(run, "select count(distinct a.attempt_id) from attempts a join events e on e.attempt_id = a.attempt_id "
                     "and e.name = 'router.try' where a.client_status is not null") == [(30,)]
    assert rows(run, "select count(*) from gaps where gap_id like 'collector:router%'") == [(0,)]


def test_a_routers_span_is_a_row_of_its_own_only_when_its_request_is_ours_and_no_folder_holds_it(tmp_path):
    """The join by request id alone, by hand: A's refused first try is a row A@replica1#1 and its answer, held
    by replica2's folder (the span it recorded as parent), is an event of the attempt the folder holds; B's refused try would be B@replica1#1,
    the name a folder's try already has: a gap, not a second row; E's only try, to a worker no replica is, goes
    on E itself; a request the client never sent (X), a try whose request's span is missing, and an attempt (D)
    whose spans never came are gaps."""
    from inferledger.collectors.capture.router_tries import RouterTries
    from inferledger.probes.events import EVENT_SCHEMA

    def ev(name, aid, attrs="{}", source="client"):
        return {"run_id": "r", "event_id": f"{source}:{name}:{aid}", "seq": 0, "source": source, "host": "h",
                "name": name, "ts_ns": 1, "clock": "mono:h", "task_id": aid[:1], "session_id": None,
                "request_id": aid[:1], "attempt_id": aid, "step_id": None, "value": None, "attrs": attrs}

    (tmp_path / "events").mkdir()
    pq.write_table(pa.Table.from_pylist(
        [ev("attempt.sent", a) for a in "ABDE"] + [
            ev("server.received", "A", '{"parent_span_id":"00000000000000a2"}', "server"),
            ev("server.received", "B@replica1#1", '{"parent_span_id":"00000000000000b0"}', "server")],
        schema=EVENT_SCHEMA), tmp_path / "events" / "part-00000.parquet")

    def span(sid, parent, kind, start, **attrs):
        return {"traceId": "0" * 31 + "1", "spanId": sid, "parentSpanId": parent, "name": "POST", "kind": kind,
                "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 10),
                "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
                "status": {"code": 2, "message": "refused"} if "refused" in attrs.values() else {}}

    w1, w9 = "http://127.0.0.1:18111/v1/chat/completions", "http://10.0.0.9:8000/v1/chat/completions"
    spans = [span("00000000000000aa", "", 2, 100, request_id="A"), span("00000000000000bb", "", 2, 100, request_id="B"),
             span("00000000000000ee", "", 2, 100, request_id="E"), span("00000000000000ff", "", 2, 100, request_id="X"),
             span("00000000000000a1", "00000000000000aa", 3, 110, **{"url.full": w1, "note": "refused"}),
             span("00000000000000a2", "00000000000000aa", 3, 120, **{"url.full": w1.replace("18111", "18112")}),
             span("00000000000000b1", "00000000000000bb", 3, 110, **{"url.full": w1, "note": "refused"}),
             span("00000000000000b2", "00000000000000bb", 3, 120, **{"url.full": w1, "http.response.status_code": "200"}),
             span("00000000000000e1", "00000000000000ee", 3, 110, **{"url.full": w9, "http.response.status_code": "200"}),
             span("00000000000000f1", "00000000000000ff", 3, 110, **{"url.full": w1}),
             span("00000000000000c1", "00000000000000cc", 3, 110, **{"url.full": w1})]
    traces = tmp_path / "spans.jsonl"
    traces.write_text(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}) + "\n")

    class Writer:
        run_id, rows = "r", []

        def flush(self):
            pass

        def emit(self, row):
            self.rows.append(row)

    tries = RouterTries(traces, "vm", "http://127.0.0.1:18200", {"127.0.0.1:18111": "replica1", "127.0.0.1:18112": "replica2"})
    w = Writer()
    tries.join(w, tmp_path, wait_s=0, say=lambda _: None)
    got = [(r["attempt_id"], r["clock"], json.loads(r["attrs"])) for r in w.rows]
    assert [(a, c, x["replica_id"], x.get("parent_attempt_id"), x.get("error"), x.get("status")) for a, c, x in got] == [
        ("A@replica1#1", "wall:vm", "replica1", "A", "refused", None),
        ("A", "wall:vm", "replica2", None, None, None),
        ("B", "wall:vm", "replica1", None, None, 200),
        ("E", "wall:vm", "10.0.0.9:8000", None, None, 200)]
    assert tries.gaps[0]["affects"].startswith("attempts.replica_id (no folder holds it), ")  # D: only attempt.sent
    assert [(g["gap_id"], g["subject_id"]) for g in tries.gaps] == [
        ("collector:router-spans:D", "D"), ("collector:router-span:00000000000000c1", "00000000000000c1"),
        ("collector:router-span:00000000000000f1", "00000000000000f1"),
        ("collector:router-span:00000000000000b1", "B@replica1#1")]
    assert (tmp_path / "router-spans.jsonl").read_bytes() == traces.read_bytes()
    assert (tries.summary["unseen_tries"], tries.summary["held_by_folders"], tries.summary["events"]) == (1, 1, 4)


def test_a_load_points_good_share_is_of_the_clients_requests_not_the_routers_retries(runs):
    """The load study's point (studies/load.py): of the 37 rows of `retries`, 17 are the router's tries that
    replica1 refused, which the client never made; the client made 20 requests, 12 of them good. Its good
    share is 12 / 20, not 12 / 37 (a knee where no request was lost)."""
    from inferledger.studies.load import POINT_SQL

    assert rows(runs["retries"], "select count(*), count(client_status) from attempts") == [(37, 20)]
    assert rows(runs["retries"], "select n_good from run_metrics") == [(12,)]
    with open_ledger(runs["retries"]) as led:
        cols, got = led.rows(POINT_SQL)
    point = dict(zip(cols, got[0]))
    assert (point["n_attempts"], point["good_share"]) == (20, pytest.approx(12 / 20))
