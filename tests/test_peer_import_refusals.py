"""Hostile or broken load-tool output is refused by file:line (or JSON path) and field, exit 2, no
traceback, and nothing at --out: NaN and infinities, wrong JSON types, non-integer or negative or huge
token counts, lists of unequal length, deep nesting, invalid UTF-8, times past the ledger's span; and a
hypothesis pass: whatever one value of a record becomes, the import refuses it clearly or the run rebuilds."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.peers.importer import PeerRecordsError, import_peer
from inferledger.collectors.peers.records import RecordError
from inferledger.ledger.reconstruct import reconstruct
from peer_util import SAMPLES

AIPERF = (SAMPLES / "aiperf-0.13.0" / "tool" / "profile_export.jsonl").read_text().splitlines()
AIPERF_SUMMARY = (SAMPLES / "aiperf-0.13.0" / "tool" / "profile_export_aiperf.json").read_text()
VLLM = json.loads((SAMPLES / "vllm-bench-0.32.0" / "tool" / "result.json").read_text())
GUIDELLM = json.loads((SAMPLES / "guidellm-0.8.1" / "tool" / "benchmarks.json").read_text())
DEEP = "[" * 100_000 + "]" * 100_000


def refused(tmp_path: Path, tool: str, path: Path, *extra: str) -> str:
    """The import's message; asserts exit 2, no traceback, nothing at --out and no folder left beside it."""
    out = tmp_path / "runs" / "run"
    out.parent.mkdir(exist_ok=True)
    res = CliRunner().invoke(app, ["import", "--from", tool, str(path), "--out", str(out), *extra])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert list(out.parent.iterdir()) == [], "a refused import left something behind"
    return " ".join(res.output.split())  # rich wraps long lines


def _aiperf(tmp_path: Path, n: int, edit=None, raw: str | None = None, summary: str | None = None) -> Path:
    """The AIPerf sample's records with line n (1-based) edited, or replaced by `raw`."""
    lines = list(AIPERF)
    if raw is not None:
        lines[n - 1] = raw
    elif edit is not None:
        rec = json.loads(lines[n - 1])
        edit(rec)
        lines[n - 1] = json.dumps(rec)
    d = tmp_path / "aiperf"
    d.mkdir()
    (d / "profile_export.jsonl").write_text("\n".join(lines) + "\n")
    (d / "profile_export_aiperf.json").write_text(AIPERF_SUMMARY if summary is None else summary)
    return d


def _set(path: str, value):
    def edit(rec):
        *parents, last = path.split(".")
        node = rec
        for p in parents:
            node = node[p]
        node[last] = value
    return edit


def _icl_nan(rec):
    rec["metrics"]["inter_chunk_latency"]["value"][3] = float("nan")


@pytest.mark.parametrize("edit, words", [
    (_icl_nan, ":4: field metrics.inter_chunk_latency.value[3]: must be a finite number, got nan"),
    (_set("metrics.time_to_first_token.value", float("inf")), ":4: field metrics.time_to_first_token.value: must be a finite number, got inf"),
    (_set("metrics.output_sequence_length.value", 24.9), ":4: field metrics.output_sequence_length.value: must be an integer number of tokens, got float '24.9'"),
    (_set("metrics.output_sequence_length.value", -24), ":4: field metrics.output_sequence_length.value: must be between 0 and 2147483647 tokens, got -24"),
    (_set("metrics.usage_completion_tokens.value", 2**63), ":4: field metrics.usage_completion_tokens.value: must be between 0 and 2147483647 tokens"),
    (_set("metrics.usage_completion_tokens", 5), ":4: field metrics.usage_completion_tokens: must be a JSON object, got int '5'"),
    (_set("metadata", "none"), ":4: field metadata: must be dict, got str 'none'"),
    (_set("metrics", [1]), ":4: field metrics: must be a JSON object, got list"),
    (_set("metadata.was_cancelled", "no"), ":4: field metadata.was_cancelled: must be true or false, got 'no'"),
    (_set("metadata.request_start_ns", 2**70), ":4: field (sent time): 1180591620717411303424 ns is outside ±2^61 ns"),
])
def test_a_bad_aiperf_field_is_refused_by_line_and_field(tmp_path, edit, words):
    d = _aiperf(tmp_path, 4, edit)
    assert f"{d / 'profile_export.jsonl'}{words}" in refused(tmp_path, "aiperf", d)


