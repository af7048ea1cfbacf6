"""The studies on the real engine, at their tiny scale on the session's model: every point of each
comparison is there, the figures the design fixes (chunk counts, cached tokens) are exact, the timing
figures keep the orders a step's timeline implies, and each run opens alone."""
from __future__ import annotations

import pytest

import inferledger
from inferledger.ledger.query import open_ledger
from inferledger.probes.study_dir import read_comparison, read_study, run_dirs

pytestmark = pytest.mark.slow


def _run(name, tmp_path_factory, bundle, **options):
    out = tmp_path_factory.mktemp("studies") / name
    inferledger.study(name, out, bundle=bundle, scale="tiny", **options)
    return out, read_comparison(out)


def _rows(table: dict) -> dict[str, dict]:
    return {r[0]: dict(zip(table["columns"], r)) for r in table["rows"]}


@pytest.fixture(scope="module")
def chunked(tmp_path_factory, resolved_bundle):
    return _run("chunked-prefill", tmp_path_factory, resolved_bundle)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory, resolved_bundle):
    return _run("prefix-cache", tmp_path_factory, resolved_bundle)


def test_chunked_prefill_splits_the_long_prompt_as_configured_and_gaps_span_its_steps(chunked):
    out, comp = chunked
    key = _rows(comp["chunks"])
    assert list(key) == ["whole", "chunk-64"]  # from the whole prefill to the smallest chunk
    # the long prompt is 192 tokens: one step whole, 192 / 64 = 3 chunks of 64
    assert (key["whole"]["largest_chunk_tokens"], key["whole"]["long_prefill_steps"]) == (192, 1)
    assert (key["chunk-64"]["largest_chunk_tokens"], key["chunk-64"]["long_prefill_steps"]) == (64, 3)
    steps = _rows(comp["steps"])
    for name in key:
        # the decoders were running beside the long prefill, so one of their output gaps spans its longest step
        assert steps[name]["mixed_steps"] >= 1
        assert key[name]["longest_gap_ms"] >= steps[name]["longest_prefill_step_ms"]
        assert key[name]["long_ttft_ms"] >= steps[name]["longest_prefill_step_ms"]
    assert steps["whole"]["mixed_steps"] == 1 and steps["chunk-64"]["mixed_steps"] <= 3
    doc = read_study(out)
    assert doc["state"] == "complete" and doc["figures"][0]["kind"] == "curve"
    for name, run in run_dirs(out):  # each point opens alone, as a capture of the real engine
        with open_ledger(run) as led:
            assert led.rows("SELECT count(*) FROM request_metrics WHERE server_evidence = 'observed'")[1] == [(3,)]


def test_prefix_cache_serves_the_shared_prefix_to_every_request_after_the_first(prefix):
    _, comp = prefix
    key = _rows(comp["prefix"])
    assert list(key) == ["distinct", "shared", "shared-off"]
    # three prompts of 128 tokens; 96 shared = 6 whole blocks of 16, served to the second and the third
    assert [key[n]["prompt_tokens"] for n in key] == [384, 384, 384]
    assert (key["shared"]["cached_tokens"], key["shared"]["computed_tokens"], key["shared"]["hit_share"]) == (192, 192, 0.5)
    for name in ("distinct", "shared-off"):
        assert (key[name]["cached_tokens"], key[name]["computed_tokens"], key[name]["hit_share"]) == (0, 384, 0.0)
    shared = [r for r in comp["requests"]["rows"] if r[0] == "shared"]
    assert [r[3] for r in shared] == [0, 96, 96]  # the first request found the cache empty
    assert all(r[5] is not None and r[6] >= r[5] for r in comp["requests"]["rows"])  # client TTFT ≥ server's
