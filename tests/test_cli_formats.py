"""One command-line convention: `--format table|csv|json` serialises the same rows in every command
that prints them, a file type is `--as`, and a short flag has one meaning."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.ledger.reconstruct import reconstruct

E0 = Path(__file__).resolve().parent.parent / "samples" / "e0"


@pytest.fixture(scope="module")
def book_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("formats") / "book"
    import_archive(E0 / "critical_path_book" / "archive.jsonl", run)
    reconstruct(run)
    return run


def _run(*args) -> str:
    res = CliRunner().invoke(app, list(map(str, args)), env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.output


def test_whatif_prints_the_same_rows_as_json_and_csv(book_run):
    args = ("whatif", book_run, "--node", "S6_decode", "--shrink", "30%", "--scope", "T1")
    rows = json.loads(_run(*args, "--format", "json"))
    assert len(rows) == 1
    r = rows[0]
    assert (r["scope"], r["scope_id"]) == ("task", "T1")
    assert (r["e2e_before_ms"], r["e2e_after_ms"]) == pytest.approx((6700.0, 5770.0))
    assert r["delta_ms"] == pytest.approx(-930.0) and "tool_clause_lookup" not in r["path_after"]
    table = list(csv.DictReader(io.StringIO(_run(*args, "-f", "csv"))))
    assert [float(table[0]["e2e_after_ms"])] == pytest.approx([5770.0])
    assert json.loads(table[0]["path_after"]) == r["path_after"]  # a list cell is JSON in CSV


def test_whatif_has_no_short_flag_for_node(book_run):
    res = CliRunner().invoke(app, ["whatif", str(book_run), "-n", "S6_decode", "--shrink", "30%"])
    assert res.exit_code == 2  # -n is query's --limit, and nothing else


def test_summary_json_holds_every_section_and_csv_every_cell(book_run):
    whole = json.loads(_run("summary", book_run, "--format", "json"))
    assert list(whole) == ["verdict_time", "verdict_prediction", "verdict_cause", "latency", "accounts", "run",
                           "peer_views", "peers", "slo_misses", "ghost", "model", "stream_checks", "gaps"]
    assert whole["model"]["n_steps"] == 0 and whole["model"]["median_bound_share_pct"] is None  # no shape: unknown
    cells = list(csv.DictReader(io.StringIO(_run("summary", book_run, "--format", "csv"))))
    assert {c["section"] for c in cells} >= {"latency", "accounts", "run", "gaps"}
    gaps = [c for c in cells if c["section"] == "gaps"]
    assert gaps == [{"section": "gaps", "row": "0", "column": "n", "value": str(whole["gaps"]["n"])}]
    accounts = json.loads(_run("summary", book_run, "--table", "accounts", "--format", "json"))
    assert accounts == whole["accounts"]


def test_summary_refuses_an_unknown_section(book_run):
    res = CliRunner().invoke(app, ["summary", str(book_run), "--table", "nope"])
    assert res.exit_code == 2 and "latency" in res.output


def test_export_takes_its_file_type_with_as_and_format_is_not_a_file_type(book_run, tmp_path):
    _run("export", book_run, "--as", "perfetto", "-o", tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    res = CliRunner().invoke(app, ["export", str(book_run), "--format", "perfetto"])
    assert res.exit_code == 2


def test_doctor_prints_its_sources_as_csv_rows(tmp_path):
    rows = list(csv.DictReader(io.StringIO(_run("doctor", "--format", "csv", "--powercap-root", tmp_path))))
    report = json.loads(_run("doctor", "--format", "json", "--powercap-root", tmp_path))
    assert [r["name"] for r in rows] == [s["name"] for s in report["sources"]]
    assert {r["status"] for r in rows} <= {"available", "unavailable"}


def test_capture_overhead_line_says_unknown_for_pacing_over_no_arrivals():
    from inferledger.cli.capture_progress import overhead_line

    assert overhead_line(0.5, {"n": 0}).endswith("p50 unknown, p99 unknown over 0 arrivals")
    assert overhead_line(0.5, {"n": 3, "p50": 0.25, "p99": 1.5}).endswith("p50 0.25 ms, p99 1.50 ms over 3 arrivals")


def test_an_error_message_is_never_wrapped_nor_read_as_markup(tmp_path):
    # a refusal names its path whole: a long path with brackets in it, on an 80-column terminal
    run = tmp_path / ("a-run-folder-with-a-long-name-" * 3 + "[bold]x")
    run.mkdir()
    for args in (["reconstruct", str(run)], ["report", str(run)], ["export", str(run), "--as", "perfetto"],
                 ["whatif", str(run), "--node", "n", "--shrink", "0.5"]):
        res = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
        assert res.exit_code == 2, (args, res.output)
        first = res.output.splitlines()[0]
        assert first.startswith("error: ") and str(run) in first, (args, res.output)
