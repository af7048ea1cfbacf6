"""The studies on the real engine, at their tiny scale on the session's model: every point of each
comparison is there, the figures the design fixes (chunk counts, cached tokens) are exact, the timing
figures keep the orders a step's timeline implies, and each run opens alone. They run on the session's
fp32 model (`bundle`), once: what they check is the same at every dtype, and the `dtype` reruns would
triple their time."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import inferledger
from inferledger.cli.app import app
from inferledger.ledger.query import open_ledger
from inferledger.probes.run_folder import StudyIndex
from inferledger.probes.study_dir import read_comparison, run_dirs
from inferledger.studies.fidelity import contention_sentence
from inferledger.studies.load import CAUSES, MIN_POINT_ATTEMPTS, explain

pytestmark = pytest.mark.slow


def _run(name, tmp_path_factory, bundle, **options):
    out = tmp_path_factory.mktemp("studies") / name
    inferledger.study(name, out, bundle=bundle, scale="tiny", **options)
    return out, read_comparison(out)


def _rows(table: dict) -> dict[str, dict]:
    return {r[0]: dict(zip(table["columns"], r)) for r in table["rows"]}


# per run: the longest stretch, in a step holding the long prompt's prefill, from the step's start to a decoder's
# token (T0000) and to the long prompt's own token (T0001) in it
LONG_STEP_BOUNDS_SQL = """
WITH long_steps AS (SELECT DISTINCT s.step_id FROM step_attribution s JOIN request_metrics r USING (attempt_id)
                    WHERE r.task_id = 'T0001' AND s.kind = 'prefill'),
     starts AS (SELECT step_id, ts_ns FROM events WHERE name = 'step.start'),
     tok AS (SELECT e.step_id, e.ts_ns, r.task_id FROM events e JOIN request_metrics r USING (attempt_id)
             WHERE e.name = 'engine.token' AND e.step_id IN (SELECT step_id FROM long_steps))
SELECT max((tok.ts_ns - starts.ts_ns) / 1e6) FILTER (WHERE tok.task_id = 'T0000'),
       max((tok.ts_ns - starts.ts_ns) / 1e6) FILTER (WHERE tok.task_id = 'T0001')
