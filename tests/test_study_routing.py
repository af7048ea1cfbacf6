"""`study routing`: one shared-prefix workload through two replicas behind vLLM's router, once per policy.
Its declaration and plan, the refusal where the router is not installed, and its tables computed from the
recorded study (samples/peers/vllm_router/routing/: a real run per policy, the ledgers rebuilt here without
the router) and held to exact values."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.probes.study_dir import read_comparison
from inferledger.studies import routing
from inferledger.studies.framework import StudyError, rebuild_study
from inferledger.studies.registry import get_study

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "peers" / "vllm_router" / "routing"


def _said(res) -> str:
    return " ".join(res.output.replace("│", " ").split())


@pytest.fixture
def router(tmp_path):
    """A stand-in for the router's binary: planning only checks it is an executable file."""
    path = tmp_path / "vllm-router"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_the_study_is_declared_with_three_policies_and_plans_one_run_each(router):
    study = get_study("routing")
    opts = study.resolve_options({"router": router})
    assert opts["policies"] == "round_robin,power_of_two,cache_aware" and not study.needs_model
    assert [(r.name, r.knob) for r in study.runs(opts)] == [
        ("round_robin", {"policy": "round_robin"}), ("power_of_two", {"policy": "power_of_two"}),
        ("cache_aware", {"policy": "cache_aware"})]
    picked = study.resolve_options({"router": router, "policies": "cache_aware, round_robin"})
    assert [r.name for r in study.runs(picked)] == ["cache_aware", "round_robin"]
    # the workload: five prefix groups (odd: round robin sends each to both replicas) dealt in turn
    wl = routing._workload(study.resolve_options({"scale": "tiny"}))
    assert [(c.name, c.prompt_tokens, c.shared_prefix_tokens) for c in wl.classes] == \
        [(f"group{k}", 128, 96) for k in range(1, 6)]
    assert [c.name for c in wl.class_sequence()[:7]] == [f"group{k}" for k in (1, 2, 3, 4, 5, 1, 2)]
    assert (wl.n_tasks, wl.max_tokens, wl.process, wl.rate_rps) == (24, 4, "poisson", 2.0)
    # each replica: prefix caching on, its own folder; the router: the policy, its metrics on their own port
    assert routing.replica_argv(5, Path("w/replica1"))[-5:] == ["--max-num-seqs", "2", "--enable-prefix-caching",
                                                                "--out", "w/replica1"]
    argv = routing.router_argv(Path("r"), 1, 2, ["http://a", "http://b"], "cache_aware")
    assert argv[argv.index("--worker-urls"):argv.index("--policy") + 2] == \
        ["--worker-urls", "http://a", "http://b", "--policy", "cache_aware"]
    assert argv[argv.index("--prometheus-port") + 1] == "2"


@pytest.mark.parametrize("policies, message", [
    ("least_loaded", "'least_loaded' is not one"), ("round_robin,round_robin", "none twice"),
    (" , ", "one or more of")])
def test_a_policy_list_that_cannot_run_is_refused(router, policies, message):
    study = get_study("routing")
    with pytest.raises(StudyError, match=f"--set policies=.*{message}"):
        study.runs(study.resolve_options({"router": router, "policies": policies}))


def test_without_the_router_the_study_is_refused_naming_the_install_script(tmp_path, monkeypatch):
    monkeypatch.setattr(routing, "INSTALLED", tmp_path / "none" / "vllm-router")
    monkeypatch.setenv("PATH", str(tmp_path))
    res = CliRunner().invoke(app, ["study", "routing", "-o", str(tmp_path / "s"), "--set", "scale=tiny"])
    assert res.exit_code == 2 and "vLLM's router, which is not installed: install it with `bash " \
        "benchmarks/peers/vllm_router.sh install`" in _said(res), res.output
    assert not (tmp_path / "s").exists()
    res = CliRunner().invoke(app, ["study", "routing", "-o", str(tmp_path / "s"), "--set", f"router={tmp_path}"])
    assert res.exit_code == 2 and f"--set router={tmp_path}: not an executable file" in _said(res), res.output
    assert not (tmp_path / "s").exists()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The recorded study folder, its runs' ledgers rebuilt and its comparison computed again from them."""
    out = tmp_path_factory.mktemp("routing") / "study"
    shutil.copytree(SAMPLE, out, ignore=shutil.ignore_patterns("README.md"))
    (out / "comparison.json").unlink()
    rebuild_study(out, get_study("routing"))
    return out, read_comparison(out)


def _rows(table: dict) -> list[dict]:
    return [dict(zip(table["columns"], r)) for r in table["rows"]]


