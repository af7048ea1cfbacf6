"""Exports: the Perfetto trace obeys the trace-event format's rules; OTLP spans round-trip through the
SDK with attempts + stages spans, right parent links, gen_ai attributes and ns timestamps."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_report import build_demo_run

from inferledger.report.export import export_run
from inferledger.report.export_otlp import emit_spans
from inferledger.report.read import open_run
from sample_runs import built_e0, copy_to

EPS_US = 1e-3  # 1 ns: float µs of the same ns are identical, sums may differ in the last bit


def validate_trace(trace: dict) -> dict:
    """Every rule the trace-event format and Perfetto's importer rely on; returns counts per phase."""
    events = trace["traceEvents"]
    named_pids, named_tids, used = set(), set(), set()
    slices, flows = defaultdict(list), defaultdict(list)
    stacks: dict[tuple, list] = defaultdict(list)
    counts = defaultdict(int)
    for e in events:
        ph = e["ph"]
        counts[ph] += 1
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        if ph == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index"), e
            if e["name"] == "process_name":
                named_pids.add(e["pid"])
            if e["name"] == "thread_name":
                named_tids.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"]), e
        key = (e["pid"], e["tid"])
        if ph != "C":
            used.add(key)
        if ph == "X":
            assert e["dur"] >= 0, e
            slices[key].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif ph == "B":
            stacks[key].append(e)
        elif ph == "E":
            assert stacks[key], f"E without B on {key}"
            b = stacks[key].pop()
            assert e["ts"] >= b["ts"]
            slices[key].append((b["ts"], e["ts"], b["name"]))
        elif ph == "C":
            assert e["args"] and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                     for v in e["args"].values()), e
            used.add((e["pid"], None))
        elif ph in ("s", "f"):
            flows[(e["cat"], e["name"], e["id"])].append(e)
        elif ph == "i":
            assert e.get("s") in ("t", "p", "g"), e
        else:
            raise AssertionError(f"unexpected phase {ph}")
    assert all(not s for s in stacks.values()), "B without E"
    for key, items in slices.items():  # slices on one thread nest: no partial overlap
        open_: list = []
        for s, t, name in sorted(items, key=lambda x: (x[0], -x[1])):
            while open_ and open_[-1][1] <= s + EPS_US:
                open_.pop()
            assert not open_ or t <= open_[-1][1] + EPS_US, f"{name} [{s}, {t}] overlaps {open_[-1]} on {key}"
            open_.append((s, t, name))
    for fid, pair in flows.items():
        assert sorted(x["ph"] for x in pair) == ["f", "s"], f"flow {fid} is not one s and one f"
        s, f = sorted(pair, key=lambda x: x["ph"] == "f")
        assert f["ts"] >= s["ts"] and f.get("bp") == "e" and s["pid"] == f["pid"], (s, f)
        for x in (s, f):  # each end lies inside a slice of its thread, which is what it binds to
            assert any(a - EPS_US <= x["ts"] <= b + EPS_US for a, b, _ in slices[(x["pid"], x["tid"])]), x
    pids = {p for p, _t in used}
    assert pids <= named_pids, f"processes without a name: {pids - named_pids}"
    assert {k for k in used if k[1] is not None} <= named_tids, "threads without a name"
    return dict(counts)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return build_demo_run(tmp_path_factory.mktemp("export") / "run")


def test_perfetto_trace_follows_the_format(demo, tmp_path):
    res = export_run(demo, "perfetto", tmp_path / "t.json")
    trace = json.loads(Path(res.destination).read_text())
    counts = validate_trace(trace)
    assert counts["s"] == counts["f"] == 4  # one flow per attempt, send -> receipt
    assert counts["C"] > 0 and counts["X"] > 0
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"A0 · client", "A0 · server", "A0 · engine", "A1 · engine", "engine steps"} <= names
    kv = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"].startswith("KV blocks")]
    assert kv and set(kv[0]["args"]) == {"used", "cached", "free"}
    x = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["args"].get("attempt_id") == "A1"
         and e["name"] == "preempted"]
    assert len(x) == 1 and x[0]["dur"] == 60_000.0  # µs: preempted at +5 ms, rescheduled at +65 ms
    origin = int(trace["metadata"]["axes"]["clock mono:h"]["origin_ns"])
    rv = open_run(demo)
    try:  # ts = (ns - origin) / 1000 exactly: µs as floats keep every nanosecond
        ivs = rv.all("SELECT name, start_ns, end_ns FROM intervals WHERE attempt_id = 'A1' AND stream = 'engine'")
    finally:
        rv.close()
    got = {e["name"]: (e["ts"], e["dur"]) for e in trace["traceEvents"] if e["ph"] == "X"
           and e["args"].get("attempt_id") == "A1" and e["cat"].startswith("engine")}
    for name, s, e in ivs:
        if name in got and name != "decode":
            assert got[name] == ((s - origin) / 1000, (e - s) / 1000)


