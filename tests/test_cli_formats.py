"""One command-line convention: `--format table|csv|json` serialises the same rows in every command
that prints them, a file type is `--as`, and a short flag has one meaning."""
from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.cli.output import command_name
from sample_runs import built_e0, copy_to

E0 = Path(__file__).resolve().parent.parent / "samples" / "e0"


@pytest.fixture(scope="module")
def book_run(tmp_path_factory):
    """The critical-path book's run rebuilt (the session's shared build, tests/sample_runs.py), this module's copy."""
    return copy_to(built_e0(tmp_path_factory, "critical_path_book"), tmp_path_factory.mktemp("formats") / "book")


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
    assert list(whole) == ["verdict_time", "verdict_prediction", "verdict_cause", "latency", "client", "accounts", "run",
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


# ---- tables for people ---------------------------------------------------------------------------
@pytest.mark.parametrize("value, text", [
    (273.301666999999, "273.3017"), (0.0123456, "0.01235"), (0.000123456, "1.235e-04"), (2.5, "2.5"),
    (3, "3"), (100.0, "100"), (-0.5, "-0.5"), (0.0, "0"), (1234567.123456, "1234567.1235")])
def test_a_table_rounds_floats_to_four_places_four_figures_below_one_scientific_below_a_thousandth(value, text):
    from inferledger.cli.output import number_text

    assert number_text(value) == text


def _drawn(columns, rows, width):
    from rich.console import Console

    from inferledger.cli.output import print_rows

    con = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    print_rows(columns, rows, title="t", con=con)
    return [line.rstrip() for line in con.file.getvalue().splitlines()]


def test_a_table_right_aligns_numbers_and_splits_by_columns_keeping_headers_whole():
    lines = _drawn(["run_id", "completed_rps", "ttft_p50_ms", "ttft_p99_ms", "goodput_rps"],
                   [["a", 1.23456, 273.301666999999, None, 0.000123], ["bb", 12, 3.0, 4.5, 0.5],
                    ["c", 0, 0, 0, 0], ["d", 1, 1, 1, 1]], 60)
    assert lines == [
        "t (columns 1–4 of 5)",
        "┏━━━━━━━━┳━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━━━┓",
        "┃ run_id ┃ completed_rps ┃ ttft_p50_ms ┃ ttft_p99_ms ┃",
        "┡━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━━━┩",
        "│ a      │        1.2346 │    273.3017 │        NULL │",
        "│ bb     │            12 │           3 │         4.5 │",
        "│ c      │             0 │           0 │           0 │",
        "│ d      │             1 │           1 │           1 │",
        "└────────┴───────────────┴─────────────┴─────────────┘",
        "t (columns 5–5 of 5)",
        "┏━━━━━━━━┳━━━━━━━━━━━━━┓",
        "┃ run_id ┃ goodput_rps ┃",
        "┡━━━━━━━━╇━━━━━━━━━━━━━┩",
        "│ a      │   1.230e-04 │",
        "│ bb     │         0.5 │",
        "│ c      │           0 │",
        "│ d      │           1 │",
        "└────────┴─────────────┘"]


def test_a_few_wide_rows_are_drawn_one_line_per_column():
    assert _drawn(["run_id", "completed_rps", "ttft_p50_ms"], [["a", 1.23456, None]], 30) == [
        "t",
        "┏━━━━━━━━━━━━━━━┳━━━━━━━━┓",
        "┃ column        ┃ row 1  ┃",
        "┡━━━━━━━━━━━━━━━╇━━━━━━━━┩",
        "│ run_id        │ a      │",
        "│ completed_rps │ 1.2346 │",
        "│ ttft_p50_ms   │ NULL   │",
        "└───────────────┴────────┘"]


def test_piped_query_output_keeps_its_full_width_and_csv_its_full_values(book_run):
    sql = "select 273.301666999999::double as a_rather_long_column_name_one, 0.5::double as " \
          "a_rather_long_column_name_two, 'x' as a_rather_long_column_name_three"
    res = CliRunner().invoke(app, ["query", str(book_run), sql], env={"COLUMNS": None})
    assert res.exit_code == 0, res.output
    assert "│ 273.3017 │" not in res.output  # the value fits its long header's column, right-aligned:
    assert "│                      273.3017 │                           0.5 │ x                               │" \
        in res.output.splitlines()
    assert max(map(len, res.output.splitlines())) > 80
    assert _run("query", book_run, sql, "--format", "csv").splitlines()[1] == "273.301666999999,0.5,x"


def test_version_and_h_on_every_command():
    from importlib.metadata import version

    assert _run("--version") == f"inferledger {version('inferledger')}\n"
    for name in ("query", "capture", "serve", "predict", "summary", "reconstruct", "report", "study", "demo"):
        assert f" {name} [OPTIONS]" in _run(name, "-h")


def test_serve_capture_and_predict_share_the_engines_batch_limit_default():
    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.engine.params import EngineConfig

    import typer

    commands = typer.main.get_command(app).commands
    assert {name: next(p.default for p in commands[name].params if p.name == "max_num_seqs")
            for name in ("serve", "capture", "predict")} == {"serve": 16, "capture": 16, "predict": 16}
    assert CaptureOptions().max_num_seqs == EngineConfig().max_num_seqs == 16


def test_predict_help_keeps_its_bracketed_phrase():
    assert "(ranges as [low, high])" in " ".join(_run("predict", "--help").replace("│", " ").split())


def test_the_demos_closing_hint_runs_as_pasted():
    from inferledger.cli.cmd_demo import next_steps

    assert next_steps(".venv/bin/inferledger", "runs/demo 1").splitlines()[0] == (
        "  .venv/bin/inferledger query 'runs/demo 1' \"select client_status, server_status, count(*) from accounts "
        "group by all\"")


def test_the_recorded_vllm_capture_reconstructs_as_the_readme_says(tmp_path):
    sample = E0.parent / "peers" / "vllm-0.32-cpu"
    res = CliRunner().invoke(app, ["reconstruct", str(sample)])
    assert res.exit_code == 2 and res.stderr.splitlines() == [
        f"{sample} is a recorded capture (raw evidence), not a run; join it into one first:",
        f"  {command_name()} import --from vllm-recording {sample} -o runs/vllm-0.32-cpu",
        f"  {command_name()} reconstruct runs/vllm-0.32-cpu"]
    assert not (sample / "ledger.duckdb").exists()
    said = _run("import", "--from", "vllm-recording", sample, "-o", tmp_path / "vllm")
    assert said.splitlines()[-1] == f"next: {command_name()} reconstruct {tmp_path / 'vllm'}"  # runs as pasted
    out = json.loads(_run("reconstruct", tmp_path / "vllm", "--format", "json"))
    assert (out["ledger"]["n_attempts"], out["ledger"]["n_tasks"]) == (43, 40)


def test_serve_refuses_a_busy_port_before_loading_the_model(monkeypatch):
    import socket

    from inferledger.engine import loader

    def never(*a, **k):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(loader, "load_model", never)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = CliRunner().invoke(app, ["serve", "--port", str(port)], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}: Address already in use" in res.output


def test_every_next_step_hint_names_the_command_as_it_runs_here(tmp_path):
    """The hints a command prints (build the ledger first, ...) call `inferledger` as this shell reaches it
    (`.venv/bin/inferledger` without the venv on PATH), so they run as pasted, as the demo's do."""
    empty = tmp_path / "r"
    empty.mkdir()
    res = CliRunner().invoke(app, ["summary", str(empty)])
    assert res.exit_code == 2 and f"build it with: {command_name()} reconstruct {empty}" in res.stderr
    res = CliRunner().invoke(app, ["whatif", str(empty), "--node", "n", "--shrink", "30%"])
    assert res.exit_code == 2 and f"run `{command_name()} reconstruct {empty}` first" in res.stderr


def test_no_help_example_writes_into_a_folder_the_readmes_tour_has_made():
    """A new user runs the README's tour, then a command's --help example: its -o folder must be new
    (a capture, import or study refuses a folder that is not empty)."""
    import re

    import typer.main

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    folder = re.compile(r"(?:-o|--out)\s+(runs/[\w.\-]+)")
    tour = set(folder.findall(readme))
    assert {"runs/b0", "runs/book", "runs/vllm"} <= tour
    for name, command in typer.main.get_command(app).commands.items():
        assert not set(folder.findall(command.help or "")) & tour, name


def test_the_readme_activates_the_venv_right_after_its_two_commands():
    """The tour calls `inferledger` by name: the line that makes it reachable comes before the tour."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    first_block = readme.index("make demo")
    activate = readme.index(". .venv/bin/activate")
    assert first_block < activate < readme.index("## A five-minute tour") < readme.index("inferledger query")


WIDTH = 80
_INTENDED = re.compile(r"\s|Example|[-*•] |\d+[.)] ")  # a line the help text starts on purpose


def _stops_short(above: str, line: str) -> bool:
    """`above` ends a line of a help paragraph though `line`, which continues the paragraph, begins with a
    word that would have fit after it: a hard line break of the source, not the terminal's wrap (rich
    leaves one column free on each side, so a line holds WIDTH - 2 characters)."""
    if not above.strip() or not line.strip() or _INTENDED.match(line[1:]):
        return False
    return len(above.rstrip()) - 1 + 1 + len(line.split()[0]) <= WIDTH - 2


def test_help_paragraphs_reflow_to_the_terminal_keeping_their_example_and_list_lines():
    for name in ("study", "summary", "capture", "doctor"):
        res = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": str(WIDTH)})
        assert res.exit_code == 0, res.output
        lines = res.output.splitlines()
        text = lines[[i for i, line in enumerate(lines) if "Usage:" in line][0] + 1:
                     [i for i, line in enumerate(lines) if line.startswith("╭")][0]]
        assert max(map(len, text)) <= WIDTH
        short = [(a, b) for a, b in zip(text, text[1:]) if _stops_short(a, b)]
        assert short == [], f"{name} --help: {short}"
        assert "\b" not in res.output
    study = CliRunner().invoke(app, ["study", "--help"], env={"COLUMNS": str(WIDTH)}).output
    assert [line.split()[:3] for line in study.splitlines() if line.startswith(" Example:")] == \
        [["Example:", "inferledger", "study"]] * 5  # each starts its line, as written
    doctor = CliRunner().invoke(app, ["doctor", "--help"], env={"COLUMNS": str(WIDTH)}).output
    assert "\n   inferledger doctor --format csv" in doctor and "\n   rapl    CPU energy counters" in doctor
    capture = CliRunner().invoke(app, ["capture", "--help"], env={"COLUMNS": "200"}).output
    assert "workload's [deployment] section" in capture  # a bracket is text, not markup
