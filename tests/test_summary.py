"""The terminal summary printed after reconstruct, on a hand-computed archive."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from inferledger.cli.summary import print_summary
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.ledger.reconstruct import reconstruct
from sample_runs import built_e0, copy_to

E0 = Path(__file__).resolve().parent.parent / "samples" / "e0"


def test_summary_sets_the_peers_readings_beside_ours(tmp_path, tmp_path_factory):
    run = copy_to(built_e0(tmp_path_factory, "peer_definitions"), tmp_path / "peers")  # the session's build, a copy
    console = Console(record=True, width=200)
    print_summary(run / "ledger.duckdb", console)
    text = console.export_text()
    # the rows of samples/e0/peer_definitions/README.md: metric, tool, weighting, n, p50, p99
    for row in (("TTFT", "inferledger", "request", "2", "85.0", "109.5"),
                ("TTFT", "vLLM bench", "request", "2", "70.0", "99.4"),
                ("ITL", "vLLM bench", "gap", "8", "20.0", "39.3"),
                ("ITL", "GuideLLM", "token (tokens − 1)", "2", "15.0", "20.0"),
                ("TPOT", "GuideLLM", "token", "2", "34.0", "34.0")):
        line = next(ln for ln in text.splitlines() if f" {row[0]} " in ln and f" {row[1]} " in ln)
        assert line.split("│")[1:-1] and [c.strip() for c in line.split("│")[1:-1]] == list(row), line
    # every row has samples here; no thresholds declared, so no vLLM-style goodput (not a zero)
    assert "MLPerf-style" in text and "vLLM-style goodput" not in text
    # no verdicts: A1 and A2 are unjudged; A3 timed out, so it is judged not good
    assert ("good results (correct and on time): 0 of 1 judged attempts (3 attempts in all, for 3 tasks: "
            "unknown 2, failure 1)") in " ".join(text.split())


def test_reconstruct_of_an_engine_only_run_prints_unknown_goodput_instead_of_crashing(tmp_path):
    """Server and engine events, no client: goodput is NULL (no client results) and the summary says
    so, with what it needs, in every format."""
    import json

    from typer.testing import CliRunner

    from inferledger.cli.app import app
    from ledger_util import build_run

    run = tmp_path / "engine-only"
    events = [dict(name="server.received", ms=0, source="server"), dict(name="engine.enqueued", ms=1, source="engine"),
              dict(name="engine.scheduled", ms=2, source="engine"),
              dict(name="engine.prefill", ms=3, source="engine", value=5),
              dict(name="engine.token", ms=10, source="engine", value=1),
              dict(name="engine.token", ms=20, source="engine", value=1),
              dict(name="engine.finished", ms=21, source="engine", attrs={"reason": "stop"}),
              dict(name="server.write", ms=21, source="server", value=2, attrs={"kinds": ["content"]}),
              dict(name="server.done", ms=22, source="server", attrs={"status": 200})]
    build_run(run, events, manifest={"source": "test"}).close()
    res = CliRunner().invoke(app, ["reconstruct", str(run)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "goodput over a 0.0 s window: unknown — needs client events" in res.output
    res = CliRunner().invoke(app, ["reconstruct", str(run), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["run"]["goodput_rps"] is None and out["run"]["t_obs_s"] == 0.021
    assert out["ledger"]["n_attempts"] == 1
    engine_ttft = next(r for r in out["latency"] if r["column"] == "request_metrics.ttft_server_ms")
    assert (engine_ttft["n"], engine_ttft["p50_ms"]) == (1, 9.0)  # token at 10 ms − enqueued at 1 ms


def test_a_piped_summary_keeps_every_header_and_line_whole(tmp_path, tmp_path_factory, monkeypatch):
    """Piped or written to a file (no terminal), rich would draw at 80 columns: the verdict's header
    cut to `conte…` and its lines wrapped. The summary prints each table at its own width instead."""
    import io

    monkeypatch.delenv("COLUMNS", raising=False)  # $COLUMNS would say a terminal's width
    run = copy_to(built_e0(tmp_path_factory, "r2_timeout_retry"), tmp_path / "retry")  # the session's build, a copy
    out = io.StringIO()
    print_summary(run / "ledger.duckdb", Console(file=out, width=80, force_terminal=False))
    text = out.getvalue()
    header = next(ln for ln in text.splitlines() if "request" in ln and "attempt" in ln)
    assert [c.strip() for c in header.split("┃")[1:-1]] == [
        "request", "attempt", "E2E", "held", "queue", "prefill", "decode", "interference", "contention", "stalls",
        "transport", "client", "asleep"]
    assert "…" not in text and max(map(len, text.splitlines())) > 80


def _summary_text(run: Path) -> str:
    console = Console(record=True, width=200)
    print_summary(run / "ledger.duckdb", console)
    return console.export_text()


def _cells(text: str, *first: str) -> list[str]:
    """The cells of the table row whose first cells are `first`."""
    for ln in text.splitlines():
        cells = [c.strip() for c in ln.split("│")[1:-1]]
        if cells[:len(first)] == list(first):
            return cells
    raise AssertionError(f"no row {first} in\n{text}")


def test_headline_counts_say_attempts_or_tasks_on_a_run_with_a_retry(tmp_path, tmp_path_factory):
    """r2_timeout_retry: one task, two attempts (A1 timed out, A2 its retry completed): every count says
    which it counts, so 2 attempts are never read as 2 tasks."""
    run = copy_to(built_e0(tmp_path_factory, "r2_timeout_retry"), tmp_path / "retry")  # the session's build, a copy
    text = _summary_text(run)
    assert ("good results (correct and on time): 1 of 2 judged attempts (2 attempts in all, for 1 task: "
            "success 1)") in text
    assert _cells(text, "TTFT", "engine")[2] == "2 attempts"  # A1's 2190 ms and A2's
    assert _cells(text, "TTFT", "client (first content)")[2] == "1 attempt"  # A1 saw no chunk
    assert _cells(text, "ITL", "server (per output event)")[2] == "174 gaps"  # 115 + 59
    assert _cells(text, "", "timeout") == ["", "timeout", "1 attempt"]  # the client account's second row
    assert _cells(text, "server", "completed") == ["server", "completed", "2 attempts"]
    assert _cells(text, "task", "success") == ["task", "success", "1 task"]
    assert "client-bound" not in text  # an imported archive has no client block: nothing to say


CLIENT_BOUND = ("client-bound: the client's event loop lagged 2.64 ms at p99 (9.10 ms at worst; event-loop lag "
                "p99 > 1.0 ms). Client TTFT and E2E include up to that lag, each client ITL gap can be off by up "
                "to it, client TPOT by up to it over the attempt's output tokens less one; the server and engine "
                "figures do not include it")


def _client_run(run: Path, client: dict) -> Path:
    from ledger_util import build_run

    events = [dict(name="attempt.created", ms=0), dict(name="attempt.sent", ms=1),
              dict(name="server.received", ms=2, source="server"), dict(name="engine.enqueued", ms=3, source="engine"),
              dict(name="engine.scheduled", ms=4, source="engine"), dict(name="engine.token", ms=10, source="engine", value=1),
              dict(name="engine.token", ms=20, source="engine", value=1),
              dict(name="attempt.chunk", ms=12, value=1, attrs={"kinds": ["content"]}),
              dict(name="attempt.chunk", ms=22, value=1, attrs={"kinds": ["content"]}),
              dict(name="engine.finished", ms=21, source="engine", attrs={"reason": "stop"}),
              dict(name="server.done", ms=22, source="server", attrs={"status": 200}),
              dict(name="attempt.done", ms=23, attrs={"finish_reason": "stop"})]
    build_run(run, events, manifest={"source": "test", "client": client}).close()
    return run


def test_a_client_bound_run_says_what_the_lag_does_to_each_latency_figure(tmp_path):
    import json

    from typer.testing import CliRunner

    from inferledger.cli.app import app

    bound = _client_run(tmp_path / "bound", {"loop_lag_p99_ms": 2.64, "loop_lag_max_ms": 9.1, "client_bound": True,
                                             "client_bound_rule": "event-loop lag p99 > 1.0 ms"})
    text = " ".join(_summary_text(bound).split())
    assert CLIENT_BOUND in text
    assert text.index("Latency by observation layer") < text.index("client-bound:") < text.index("The four accounts")
    out = json.loads(CliRunner().invoke(app, ["summary", str(bound), "--table", "client", "--format", "json"]).output)
    assert out == [{"client_bound": True, "loop_lag_p99_ms": 2.64, "loop_lag_max_ms": 9.1,
                    "rule": "event-loop lag p99 > 1.0 ms", "effect": CLIENT_BOUND}]
    calm = _client_run(tmp_path / "calm", {"loop_lag_p99_ms": 0.4, "loop_lag_max_ms": 1.2, "client_bound": False,
                                           "client_bound_rule": "event-loop lag p99 > 1.0 ms"})
    assert "client-bound" not in _summary_text(calm)


def test_a_ledger_other_code_built_is_refused_by_name_and_rebuilt_on_request(tmp_path):
    """A ledger records the ledger modules' code that built it; a reader with other code (an older
    ledger without the record, or one whose record names other modules) gets exit 2 naming the file and
    the rebuild from summary, report and export, never a traceback or figures of another definition;
    query reads it with a warning."""
    import duckdb
    from typer.testing import CliRunner

    from inferledger.cli.app import app
    from inferledger.ledger.modules import modules_sha256

    run = tmp_path / "r"
    import_archive(E0 / "r2_timeout_retry" / "archive.jsonl", run, run_id="r")
    reconstruct(run)
    ledger = run / "ledger.duckdb"
    con = duckdb.connect(str(ledger))
    assert con.execute("SELECT run_id, modules_sha256 FROM ledger_build").fetchall() == [("r", modules_sha256())]
    con.close()
    runner = CliRunner()
    assert runner.invoke(app, ["summary", str(run), "--format", "json"]).exit_code == 0
    for change in ("UPDATE ledger_build SET modules_sha256 = 'abc'", "DROP TABLE ledger_build"):
        con = duckdb.connect(str(ledger))
        con.execute(change)
        con.close()
        for args in (["summary", str(run)], ["report", str(run), "-o", str(tmp_path / "r.html")],
                     ["export", str(run), "--as", "perfetto", "-o", str(tmp_path / "x.json")]):
            res = runner.invoke(app, args)
            assert res.exit_code == 2, (change, args, res.output)
            assert f"rebuild it: inferledger reconstruct {run}" in res.output and "Traceback" not in res.output, res.output
        res = runner.invoke(app, ["query", str(run), "select count(*) from attempts", "--format", "csv"])
        assert res.exit_code == 0 and "warning:" in res.stderr and "rebuild it" in res.stderr, res.output
        reconstruct(run)  # the rebuild the message asks for
        assert runner.invoke(app, ["summary", str(run)]).exit_code == 0