def test_perfetto_keeps_unmapped_clocks_apart_and_maps_mapped_ones(tmp_path, tmp_path_factory):
    for name, n_pids in (("clocks_unmapped", 2), ("clocks_mapped", 1), ("r1_double_counted", 1)):
        run = copy_to(built_e0(tmp_path_factory, name), tmp_path / name)  # the session's build, a copy to write in
        trace = json.loads(Path(export_run(run, "perfetto").destination).read_text())
        validate_trace(trace)
        procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
        assert len(procs) == n_pids, procs
        flows = [e for e in trace["traceEvents"] if e["ph"] == "s"]
        if name == "clocks_unmapped":
            assert not flows and any("no mapping" in p for p in procs.values())
        else:
            assert flows
        if name == "r1_double_counted":  # the duplicated span is kept, nested in the one it overlaps
            dup = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "gateway_buffer"]
            assert len(dup) == 1 and dup[0]["args"]["on_path"] is False


def test_otlp_round_trips_through_the_sdk(demo):
    rv = open_run(demo)
    try:
        exporter = InMemorySpanExporter()
        stats = emit_spans(rv, exporter, batch_size=7)
        n_att, n_stages = rv.one("SELECT (SELECT count(*) FROM attempts), "
                                 "(SELECT count(*) FROM intervals WHERE start_ns IS NOT NULL)")
        created = rv.one("SELECT ts_ns FROM events WHERE attempt_id = 'A0' AND name = 'attempt.created'")[0]
    finally:
        rv.close()
    spans = exporter.get_finished_spans()
    assert len(spans) == stats.spans == n_att + n_stages and stats.attempts == n_att == 4
    roots = {s.context.span_id: s for s in spans if s.parent is None}
    assert len(roots) == n_att
    for s in spans:
        if s.parent is not None:
            root = roots[s.parent.span_id]
            assert s.context.trace_id == root.context.trace_id
            assert root.start_time <= s.start_time <= s.end_time <= root.end_time
            assert s.name == f"{s.attributes['inferledger.stream']}.{s.attributes['inferledger.stage']}"
    a0 = next(r for r in roots.values() if r.attributes["inferledger.attempt_id"] == "A0")
    assert a0.name == f"chat {a0.attributes['gen_ai.request.model']}"  # {operation} {model}, as the conventions say
    for key, want in (("gen_ai.system", "inferledger"), ("gen_ai.operation.name", "chat"),
                      ("gen_ai.usage.output_tokens", 8), ("gen_ai.usage.input_tokens", 30),
                      ("gen_ai.response.finish_reasons", ("stop",)), ("gen_ai.request.stream", True)):
        assert a0.attributes[key] == want, key
    assert "gen_ai.request.model" in a0.attributes
    assert isinstance(a0.start_time, int) and a0.start_time == created == 200_000  # the client's first point, in ns
    assert "monotonic" in a0.attributes["inferledger.time_base"]
    a2 = next(r for r in roots.values() if r.attributes["inferledger.attempt_id"] == "A2")
    assert a2.attributes["inferledger.client_status"] == "cancelled"
    assert a2.attributes["gen_ai.response.finish_reasons"] == ("cancelled",)