FROM tok JOIN starts USING (step_id)"""


@pytest.fixture(scope="module")
def chunked(tmp_path_factory, bundle):
    return _run("chunked-prefill", tmp_path_factory, bundle)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory, bundle):
    return _run("prefix-cache", tmp_path_factory, bundle)


def test_chunked_prefill_splits_the_long_prompt_as_configured_and_gaps_span_its_steps(chunked):
    out, comp = chunked
    key = _rows(comp["chunks"])
    assert list(key) == ["whole", "chunk-64"]  # from the whole prefill to the smallest chunk
    # the long prompt is 192 tokens: one step whole; in chunks of at most 64, at least 192 / 64 = 3 steps (a
    # fourth when its first chunk took what the decoders' prefills left of a step's budget of 67)
    whole, chunk = key["whole"], key["chunk-64"]
    assert (whole["largest_chunk_tokens"], whole["long_prefill_tokens"], whole["long_prefill_steps"]) == (192, 192, 1)
    assert (chunk["largest_chunk_tokens"], chunk["long_prefill_tokens"]) == (64, 192)
    assert chunk["long_prefill_steps"] in (3, 4)
    steps = _rows(comp["steps"])
    runs = dict(run_dirs(out))
    for name in key:
        # the decoders were running beside the long prefill, so one of their output gaps spans a long step up to
        # their token in it (their previous token came before that step began); the long prompt's TTFT, likewise
        assert steps[name]["mixed_steps"] >= 1
        with open_ledger(runs[name]) as led:
            (decoder_bound, long_bound), = led.rows(LONG_STEP_BOUNDS_SQL)[1]
        assert key[name]["longest_gap_ms"] >= decoder_bound > 0
        assert key[name]["long_ttft_ms"] >= long_bound > 0
    assert steps["whole"]["mixed_steps"] == 1 and steps["chunk-64"]["mixed_steps"] <= chunk["long_prefill_steps"]
    doc = StudyIndex.read(out).doc
    assert doc["state"] == "complete" and doc["figures"][0]["kind"] == "curve"
    for name, run in run_dirs(out):  # each point opens alone, as a capture of the real engine
        with open_ledger(run) as led:
            assert led.rows("SELECT count(*) FROM request_metrics WHERE server_evidence = 'observed'")[1] == [(3,)]


def test_prefix_cache_serves_the_shared_prefix_to_every_request_after_the_first(prefix):
    _, comp = prefix
    key = _rows(comp["prefix"])
    assert list(key) == ["distinct", "shared", "shared-off"]
    # two prompts of 128 tokens; 96 shared = 6 whole blocks of 16, served to the second
    assert [key[n]["prompt_tokens"] for n in key] == [256, 256, 256]
    shared = key["shared"]
    assert (shared["cached_tokens"], shared["computed_tokens"], shared["hit_share"]) == (96, 160, 96 / 256)
    for name in ("distinct", "shared-off"):
        assert (key[name]["cached_tokens"], key[name]["computed_tokens"], key[name]["hit_share"]) == (0, 256, 0.0)
    shared = [r for r in comp["requests"]["rows"] if r[0] == "shared"]
    assert [r[3] for r in shared] == [0, 96]  # the first request found the cache empty
    assert all(r[5] is not None and r[6] >= r[5] for r in comp["requests"]["rows"])  # client TTFT ≥ server's


@pytest.fixture(scope="module")
def spec(tmp_path_factory, bundle):
    return _run("spec-decode", tmp_path_factory, bundle)


@pytest.fixture(scope="module")
def load(tmp_path_factory, bundle):
    return _run("load", tmp_path_factory, bundle)


def test_spec_decode_rounds_commit_accepted_plus_one_and_account_for_every_output_token(spec):
    _, comp = spec
    key = _rows(comp["draft"])
    assert list(key) == ["off", "k4"]
    # one request of 12 output tokens: 11 after the first, each from a plain decode step without speculation
    off = key["off"]
    assert (off["k"], off["rounds"], off["plain_steps"], off["tokens_per_decode_step"]) == (0, 0, 11, 1.0)
    assert off["acceptance"] is None and off["round_ms_p50"] is None
    k4 = key["k4"]
    rounds = [dict(zip(comp["rounds"]["columns"], r)) for r in comp["rounds"]["rows"] if r[0] == "k4"]
    verify = [r for r in rounds if r["drafted"] is not None]
    assert len(verify) == k4["rounds"] >= 1 and len(rounds) - len(verify) == k4["plain_steps"]
    for r in verify:  # a round commits its accepted draft tokens and one more, never past the draft
        assert r["kind"] == "verify" and 0 <= r["accepted"] <= r["drafted"] <= 4
        assert r["committed"] == r["accepted"] + 1 and r["step_tokens"] == r["drafted"] + 1
    assert sum(r["committed"] for r in verify) + k4["plain_steps"] == 11
    assert k4["accepted_tokens"] == sum(r["accepted"] for r in verify)
    assert k4["acceptance"] == pytest.approx(sum(r["accepted"] for r in verify) / sum(r["drafted"] for r in verify))
    assert k4["tokens_per_decode_step"] == pytest.approx(11 / len(rounds))


def test_load_has_every_point_with_littles_law_and_names_the_knee_or_its_absence(load):
    out, comp = load
    key = _rows(comp["load"])
    assert list(key) == ["saturated", "x0.5", "x2"]
    # the capacity is the saturated run's completed rate (its ledger); the points offer multiples of it
    sat = key.pop("saturated")
    assert sat["offered_rps"] is None and sat["good_share"] == 1.0  # no deadline that counts: ten minutes
    assert key["x0.5"]["offered_rps"] == pytest.approx(0.5 * sat["completed_rps"], rel=1e-3)
    assert key["x2"]["offered_rps"] == pytest.approx(2 * sat["completed_rps"], rel=1e-3)
    for p in [sat, *key.values()]:
        assert p["goodput_rps"] <= p["completed_rps"] <= p["attempted_rps"]
        assert 0 <= p["good_share"] <= 1
        # Little's law at the client is one sum (a bookkeeping check); at the server the engine's own gauge
        # against its admissions × their time in it, two measurements
        assert p["little_rel_err"] == pytest.approx(abs(p["little_l"] - p["little_lambda_w"]) / p["little_l"])
        assert p["little_rel_err"] < 0.01
        assert p["server_little_rel_err"] == pytest.approx(
            abs(p["server_l"] - p["server_lambda_w"]) / p["server_l"])
        assert p["client_transport_l"] == pytest.approx(p["little_l"] - p["server_l"])
        assert 0 < p["server_l"] <= p["little_l"]
        # the point's diagnosis: the known shares of its delay add up to 1, its first cause the largest
        known = {c: p[f"{c}_share"] for c in CAUSES if p[f"{c}_share"] is not None}
        assert p["diagnosed"] in ("late", "all") and p["n_diagnosed"] >= 1
        if p["first_cause"] is not None:
            assert sum(known.values()) == pytest.approx(1.0)
            assert p["first_cause_share"] == max(known.values()) == known[p["first_cause"]]
    [knee] = comp["knee"]["rows"]
    if min(p["n_attempts"] for p in key.values()) < MIN_POINT_ATTEMPTS:  # the tiny scale: too few to conclude
        assert knee[0] is None and knee[5].startswith("no conclusion: too few requests (")
    else:
        assert knee[5].startswith("knee at " if knee[0] is not None else "no knee up to ")
    with open_ledger(out) as led:  # the study's cause is the ledger's: run_diagnosis at each point
        diag = dict(led.rows("SELECT run_id, first_cause FROM run_diagnosis WHERE scope = 'point'")[1])
    assert {f"load.{r}": key[r]["first_cause"] for r in ("x0.5", "x2")} == diag
    for name, run in run_dirs(out)[1:]:  # every point declares where it sits on the curve
        point = json.loads((run / "manifest.json").read_text())["study_point"]
        assert point["multiple_of_capacity"] == {"x0.5": 0.5, "x2": 2.0}[name]
        assert point["capacity_rps"] == pytest.approx(sat["completed_rps"], rel=1e-3)
    with open_ledger(out) as led:  # the folder reads as all its runs, each under <study>.<run>
        assert [r[0] for r in led.rows("SELECT DISTINCT run_id FROM run_metrics ORDER BY 1")[1]] == \
            ["load.saturated", "load.x0.5", "load.x2"]


def _point(run, rps, good, cause=None, share=None):
    return {"run": run, "multiple": rps, "offered_rps": rps, "good_share": good, "first_cause": cause,
            "first_cause_share": share, "evidence": f"ev {run}"}


def test_the_knee_is_where_the_good_share_stays_below_90_percent_and_its_cause_the_diagnosis_there():
    points = [_point("c", 3.0, 0.5, "prefill_interference", 0.62), _point("a", 1.0, 1.0, "server_queue", 0.5),
              _point("b", 2.0, 0.95, "server_queue", 0.7)]
    knee, sentence = explain(points)
    assert knee["run"] == "c"
    assert sentence == ("knee at 3 req/s (3 × capacity, 50% good); first cause: prefill_interference (62% of the "
                        "delay; ev c)")
    blip, _ = explain([_point("a", 1.0, 0.3), _point("b", 2.0, 1.0), _point("c", 3.0, 0.4, "preemption", 0.9)])
    assert blip["run"] == "c"  # a's bad point has a good one above it: not the knee
    _, calm = explain([_point("a", 1.0, 1.0)])
    assert calm == "no knee up to 1 req/s (every rate kept 90% good); no measured delay at 1 req/s (ev a)"
    _, busy = explain([_point("a", 1.0, 1.0, "host_contention", 0.55)])
    assert busy == ("no knee up to 1 req/s (every rate kept 90% good); largest cause at the highest rate: "
                    "host_contention (55% of the delay; ev a)")


def test_a_point_of_too_few_requests_gives_no_conclusion_and_the_sent_rate_stands_beside_the_offered():
    few = [dict(_point("a", 1.0, 1.0), n_attempts=40), dict(_point("b", 6.31, 1.0), n_attempts=4, attempted_rps=2.76)]
    knee, sentence = explain(few)
    assert knee is None
    assert sentence == ("no conclusion: too few requests (4 attempts at 6.31 req/s offered (2.76 req/s attempted); "
                        "at least 20 a point are needed to tell 90% good from not)")
    enough = [dict(_point("a", 1.0, 1.0), n_attempts=40, attempted_rps=1.0),
              dict(_point("b", 6.31, 0.5, "server_queue", 0.8), n_attempts=40, attempted_rps=2.76)]
    knee, sentence = explain(enough)
    assert knee["run"] == "b" and sentence.startswith("knee at 6.31 req/s offered (2.76 req/s attempted) (6.31 × ")


def test_a_real_engine_study_refuses_an_unknown_scale_before_loading_anything(tmp_path):
    res = CliRunner().invoke(app, ["study", "load", "-o", str(tmp_path / "s"), "--set", "scale=huge"])
    assert res.exit_code == 2 and "scale=huge: expected one of default, tiny" in res.output
    assert not (tmp_path / "s").exists()


# the workload under test: three chats, the first one's first attempt times out mid-decode (the client
# disconnects, the engine cancels it) and is retried; the retry and the two others complete
RETRY_WORKLOAD = """name = "fidelity-retry"
seed = 5
[taskset]
file = "basic.jsonl"
[arrivals]
process = "replay"
file = "arrivals.txt"
[contract]
deadline_ms = 120000
[client]
timeout_ms = 60000
max_attempts = 2
backoff_ms = 20
[generation]
max_tokens = 16
ignore_eos = true
[[classes]]
name = "chat"
prompt_tokens = 48
[inject]
timeout_tasks = [1]
timeout_ms = 250
"""


def _retry_workload(folder):
    (folder / "arrivals.txt").write_text("0\n150\n300\n")
    (folder / "retry.toml").write_text(RETRY_WORKLOAD)
    return folder / "retry.toml"


@pytest.fixture(scope="module")
def fidelity(tmp_path_factory, bundle):
    wl = _retry_workload(tmp_path_factory.mktemp("fidelity-workload"))
    return _run("fidelity", tmp_path_factory, bundle, workload=str(wl))


# each attempt's arrival at the engine and the cancellation it learned of, in ns from the run's first arrival
ENGINE_TIMES_SQL = """WITH t0 AS (SELECT min(ts_ns) AS ns FROM events WHERE name = 'engine.enqueued')
SELECT attempt_id, name, ts_ns - t0.ns FROM events, t0
WHERE name IN ('engine.enqueued', 'engine.cancel_received') ORDER BY 1, 2"""


def test_fidelity_replays_every_attempt_of_a_workload_with_a_retry_keyed_on_attempt_id(fidelity):
    out, comp = fidelity
    assert [r["name"] for r in StudyIndex.read(out).doc["runs"]] == ["fit", "real", "sim"]
    assert StudyIndex.read(out).doc["runs"][1]["knob"]["workload"] == "fidelity-retry"
    dirs = dict(run_dirs(out))
    q = "SELECT attempt_id, request_id, attempt_index, server_status FROM attempts ORDER BY 1"
    with open_ledger(dirs["real"]) as real, open_ledger(dirs["sim"]) as sim:
        r, s = real.rows(q)[1], sim.rows(q)[1]
        # four attempts of three requests: the timed-out first one and its retry share a request
        assert len(r) == 4 and len({x[1] for x in r}) == 3 and sorted(x[2] for x in r) == [1, 1, 1, 2]
        assert real.rows("SELECT client_status, count(*) FROM attempts GROUP BY 1 ORDER BY 1")[1] == [
            ("completed", 3), ("timeout", 1)]
        assert [x[:3] for x in s] == [x[:3] for x in r]  # every real attempt has its sim attempt, by id and place
        assert sorted(x[3] for x in r) == ["cancelled", "completed", "completed", "completed"]
        timed_out = [x[0] for x in r if x[3] == "cancelled"]
        # each attempt arrives when the real engine saw it arrive, to the ns; the timed-out one is planned to be
        # cancelled when the real engine learned of its cancellation (the simulation may have finished it before)
        times = real.rows(ENGINE_TIMES_SQL)[1]
        assert [t for t in sim.rows(ENGINE_TIMES_SQL)[1] if t[1] == "engine.enqueued"] == \
            [t for t in times if t[1] == "engine.enqueued"]
        [cancel_ns] = [t[2] for t in times if t[1] == "engine.cancel_received"]
        plan = json.loads((dirs["sim"] / "manifest.json").read_text())["workload"]["plan"]
        assert [(a["attempt_id"], round(a["cancel_at_ms"] * 1e6)) for a in plan if a["cancel_at_ms"] is not None] \
            == [(timed_out[0], cancel_ns)]
        # the others replayed whole: the output each one's engine gave it
        q = "SELECT attempt_id, n_output_tokens FROM attempts WHERE attempt_id <> ? ORDER BY 1"
        assert sim.rows(q, timed_out)[1] == real.rows(q, timed_out)[1] == [(x[0], 16) for x in r if x[3] == "completed"]
        assert sim.rows("SELECT value FROM events WHERE name = 'engine.enqueued'")[1] == [(48,)] * 4
    replay = _rows(comp["replay"])
    assert {k: v["n_attempts"] for k, v in replay.items()} == {"whole": 3, "until_cancel": 1}  # none left out
    attempts = {a["attempt_id"]: a for a in (dict(zip(comp["attempts"]["columns"], row))
                                             for row in comp["attempts"]["rows"])}
    assert sorted(attempts) == [x[0] for x in r]
    assert [a["replay"] for a in attempts.values() if a["attempt_id"] in timed_out] == ["until_cancel"]
    assert sorted(a["replay"] for a in attempts.values()) == ["until_cancel", "whole", "whole", "whole"]
    figures = [row[0] for row in comp["fidelity"]["rows"]]
    assert figures == ["TPOT p50", "TTFT p50", "E2E p99", "TTFT p99", "TPOT p99", "E2E p50"]
    targets = {f["figure"]: f["target_ratio"] for f in _rows(comp["fidelity"]).values()}
    assert (targets["TPOT p50"], targets["TTFT p50"], targets["E2E p99"]) == (0.05, 0.10, 0.10)
    for fig in _rows(comp["fidelity"]).values():
        assert fig["n"] == fig["n_real"] == fig["n_sim"] == 3  # the three attempts both engines completed
        assert fig["error_ratio"] == pytest.approx((fig["sim_ms"] - fig["real_ms"]) / fig["real_ms"])
        assert fig["met"] == (None if fig["target_ratio"] is None else abs(fig["error_ratio"]) <= fig["target_ratio"])
        # three attempts leave fewer than five on either side of any quantile: no interval, never a guessed one
        assert fig["error_lo_ratio"] is None and fig["error_hi_ratio"] is None
    from inferledger.studies.fidelity import sampling_sentence
    assert "E2E p99 " in sampling_sentence(comp["fidelity"]["rows"]) in comp["fidelity"]["note"]
    contention = _rows(comp["contention"])
    assert list(contention) == ["fit", "real"]
    for c in contention.values():
        assert 0 <= c["n_steps_known"] <= c["n_steps"] and (c["contention_share"] is None) == (c["n_steps_known"] == 0)
    assert contention_sentence({k: v for k, v in contention["real"].items()}) in comp["fidelity"]["note"]
    model = json.loads((dirs["sim"] / "manifest.json").read_text())["simulation"]["step_model"]
    # run fit's fit priced at run real's host: both captures measured it, at their start and end at least
    host = json.loads((dirs["sim"] / "manifest.json").read_text())["simulation"]["host_rates"]
    assert host["rescaled"] is True and host["train"]["n"] >= 2 and host["test"]["n"] >= 2
    assert host["memory_scale_ratio"] == host["train"]["memory_gb_s"] / host["test"]["memory_gb_s"]
    [fit] = comp["fit"]["rows"]
    assert model["name"] == "fit" and model["parameters"]["alpha_ms"]["value"] == fit[0]
    assert model["fit"]["trained_on"] == "run fit" and fit[5] >= 3  # trained on the fit run's steps alone
    # the fit held against run real's steps after the fact: what `inferledger fit runs/fit --test runs/real` prints
    from inferledger.costmodel.fit import StepFit, held_out_summary
    from inferledger.ledger.fit_read import ledger_fit_points

    row = dict(zip(comp["fit"]["columns"], fit))
    summary = held_out_summary(StepFit.from_dict(model["fit"]), ledger_fit_points(dirs["real"]))
    assert row["kv_factor"] == model["fit"]["kv_factor"]
    assert row["real_median_abs_pct"] == summary["held_out_median_abs_error_pct"]
    assert row["real_p90_abs_pct"] == summary["held_out_p90_abs_error_pct"]
    assert row["real_steps"] == summary["n_steps"] and 0 <= row["real_extrapolated_steps"] <= row["real_steps"]
    assert row["real_time_ratio"] == summary["time_ratio"] > 0
    assert row["real_decode_time_ratio"] == summary["by_kind"]["decode"]["time_ratio"]
    from inferledger.studies.fidelity import drift_sentence, steadiness_sentence
    assert drift_sentence(row["real_decode_time_ratio"]) in comp["fidelity"]["note"]
    # run real's own steadiness, second by second, under the same fit
    from inferledger.costmodel.fit import decode_ratio_by_window

    by_second = decode_ratio_by_window(StepFit.from_dict(model["fit"]), ledger_fit_points(dirs["real"]))
    assert (row["real_decode_p10_ratio"], row["real_decode_p90_ratio"]) == (by_second["p10"], by_second["p90"])
    assert row["real_decode_p10_ratio"] is None or 0 < row["real_decode_p10_ratio"] <= row["real_decode_p90_ratio"]
    assert steadiness_sentence(row["real_decode_p10_ratio"], row["real_decode_p90_ratio"]) in comp["fidelity"]["note"]


def test_fidelity_refuses_a_bad_workload_file_by_file_and_key_before_loading_anything(tmp_path):
    bad = _retry_workload(tmp_path)
    bad.write_text(RETRY_WORKLOAD.replace("backoff_ms = 20", "backof_ms = 20"))
    res = CliRunner().invoke(app, ["study", "fidelity", "-o", str(tmp_path / "s"), "--workload", str(bad)])
    assert res.exit_code == 2 and f"--workload (--set workload): {bad}: [client].backof_ms: unknown key" in res.output
    res = CliRunner().invoke(app, ["study", "fidelity", "-o", str(tmp_path / "s"), "--set",
                                   f"calibration={tmp_path / 'none.toml'}"])
    assert res.exit_code == 2 and f"--set calibration: {tmp_path / 'none.toml'}: cannot read workload" in res.output
    res = CliRunner().invoke(app, ["study", "load", "-o", str(tmp_path / "s"), "--workload", str(bad)])
    assert res.exit_code == 2 and "--workload: study load takes no workload file" in res.output
    assert not (tmp_path / "s").exists()
    (tmp_path / "a-file").write_text("")  # the output is checked first
    res = CliRunner().invoke(app, ["study", "fidelity", "-o", str(tmp_path / "a-file"), "--workload", str(bad)])
    assert res.exit_code == 2 and "--out" in res.output and "backof_ms" not in res.output, res.output


def test_fidelity_refuses_a_workload_past_the_models_context_before_the_model_loads(tmp_path, monkeypatch):
    import inferledger.engine.loader as loader

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the workload was checked")
    monkeypatch.setattr(loader, "load_model", no_load)
    book = Path(__file__).resolve().parent.parent / "samples" / "workloads" / "book.toml"  # a class of 8192 tokens
    for args, flag in ((["--set", f"calibration={book}"], "--set calibration"), (["--workload", str(book)], "--workload")):
        res = CliRunner().invoke(app, ["study", "fidelity", "-o", str(tmp_path / "s"), *args])
        assert res.exit_code == 2, res.output
        assert f"{flag}" in res.output and "exceeds the model's context of 8192 tokens" in " ".join(res.output.split())
        assert not (tmp_path / "s").exists()


def test_the_fitted_step_model_adds_the_host_gap_to_the_predicted_step():
    from inferledger.collectors.sim.step_time import FittedStepModel, SimStepRow
    from inferledger.costmodel.fit import StepFit
    from inferledger.probes.model_shape import ModelShape

    shape = ModelShape(layers=1, d_model=8, n_heads=2, n_kv_heads=1, head_dim=4, ffn=16, vocab=32,
                       tied_embeddings=True, weight_bytes_per_param=2, act_bytes=2, kv_bytes=2)
    fixed = FittedStepModel(StepFit(alpha_ms=10.0, ms_per_gflop=0.0, ms_per_mb=0.0, gap_alpha_ms=1.0,
                                    gap_ms_per_seq=0.5), shape)
    # no work terms: 10 ms a step, plus 1 ms + 0.5 ms per sequence between steps
    assert fixed.step_ns([SimStepRow(0, 16)]) == 11_500_000
    assert fixed.step_ns([SimStepRow(5, 1), SimStepRow(9, 1), SimStepRow(0, 4)]) == 12_500_000
    no_gap = FittedStepModel(StepFit(alpha_ms=10.0, ms_per_gflop=0.0, ms_per_mb=0.0), shape)
    assert no_gap.step_ns([SimStepRow(0, 16)]) == 10_000_000
    per_flop = FittedStepModel(StepFit(alpha_ms=0.0, ms_per_gflop=1e3, ms_per_mb=0.0), shape)
    assert per_flop.step_ns([SimStepRow(0, 8)]) > per_flop.step_ns([SimStepRow(0, 4)]) > 0  # more tokens, more work


def test_the_report_draws_a_real_engine_study_and_each_point_alone(chunked, load, tmp_path):
    runner = CliRunner()
    for out, figs in ((chunked[0], ("study-fig0", "study-fig1-0", "study-fig1-1")),
                      (load[0], ("study-fig0", "study-fig1"))):
        res = runner.invoke(app, ["report", str(out), "-o", str(tmp_path / f"{out.name}.html")])
        assert res.exit_code == 0, res.output
        html = (tmp_path / f"{out.name}.html").read_text()
        assert all(f'id="{f}"' in html for f in figs)
    res = runner.invoke(app, ["report", str(load[0] / "runs" / "x2"), "-o", str(tmp_path / "one.html")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["query", str(chunked[0]), "select run_id, count(*) from attempts group by 1 order by 1",
                              "--format", "csv"])
    # two decoders and the long prompt in each run
    assert res.output.splitlines() == ["run_id,count_star()", "chunked-prefill.chunk-64,3", "chunked-prefill.whole,3"]
