"""The report's panels for one run, each from the ledger table its heading names (docs/REPORT.md)."""
from __future__ import annotations

from inferledger.probes.run_folder import MANIFEST_FILE
from inferledger.report import data as rd
from inferledger.report import figs, tables
from inferledger.report.read import num
from inferledger.report.drill import drill, drill_ids
from inferledger.report.page import esc, flatten, fmt, kv_table, note, section, table
from inferledger.report.timeline import STATE_COLORS, aggregate, arrange, attempt_index, choose_sample, gantt

IDENTITY_KEYS = (("model", ("path", "sha256", "format", "quantization", "architecture", "dtype", "tokenizer",
                            "chat_template_sha256")),
                 ("engine_config", None), ("workload", ("name", "path", "sha256", "hash")), ("target", None),
                 ("host", None), ("system_under_test", None), ("evidence", None), ("source", None),
                 ("archive", None), ("served_model_name", None))


def missing(table: str, what: str) -> str:
    return (f'<p class="missing">not in this ledger: no <code>{esc(table)}</code> table, so {esc(what)} cannot be '
            "shown (this ledger was built by an inferledger without it; rebuild with "
            "<code>inferledger reconstruct RUN</code> once it exists).</p>")


def client_bound_note(rv) -> str:
    """For a client-bound run (its manifest's client.client_bound), what the client's lag does to each latency
    figure, where client-layer latencies are shown."""
    effect = tables.client_bound(rv.manifest)["effect"]
    return note(effect) if effect else ""


def verdict(rv, p: str) -> str:
    """The first screen: where the median and the p99 request's time went, the prediction met or missed
    per request class, the first cause of the run's delay (report/tables.py reads each from the ledger)."""
    body = "<h3>Where the time went (ms)</h3>"
    requests = tables.verdict_requests(rv)
    if requests:
        body += note(f"the request whose {requests[0]['e2e_layer']} E2E is nearest the run's p50 and p99 "
                     "(latency_percentiles); its stretches from attempt_causes: queue = client + server queue, "
                     "prefill and decode its own work, contention the CPU wait of its steps, transport and the "
                     "client's own delay; held: the client's time from creating it to its end, which the stretches "
                     "divide (its client queue lies before the send, outside the E2E); asleep: of its prefill, decode "
                     "and stalls, the time its steps' thread slept on a lock (in a Python server the interpreter, "
                     "held by the front end or a full garbage collection; steps.blocked_ms)", "source")
        body += table(["request", "attempt", "E2E", "held", *(n.removesuffix("_ms") for n, _ in tables.VERDICT_COLUMNS)],
                      [[r["request"], r["attempt_id"], fmt(r["e2e_ms"]), fmt(r["held_ms"]),
                        *(fmt(r[n]) for n, _ in tables.VERDICT_COLUMNS)]
                       for r in requests])
        if requests[0]["e2e_layer"] == "client":
            body += client_bound_note(rv)
    else:
        body += note("no request with an E2E time (or a ledger without attempt_causes)")
    body += "<h3>The prediction, per request class</h3>"
    pred = tables.verdict_prediction(rv)
    if pred:
        body += table(["class", "prompt tokens", "figure", "measured p50 (ms)", "predicted range (ms)", "range", "verdict",
                       "off"],
                      [[r["class"], r["prompt_tokens"], r["figure"].upper(), fmt(r["measured_p50_ms"]),
                        f"{fmt(r['predicted_low_ms'])} – {fmt(r['predicted_high_ms'])}", r["basis"], r["verdict"],
                        "" if r["off_pct"] is None else f"{r['off_pct']:+.0f} %"] for r in pred])
        for basis in dict.fromkeys(r["basis"] for r in pred):
            body += note(f"{basis}: the ranges {tables.PREDICTION_BASIS[basis]}; queueing is not in them")
    else:
        body += note("no registered prediction (prediction_check has no row)")
    c = tables.verdict_cause(rv)
    if c["diagnosed"] is None:
        cause, sub = "unknown", "this ledger has no run_diagnosis"
    elif c["first_cause"] is None:
        cause, sub = "none measured", c["evidence"]
    elif c["first_cause_share"] is None:  # 'unknown': a cause that could be the largest is not measured
        cause, sub = c["first_cause"], c["evidence"]
    else:
        then = f"then {c['next_cause']} {c['next_cause_share']:.0%}; " if c["next_cause"] else ""
        cause, sub = f"{c['first_cause']} {c['first_cause_share']:.0%}", then + c["evidence"]
    what = c["what"] or "first cause"
    body += (f'<h3>Why</h3><div class="big"><div><span>{esc(what)}</span><b>{esc(cause)}</b>'
             f'<span>{esc(sub)}</span></div></div>')
    return section(f"{p}-verdict", "Verdict", body,
                   "latency_percentiles, attempt_causes, prediction_check, run_diagnosis (scope run)")