def test_the_recorded_study_rebuilds_to_the_comparison_it_recorded(recorded):
    """Every cell as recorded: counts and words exactly, a float to 1e-9 (a sum's order may differ in its last bit)."""
    _, comp = recorded
    want = json.loads((SAMPLE / "comparison.json").read_text())
    assert {t: (v["columns"], len(v["rows"])) for t, v in comp.items()} == \
        {t: (v["columns"], len(v["rows"])) for t, v in want.items()}
    for name, table in comp.items():
        for got, row in zip(table["rows"], want[name]["rows"]):
            for column, value, recorded_value in zip(table["columns"], got, row):
                expected = pytest.approx(recorded_value, rel=1e-9) if isinstance(recorded_value, float) else \
                    recorded_value
                assert value == expected, (name, row[0], column)


def test_each_policy_shows_the_prefix_hits_it_produced_and_the_routers_counts_agree(recorded):
    _, comp = recorded
    key = {r["policy"]: r for r in _rows(comp["routing"])}
    assert list(key) == ["round_robin", "power_of_two", "cache_aware"]
    # 24 prompts of 128 tokens in 5 groups sharing 96 (6 blocks of 16): a replica computes a group's prefix the
    # first time the group reaches it. Round robin (and power of two, here) sent every group to both replicas:
    # 10 misses, 14 hits; cache aware kept each group on one replica (four on replica1): 5 misses, 19 hits.
    assert [(p, key[p]["n_attempts"], key[p]["unseen_tries"], key[p]["prompt_tokens"], key[p]["cached_tokens"],
             key[p]["hit_rate"]) for p in key] == [
        ("round_robin", 24, 0, 3072, 14 * 96, 0.4375), ("power_of_two", 24, 0, 3072, 14 * 96, 0.4375),
        ("cache_aware", 24, 0, 3072, 19 * 96, 0.59375)]
    reps = [(r["policy"], r["replica_id"], r["attempts"], r["router_sent"], r["router_agrees"], r["cached_tokens"],
             r["prefix_hit_blocks"]) for r in _rows(comp["replicas"])]
    assert reps == [("round_robin", "replica1", 12, 12, True, 672, 42),
                    ("round_robin", "replica2", 12, 12, True, 672, 42),
                    ("power_of_two", "replica1", 13, 13, True, 768, 48),
                    ("power_of_two", "replica2", 11, 11, True, 576, 36),
                    ("cache_aware", "replica1", 19, 19, True, 1440, 90),
                    ("cache_aware", "replica2", 5, 5, True, 384, 24)]
    # the engine's cached tokens and the KV blocks its attempts took from the cache: two counts of the same hits
    assert all(r[5] == 16 * r[6] for r in reps)
    assert (key["cache_aware"]["replica1_hit_rate"], key["cache_aware"]["replica2_hit_rate"]) == (1440 / 2432, 0.6)
    # a third count, the replicas' own: each one's /metrics counters over the load (vllm:prefix_cache_hits_total,
    # vllm:prefix_cache_queries_total) equal its engine's cached and prompt tokens
    rows = _rows(comp["replicas"])
    counted = [(r["prefix_hit_tokens"], r["prefix_query_tokens"], r["prefix_counter_agrees"]) for r in rows]
    assert counted == [(r["cached_tokens"], r["prompt_tokens"], True) for r in rows]
    assert [(key[p]["counter_hit_rate"], key[p]["counters_agree"]) for p in key] == \
        [(0.4375, True), (0.4375, True), (0.59375, True)]
    # the cost of keeping groups together: cache aware's spread is the least even (busy time, 15 against 9)
    assert key["cache_aware"]["balance"] > max(key["round_robin"]["balance"], key["power_of_two"]["balance"])
    for p in key.values():  # every attempt completed within the ten-minute default deadline: none late
        assert p["diagnosed"] == "all" and p["first_cause"] is not None and p["cause_replica"] is None
        assert p["ttft_p50_ms"] <= p["ttft_p99_ms"] and p["goodput_rps"] > 0


def test_cache_aware_kept_each_prefix_group_on_one_replica(recorded):
    from inferledger.ledger.query import open_ledger

    out, _ = recorded
    by_group = ("select (substr(attempt_id, 2, 4)::INT % 5) + 1 AS g, count(DISTINCT replica_id) from attempts "
                "group by 1")
    with open_ledger(out / "runs" / "cache_aware") as led:  # task i is of group i mod 5 + 1 (the plan's test)
        assert sorted(led.rows(by_group)[1]) == [(g, 1) for g in range(1, 6)]
    with open_ledger(out / "runs" / "round_robin") as led:
        assert sorted(led.rows(by_group)[1]) == [(g, 2) for g in range(1, 6)]
