"""One diagnosis, read two ways: each attempt's dominant cause (attempt_causes, slo_misses) and the run's
first cause (run_diagnosis) must never contradict each other, on the recorded samples rebuilt here (the
e0 archives, real deployments behind vLLM's router, a real vLLM run whose engine side is its spans):

- when every diagnosed attempt's dominant cause is the same cause, that cause is the run's first;
- when a diagnosed attempt's dominant cause is unknown, so is the run's first (that attempt's unknown
  cause could be the run's largest too);
- a first cause named is the largest of the diagnosed attempts' cause times added up here, and its share
  that sum over the delay; the known shares add up to 1;
- slo_misses is the late attempts, and a run with no late attempt diagnoses all of them;
- an attempt's causes and its own work never add up to more than the client held it (client_span_ms): an
  attempt the router gave up on, which the engine went on with, is no delay past that."""
from __future__ import annotations

from pathlib import Path

import pytest

from inferledger.ledger.query import open_ledger
from sample_runs import built_samples

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
CAUSES = ("server_queue", "client_queue", "prefill_interference", "preemption", "decode_stall", "host_contention",
          "transport", "client", "spec_rejected")
E0 = sorted(p.name for p in (SAMPLES / "e0").iterdir() if (p / "archive.jsonl").is_file())
ROUTER = ("replica_slowed", "round_robin", "retries", "router_abandoned")
CASES = [f"e0/{c}" for c in E0] + [f"router/{r}" for r in ROUTER] + ["vllm-0.32-cpu"]


def _source(case: str) -> tuple[str, Path, str]:
    """How tests/sample_runs.py makes the case's run: (kind, source, folder name)."""
    kind, _, name = case.partition("/")
    if kind == "e0":
        return "e0", SAMPLES / "e0" / name / "archive.jsonl", name
    if kind == "router":
        folder = SAMPLES / "peers" / "vllm_router" / name
        return "copy", folder / "run" if (folder / "run").is_dir() else folder, "run"
    return "rejoin", SAMPLES / "peers" / case, "run"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Each case's run rebuilt: the session's shared builds (tests/sample_runs.py), which these tests only read."""
    return dict(zip(CASES, built_samples(tmp_path_factory, [_source(case) for case in CASES])))


def _dicts(led, sql: str) -> list[dict]:
    cols, rows = led.rows(sql)
    return [dict(zip(cols, r)) for r in rows]


@pytest.mark.parametrize("case", CASES)
def test_the_runs_first_cause_agrees_with_its_attempts_dominant_causes(built, case):
    with open_ledger(built[case]) as led:
        run = _dicts(led, "SELECT * FROM run_diagnosis WHERE scope = 'run'")[0]
        # a router's tries are part of the client attempt each was made for: never diagnosed apart
        attempts = _dicts(led, "SELECT c.* FROM attempt_causes c JOIN attempts a USING (attempt_id) "
                               "WHERE a.client_attempt IS NOT FALSE")
        n_tries = led.rows("SELECT count(*) FROM attempts WHERE parent_attempt_id IS NOT NULL")[1][0][0]
        n_slo = led.rows("SELECT count(*) FROM slo_misses")[1][0][0]
    late = [a for a in attempts if a["late"]]
    assert run["n_late"] == len(late) == n_slo
    diagnosed = late or attempts
    assert run["diagnosed"] == ("late" if late else "all") and run["n_attempts"] == len(diagnosed)
    if case == "router/retries":  # 20 client attempts (the client's attempt.created), 17 tries of the router's
        assert (run["n_attempts"], n_tries) == (20, 17)
    dominant = {a["dominant_cause"] for a in diagnosed}
    first = run["first_cause"]
    if "unknown" in dominant:
        assert first == "unknown" and run["first_cause_share"] is None, (dominant, run["evidence"])
    if len(dominant) == 1 and next(iter(dominant)) in CAUSES:
        assert first == next(iter(dominant)), (dominant, run["evidence"])
    if first in CAUSES:
        assert "unknown" not in dominant
        # the causes added up here: a cause unknown for one diagnosed attempt is left out (its share NULL);
        # transport and the client's delay do not apply to an attempt the client did not see complete
        def ms(a, c):
            v = a[f"{c}_ms"]
            return 0.0 if v is None and c in ("transport", "client") and a["client_status"] != "completed" else v
        sums = {c: sum(ms(a, c) for a in diagnosed) for c in CAUSES
                if all(ms(a, c) is not None for a in diagnosed)}
        assert first == max(sums, key=lambda c: (sums[c], -CAUSES.index(c)))
        assert run["delay_ms"] == pytest.approx(sum(sums.values()))
        assert run["first_cause_share"] == pytest.approx(sums[first] / run["delay_ms"])
    shares = [run[f"{c}_share"] for c in CAUSES if run[f"{c}_share"] is not None]
    if run["delay_ms"]:
        assert sum(shares) == pytest.approx(1.0)


def test_a_run_without_attempts_diagnoses_none_and_names_nothing(built):
    with open_ledger(built["e0/critical_path_book"]) as led:
        row = _dicts(led, "SELECT diagnosed, n_attempts, n_late, delay_ms, first_cause, evidence FROM run_diagnosis")
    assert row == [{"diagnosed": "all", "n_attempts": 0, "n_late": 0, "delay_ms": None, "first_cause": None,
                    "evidence": "no attempt to diagnose"}]


CAUSE_AND_WORK = [f"{c}_ms" for c in CAUSES] + ["prefill_work_ms", "decode_work_ms"]


# where the client's end cannot be put on the engine's clock nothing is cut: two clocks without a mapping
# (clocks_unmapped); an engine's own spans (the vLLM run's reported phases) are cut by the same rule as our probes
UNCUT = ("e0/clocks_unmapped",)


@pytest.mark.parametrize("case", [c for c in CASES if c not in UNCUT])
def test_no_attempts_causes_and_work_outlast_the_client_holding_it(built, case):
    with open_ledger(built[case]) as led:
        rows = _dicts(led, "SELECT c.*, r.client_span_ms FROM attempt_causes c JOIN request_metrics r USING (attempt_id) "
                           "WHERE r.client_span_ms IS NOT NULL")
    over = {r["attempt_id"]: (sum(r[k] or 0.0 for k in CAUSE_AND_WORK), r["client_span_ms"]) for r in rows
            if sum(r[k] or 0.0 for k in CAUSE_AND_WORK) > r["client_span_ms"] + 1.0}  # 1 ms: clock mappings' slack
    assert not over, over