def identity(rv, p: str) -> str:
    m = rv.manifest
    c = rd.counts(rv)
    facts = [("run", rv.name), ("run folder", str(rv.run_dir)), ("events", c["events"]), ("attempts", c["attempts"]),
             ("tasks", c["tasks"]), ("gap register rows", c["gaps"])]
    if m is None:
        return section(f"{p}-identity", f"Run identity: {rv.name}",
                       kv_table(facts) + note(f"no run identity: {rv.manifest_error}"), MANIFEST_FILE)
    parts = []
    for key, keep in IDENTITY_KEYS:
        v = m.get(key)
        if v is None:
            continue
        if isinstance(v, dict):
            sub = {k: v[k] for k in keep if k in v} if keep else v
            parts.append(f"<h3>{esc(key)}</h3>" + kv_table(flatten(sub)))
        else:
            facts.append((key, v))
    if "workload" not in m:
        facts.append(("workload", f"not recorded in {MANIFEST_FILE}"))
    full = kv_table(flatten(m, depth=4))
    body = (kv_table(facts) + '<div class="cols">' + "".join(f"<div>{x}</div>" for x in parts) + "</div>"
            + f"<details><summary>the whole {MANIFEST_FILE}</summary>{full}</details>")
    return section(f"{p}-identity", f"Run identity: {rv.name}", body, f"{MANIFEST_FILE} and the ledger's row counts")


