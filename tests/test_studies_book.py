"""The two book studies on the simulated clock reproduce the book's figures from the ledger: schedule-book's
totals and longest output gaps (§8.2.2, figs 8-5 to 8-7), kv-layout's 64 / 52 / 44 token slots and the
release by reference counts (§8.3.1-8.3.2, figs 8-11 to 8-14); their folders open with query and report."""
from __future__ import annotations

import json

import pytest

import inferledger
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.ledger.query import open_ledger
from inferledger.probes.run_folder import StudyIndex
from inferledger.probes.study_dir import read_comparison

pytestmark = pytest.mark.slow  # the book's studies run whole


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    out = tmp_path_factory.mktemp("studies") / "book"
    inferledger.study("schedule-book", out)  # the Python API
    return out


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    out = tmp_path_factory.mktemp("studies") / "layout"
    res = CliRunner().invoke(app, ["study", "kv-layout", "-o", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    return out, json.loads(res.output)


def test_schedule_book_gives_the_books_totals_and_longest_gaps_from_the_ledger(book):
    with open_ledger(book) as led:
        rows = led.rows("SELECT m.run_id, round(t_obs_s * 1000, 1), round(max(r.itl_engine_max_ms), 1) "
                        "FROM run_metrics m JOIN request_metrics r USING (run_id) GROUP BY ALL ORDER BY 1")[1]
        # the book's figures, rounded as it prints them
        assert rows == [("schedule-book.chunked", 844.3, 132.6), ("schedule-book.continuous", 765.6, 376.0),
                        ("schedule-book.fixed", 870.5, 26.3)]
        finer = led.rows("SELECT m.run_id, round(t_obs_s * 1000, 2), round(max(r.itl_engine_max_ms), 2) "
                         "FROM run_metrics m JOIN request_metrics r USING (run_id) GROUP BY ALL ORDER BY 1")[1]
        # an independent 60-line event simulation with the same conventions gives these to 0.01 ms
        assert finer == [("schedule-book.chunked", 844.25, 132.56), ("schedule-book.continuous", 765.59, 375.97),
                         ("schedule-book.fixed", 870.47, 26.31)]
        gap = led.rows("SELECT itl_engine_max_ms FROM request_metrics WHERE run_id = 'schedule-book.continuous' "
                       "AND attempt_id = 'r0'")[1][0][0]
    # r0's longest gap is the step of its third token (n + k = 2048 + 2 pairs) beside r2's whole 8192 prefill
    assert gap == pytest.approx(26.22 + 8193 * 0.0304 + (2050 + 8192 * 8193 // 2) * 3e-6, abs=1e-6)
    key = read_comparison(book)["schedule"]
    assert [r[0] for r in key["rows"]] == ["fixed", "continuous", "chunked"]
    assert [r[key["columns"].index("matches_book")] for r in key["rows"]] == [True, True, True]


def test_schedule_book_runs_the_scheduler_as_each_knob_says(book):
    with open_ledger(book) as led:
        steps = lambda run, q: led.rows(  # noqa: E731
            "SELECT step_id, list(attempt_id || ':' || kind || ':' || tokens::INT ORDER BY attempt_id) FROM "
            f"step_attribution WHERE run_id = 'schedule-book.{run}' GROUP BY step_id HAVING {q} ORDER BY step_id")[1]
        # fixed: r2 and r3 wait for the whole first batch, then prefill together in one step
        assert [s[1] for s in steps("fixed", "bool_or(attempt_id = 'r2' AND kind = 'prefill')")] == [
            ["r2:prefill:8192", "r3:prefill:2048"]]
        # continuous: r2's whole prompt in the step after r1 left, beside r0's decode
        assert [s[1] for s in steps("continuous", "bool_or(attempt_id = 'r2' AND kind = 'prefill')")] == [
            ["r0:decode:1", "r2:prefill:8192"]]
        # chunked: four chunks of 2048, each after r0's decode under the 4096 budget
        assert [s[1] for s in steps("chunked", "bool_or(attempt_id = 'r2' AND kind = 'prefill')")] == [
            ["r0:decode:1", "r2:prefill:2048"]] * 4
    manifest = json.loads((book / "runs" / "chunked" / "manifest.json").read_text())
    assert manifest["engine_config"]["long_prefill_token_threshold"] == 2048
    assert manifest["simulation"]["step_model"]["parameters"]["per_pair_ns"]["value"] == 3.0


def test_kv_layout_gives_64_52_44_slots_from_the_block_managers_events(layout):
    out, printed = layout
    assert [(r["run"], r["slots_allocated"], r["slots_referenced"], r["unused_slots"], r["shared_blocks"])
            for r in printed["layout"]] == [("reserved-16", 64, 64, 22, 0), ("paged-4", 52, 52, 10, 0),
                                            ("shared-4", 44, 52, 10, 2)]
    assert (out / "comparison.csv").read_text().splitlines() == [
        "run,block_size,requests,tokens,slots_allocated,slots_referenced,unused_slots,shared_blocks",
        "reserved-16,16,4,42,64,64,22,0", "paged-4,4,4,42,52,52,10,0", "shared-4,4,4,42,44,52,10,2"]
    assert list(printed) == ["layout", "requests", "release"]
    per_request = read_comparison(out)["requests"]["rows"]
    # paged 4-token blocks hold 12, 16, 8 and 16 slots; with sharing B takes A's two prefix blocks from the cache
    assert [r[4] for r in per_request if r[0] == "paged-4"] == [12, 16, 8, 16]
    assert [(r[1], r[6], r[7]) for r in per_request if r[0] == "shared-4"] == [
        ("A", 2, 0), ("B", 2, 2), ("C", 0, 0), ("D", 0, 0)]
    with open_ledger(out / "runs" / "shared-4") as led:  # the same two physical blocks in both tables
        assert led.rows("SELECT count(DISTINCT block), count(DISTINCT attempt_id) FROM kv_holds "
                        "WHERE block IN (SELECT block FROM kv_holds WHERE how = 'prefix_hit')")[1] == [(2, 2)]


def test_kv_layout_releases_by_reference_count(layout):
    out, _ = layout
    release = {(r[0], r[1]): r[3:] for r in read_comparison(out)["release"]["rows"]}
    # A ends first: 3 blocks released, 1 back in the pool, the 2 shared ones kept by B (2 refs -> 1)
    assert release[("shared-4", "A")] == [3, 1, 2, 1]
    # B's release drops the last references: all 4 back in the pool
    assert release[("shared-4", "B")] == [4, 4, 0, 0]
    assert release[("paged-4", "A")] == [3, 3, 0, 0]
    with open_ledger(out / "runs" / "shared-4") as led:
        frees = led.rows("SELECT attempt_id, value::INT, json_extract(attrs, '$.shared')::INT FROM events "
                         "WHERE name = 'kv.free' AND attempt_id IN ('A', 'B') ORDER BY ts_ns, seq")[1]
    assert frees == [("A", 1, 2), ("B", 4, 0)]


def test_a_study_folder_opens_with_query_and_report(layout, tmp_path):
    out, _ = layout
    runner = CliRunner()
    res = runner.invoke(app, ["query", str(out), "select run_id, count(*) as n from attempts group by 1 order by 1",
                              "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == ["run_id,n", "kv-layout.paged-4,4", "kv-layout.reserved-16,4",
                                       "kv-layout.shared-4,4"]
    res = runner.invoke(app, ["report", str(out), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "r.html").read_text()
    assert all(f'id="study-fig0-{i}"' in html for i in range(3)) and "slots_allocated" in html
    res = runner.invoke(app, ["report", str(out / "runs" / "paged-4"), "-o", str(tmp_path / "one.html")])
    assert res.exit_code == 0, res.output


def test_the_report_refuses_a_study_that_did_not_complete(layout, tmp_path):
    out, _ = layout
    doc = StudyIndex.read(out).doc
    broken = tmp_path / "failed"
    broken.mkdir()
    (broken / "study.json").write_text(json.dumps({**doc, "state": "failed", "error": "RuntimeError: boom"}))
    res = CliRunner().invoke(app, ["report", str(broken)])
    assert res.exit_code == 2
    assert "the study is failed (RuntimeError: boom)" in res.output


def test_the_runs_timelines_share_one_time_scale_to_the_pixel():
    # a legend beside one figure would narrow its axis: every figure keeps the same plot area
    from inferledger.report.study_figs import timeline_fig

    steps = [("r0", "prefill", 8, 0.0, 10.0)]
    with_legend = timeline_fig("a", steps, [("r0", 0.0)], 870.5, legend=True)["layout"]
    without = timeline_fig("b", steps, [("r0", 0.0)], 870.5, legend=False)["layout"]
    same = ("margin", "xaxis", "legend")
    assert [with_legend[k] for k in same] == [without[k] for k in same]
    assert with_legend["legend"]["orientation"] == "h"
