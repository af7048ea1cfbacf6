"""AIPerf 0.13.0's own records (samples/peers/aiperf-0.13.0, a real run against `inferledger serve
--out`) imported and joined: peer_views' AIPerf rows equal AIPerf's own summary, every request joins
its server attempt, and malformed records are refused by line and field."""
from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from peer_util import SAMPLES, assert_every_request_joins, import_sample, peer_row

SAMPLE = SAMPLES / "aiperf-0.13.0"
SUMMARY = json.loads((SAMPLE / "tool" / "profile_export_aiperf.json").read_text())
CONSOLE = (SAMPLE / "tool" / "profile_export_console.txt").read_text()
RECORDS = (SAMPLE / "tool" / "profile_export.jsonl").read_text().splitlines()
# peer_views row -> AIPerf's summary key and the header of its console table
ROWS = {("TTFT", "AIPerf"): ("time_to_first_token", "Time to First Token (ms)"),
        ("ITL", "AIPerf"): ("inter_token_latency", "Inter Token Latency (ms)"),
        ("E2E", "AIPerf"): ("request_latency", "Request Latency (ms)")}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    run, con = import_sample("aiperf", "aiperf-0.13.0", tmp_path_factory.mktemp("aiperf"))
    yield run, con
    con.close()


@pytest.mark.parametrize("row", list(ROWS), ids=lambda r: r[0])
def test_peer_views_reproduces_aiperfs_own_summary(imported, row):
    _, con = imported
    key, header = ROWS[row]
    ours, theirs = peer_row(con, *row), SUMMARY[key]
    assert ours["n"] == theirs["count"] == 40
    for stat, their_stat in (("mean", "avg"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99")):
        assert ours[stat] == pytest.approx(theirs[their_stat], abs=1e-6), stat  # sub-nanosecond
    # and as AIPerf printed them: avg, p99, p90, p50, two decimals, thousands separated
    printed = re.search(re.escape(header) + r"\s*│([^\n]*)", CONSOLE).group(1).split("│")
    avg, p99, p90, p50 = (printed[i].strip() for i in (0, 3, 4, 5))
    assert (f"{ours['mean']:,.2f}", f"{ours['p99']:,.2f}", f"{ours['p90']:,.2f}", f"{ours['p50']:,.2f}") == (avg, p99, p90, p50)


def test_aiperf_counts_its_own_tokens_and_we_carry_them(imported):
    _, con = imported
    rows = con.execute("""
        SELECT a.attempt_id, a.n_tokens_engine, a.n_tokens_usage,
               TRY_CAST(json_extract_string(e.attrs, '$.reported_output_tokens') AS BIGINT)
        FROM attempts a JOIN events e ON e.attempt_id = a.attempt_id AND e.name = 'attempt.done'""").fetchall()
    osl = {json.loads(r)["metadata"]["x_request_id"]: json.loads(r)["metrics"]["output_sequence_length"]["value"]
           for r in RECORDS}
    assert len(rows) == 40
    for aid, engine, usage, reported in rows:
        assert usage == engine  # the usage AIPerf received is the engine's count
        assert reported == osl[aid]  # AIPerf's re-tokenised count, carried as its own
    # AIPerf's OSL is its tokenizer's reading of the text: in this sample it equals usage only on most requests
    assert sum(osl[a] == e for a, e, _u, _r in rows) >= 30


def test_every_aiperf_request_joins_its_server_attempt(imported):
    run, con = imported
    assert_every_request_joins(con, run, 40)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["tool"] == "aiperf" and manifest["tool_version"] == "0.13.0"
    assert manifest["command"].startswith("aiperf profile --model 'smol'")
    assert manifest["join"]["key_rules"] == {"x-request-id, exact": 40}
    ev = con.execute("SELECT DISTINCT clock, json_extract_string(attrs, '$.evidence'), "
                     "json_extract_string(attrs, '$.reporter') FROM events WHERE source = 'client'").fetchall()
    assert ev == [("wall:aiperf-client", "reported", "aiperf-0.13.0")]


def _write(tmp_path, lines):
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_malformed_record_is_refused_by_line_and_field(tmp_path):
    bad = json.loads(RECORDS[2])
    del bad["metadata"]["request_start_ns"]
    worse = json.loads(RECORDS[5])
    worse["metrics"]["time_to_first_token"]["value"] = "soon"
    lines = RECORDS[:2] + [json.dumps(bad)] + RECORDS[3:5] + [json.dumps(worse), "{not json"]
    path = _write(tmp_path, lines)
    res = CliRunner().invoke(app, ["import", "--from", "aiperf", str(path), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2
    assert f"{path}:3: field metadata.request_start_ns: missing" in res.output
    assert f"{path}:6: field metrics.time_to_first_token.value: must be int or float or list, got str 'soon'" in res.output
    assert f"{path}:7: field (line): not JSON" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "run").exists()


def test_lenient_keeps_each_refused_record_as_a_gap(tmp_path):
    bad = json.loads(RECORDS[0])
    bad["metadata"]["x_request_id"] = 17
    path = _write(tmp_path, [json.dumps(bad)] + RECORDS[1:4])
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["import", "--from", "aiperf", str(path), "--out", str(run), "--lenient"])
    assert res.exit_code == 0, res.output
    import pyarrow.parquet as pq

    gaps = pq.read_table(run / "gaps.parquet").to_pylist()
    assert [(g["subject_id"], g["needs"]) for g in gaps] == [(f"{path}:1", f"fix {path}:1: field metadata.x_request_id")]
    assert json.loads((run / "manifest.json").read_text())["counts"]["refused"] == 1


def test_report_and_summary_put_aiperfs_numbers_beside_ours(imported):
    from inferledger.report.build import build_report

    run, _ = imported
    theirs = SUMMARY["time_to_first_token"]
    html = build_report(run, run / "report.html").path.read_text(encoding="utf-8")
    part = html[html.index("aiperf-0.13.0: its own numbers beside ours"):]
    part = part[:part.index("</table>")]
    assert f"{theirs['avg']:,.1f} / {theirs['p50']:,.1f} / {theirs['p99']:,.1f}" in part
    assert part.count("<tr>") == 4  # a header, then TTFT, ITL, E2E: the metrics AIPerf prints
    res = CliRunner().invoke(app, ["summary", str(run), "--table", "peers", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["metric"]: r for r in json.loads(res.output)}
    assert set(rows) == {"TTFT", "ITL", "E2E"} and all(r["reporter"] == "aiperf-0.13.0" for r in rows.values())
    itl = rows["ITL"]
    assert itl["tool_mean_ms"] == pytest.approx(SUMMARY["inter_token_latency"]["avg"], abs=1e-6)
    assert itl["ours_n"] > itl["tool_n"] == 40 and "re-tokenised" in itl["reason"]
    csv_out = CliRunner().invoke(app, ["summary", str(run), "--table", "peers", "--format", "csv"]).output.splitlines()
    assert csv_out[0].startswith("metric,tool,imported,reporter") and len(csv_out) == 4


def test_a_request_the_server_never_saw_is_a_gap_and_no_clock_is_assumed(tmp_path):
    # AIPerf's records against another run's server: nothing joins, so every request is a gap and no
    # mapping is made up between the two clocks
    run = tmp_path / "wrong-server"
    res = CliRunner().invoke(app, ["import", "--from", "aiperf", str(SAMPLE / "tool"), "--out", str(run),
                                   "--server", str(SAMPLES / "guidellm-0.8.1" / "server")])
    assert res.exit_code == 0, res.output
    assert "no clock mapping" in res.output
    import pyarrow.parquet as pq

    gaps = pq.read_table(run / "gaps.parquet").to_pylist()
    joins = [g for g in gaps if g["gap_id"].startswith("peer-join:")]
    assert len(joins) == 40 and {g["scope"] for g in joins} == {"attempt"}
    assert [g["gap_id"] for g in gaps if g["gap_id"] == "peer-clock"] == ["peer-clock"]
    clocks = pq.read_table(run / "clocks.parquet").to_pylist()
    assert not [c for c in clocks if c["from_clock"] == "wall:aiperf-client" or c["to_clock"] == "wall:aiperf-client"]


def test_a_server_folder_that_is_no_run_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["import", "--from", "aiperf", str(SAMPLE / "tool"), "--out", str(tmp_path / "run"),
                                   "--server", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "not a run directory (no events/part-*.parquet)" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "run").exists()
    res = CliRunner().invoke(app, ["import", str(SAMPLE / "tool" / "profile_export.jsonl"), "--out", str(tmp_path / "r2"),
                                   "--server", str(SAMPLE / "server")])
    assert res.exit_code == 2 and "--server goes with --from" in res.output