def headline(rv, p: str, h: dict) -> str:
    c = h["counts"]
    if h["source"] == "run_metrics":
        src = ("run_metrics (t_obs_s, window, n_good, goodput_rps, completed_rps, vllm_goodput_rps, "
               "output_tok_s, total_tok_s, computed_tok_s, energy_per_good_j, gpu_s_per_good)")
        said = (h["run_metrics"] or {}).get("window")
        window = f"T_obs = {fmt(h['t_obs_s'], 3)} s (run_metrics.t_obs_s)" + (f": {said}" if said else "")
    else:
        src = "unknown: this ledger has no run_metrics table (goodput and its window are defined there)"
        window = f"no observation window: rebuild the ledger with <code>inferledger reconstruct {esc(str(rv.run_dir))}</code>"
    energy = (f"{fmt(h['energy_per_good_j'], 2)} J" if h["energy_per_good_j"] is not None else "unknown")
    cards = [("goodput", f"{fmt(h['goodput_rps'], 3)} req/s", "good results (correct and on time) / T_obs"),
             ("completed throughput", f"{fmt(h['completed_rps'], 3)} req/s", "client-completed attempts / T_obs"),
             ("good results", f"{fmt(h['n_good'])} of {fmt(c['judged'])} judged attempts",
              f"{tables.counted(c['attempts'], 'attempts')} ({fmt(c['completed'])} completed at the client) for "
              f"{tables.tasks_text(tables.task_outcomes(rv))}"),
             ("energy per good result", energy, "run_metrics.energy_per_good_j")]
    rm = h["run_metrics"] or {}
    if rm.get("vllm_goodput_rps") is not None:
        cards.insert(2, ("vLLM-style goodput", f"{fmt(rm['vllm_goodput_rps'], 3)} req/s",
                         f"{tables.slo_text(rm.get('slo_ttft_ms'), rm.get('slo_tpot_ms'), rm.get('slo_e2e_ms'))}; "
                         "latency only, answers not checked (run_metrics.vllm_goodput_rps)"))
    if rm.get("output_tok_s") is not None:
        cards.append(("output tokens/s", f"{fmt(rm['output_tok_s'], 1)} tok/s",
                      f"{fmt(rm.get('total_tok_s'), 1)} with prompt tokens as peers count them (cached included), "
                      f"{fmt(rm.get('computed_tok_s'), 1)} computed (run_metrics.*_tok_s)"))
    if h["gpu_s_per_good"] is not None:
        cards.append(("GPU-seconds per good result", fmt(h["gpu_s_per_good"], 3), "run_metrics.gpu_s_per_good"))
    big = '<div class="big">' + "".join(f"<div><span>{esc(a)}</span><b>{esc(b)}</b><span>{esc(s)}</span></div>"
                                        for a, b, s in cards) + "</div>"
    body = big + note(window, "source")
    if h["energy_per_good_j"] is None:
        body += note(f"energy per good result is unknown: {h['energy_reason']}")
    rows = [[r["metric"], r["layer"], tables.counted(r["n"], r["of"]), *r["values"], r["column"]]
            for r in tables.latency(rv)]
    body += "<h3>Latency by observation layer (ms)</h3>" + client_bound_note(rv) + table(
        ["metric", "layer", "n", "p50", "p90", "p99", "max", "ledger column"], rows)
    if rv.has("peer_views"):
        peers = rv.all("SELECT metric, tool, definition, weighting, n, mean_ms, p50_ms, p90_ms, p99_ms FROM peer_views")
        if any(r[4] for r in peers):
            body += ("<h3>The same names in other tools (ms)</h3>"
                     + note("peer_views: each tool's definition applied to this run's client events, over the "
                            "attempts the client saw complete; docs/LEDGER.md gives every formula")
                     + table(["metric", "tool", "definition", "weighting", "n", "mean", "p50", "p90", "p99"],
                             [[m, t, d, w, n, *[fmt(v, 1) for v in vals]] for m, t, d, w, n, *vals in peers]))
    body += peer_comparison_html(rv)
    if h["run_metrics"]:
        body += "<details><summary>run_metrics row</summary>" + kv_table(h["run_metrics"].items()) + "</details>"
    return section(f"{p}-headline", "Headline figures", body, src)


def peer_comparison_html(rv) -> str:
    """For a run imported from a load tool: its own numbers, ours on the same requests, the engine's, why."""
    if not rv.has("peer_comparison"):
        return ""
    rows = rv.all("SELECT metric, reporter, tool_n, tool_mean_ms, tool_p50_ms, tool_p99_ms, ours_n, ours_mean_ms, "
                  "ours_p50_ms, ours_p99_ms, server_n, server_mean_ms, server_p50_ms, server_p99_ms, reason "
                  "FROM peer_comparison WHERE imported")
    if not rows:
        return ""

    def three(n, *vals) -> str:
        return "—" if not n else " / ".join(fmt(v, 1) for v in vals)

    return (f"<h3>{esc(rows[0][1])}: its own numbers beside ours on the same requests (ms)</h3>"
            + note("peer_comparison: the tool's reading reproduced from its own records, our client definition on "
                   "the same events, the engine's account of the same attempts; mean / p50 / p99")
            + table(["metric", "the tool's", "ours (client)", "engine", "why they differ"],
                    [[r[0], three(*r[2:6]), three(*r[6:10]), three(*r[10:14]), r[14]] for r in rows]))