@pytest.mark.parametrize("raw, words", [
    (DEEP, ":4: field (line): nested deeper than 32 levels"),
    ('{"metadata": ' + "[" * 40 + "]" * 40 + "}", ":4: field (document): nested deeper than 32 levels"),
    ('{"metadata": {"x_request_id": "\\ud800"}}', ":4: field $.metadata.x_request_id: a string with a lone UTF-16 surrogate"),
])
def test_unreadable_aiperf_lines_are_refused_by_line(tmp_path, raw, words):
    d = _aiperf(tmp_path, 4, raw=raw)
    assert f"{d / 'profile_export.jsonl'}{words}" in refused(tmp_path, "aiperf", d)


def test_invalid_utf8_is_refused_by_line(tmp_path):
    d = _aiperf(tmp_path, 1)
    path = d / "profile_export.jsonl"
    path.write_bytes(path.read_bytes().replace(b"session_000003", b"session_\xff\xfe0003"))
    assert f"{path}:4: field (encoding): not valid UTF-8 (byte 0xff)" in refused(tmp_path, "aiperf", d)


@pytest.mark.parametrize("summary, words", [
    ("[1, 2]", ":1: field (document): not an AIPerf summary object (got a JSON list)"),
    ('{"aiperf_version": 13}', ":1: field aiperf_version: must be a string, got int"),
    ('{"run_info": "x"}', ":1: field run_info: must be a JSON object, got str"),
])
def test_a_bad_aiperf_summary_is_refused(tmp_path, summary, words):
    d = _aiperf(tmp_path, 1, summary=summary)
    assert f"{d / 'profile_export_aiperf.json'}{words}" in refused(tmp_path, "aiperf", d)


def _vllm(tmp_path: Path, edit) -> Path:
    doc = json.loads(json.dumps(VLLM))
    edit(doc)
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    return path


def _item(name, i, value, j=None):
    def edit(doc):
        if j is None:
            doc[name][i] = value
        else:
            doc[name][i][j] = value
    return edit


@pytest.mark.parametrize("edit, words", [
    (_item("itls", 3, float("nan"), 2), ":$.start_times[3]: field itls[3][2]: must be a finite number, got nan"),
    (_item("start_times", 1, float("inf")), ":$.start_times[1]: field start_times[1]: must be a finite number, got inf"),
    (_item("ttfts", 2, float("-inf")), ":$.start_times[2]: field ttfts[2]: must be a finite number, got -inf"),
    (_item("latencies", 5, float("nan")), ":$.start_times[5]: field latencies[5]: must be a finite number, got nan"),
    (_item("output_lens", 6, 24.5), ":$.start_times[6]: field output_lens[6]: must be an integer number of tokens"),
    (_item("output_lens", 6, -1), ":$.start_times[6]: field output_lens[6]: must be between 0 and 2147483647 tokens"),
    (_item("input_lens", 7, 2**40), ":$.start_times[7]: field input_lens[7]: must be between 0 and 2147483647 tokens"),
    (_item("start_times", 8, 1e300), ":$.start_times[8]: field (sent time):"),
    (_item("errors", 9, {"x": 1}), ":$.start_times[9]: field errors[9]: must be a string, got dict"),
    (lambda d: d.update(errors=d["errors"][:-1]), ":$.errors: field errors: has 39 entries, start_times has 40"),
    (lambda d: d.update(input_lens=d["input_lens"][:5]), ":$.input_lens: field input_lens: has 5 entries, start_times has 40"),
    (lambda d: d.update(errors="none"), ":$.errors: field errors: must be a list, got str"),
])
def test_a_bad_vllm_bench_value_is_refused_by_path_and_field(tmp_path, edit, words):
    path = _vllm(tmp_path, edit)
    assert f"{path}{words}" in refused(tmp_path, "vllm-bench", path)