def test_otlp_json_lines_file(demo, tmp_path):
    res = export_run(demo, "otlp", tmp_path / "spans.jsonl")
    lines = Path(res.destination).read_text().splitlines()
    spans = [s for ln in lines for rs in json.loads(ln)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(spans) == res.counts["spans"] > 4
    ids = {s["spanId"] for s in spans}
    for s in spans:
        assert len(s["traceId"]) == 32 and len(s["spanId"]) == 16 and int(s["traceId"], 16)
        assert int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"])
        assert "parentSpanId" not in s or s["parentSpanId"] in ids


def test_export_refuses_bad_requests(demo):
    with pytest.raises(ValueError, match="unknown format"):
        export_run(demo, "jaeger")
    with pytest.raises(ValueError, match="--endpoint goes with"):
        export_run(demo, "perfetto", endpoint="http://localhost:4318")
    with pytest.raises(ValueError, match="http"):
        export_run(demo, "otlp", endpoint="localhost:4318")


def test_export_command(demo, tmp_path):
    from typer.testing import CliRunner

    from inferledger.cli.app import app

    for fmt, name in (("perfetto", "t.json"), ("otlp", "s.jsonl")):
        res = CliRunner().invoke(app, ["export", str(demo), "--as", fmt, "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        assert (tmp_path / name).stat().st_size > 0
    res = CliRunner().invoke(app, ["export", str(demo), "--as", "zipkin"])
    assert res.exit_code != 0 and "perfetto" in res.output


def test_a_derived_interval_below_zero_exports_as_zero_length(tmp_path):
    """Client and server clocks mapped with 2 ms epsilon; the server's first write lands 0.5 ms after
    the client's first chunk once mapped: a downlink of -0.5 ms ± 2 ms. Both exports keep the span
    well-formed (zero length) and carry the signed figure."""
    from ledger_util import build_run

    s = {"clock": "s", "source": "server"}
    e = {"clock": "s", "source": "engine"}
    events = [
        {"name": "attempt.created", "ms": 0}, {"name": "attempt.sent", "ms": 1},
        {"name": "server.received", "ms": 3, **s}, {"name": "engine.enqueued", "ms": 3.5, **e},
        {"name": "engine.scheduled", "ms": 4, **e}, {"name": "engine.token", "ms": 20, "value": 1, **e},
        {"name": "server.write", "ms": 20.5, "value": 1, "attrs": {"kinds": ["content"]}, **s},
        {"name": "attempt.chunk", "ms": 10, "value": 1, "attrs": {"kinds": ["content"]}},  # 20 ms on s
        {"name": "engine.finished", "ms": 21, "value": 1, "attrs": {"reason": "stop"}, **e},
        {"name": "server.done", "ms": 22, **s}, {"name": "attempt.done", "ms": 13},
    ]
    # t_c = t_s - 10 ms: server 20.5 ms is client 10.5 ms, after the chunk the client read at 10 ms
    events = [{**ev, "ms": ev["ms"] + 1000} for ev in events]  # monotonic clocks far from zero
    run = tmp_path / "neg"
    con = build_run(run, events, domains=("c", "s"), maps=[("s", "c", -10_000_000, 2_000_000, "round-trip")])
    dl = con.execute("SELECT downlink_first_ms, downlink_first_eps_ms, downlink_first_label FROM request_metrics").fetchone()
    assert dl == (pytest.approx(-0.5), pytest.approx(2.0), "derived")
    con.close()
    trace = json.loads(Path(export_run(run, "perfetto", tmp_path / "t.json").destination).read_text())
    validate_trace(trace)
    link = [ev for ev in trace["traceEvents"] if ev.get("ph") == "X" and ev["name"] == "downlink_first"]
    assert [(ev["dur"], ev["args"]["dur_ms"]) for ev in link] == [(0, pytest.approx(-0.5))]
    lines = Path(export_run(run, "otlp", tmp_path / "s.jsonl").destination).read_text().splitlines()
    spans = [sp for ln in lines for rs in json.loads(ln)["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]
    (down,) = [sp for sp in spans if sp["name"] == "link.downlink_first"]
    assert down["startTimeUnixNano"] == down["endTimeUnixNano"]
    attrs = {a["key"]: a["value"] for a in down["attributes"]}
    assert attrs["inferledger.dur_ms"]["doubleValue"] == pytest.approx(-0.5)
    assert all(int(sp["endTimeUnixNano"]) >= int(sp["startTimeUnixNano"]) for sp in spans)