def timeline(rv, page, p: str, tb, detail_limit: int, drill_limit: int) -> str:
    atts = attempt_index(rv, tb)
    if not atts:
        return section(f"{p}-timeline", "Per-request timeline", note("the ledger has no attempts"))
    body = ""
    agg, stream = aggregate(rv, tb)
    if agg:
        body += (f"<h3>Attempts in each {esc(stream)} state over time (all {len(atts):,} attempts)</h3>"
                 + page.figure(f"{p}-agg", agg))
    sample = choose_sample(atts, detail_limit)
    rows = arrange(atts, sample)
    fig, left = gantt(rv, tb, sample, rows)
    what = (f"all {len(atts):,} attempts" if len(sample) == len(atts) else
            f"{len(sample):,} of {len(atts):,} attempts: the slowest end to end and to first token, the ones not "
            "completed on every layer, and an even spread by arrival (hover a row for why it was drawn)")
    body += (f"<h3>One row per attempt: {esc(what)}</h3>"
             '<p class="source">grouped by ' + ("replica, then " if any(a["replica"] is not None for a in atts) else "")
             + 'task class, then outcome (the client status; the server status without '
             "client events); in each group the slowest first (client E2E, else the client's time to its terminal "
             "event, else server E2E), each row from its attempt's send (or all on the run's clock). Wide pale bar: client stream; narrow bar: engine stream; triangle: arrival "
             "(the task's arrival.planned, else the attempt's creation); ticks: prefill chunks; crosses: "
             "cancellations, timeouts, errors. Drag a box to zoom on time and rows, pick a group to zoom to its "
             "rows, double-click to reset; click a row to open it in the drill-down.</p>"
             f'<div class="filters tl-controls" data-fig="{esc(p)}-gantt"><label>rows in each group '
             '<select class="tl-order"><option value="slowest">slowest first</option>'
             '<option value="arrival">in arrival order</option></select></label>'
             '<label>time <select class="tl-time"><option value="sent">from each attempt\'s send</option>'
             '<option value="run">on the run\'s clock</option></select></label>'
             '<label>zoom to <select class="tl-group"><option value="">every group</option></select></label></div>'
             + page.figure(f"{p}-gantt", fig))
    if left["intervals"]:
        body += note(f"{left['intervals']} intervals or markers are on clocks with no mapping to {tb.ref} "
                     f"({', '.join(left['clocks'])}) and are not drawn on this axis (the drill-down lists them).")
    if left["unanchored"]:
        body += note(f"{left['unanchored']} markers belong to attempts with neither a send nor an interval on this "
                     "axis, so they have no row start and are not drawn (the drill-down lists them).")
    row_of = {aid: i for i, aid in enumerate(rows["orders"]["slowest"])}
    ids = sorted(drill_ids(sample, drill_limit), key=row_of.__getitem__)  # in the timeline's order
    by_id = {a["id"]: a for a in atts}
    slowest = rows["orders"]["slowest"]
    group_of = {aid: g["label"] for g in rows["groups"] for aid in slowest[g["first"]:g["first"] + g["n"]]}
    page.data["drill"][p] = [{**d, "group": group_of[d["id"]],
                              "took_ms": by_id[d["id"]]["e2e"]} for d in drill(rv, tb, ids, dict(sample))]
    page.data["gantt"][f"{p}-gantt"] = p
    page.data["timeline"][f"{p}-gantt"] = rows
    page.data["colors"] = STATE_COLORS
    body += (f'<h3>Drill-down: one attempt ({len(ids):,} attempts available, in the timeline\'s order)</h3>'
             f'<div class="drill" data-key="{esc(p)}"><select aria-label="attempt"></select>'
             '<h4 class="drill-title"></h4><div class="cols">'
             '<div><h4>The four accounts</h4><table class="kv drill-accounts"></table></div>'
             '<div><h4>Causes of delay (attempt_causes, ms)</h4><table class="kv drill-causes"></table></div>'
             '<div><h4>Figures (request_metrics)</h4><table class="kv drill-metrics"></table></div></div>'
             '<h4>Intervals (ms on the report axis)</h4><table class="grid drill-intervals"><thead><tr><th>stream</th>'
             "<th>interval</th><th>kind</th><th>start</th><th>end</th><th>duration</th><th>±</th><th>label</th>"
             "<th>on the path</th><th>when, within the attempt</th></tr></thead><tbody></tbody></table>"
             '<div class="plot drill-plot" id="' + esc(p) + '-drill-plot"></div>'
             "<h4>Evidence: the attempt's events (output events drawn above)</h4><div class=\"scroll\">"
             '<table class="grid drill-events"><thead><tr><th>ms</th><th>event</th><th>source</th><th>clock</th>'
             "<th>ts_ns</th><th>value</th><th>attrs</th><th>event_id</th></tr></thead><tbody></tbody></table>"
             "</div></div>")
    return section(f"{p}-timeline", "Per-request timeline", body,
                   f"intervals (stream, name, start_ns, end_ns, label) and events, on clock {tb.ref}")


