"""The report's long views at 1,000 attempts, in headless Chromium: the timeline grouped by task class and
outcome with the slowest first in each group (and in arrival order when asked), zoomed to one group, and
the drill-down as a formatted page of one attempt with its exact values. The run is a generated E0
archive (no engine): attempt i arrives at 50·i ms, its class `long` when i % 3 == 0, else `chat`; the
client times out when i % 10 == 7 and cancels after two chunks when i % 10 == 3."""
from __future__ import annotations

import json
import re
import time
from html import unescape
from pathlib import Path

import duckdb
import pytest

from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.ledger.reconstruct import reconstruct
from inferledger.report.build import build_report
from test_report import _chromium, png_pixels

pytestmark = pytest.mark.slow  # 1,000 attempts built and drawn in Chromium

N = 1000
CLOCK = "mono:gen"


def timing(i: int) -> dict:
    """Attempt i's times in ms (hand arithmetic for every figure the test checks)."""
    base = 50.0 * i
    q = float((i * 7) % 40)  # the engine queue
    n = 4 + i % 5  # output tokens
    gap = 10.0 + (i * 13) % 17  # between tokens
    scheduled = base + 2 + q
    tokens = [scheduled + 12 + k * gap for k in range(n)]
    return {"base": base, "sent": base + 0.5, "received": base + 1, "enqueued": base + 1.5, "scheduled": scheduled,
            "prefill": scheduled + 10, "tokens": tokens, "finished": tokens[-1] + 0.5, "server_done": tokens[-1] + 1,
            "done": tokens[-1] + 2, "n": n}


def archive_lines(n: int) -> list[dict]:
    lines = [{"name": "clock.domain", "clock": CLOCK, "source": "archive", "attrs": {"host": "gen", "kind": "monotonic"}}]

    def ev(name, ms, source, i, value=None, **attrs):
        e = {"name": name, "source": source, "ts_ns": int(round(ms * 1e6)), "clock": CLOCK, "task_id": f"T{i:04d}"}
        if not name.startswith(("task.", "arrival.")):
            e |= {"request_id": f"R{i:04d}", "attempt_id": f"A{i:04d}"}
        if value is not None:
            e["value"] = value
        if attrs:
            e["attrs"] = attrs
        lines.append(e)

    for i in range(n):
        t = timing(i)
        ev("arrival.planned", t["base"], "client", i)
        ev("task.start", t["base"] + 0.1, "client", i, task_class="long" if i % 3 == 0 else "chat", deadline_ms=5000)
        ev("attempt.created", t["base"] + 0.2, "client", i)
        ev("attempt.sent", t["sent"], "client", i)
        ev("server.received", t["received"], "server", i)
        ev("engine.enqueued", t["enqueued"], "engine", i, value=32)
        ev("engine.scheduled", t["scheduled"], "engine", i)
        ev("engine.prefill", t["prefill"], "engine", i, value=32)
        cancel = i % 10 == 3
        for k, tk in enumerate(t["tokens"]):
            ev("engine.token", tk, "engine", i, value=1)
            ev("server.write", tk + 0.25, "server", i, value=1, kinds=["content"])
            if i % 10 != 7:  # a timed-out client reads nothing
                ev("attempt.chunk", tk + 0.75, "client", i, value=1, kinds=["content"])
            if cancel and k == 1:
                ev("attempt.cancel", tk + 1, "client", i)
                ev("engine.cancel_received", tk + 1.5, "engine", i)
                ev("engine.finished", tk + 2, "engine", i, value=2, reason="cancelled")
                break
        if i % 10 == 7:
            ev("attempt.timeout", t["sent"] + 10, "client", i, after_ms=10)
        if not cancel:
            ev("engine.finished", t["finished"], "engine", i, value=t["n"], reason="stop")
            ev("server.done", t["server_done"], "server", i, status=200)
        if i % 10 not in (3, 7):
            ev("attempt.done", t["done"], "client", i, finish_reason="stop",
               usage={"prompt_tokens": 32, "completion_tokens": t["n"]})
            ev("verdict", t["done"] + 1, "checker", i, correct=True)
    return lines


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("long")
    archive = base / "archive.jsonl"
    archive.write_text("\n".join(json.dumps(x) for x in archive_lines(N)) + "\n", encoding="utf-8")
    run = base / "run"
    import_archive(archive, run)
    reconstruct(run)
    t0 = time.perf_counter()
    res = build_report(run)
    return run, res, time.perf_counter() - t0


