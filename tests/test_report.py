"""The HTML report: built from real ledgers, loaded in headless Chromium, no script errors, run strings
shown as text (never run), self-contained (no network), timeline drawn, big runs sampled."""
from __future__ import annotations

import json
import re
import struct
import subprocess
import zlib
from html import unescape
from pathlib import Path

import pyarrow as pa
import pytest

from inferledger.report.build import build_report
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.collectors.rundir.writer import RunWriter, write_table_atomic
from inferledger.ledger.reconstruct import reconstruct
from sample_runs import built_e0, copy_to
from inferledger.probes.events import GAP_SCHEMA

XSS = "<script>alert(1)</script>"
CHROMIUM = "/usr/bin/chromium"
SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "e0"
CLOCK = "mono:h"


def build_demo_run(run_dir: Path, *, attempts: int = 4, gap_ms: float = 20.0, tokens: int = 8,
                   slo: dict | None = None) -> Path:
    """A run on one clock: attempt 1 is preempted and resumed, attempt 2 is cancelled by its client,
    attempt 0's prompt, attempt 2's task id, the manifest and a gap carry a <script> tag."""
    w = RunWriter(run_dir, run_dir.name)
    w.clock_domain(CLOCK, host="h", kind="monotonic")
    seq: dict[str, int] = {}

    def ev(name, ms, source, attempt=None, task=None, value=None, step=None, **attrs):
        n = seq[source] = seq.get(source, -1) + 1
        w.emit({"run_id": run_dir.name, "event_id": f"{source}:{n}", "seq": n, "source": source, "host": "h",
                "name": name, "ts_ns": int(round(ms * 1e6)), "clock": CLOCK, "task_id": task, "session_id": None,
                "request_id": None if attempt is None else f"R{attempt}", "attempt_id": attempt, "step_id": step,
                "value": value, "attrs": json.dumps(attrs)})

    end = 0.0
    for i in range(attempts):
        a, t = f"A{i}", (f"T{i}{XSS}" if i == 2 else f"T{i}")
        base = i * 40.0
        ev("arrival.planned", base, "client", task=t)
        ev("task.start", base + 0.1, "client", task=t, deadline_ms=2000)
        ev("attempt.created", base + 0.2, "client", a, t, **({"prompt": XSS} if i == 0 else {}))
        ev("attempt.sent", base + 0.5, "client", a, t)
        ev("server.received", base + 1.5, "server", a, endpoint="/v1/chat/completions", stream=True)
        ev("engine.enqueued", base + 2, "engine", a, value=30)
        ev("engine.scheduled", base + 10 + 3 * i, "engine", a)
        ev("kv.alloc", base + 10 + 3 * i, "engine", a, value=3, blocks=[3 * i, 3 * i + 1, 3 * i + 2])
        ev("engine.prefill", base + 30, "engine", a, value=15, cached_tokens=0)
        ev("engine.prefill", base + 50, "engine", a, value=15, cached_tokens=0)
        shift, last = 0.0, None
        for k in range(tokens):
            tk = base + 55 + gap_ms * k + shift
            if i == 2 and k == 4:  # the client gives up after four tokens
                ev("attempt.cancel", tk - 10, "client", a, t)
                ev("server.disconnect", tk - 9, "server", a)
                ev("engine.cancel_received", tk - 9, "engine", a)
                ev("engine.cancel_effective", tk - 5, "engine", a)
                ev("engine.finished", tk - 4, "engine", a, value=4, reason="cancelled")
                ev("kv.release", tk - 3, "engine", a, value=3)
                ev("kv.free", tk - 2, "engine", a, value=3)
                break
            ev("engine.token", tk, "engine", a, value=1)
            ev("server.write", tk + 1, "server", a, value=1, kinds=["content"])
            ev("attempt.chunk", tk + 3, "client", a, t, value=1, kinds=["content"])
            last = tk
            if i == 1 and k == 2:  # preempted, recomputed 60 ms later
                ev("engine.preempted", tk + 5, "engine", a, value=33, recompute_tokens=33)
                ev("engine.scheduled", tk + 65, "engine", a, resume=True)
                ev("engine.prefill", tk + 85, "engine", a, value=33, cached_tokens=0, recompute=True)
                shift += 90.0
        if i != 2:
            ev("engine.finished", last + 1, "engine", a, value=tokens, reason="stop")
            ev("kv.release", last + 1.5, "engine", a, value=3)
            ev("kv.free", last + 2, "engine", a, value=3)
            ev("server.done", last + 2.5, "server", a, status=200)
            ev("attempt.done", last + 5, "client", a, t, finish_reason="stop",
               usage={"prompt_tokens": 30, "completion_tokens": tokens})
            ev("verdict", last + 6, "checker", a, t, correct=i % 3 != 0)
            end = max(end, last + 6)
    for s, g in enumerate(range(0, int(end), 20)):
        ev("step.start", g, "engine", step=s, batch=[["A0", "decode", 1]], token_budget=256, num_seqs=1)
        ev("step.end", g + 15, "engine", step=s, value=1, mode="eager")
        for metric, v in (("kv_blocks_used", 3 + s % 5), ("kv_blocks_cached", 2), ("kv_blocks_free", 59 - s % 5)):
            w.sample(ts_ns=int((g + 15) * 1e6), clock=CLOCK, source="engine", host="h", metric=metric,
                     value=float(v), unit="blocks")
    w.flush()
    write_table_atomic(pa.Table.from_pylist([{
        "run_id": run_dir.name, "gap_id": "collector:test", "scope": "run", "subject_id": None,
        "affects": "nothing real", "needs": f"a reader who sees {XSS} as text", "detail": XSS}], schema=GAP_SCHEMA),
        run_dir / "gaps.parquet")
    w.write_manifest({"source": "test", "model": {"path": f"/models/{XSS}.gguf", "sha256": "ab" * 32,
                                                  "format": "gguf", "quantization": "Q4_1"},
                      "engine_config": {"block_size": 16, "num_blocks": 64, "max_num_seqs": 4},
                      "workload": {"name": f"demo {XSS}", "sha256": "cd" * 32},
                      "host": {"name": "h", "platform": "test"}, "evidence": {"engine_config": "declared"},
                      **({"slo": slo} if slo else {})})
    w.close()
    reconstruct(run_dir)
    return run_dir