def itl(rv, page, p: str) -> str:
    hist = rd.itl_histogram(rv)
    if not hist:
        return section(f"{p}-itl", "Inter-token latency", note("the itl table is empty (no output events)"), "itl")
    maxes = [[layer, h["max_ms"], sum(h["counts"])] for layer, h in sorted(hist.items())]
    body = page.figure(f"{p}-itl-fig", figs.itl_fig([(rv.name, hist)])) + table(
        ["layer", "maximum ITL, ms", "gaps"], maxes)
    return section(f"{p}-itl", "Inter-token latency: distribution and maximum per layer", body,
                   "itl.gap_ms per layer (a chunk is a gap, not a token); per-attempt maxima in the latency table")


def ttft(rv, page, p: str) -> str:
    rows, n = rd.ttft_pairs(rv)
    if not rows:
        return section(f"{p}-ttft", "TTFT: client vs server",
                       note("no attempt has both ttft_client_ms and ttft_server_ms (one layer is missing)"))
    return section(f"{p}-ttft", "TTFT: client vs server", page.figure(f"{p}-ttft-fig", figs.ttft_fig(rows, n)),
                   "request_metrics.ttft_client_ms against request_metrics.ttft_server_ms")


def kv(rv, page, p: str, tb) -> str:
    series = rd.kv_series(rv, tb)
    if not series:
        return section(f"{p}-kv", "KV blocks over time",
                       note("no kv_blocks_used / cached / free samples in this run"), "samples")
    body = page.figure(f"{p}-kv-fig", figs.kv_fig(series, tb.ref))
    if series["other_clocks"]:
        body += note(f"KV samples on other clocks not drawn: {', '.join(series['other_clocks'])}")
    return section(f"{p}-kv", "KV blocks over time", body,
                   f"samples kv_blocks_used / cached / free, mean per {series['bucket_ms']:.3f} ms bucket")


def critical(rv, page, p: str, top: int = 3) -> str:
    if not rv.has("critical_path"):
        return section(f"{p}-critical", "Critical path of the slowest tasks", missing("critical_path", "the waterfall"))
    has_scope = "scope" in rv.columns("critical_path")
    scope_col = "scope" if has_scope else "NULL"
    # the slowest task scopes (attempt scopes when the run has no task graph)
    scopes = rv.all(f"SELECT * FROM (SELECT {scope_col} AS sc, scope_id, max(start_ms + dur_ms) AS end_ms "
                    "FROM critical_path GROUP BY 1, 2) ORDER BY (sc = 'task') DESC NULLS LAST, end_ms DESC NULLS LAST, "
                    f"scope_id LIMIT {int(top)}")
    body = ""
    for i, (scope, scope_id, _end) in enumerate(scopes):
        where = "scope_id = $id" + (" AND scope = $scope" if has_scope else "")
        params = {"id": scope_id, **({"scope": scope} if has_scope else {})}
        nodes = rv.all(f"SELECT node, start_ms, dur_ms, slack_ms, on_path FROM critical_path WHERE {where} "
                       "ORDER BY start_ms, node", params)
        body += page.figure(f"{p}-cp-{i}", figs.waterfall_fig(f"{scope or 'scope'} {scope_id}", nodes))
    return section(f"{p}-critical", "Critical path of the slowest tasks", body or note("critical_path is empty"),
                   "critical_path (scope, scope_id, node, start_ms, dur_ms, slack_ms, on_path)")