HOOK = r"""<script>window.addEventListener('load',function(){setTimeout(function(){
var out={errors:window.__reportErrors.slice()};
function rows(div){var r=[];div.data.forEach(function(t){if(!t.customdata)return;
  t.customdata.forEach(function(a,j){r[t.y[j]]=a;});});return r;}
var g=document.getElementById('a-gantt'),bar=document.querySelector('.tl-controls');
out.slowest=rows(g);out.groups=g.layout.annotations.map(function(a){return a.text;});
function at(name,key,aid){var r=null;g.data.forEach(function(t){if(t.name===name)t.customdata.forEach(function(a,j){
  if(a===aid)r=t[key][j];});});return r;}
var first=out.slowest[0],tm=bar.querySelector('.tl-time');
out.sent={queue:at('engine: queue','base',first),arrival:at('arrival','x',first),title:g.layout.xaxis.title.text};
tm.value='run';tm.dispatchEvent(new Event('change'));
out.run={queue:at('engine: queue','base',first),arrival:at('arrival','x',first),title:g.layout.xaxis.title.text};
var order=bar.querySelector('.tl-order');order.value='arrival';order.dispatchEvent(new Event('change'));
out.arrival=rows(g);out.ticks=g.layout.yaxis.ticktext.slice();
var grp=bar.querySelector('.tl-group');grp.value='1';grp.dispatchEvent(new Event('change'));
out.zoom=g.layout.yaxis.range.slice();
var box=document.querySelector('.drill'),sel=box.querySelector('select');
function pairs(cls){return [].map.call(box.querySelectorAll(cls+' tr'),function(r){
  return [r.querySelector('th').textContent,r.querySelector('td').textContent];});}
function cells(cls){return [].map.call(box.querySelectorAll(cls+' tbody tr'),function(r){
  return [].map.call(r.querySelectorAll('td'),function(d){return d.textContent;});});}
out.options=[].map.call(sel.options,function(o){return o.textContent;});
out.title=box.querySelector('.drill-title').textContent;
out.accounts=pairs('.drill-accounts');out.causes=pairs('.drill-causes');out.metrics=pairs('.drill-metrics');
out.intervals=cells('.drill-intervals');out.events=cells('.drill-events');
out.bars=box.querySelectorAll('.drill-intervals .bar span').length;
var d=document.createElement('pre');d.id='test-hook';d.textContent=JSON.stringify(out);document.body.appendChild(d);
},1500);});</script>"""