# -------------------------------------------------------------------------------------------------
# headless Chromium
# -------------------------------------------------------------------------------------------------
HOOK = ("<script>window.__t={errors:[],alerts:[]};window.alert=function(m){window.__t.alerts.push(String(m));};"
        "window.addEventListener('error',function(e){window.__t.errors.push(String(e.message));});"
        "var __ce=console.error;console.error=function(){window.__t.errors.push([].slice.call(arguments).join(' '));"
        "__ce.apply(console,arguments);};window.addEventListener('load',function(){setTimeout(function(){"
        # use the page: open the last attempt of the drill-down, filter the accounts to cancelled attempts
        "var box=document.querySelector('.drill'),sel=box.querySelector('select');"
        "sel.value=String(sel.options.length-1);sel.dispatchEvent(new Event('change'));"
        "window.__t.drill=box.querySelector('.drill-accounts td').textContent;"
        "var acct=document.querySelector('.acct'),f=acct.querySelector('select');f.value='cancelled';"
        "f.dispatchEvent(new Event('change'));window.__t.accounts=acct.querySelector('.tag').textContent;"
        "var d=document.createElement('pre');d.id='test-hook';d.textContent=JSON.stringify(window.__t);"
        "document.body.appendChild(d);},1000);});</script>")


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: the report's browser test needs Debian's chromium "
                    "(`make test` installs it: apt-get install -y chromium)")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'chromium-profile'}", "--virtual-time-budget=20000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def load_in_browser(report: Path, tmp: Path) -> tuple[str, str]:
    """(DOM after the scripts ran, Chromium's log) for the report with the test's error hook added."""
    text = report.read_text(encoding="utf-8")
    page = tmp / "page.html"
    page.write_text(text.replace('<meta charset="utf-8">', '<meta charset="utf-8">' + HOOK, 1), encoding="utf-8")
    proc = _chromium(tmp, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


def png_pixels(path: Path) -> tuple[int, int, set]:
    """(width, height, set of distinct RGB(A) pixels) of an 8-bit RGB/RGBA PNG (no image library)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, (w, h, depth, ctype) = 8, b"", (0, 0, 0, 0)
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and ctype in (2, 6), (depth, ctype)
    bpp = 3 if ctype == 2 else 4
    raw, stride, prev, colours = zlib.decompress(idat), w * bpp, bytearray(w * bpp), set()
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa_, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa_ <= pb and pa_ <= pc else b if pb <= pc else c)) & 255
        if y % 4 == 0:
            colours.update(bytes(line[i:i + bpp]) for i in range(0, stride, bpp * 4))
        prev = line
    return w, h, colours


# -------------------------------------------------------------------------------------------------
# tests
# -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    return build_demo_run(base / "run_a"), build_demo_run(base / "run_b", gap_ms=25.0, attempts=3)


@pytest.fixture(scope="module")
def compared(runs, tmp_path_factory):
    """Run A compared with run B, A drawn as a sample (detail 2 of 4 attempts) to exercise that path."""
    out = tmp_path_factory.mktemp("out") / "report.html"
    return build_report(runs[0], out, compare=runs[1], detail_limit=2)


def test_report_is_self_contained_and_escapes_run_strings(compared):
    html = compared.path.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I), "a script loaded from elsewhere"
    assert not re.search(r"<link[^>]+href\s*=\s*[\"']?https?:", html, re.I)
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html)
    assert csp and "default-src 'none'" in unescape(csp.group(1)), "the page may load from the network"
    assert XSS not in html, "a run string reached the page unescaped"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown as text (identity card, gap register)
    assert html.count("</script>") == html.count("<script")  # no JSON block ends early
    assert "Plotly" in html and compared.bytes < 15 * 2 ** 20


@pytest.mark.slow  # Chromium
def test_report_renders_in_chromium_without_errors(compared, tmp_path):
    dom, log = load_in_browser(compared.path, tmp_path)
    hook = json.loads(re.search(r'<pre id="test-hook">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    assert hook["errors"] == [] and hook["alerts"] == [], hook
    assert hook["accounts"] == "1 of 4 attempts match"  # the client_status filter found the cancelled one
    drilled = json.loads(re.search(r'id="report-data">(.*?)</script>', compared.path.read_text(), re.S).group(1))
    assert hook["drill"] == drilled["drill"]["a"][-1]["id"]  # the drill-down redrew the chosen attempt
    assert not re.search(r"Uncaught|Refused to|SyntaxError|TypeError", log), log[-3000:]
    rendered = re.search(r'data-rendered="(\d+)"', dom)
    assert rendered and int(rendered.group(1)) >= 10, "the page did not finish drawing its figures"
    assert re.search(r'<div id="report-errors"[^>]*hidden', dom), "the report's own error box is showing"
    gantt = dom[dom.index('id="a-gantt"'):dom.index('class="drill"')]
    assert "main-svg" in gantt and gantt.count('class="point"') >= 4, "the timeline has no bars"
    # the run's <script> strings arrived as text: in the accounts table (JS), identity and gaps (HTML)
    assert dom.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3
    assert "<img" not in dom and XSS not in dom
    for panel in ("a-identity", "a-headline", "a-itl", "a-ttft", "a-kv", "a-roofline", "a-residuals",
                  "a-calibration", "a-prediction", "a-critical", "a-accounts", "a-diagnosis", "a-gaps", "compare",
                  "b-timeline"):
        assert f'id="{panel}"' in dom


@pytest.mark.slow  # Chromium
def test_screenshot_shows_the_timeline(compared, tmp_path):
    # headless screenshots show the top of the page: hide every panel but the timeline
    page = tmp_path / "report.html"
    only = "<style>main>section:not(#a-timeline),main>h2{display:none}</style>"
    page.write_text(compared.path.read_text(encoding="utf-8").replace("</head>", only + "</head>", 1), encoding="utf-8")
    shot = tmp_path / "shot.png"
    proc = _chromium(tmp_path, "--hide-scrollbars", "--window-size=1280,1400", f"--screenshot={shot}", page.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    w, h, colours = png_pixels(shot)
    assert (w, h) == (1280, 1400)
    assert len(colours) > 20, f"a near-blank screenshot ({len(colours)} colours)"
    prefill, decode = bytes((0x1F, 0x77, 0xB4)), bytes((0x2C, 0xA0, 0x2C))  # the engine's prefill and decode bars
    assert any(c[:3] == prefill for c in colours) and any(c[:3] == decode for c in colours)


def test_declared_slo_puts_the_vllm_goodput_beside_ours(tmp_path):
    import duckdb

    from inferledger.report.page import esc

    run = build_demo_run(tmp_path / "slo", slo={"ttft_ms": 100, "e2e_ms": 250})  # A0 and A3 within, A1 too slow
    con = duckdb.connect(str(run / "ledger.duckdb"), read_only=True)
    vllm, t_obs = con.execute("SELECT vllm_goodput_rps, t_obs_s FROM run_metrics").fetchone()
    n = con.execute("SELECT count(*) FROM request_metrics r JOIN attempts a USING (attempt_id) WHERE "
                    "a.client_status = 'completed' AND r.ttft_client_ms <= 100 AND r.e2e_client_ms <= 250").fetchone()[0]
    con.close()
    assert n == 2 and vllm == n / t_obs
    html = build_report(run, tmp_path / "r.html").path.read_text(encoding="utf-8")
    card = html[html.index("<span>vLLM-style goodput</span>"):][:400]
    assert f"<b>{vllm:,.3f} req/s</b>" in card and esc("TTFT ≤ 100 ms, E2E ≤ 250 ms") in card
    con = duckdb.connect(str(run / "ledger.duckdb"), read_only=True)
    out_tok_s, total_tok_s, computed_tok_s = con.execute(
        "SELECT output_tok_s, total_tok_s, computed_tok_s FROM run_metrics").fetchone()
    con.close()
    card = html[html.index("<span>output tokens/s</span>"):][:400]
    assert f"<b>{out_tok_s:,.1f} tok/s</b>" in card
    assert f"{total_tok_s:,.1f} with prompt tokens" in card and f"{computed_tok_s:,.1f} computed" in card
    plain = build_report(build_demo_run(tmp_path / "no_slo"), tmp_path / "p.html").path.read_text(encoding="utf-8")
    assert "vLLM-style goodput" not in plain  # no thresholds declared: no such figure, not a zero


def test_headline_sets_the_peers_definitions_beside_ours(runs, tmp_path):
    import duckdb

    from inferledger.report.page import esc

    html = build_report(runs[0], tmp_path / "peers.html").path.read_text(encoding="utf-8")
    part = html[html.index("The same names in other tools"):]
    part = part[:part.index("</table>")]
    con = duckdb.connect(str(runs[0] / "ledger.duckdb"), read_only=True)
    rows = con.execute("SELECT tool, definition, n, p50_ms FROM peer_views").fetchall()
    con.close()
    assert len(rows) == 16 == part.count("<tr>") - 1  # a header row, then one per metric x tool
    for tool, definition, n, p50 in rows:
        assert (p50 is None) == (n == 0)  # no planned send times in this run: the MLPerf-style row is empty
        assert esc(definition) in part and (f"{p50:,.1f}" if n else "—") in part, (tool, definition)


def test_single_run_report_draws_every_attempt(runs, tmp_path):
    res = build_report(runs[0], tmp_path / "one.html")
    html = res.path.read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', html, re.S).group(1))
    figs = json.loads(re.search(r'id="report-figures">(.*?)</script>', html, re.S).group(1))
    # grouped by outcome (no class declared: A0, A1, A3 completed, A2 cancelled), the slowest first in each:
    # client E2E A1 289.5 ms, A0 and A3 199.5 (a tie: by id)
    assert res.attempts == 4 and [d["id"] for d in data["drill"]["a"]] == ["A1", "A0", "A3", "A2"]
    assert len(data["accounts"]["a"]["rows"]) == 4
    assert {t["name"] for t in figs["a-gantt"]["data"]} >= {"engine: prefill", "engine: decode", "engine: preempted",
                                                           "client: stream", "arrival", "prefill chunk", "client cancel"}
    assert figs["a-gantt"]["layout"]["yaxis"]["ticktext"] == ["A1", "A0", "A3", "A2"]
    assert [a["text"] for a in figs["a-gantt"]["layout"]["annotations"]] == [
        "(no class) · completed (3)", "(no class) · cancelled (1)"]
    assert data["timeline"]["a-gantt"]["orders"]["arrival"] == ["A0", "A1", "A3", "A2"]
    assert "all 4 attempts" in html and "compared" not in html.split("<main>")[1][:200]


def test_big_run_is_sampled_with_the_reason_for_each_row(runs, tmp_path):
    res = build_report(runs[0], tmp_path / "s.html", detail_limit=2, drill_limit=1)
    html = res.path.read_text(encoding="utf-8")
    figs = json.loads(re.search(r'id="report-figures">(.*?)</script>', html, re.S).group(1))
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', html, re.S).group(1))
    assert len(figs["a-gantt"]["layout"]["yaxis"]["tickvals"]) == 2 and len(data["drill"]["a"]) == 1
    assert "2 of 4 attempts" in html and "a-agg" in figs  # every attempt still counted in the aggregate
    assert len(data["accounts"]["a"]["rows"]) == 4


@pytest.mark.parametrize("name", ["black_box", "clocks_unmapped", "r1_double_counted", "r2_timeout_retry"])
def test_report_builds_for_e0_samples(name, tmp_path, tmp_path_factory):
    run = copy_to(built_e0(tmp_path_factory, name), tmp_path / name)  # the session's build, a copy to write in
    res = build_report(run)
    html = res.path.read_text(encoding="utf-8")
    assert res.path == run / "report.html" and "Gap register" in html
    if name == "clocks_unmapped":
        assert "no mapping to" in html  # the unaligned stream is named, not drawn on the shared axis


def test_missing_ledger_is_a_clear_error(tmp_path):
    from inferledger.ledger.query import LedgerError

    with pytest.raises(LedgerError, match="reconstruct"):
        build_report(tmp_path)


def test_report_command(runs, tmp_path):
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    out = tmp_path / "cli.html"
    res = CliRunner().invoke(app, ["report", str(runs[0]), "--compare", str(runs[1]), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.exists() and "report:" in res.output
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and "no such run" in res.output


def test_goodput_has_one_definition_a_ledger_without_run_metrics_shows_it_unknown(tmp_path):
    # goodput and its window are run_metrics's alone: the report never derives them itself
    import duckdb

    run = build_demo_run(tmp_path / "no-run-metrics")
    con = duckdb.connect(str(run / "ledger.duckdb"))
    con.execute("DROP TABLE run_metrics")
    con.close()
    html = unescape(build_report(run).path.read_text(encoding="utf-8"))
    headline = html[html.index("Headline figures"):]
    assert "unknown: this ledger has no run_metrics table" in headline
    assert re.search(r"goodput</[^>]+>\s*<[^>]+>— req/s", headline), headline[:2000]


def test_the_verdict_is_the_first_section_and_holds_the_figures(runs, tmp_path):
    out = build_report(runs[0], tmp_path / "one.html")
    proc = _chromium(tmp_path, "--dump-dom", out.path.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    sections = re.findall(r'<section id="([^"]+)"', dom)
    assert sections[0] == "a-verdict" and sections[-2:] == ["a-identity", "a-gaps"]  # identity below the figures
    verdict = dom[dom.index('<section id="a-verdict"'):dom.index("</section>")]
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", verdict, re.S)]
    # the p50 request (client E2E 199.5, 199.5, 289.5: A0 and A3 tie, the first id wins) and the p99 one (A1):
    # queue = client queue 0.3 (created 0.2 -> sent 0.5) + server queue (the front end, received 1.5 ->
    # enqueued 2, and scheduled − enqueued: 0.5 + 8 + 3i), prefill = first token (base + 55) − scheduled,
    # decode = finished − first token less the causes inside it (A1: its 105 ms preempted, under stalls),
    # interference 0 (A0 shares no step with a prefill; A1's steps are not in the archive: unknown),
    # contention unknown, transport = client E2E − server E2E 4 ms (under the TTFT difference, 4.5 ms) less
    # the front end's 0.5 (the server's), the client's delay unknown; held = its client E2E and its client queue
    # asleep: no step of the archive says how long its thread slept on a lock (unknown, not 0)
    assert cells[:26] == ["p50", "A0", "199.5", "199.8", "8.8", "45.0", "141.0", "0.0", "—", "0.0", "3.5", "—", "—",
                          "p99", "A1", "289.5", "289.8", "11.8", "42.0", "126.0", "—", "—", "105.0", "3.5", "—", "—"]
    assert "no registered prediction" in verdict
    # no request was late: every attempt diagnosed; A1's 105 ms of preemption of the 168.7 ms known delay
    # (client queues 4 × 0.3, server queues 8.5 + 11.5 + 14.5 + 17.5, transport 3 × 3.5, the cancelled one none) is
    # the largest known, but A1's steps are not in the archive: its interference could be larger, so no
    # cause is named first
    text = unescape(re.sub(r"<[^>]+>", " ", verdict))
    assert "largest cause of delay (no request was late)" in text and " unknown " in text
    assert ("an engine cause is unknown, so none is named first; the largest known, preemption: 105.0 ms of the "
            "168.7 ms known over 4 attempts (none was late); unknown: prefill_interference, host_contention, "
            "client") in text


def test_compare_colours_a_change_by_the_figures_direction():
    """More goodput is better (green), a higher latency worse (red), more attempts sent neither: the
    colour says better or worse, not up or down."""
    from inferledger.report.compare import _delta_cells

    assert _delta_cells(1.74, 1.0, "higher").count('class="num better"') == 2
    assert _delta_cells(1.74, 1.0, "lower").count('class="num worse"') == 2
    assert _delta_cells(80.0, 100.0, "lower").count('class="num better"') == 2
    assert _delta_cells(120, 100, None) == '<td class="num ">+20.000</td><td class="num ">+20.0%</td>'
    assert _delta_cells(None, 1.0, "higher") == "<td>—</td><td>—</td>"


def test_headline_counts_say_attempts_or_tasks_and_a_client_bound_run_says_what_it_cost(tmp_path):
    """r2_timeout_retry: one task, two attempts (the first timed out, its retry completed). Marked client-bound
    here: the verdict's client E2E and the latency table carry what the client's lag does to each figure."""
    from inferledger.probes.run_folder import Manifest
    from inferledger.report.page import esc

    run = tmp_path / "retry"
    import_archive(SAMPLES / "r2_timeout_retry" / "archive.jsonl", run)
    m = Manifest.read(run)
    m.body["client"] = {"loop_lag_p99_ms": 2.64, "loop_lag_max_ms": 9.1, "client_bound": True,
                        "client_bound_rule": "event-loop lag p99 > 1.0 ms"}
    m.write(run)
    reconstruct(run)
    html = build_report(run, tmp_path / "r.html").path.read_text(encoding="utf-8")
    card = html[html.index("<span>good results</span>"):][:300]
    assert card.startswith("<span>good results</span><b>1 of 2 judged attempts</b>"
                           "<span>2 attempts (1 completed at the client) for 1 task: success 1</span>"), card
    effect = esc("client-bound: the client's event loop lagged 2.64 ms at p99 (9.10 ms at worst; event-loop lag "
                 "p99 > 1.0 ms). Client TTFT and E2E include up to that lag, each client ITL gap can be off by up "
                 "to it, client TPOT by up to it over the attempt's output tokens less one; the server and engine "
                 "figures do not include it")
    verdict = html[html.index('<section id="a-verdict"'):html.index('<section id="a-headline"')]
    headline = html[html.index('<section id="a-headline"'):]
    headline = headline[:headline.index("</section>")]
    assert f'<p class="note">{effect}</p>' in verdict and f'<p class="note">{effect}</p>' in headline
    assert "<td>TTFT</td><td>engine</td><td>2 attempts</td>" in headline
    assert "<td>ITL</td><td>server (per output event)</td><td>174 gaps</td>" in headline
    accounts = html[html.index('<section id="a-accounts"'):]
    assert "<th>task</th><th>tasks</th>" in accounts and "<th>client</th><th>attempts</th>" in accounts