def accounts(rv, page, p: str) -> str:
    counts = tables.account_counts(rv)
    small = "".join(f"<div>{table([name, tables.ACCOUNT_COUNTS[name]], rows)}</div>" for name, rows in counts.items())
    cols, rows = rd.account_rows(rv)
    page.data["accounts"][p] = {"cols": cols, "rows": rows}
    body = (f'<div class="cols">{small}</div><div class="acct" data-key="{esc(p)}"><div class="filters"></div>'
            '<div class="scroll"><table class="grid"><thead></thead><tbody></tbody></table></div></div>')
    return section(f"{p}-accounts", "The four accounts", body,
                   "accounts (client, server, resource status), tasks.outcome, request_metrics")


def diagnosis(rv, page, p: str) -> str:
    body = "<h3>Reconciliation</h3>"
    if rv.has("reconciliation"):
        cols, rows, _n = rd.table_rows(rv, "reconciliation")
        body += "".join(kv_table(zip(cols, r)) for r in rows) or note("reconciliation is empty")
    else:
        body += missing("reconciliation", "created / sent / received / completed counts and ghost load")
    body += "<h3>SLO misses and their causes</h3>"
    if rv.has("slo_misses"):
        cols, rows, n = rd.table_rows(rv, "slo_misses", limit=300)
        cause = next((c for c in cols if c == "cause"), next((c for c in cols if "cause" in c), None))
        # the causes' columns (an attempt's own prefill and decode work is not a cause)
        causes_ms = [c for c in cols if c.endswith("_ms")
                     and c not in ("deadline_ms", "done_since_reference_ms", "prefill_ms", "decode_ms")]
        plots = ""
        if cause:
            by = rv.all(f'SELECT "{cause}", count(*) FROM slo_misses GROUP BY 1 ORDER BY 2 DESC, 1')
            plots += "<div>" + page.figure(f"{p}-slo-fig", figs.count_bar(
                [b[0] for b in by], [b[1] for b in by], f"misses by {cause} ({n:,} misses)")) + "</div>"
        if causes_ms and n:
            sums = rv.one("SELECT " + ", ".join(f'sum("{c}")' for c in causes_ms) + " FROM slo_misses")
            plots += "<div>" + page.figure(f"{p}-slo-ms", figs.count_bar(
                causes_ms, [num(v) for v in sums], "ms charged to each cause, all misses")) + "</div>"
        body += f'<div class="cols">{plots}</div>' if plots else ""
        body += (note(f"first {len(rows)} of {n:,} rows") if n > len(rows) else "")
        body += f'<div class="scroll">{table(cols, rows)}</div>'
    else:
        body += missing("slo_misses", "the causes of SLO misses")
    if rv.has("run_diagnosis"):
        cols, rows, _n = rd.table_rows(rv, "run_diagnosis")
        body += "<h3>The run's diagnosis</h3>" + f'<div class="scroll">{table(cols, rows)}</div>'
    return section(f"{p}-diagnosis", "Reconciliation and SLO misses", body, "reconciliation, slo_misses, run_diagnosis")


def gaps(rv, p: str) -> str:
    cols, rows, n = rd.table_rows(rv, "gaps", order="origin, gap_id")
    if not n:
        return section(f"{p}-gaps", "Gap register", note("no gaps: every figure had its evidence", "source"), "gaps")
    more = note(f"first {len(rows):,} of {n:,} rows (query: select * from gaps)") if n > len(rows) else ""
    return section(f"{p}-gaps", f"Gap register ({n:,})", more + f'<div class="scroll">{table(cols, rows)}</div>',
                   "gaps (gap_id, scope, subject_id, affects, needs, detail, origin)")
