"""GuideLLM 0.8.1's own records (samples/peers/guidellm-0.8.1, a real run against `inferledger serve
--out`) imported and joined by response id: peer_views' GuideLLM rows equal GuideLLM's own summary
(its weights and its percentile rule), every request joins its server attempt, malformed records are
refused by JSON path and field."""
from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from peer_util import SAMPLES, assert_every_request_joins, import_sample, peer_row

SAMPLE = SAMPLES / "guidellm-0.8.1"
REPORT = json.loads((SAMPLE / "tool" / "benchmarks.json").read_text())
METRICS = REPORT["benchmarks"][0]["metrics"]
RECORDS = REPORT["benchmarks"][0]["requests"]["successful"]
CONSOLE = (SAMPLE / "tool" / "console.txt").read_text()
# peer_views row -> GuideLLM's metric, its unit in ms, and the column of its printed latency table
ROWS = {("TTFT", "GuideLLM"): ("time_to_first_token_ms", 1.0, 3),
        ("ITL", "GuideLLM"): ("inter_token_latency_ms", 1.0, 9),
        ("TPOT", "GuideLLM"): ("time_per_output_token_ms", 1.0, 12),
        ("E2E", "GuideLLM"): ("request_latency", 1000.0, 0)}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    run, con = import_sample("guidellm", "guidellm-0.8.1", tmp_path_factory.mktemp("guidellm"))
    yield run, con
    con.close()


def _printed() -> list[str]:
    """The cells of GuideLLM's latency table row (mean ± ci, median, p95 per metric)."""
    line = next(ln for ln in CONSOLE.splitlines() if ln.startswith("| concurrent@3") and "±" in ln)
    return [c.strip() for c in line.strip("|").split("|")][1:]


@pytest.mark.parametrize("row", list(ROWS), ids=lambda r: r[0])
def test_peer_views_reproduces_guidellms_own_summary(imported, row):
    _, con = imported
    key, to_ms, col = ROWS[row]
    ours, theirs = peer_row(con, *row), METRICS[key]["successful"]
    assert ours["n"] == 33
    assert ours["mean"] == pytest.approx(theirs["mean"] * to_ms, abs=1e-6)
    for stat in ("p50", "p90", "p99"):
        assert ours[stat] == pytest.approx(theirs["percentiles"][stat] * to_ms, abs=1e-6), stat
    # as GuideLLM printed them: mean (before ±) and median, one decimal (seconds for the latency)
    cells = _printed()
    mean, median = cells[col].split("±")[0].strip(), cells[col + 1]
    assert (f"{ours['mean'] / to_ms:.1f}", f"{ours['p50'] / to_ms:.1f}") == (mean, median)


def test_guidellms_token_weights_are_its_counts(imported):
    _, con = imported
    # its ITL is weighted by tokens - 1, its TPOT by tokens: GuideLLM's count is the sum of the weights
    tokens = [r["output_metrics"]["total_tokens"] for r in RECORDS]
    assert METRICS["inter_token_latency_ms"]["successful"]["count"] == sum(t - 1 for t in tokens)
    assert METRICS["time_per_output_token_ms"]["successful"]["count"] == sum(tokens)
    n = con.execute("SELECT sum(n_tokens_engine), sum(n_tokens_usage) FROM attempts").fetchone()
    assert n == (sum(tokens), sum(tokens))  # equal to the engine's count, request by request below


def test_every_guidellm_request_joins_its_server_attempt(imported):
    run, con = imported
    assert_every_request_joins(con, run, 33)
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["tool"], manifest["tool_version"]) == ("guidellm", "0.8.1")
    assert manifest["join"]["key_rules"] == {"response id (chatcmpl-<id>), exact": 33}
    for r in RECORDS:  # the response id is chatcmpl-<the server's attempt id>, with the engine's token count
        aid = re.fullmatch(r"chatcmpl-(.+)", r["response_id"]).group(1)
        engine = con.execute("SELECT n_tokens_engine FROM attempts WHERE attempt_id = ?", [aid]).fetchone()
        assert engine == (r["output_metrics"]["total_tokens"],)


def test_guidellm_keeps_only_first_and_last_token_times(imported):
    _, con = imported
    # so the pooled chunk-gap rows are unknown (n = 0), not made up from two chunks per request
    assert peer_row(con, "ITL", "inferledger")["n"] == 0 and peer_row(con, "ITL", "vLLM bench")["n"] == 0
    reason = con.execute("SELECT reason FROM peer_comparison WHERE metric = 'ITL' AND tool = 'GuideLLM'").fetchone()[0]
    assert reason.startswith("ours is unknown")
    # and the gap register says why: the tool's records, not a client that saw too little
    needs = con.execute("SELECT needs FROM gaps WHERE affects = 'peer_views (ITL inferledger)'").fetchone()[0]
    assert needs == "client chunk times that guidellm-0.8.1's records do not keep (our own client records every chunk)"


def test_a_malformed_guidellm_record_is_refused_by_path_and_field(tmp_path):
    bad = json.loads(json.dumps(REPORT))
    recs = bad["benchmarks"][0]["requests"]["successful"]
    del recs[4]["info"]["timings"]["request_start"]
    recs[7]["output_metrics"]["total_tokens"] = "24"
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(bad))
    res = CliRunner().invoke(app, ["import", "--from", "guidellm", str(path), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2
    assert f"{path}:$.benchmarks[0].requests.successful[4]: field info.timings.request_start: missing" in res.output
    assert f"{path}:$.benchmarks[0].requests.successful[7]: field output_metrics.total_tokens: must be an integer" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "run").exists()