def test_a_deep_or_foreign_vllm_bench_document_is_refused(tmp_path):
    path = tmp_path / "result.json"
    path.write_text('{"start_times": ' + DEEP + "}")
    assert f"{path}:1: field (document): nested deeper than 32 levels" in refused(tmp_path, "vllm-bench", path)
    path.write_bytes(b'{"start_times": [1.0], "x": "\xc3\x28"}')
    assert f"{path}:1: field (encoding): not valid UTF-8 (byte 0xc3)" in refused(tmp_path, "vllm-bench", path)


def test_a_summary_figure_vllm_bench_could_not_compute_is_unknown(tmp_path):
    path = _vllm(tmp_path, lambda d: d.update(p99_ttft_ms=float("nan")))
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["import", "--from", "vllm-bench", str(path), "--out", str(run)])
    assert res.exit_code == 0, res.output
    summary = json.loads((run / "manifest.json").read_text())["input"]["summary"]
    assert summary["p99_ttft_ms"] is None and summary["mean_ttft_ms"] == VLLM["mean_ttft_ms"]


def _guidellm(tmp_path: Path, edit) -> Path:
    doc = json.loads(json.dumps(GUIDELLM))
    edit(doc)
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(doc))
    return path


def _rec(i, path, value):
    def edit(doc):
        node = doc["benchmarks"][0]["requests"]["successful"][i]
        *parents, last = path.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return edit


REC = ":$.benchmarks[0].requests.successful"


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(metadata="v0.8"), ":1: field metadata: must be a JSON object, got str"),
    (lambda d: d["metadata"].update(guidellm_version=8), ":1: field metadata.guidellm_version: must be a string, got int"),
    (_rec(2, "input_metrics", 62), f"{REC}[2]: field input_metrics: must be a JSON object, got int"),
    (_rec(2, "info.timings.request_start", float("nan")), f"{REC}[2]: field info.timings.request_start: must be a finite number, got nan"),
    (_rec(3, "output_metrics.total_tokens", 2**31), f"{REC}[3]: field output_metrics.total_tokens: must be between 0 and 2147483647 tokens"),
    (_rec(3, "info.timings.token_iterations", 2.5), f"{REC}[3]: field info.timings.token_iterations: must be an integer number of tokens"),
    (_rec(4, "time_to_first_token_ms", float("inf")), f"{REC}[4]: field time_to_first_token_ms: must be a finite number, got inf"),
    (_rec(5, "response_id", 17), f"{REC}[5]: field response_id: must be str, got int"),
    (lambda d: d["benchmarks"][0]["requests"].update(successful="all"), ":$.benchmarks[0].requests: field successful: must be a list of records, got str"),
])
def test_a_bad_guidellm_field_is_refused_by_path_and_field(tmp_path, edit, words):
    path = _guidellm(tmp_path, edit)
    assert f"{path}{words}" in refused(tmp_path, "guidellm", path)


# -- hypothesis: any one value of a record changed, the import refuses it clearly or the run rebuilds --
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(), st.text(max_size=3),
                 st.sampled_from([[], [1.5], {}, {"value": 1}, [[[]]], "\ud800"]))


def _paths(o, at=()):
    if isinstance(o, dict):
        for k, v in o.items():
            yield at + (k,)
            yield from _paths(v, at + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o[:4]):
            yield at + (i,)
            yield from _paths(v, at + (i,))


AIPERF_RECORD = json.loads(AIPERF[3])
AIPERF_PATHS = list(_paths(AIPERF_RECORD))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, len(AIPERF_PATHS) - 1), _ANY, st.booleans())
def test_whatever_one_aiperf_value_becomes_the_import_refuses_it_or_the_run_rebuilds(k, value, lenient):
    tmp = Path(tempfile.mkdtemp())
    try:
        rec = json.loads(json.dumps(AIPERF_RECORD))
        node, path = rec, AIPERF_PATHS[k]
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        d = tmp / "tool"
        d.mkdir()
        (d / "profile_export.jsonl").write_text("\n".join(AIPERF[:3] + [json.dumps(rec)] + AIPERF[4:8]) + "\n")
        try:
            import_peer("aiperf", d, tmp / "run", server=SAMPLES / "aiperf-0.13.0" / "server", lenient=lenient)
        except (RecordError, PeerRecordsError):
            assert not (tmp / "run").exists()
            return
        reconstruct(tmp / "run")  # any exception here fails the test
    finally:
        shutil.rmtree(tmp)
