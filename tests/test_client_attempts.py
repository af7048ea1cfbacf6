"""The client's attempts, defined once (attempts.client_attempt) and read by every count of them: run_metrics
(n_client_attempts, n_unjudged), the load study's denominator, the routing study, replicas. Held on samples where
the old predicates disagreed: a router run whose one client attempt's client events are gone (the server saw it,
no router made it: neither the client's nor a router's), and an engine-only run (an E0 archive without its client
lines). Every expected count is read from the raw events, not from the ledger."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.ledger.query import open_ledger
from inferledger.ledger.reconstruct import reconstruct
from inferledger.studies.load import POINT_SQL
from inferledger.studies.routing import POLICY_SQL

ROOT = Path(__file__).resolve().parent.parent
RETRIES = ROOT / "samples" / "peers" / "vllm_router" / "retries"
E0_RETRY = ROOT / "samples" / "e0" / "r2_timeout_retry" / "archive.jsonl"


def rows(run, sql):
    with open_ledger(run) as led:
        return led.rows(sql)[1]


def record(run, sql):
    with open_ledger(run) as led:
        cols, got = led.rows(sql)
    assert len(got) == 1
    return dict(zip(cols, got[0]))


def _raw(run: Path):
    (part,) = sorted((run / "events").glob("*.parquet"))
    return part, pq.read_table(part)


@pytest.fixture(scope="module")
def router_run(tmp_path_factory):
    """The router sample `retries` (20 client attempts, the router's 17 refused tries on replica1) with the
    client's events (and the checker's verdict) of one attempt replica2 answered removed: the server's copy of
    it is left, no router made it, so it is neither the client's nor a router's."""
    run = tmp_path_factory.mktemp("retries") / "run"
    shutil.copytree(RETRIES, run)
    part, ev = _raw(run)
    src, aid, attrs = (ev.column(c).to_pylist() for c in ("source", "attempt_id", "attrs"))
    client_ids = sorted({a for s, a in zip(src, aid) if s == "client" and a is not None})
    on_replica2 = {a for a, t in zip(aid, attrs)
                   if a is not None and t and json.loads(t).get("replica_id") == "replica2"}
    dropped = next(a for a in client_ids if a in on_replica2)
    keep = pc.invert(pc.and_(pc.is_in(ev.column("source"), pa.array(["client", "checker"])),
                             pc.equal(ev.column("attempt_id"), dropped)))
    pq.write_table(ev.filter(keep), part)
    reconstruct(run)
    return run, dropped


def test_raw_router_sample_counts(router_run):
    """What the raw events hold after the edit, counted without the ledger: 19 attempts the client recorded,
    the router's 17 tries (attrs.parent_attempt_id), the dropped one only in replica2's copy."""
    run, dropped = router_run
    _, ev = _raw(run)
    src, aid, attrs = (ev.column(c).to_pylist() for c in ("source", "attempt_id", "attrs"))
    parsed = [json.loads(t) if t else {} for t in attrs]
    assert len({a for s, a in zip(src, aid) if s == "client" and a is not None}) == 19
    assert len({a for a, t in zip(aid, parsed) if a is not None and "parent_attempt_id" in t}) == 17
    assert {t.get("replica_id") for a, t in zip(aid, parsed) if a == dropped} == {"replica2"}
    assert {s for s, a in zip(src, aid) if a == dropped} == {"server", "engine"}
    # the checker judged 19 answers, 11 correct (no task has a deadline: good is correct)
    verdicts = [t["correct"] for n, t in zip(ev.column("name").to_pylist(), parsed) if n == "verdict"]
    assert (len(verdicts), sum(verdicts)) == (19, 11)
    assert not [t for n, t in zip(ev.column("name").to_pylist(), parsed) if n == "task.start" and "deadline_ms" in t]


def test_one_column_says_whose_each_attempt_is(router_run):
    run, dropped = router_run
    assert rows(run, "select client_attempt, count(*) from attempts group by 1 order by 1 nulls last") == \
        [(False, 17), (True, 19), (None, 1)]
    assert rows(run, "select attempt_id from attempts where client_attempt is null") == [(dropped,)]
    # a router's try is never the client's, and the client's are exactly those with a client status
    assert rows(run, "select count(*) from attempts where (client_attempt is false) <> (parent_attempt_id is not null) "
                     "or coalesce(client_attempt, false) <> (client_status is not null)") == [(0,)]
    # the attempt no one accounts for is named; a router's try is not
    assert rows(run, "select subject_id from gaps where scope = 'attempt' and affects like '%client_attempt%'") == \
        [(dropped,)]


def test_every_count_of_the_clients_attempts_agrees(router_run):
    run, _ = router_run
    m = record(run, "select n_client_attempts, n_completed, n_good, n_unjudged from run_metrics")
    assert m == {"n_client_attempts": 19, "n_completed": 19, "n_good": 11, "n_unjudged": 0}
    point = record(run, POINT_SQL)
    assert (point["n_attempts"], point["good_share"]) == (19, 11 / 19)
    policy = record(run, POLICY_SQL)
    assert (policy["n_attempts"], policy["unseen_tries"]) == (19, 17)
    assert rows(run, "select replica_id, attempts, client_attempts, unseen_tries from replicas order by 1") == \
        [("replica1", 19, 2, 17), ("replica2", 18, 17, 0)]
    rec = record(run, "select completed, p_fail from reconciliation")
    assert rec == {"completed": 19, "p_fail": 0.0}


@pytest.fixture(scope="module")
def engine_only(tmp_path_factory):
    """r2_timeout_retry without its client lines (and the checker's verdict on the client's answer): the server
    and engine of two attempts, no client."""
    root = tmp_path_factory.mktemp("engine_only")
    lines = [ln for ln in E0_RETRY.read_text().splitlines()
             if ln.strip() and json.loads(ln).get("source") not in ("client", "checker")]
    archive = root / "archive.jsonl"
    archive.write_text("\n".join(lines) + "\n")
    run = root / "run"
    import_archive(archive, run)
    reconstruct(run)
    return run, lines


def test_an_engine_only_run_has_no_count_of_the_clients_attempts(engine_only):
    run, lines = engine_only
    events = [json.loads(ln) for ln in lines]
    assert not [e for e in events if e.get("source") == "client"]
    assert sorted({e["attempt_id"] for e in events if e.get("attempt_id")}) == ["A1", "A2"]
    assert rows(run, "select attempt_id, client_attempt, client_status from attempts order by 1") == \
        [("A1", None, None), ("A2", None, None)]
    m = record(run, "select n_client_attempts, n_unjudged, n_good from run_metrics")
    assert m == {"n_client_attempts": None, "n_unjudged": None, "n_good": None}  # unknown, not 0 nor 2
    point = record(run, POINT_SQL)
    assert (point["n_attempts"], point["good_share"]) == (None, None)
    assert record(run, POLICY_SQL)["n_attempts"] is None
    assert rows(run, "select count(*) from gaps where scope = 'run' "
                     "and affects like '%n_client_attempts, n_unjudged%'") == [(1,)]


def test_a_routers_tries_take_no_place_in_the_clients_retry_budget(tmp_path):
    """`retries` with every contract allowing 3 attempts: the router's refused tries (good unknown: no client)
    neither push the client's attempts down the order nor make a request whose answer was wrong undetermined."""
    run = tmp_path / "run"
    shutil.copytree(RETRIES, run)
    t = pq.read_table(run / "tasks.parquet")
    i = t.schema.get_field_index("max_attempts")
    pq.write_table(t.set_column(i, t.schema.field(i), pa.array([3] * len(t), t.schema.field(i).type)),
                   run / "tasks.parquet")
    _, ev = _raw(run)
    names, tasks, attrs = (ev.column(c).to_pylist() for c in ("name", "task_id", "attrs"))
    aids = ev.column("attempt_id").to_pylist()
    verdict_task = {a: tk for a, tk in zip(aids, tasks) if a and tk}
    wrong = sorted({verdict_task[a] for n, a, t in zip(names, aids, attrs)
                    if n == "verdict" and not json.loads(t)["correct"]})
    assert len(wrong) == 8  # the checker's 8 wrong answers, one per task (one attempt each)
    reconstruct(run)
    assert rows(run, "select outcome, count(*) from tasks group by 1 order by 1") == [("failure", 8), ("success", 12)]
    assert [t for (t,) in rows(run, "select task_id from tasks where outcome = 'failure' order by 1")] == wrong
    # the client's one attempt per request is its first; each try is numbered among the router's (its #n)
    assert rows(run, "select count(*) from attempts where client_attempt and attempt_index <> 1") == [(0,)]
    tries = rows(run, "select attempt_id, attempt_index from attempts where client_attempt is false")
    assert len(tries) == 17 and all(idx == int(a.rsplit("#", 1)[1]) for a, idx in tries)