@pytest.fixture(scope="module")
def rendered(long_run, tmp_path_factory):
    run, res, _ = long_run
    tmp = tmp_path_factory.mktemp("chromium")
    page = tmp / "page.html"
    page.write_text(res.path.read_text(encoding="utf-8").replace("</body>", HOOK + "</body>", 1), encoding="utf-8")
    proc = _chromium(tmp, "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    hook = re.search(r'<pre id="test-hook">(.*?)</pre>', proc.stdout, re.S)
    assert hook, "the page's scripts did not finish: " + proc.stderr[-2000:]
    return json.loads(unescape(hook.group(1)))


def _ledger(run: Path) -> dict[str, tuple]:
    con = duckdb.connect(str(run / "ledger.duckdb"), read_only=True)
    rows = con.execute("SELECT attempt_id, a.client_status, coalesce(r.e2e_client_ms, r.client_span_ms, r.e2e_server_ms) "
                       "FROM attempts a JOIN request_metrics r USING (attempt_id)").fetchall()
    con.close()
    return {aid: (status, e2e) for aid, status, e2e in rows}


OUTCOMES = ("completed", "timeout", "cancelled")


def test_the_timeline_is_grouped_by_class_and_outcome_with_the_slowest_first(long_run, rendered):
    run, res, seconds = long_run
    assert res.attempts == N and rendered["errors"] == []
    led = _ledger(run)
    rows = rendered["slowest"]
    assert len(rows) == 300 == len(set(rows))  # --detail's default: a sample of the 1,000

    def cls(aid):
        return "long" if int(aid[1:]) % 3 == 0 else "chat"

    def group(aid):
        return cls(aid), OUTCOMES.index(led[aid][0])

    # groups in order: class by name, then completed, timeout, cancelled; a group's rows adjacent
    assert [group(a) for a in rows] == sorted(group(a) for a in rows)
    labels = []
    for g in sorted({group(a) for a in rows}):
        members = [a for a in rows if group(a) == g]
        labels.append(f"{g[0]} · {OUTCOMES[g[1]]} ({len(members)})")
        # the slowest first in each group (client E2E, else the client's span to its terminal event)
        assert [led[a][1] for a in members] == sorted((led[a][1] for a in members), reverse=True), g
        assert members == sorted(members, key=lambda a: (-led[a][1], a))
    assert rendered["groups"] == labels and len(labels) == 6
    # each row from its attempt's send by default (the engine queue starts 1 ms after it, the arrival 0.5 ms
    # before), or on the run's clock from the menu
    t = timing(int(rows[0][1:]))
    assert rendered["sent"] == {"queue": 1.0, "arrival": -0.5,
                                "title": "ms since each attempt was sent (enqueued, without a send; clock mono:gen)"}
    assert rendered["run"] == {"queue": t["enqueued"], "arrival": t["base"],
                               "title": "ms since the run's first event (clock mono:gen)"}
    # in arrival order on request: the same groups, each in arrival order
    assert rendered["arrival"] == sorted(rows, key=lambda a: (group(a), int(a[1:])))
    assert rendered["ticks"] == rendered["arrival"]
    # zoomed to the second group: its rows only (the axis runs down)
    first = len([a for a in rows if group(a) == sorted({group(a) for a in rows})[0]])
    n = int(re.search(r"\((\d+)\)$", labels[1]).group(1))
    assert rendered["zoom"] == [first + n - 0.5, first - 0.5]
    # the drill-down's list follows the timeline's order
    drilled = [o.split(" — ")[0] for o in rendered["options"]]
    assert len(drilled) == 120 and drilled == [a for a in rows if a in set(drilled)]
    print(f"report of {N} attempts: {res.bytes / 1e6:.2f} MB in {seconds:.2f} s")


def test_the_drill_down_is_a_formatted_page_of_one_attempt(long_run, rendered):
    """The first attempt of the drill-down's list, every figure by hand from its times."""
    aid = rendered["options"][0].split(" — ")[0]
    i = int(aid[1:])
    t = timing(i)
    assert i % 10 not in (3, 7)  # completed: the slowest completed attempt of its class comes first
    e2e = t["done"] - t["sent"]
    assert rendered["options"][0] == f"{aid} — {'long' if i % 3 == 0 else 'chat'} · completed — {e2e:.1f} ms — " \
                                     "slowest end to end"
    assert rendered["title"].startswith(f"attempt {aid} · task T{i:04d} · request R{i:04d} · attempt 1 of its "
                                        f"request · {'long' if i % 3 == 0 else 'chat'} · completed · drawn because: ")
    assert rendered["accounts"] == [["attempt", aid], ["client status", "completed"], ["server status", "completed"],
                                    ["task outcome", "success"], ["resource status", "unknown"]]
    metrics = dict(rendered["metrics"])
    ttft = t["tokens"][0] + 0.75 - t["sent"]
    assert metrics["ttft_client_ms"] == f"{ttft:.3f} ms"
    assert metrics["e2e_client_ms"] == f"{e2e:.3f} ms"
    assert metrics["ttft_server_ms"] == f"{t['tokens'][0] - t['enqueued']:.3f} ms"
    assert metrics["queue_ms"] == f"{t['scheduled'] - t['enqueued']:.3f} ms"
    assert metrics["n_output_tokens"] == str(t["n"]) and metrics["good"] == "yes"
    assert metrics["server_evidence"] == "observed"
    causes = dict(rendered["causes"])
    assert causes["late"] == "no" and causes["deadline"] == "5000.000 ms"
    # the server held it from its receipt: its front end (received -> enqueued) and the engine's queue
    assert causes["server_queue"] == f"{t['scheduled'] - t['received']:.3f} ms"
    assert causes["preemption"] == "0.000 ms" and causes["evidence"] == "observed"
    assert causes["own prefill (not a cause)"] == f"{t['tokens'][0] - t['scheduled']:.3f} ms"
    # the intervals: a row each, a bar each (one clock), the engine's queue among them with its exact times
    origin = 0.0  # the axis starts at the first arrival (attempt 0 at 0 ms)
    queue = next(r for r in rendered["intervals"] if r[0] == "engine" and r[1] == "queue")
    assert queue[3:6] == [f"{t['enqueued'] - origin:.3f}", f"{t['scheduled'] - origin:.3f}",
                          f"{t['scheduled'] - t['enqueued']:.3f}"]
    assert rendered["bars"] == len(rendered["intervals"]) >= 5
    # the evidence: its events with their attrs as text, not JSON
    done = next(r for r in rendered["events"] if r[1] == "attempt.done")
    assert done[0] == f"{t['done']:.3f}"
    assert done[6] == f"finish_reason: stop; usage: (completion_tokens {t['n']}, prompt_tokens 32)"
    assert not any(r[6].startswith("{") for r in rendered["events"])


def test_screenshots_show_the_grouped_timeline_and_the_drill_downs_bars(long_run, tmp_path):
    """Headless screenshots (kept in the test's tmp folder) of the timeline zoomed to its first group and of
    the drill-down: both drawn, the engine's prefill and decode colours among their pixels."""
    _run, res, _ = long_run
    html = res.path.read_text(encoding="utf-8")
    zoom = ("<script>window.addEventListener('load',function(){var g=document.querySelector('.tl-group');"
            "g.value='0';g.dispatchEvent(new Event('change'));});</script>")
    prefill, decode = bytes((0x1F, 0x77, 0xB4)), bytes((0x2C, 0xA0, 0x2C))
    for name, css, script in (("timeline", "main>section:not(#a-timeline),main>h2,#a-timeline>.drill{display:none}", zoom),
                              ("drill", "main>section:not(#a-timeline),main>h2,#a-timeline>*:not(.drill){display:none}",
                               "")):
        page = tmp_path / f"{name}.html"
        page.write_text(html.replace("</head>", f"<style>{css}</style></head>", 1).replace("</body>", script + "</body>", 1),
                        encoding="utf-8")
        shot = tmp_path / f"{name}.png"
        proc = _chromium(tmp_path, "--hide-scrollbars", "--window-size=1400,1800", f"--screenshot={shot}", page.as_uri())
        assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
        w, h, colours = png_pixels(shot)
        assert (w, h) == (1400, 1800) and len(colours) > 20, f"{name}: a near-blank screenshot"
        assert any(c[:3] == prefill for c in colours) and any(c[:3] == decode for c in colours), name
        print(f"screenshot: {shot}")
