"""The figure tables a run's report and its terminal summary both show, read here once.

The verdict (where the median and the p99 request's time went, the prediction met or missed per
request class, the first cause of the run's delay), the latency table (the ledger's
`latency_percentiles`: percentiles per metric and observation layer) and the counts of the four
accounts. Every number is a ledger column (docs/LEDGER.md).
"""
from __future__ import annotations

from inferledger.report.read import RunView, num


def latency(rv: RunView) -> list[dict]:
    """The ledger's latency_percentiles rows in its order (`values`: p50, p90, p99, max in ms); ITL and
    max-ITL rows of a layer with no values are left out."""
    from inferledger.ledger.query import LedgerError

    if not rv.has("latency_percentiles"):
        raise LedgerError(f"{rv.run_dir}: this ledger has no latency_percentiles table (built by an older "
                          f"version): rebuild it with `inferledger reconstruct {rv.run_dir}`")
    rows = rv.all("SELECT metric, label, source_column, sample, n, p50_ms, p90_ms, p99_ms, max_ms FROM latency_percentiles "
                  "WHERE n > 0 OR metric NOT IN ('ITL', 'max ITL') ORDER BY position")
    return [{"metric": m, "layer": label, "column": col, "n": n, "of": f"{sample}s", "values": [num(v) for v in vals]}
            for m, label, col, sample, n, *vals in rows]


def counted(n, of: str) -> str:
    """A count with what it counts (`of` in the plural), as `106 attempts`, `1 task`: a headline never leaves
    attempts and tasks to guess."""
    return "— " + of if n is None else f"{n:,} {of.removesuffix('s') if n == 1 else of}"


def task_outcomes(rv: RunView) -> list[tuple[str, int]]:
    """(outcome, tasks) from the task account, most first."""
    return rv.all("SELECT coalesce(outcome, 'unknown'), count(*) FROM tasks GROUP BY 1 ORDER BY 2 DESC, 1")


def tasks_text(outcomes: list[tuple[str, int]]) -> str:
    """`72 tasks: success 48, failure 24` (the task account, beside an attempt count)."""
    n = sum(k for _, k in outcomes)
    return counted(n, "tasks") + (": " + ", ".join(f"{o} {k:,}" for o, k in outcomes) if outcomes else "")


ACCOUNT_COUNTS = {"client": "attempts", "server": "attempts", "task": "tasks", "resource": "attempts"}


def account_counts(rv: RunView) -> dict[str, list[tuple]]:
    """(status, n) per account: client and server statuses and resources per attempt, outcome per task
    (what each counts: ACCOUNT_COUNTS)."""
    return {
        # a router's try the client never saw is no attempt of the client's (attempts.client_attempt): named so
        "client": rv.all("SELECT CASE WHEN a.client_attempt IS FALSE THEN '(a router''s try)' "
                         "ELSE coalesce(c.client_status, '(no client events)') END AS status, count(*) "
                         "FROM accounts c JOIN attempts a USING (attempt_id) GROUP BY 1 ORDER BY 1"),
        "server": rv.all("SELECT server_status, count(*) FROM accounts GROUP BY 1 ORDER BY 1"),
        "task": rv.all("SELECT outcome, count(*) FROM tasks GROUP BY 1 ORDER BY 1"),
        "resource": rv.all("SELECT resource_status, count(*) FROM accounts GROUP BY 1 ORDER BY 1"),
    }


def slo_text(ttft_ms, tpot_ms, e2e_ms) -> str:
    """The declared thresholds of the vLLM-style goodput, as `TTFT ≤ 300 ms, TPOT ≤ 100 ms`."""
    parts = [f"{name} ≤ {v:g} ms" for name, v in (("TTFT", ttft_ms), ("TPOT", tpot_ms), ("E2E", e2e_ms))
             if v is not None]
    return ", ".join(parts)


# the verdict's stretches of a request, disjoint: the ledger column each is read from (attempt_causes);
# prefill and decode are its own work, the causes inside those phases beside them
WHERE_TIME_WENT = (("queue_ms", "c.client_queue_ms + c.server_queue_ms"), ("prefill_ms", "c.prefill_work_ms"),
                   ("decode_ms", "c.decode_work_ms"), ("interference_ms", "c.prefill_interference_ms"),
                   ("contention_ms", "c.host_contention_ms"),
                   ("stalls_ms", "c.preemption_ms + c.decode_stall_ms + c.spec_rejected_ms"),
                   ("transport_ms", "c.transport_ms"), ("client_ms", "c.client_ms"))
# beside the stretches, inside them: how long the request's steps slept on a lock (the interpreter: a full
# collection, the front end), in its prefill, decode and stalls above
WITHIN = (("asleep_ms", "c.blocked_ms"),)
VERDICT_COLUMNS = WHERE_TIME_WENT + WITHIN  # the verdict's columns after request, attempt, E2E and held


def verdict_requests(rv: RunView) -> list[dict]:
    """Where the time went for the median and the p99 request: the attempt whose E2E (the client's, else
    the server's) is nearest that percentile of latency_percentiles, its stretches from attempt_causes, and
    held_ms, what they divide: the client's time from creating the attempt to its end (client_span_ms; its
    client queue lies before the send, outside the E2E; an attempt it let go of ends there, the server's
    E2E maybe long after)."""
    if not (rv.has("attempt_causes") and rv.has("latency_percentiles")):
        return []
    out = []
    for layer in ("client", "server"):
        pct = rv.one("SELECT p50_ms, p99_ms FROM latency_percentiles WHERE source_column = $c",
                     {"c": f"request_metrics.e2e_{layer}_ms"})
        if pct and pct[0] is not None:
            break
    else:
        return []
    cols = ", ".join(f"{sql} AS {name}" for name, sql in VERDICT_COLUMNS)
    for which, target in zip(("p50", "p99"), pct):
        row = rv.one(f"SELECT c.attempt_id, r.e2e_{layer}_ms, r.client_span_ms, {cols} FROM attempt_causes c "
                     f"JOIN request_metrics r USING (attempt_id) WHERE r.e2e_{layer}_ms IS NOT NULL "
                     f"ORDER BY abs(r.e2e_{layer}_ms - $t), c.attempt_id LIMIT 1", {"t": target})
        if row:
            out.append({"request": which, "attempt_id": row[0], "e2e_layer": layer, "e2e_ms": num(row[1]),
                        "held_ms": num(row[2]), **{name: num(v) for (name, _), v in zip(VERDICT_COLUMNS, row[3:])}})
    return out


def against_range(measured, low, high) -> tuple[str, float | None]:
    """met / above / below the predicted range, and by how much (% of the edge it passed)."""
    if measured is None or low is None or high is None:
        return "unknown", None
    if measured > high:
        return "missed: above", 100.0 * (measured - high) / high if high else None
    if measured < low:
        return "missed: below", 100.0 * (measured - low) / low if low else None
    return "met", 0.0


PREDICTION_BASIS = {"step fit": "through the registered step fit (the engine's own efficiency, from an earlier run)",
                    "roofs": "at the measured roofs (the engine at the device's rates, without its own "
                             "efficiency; register a step fit: `inferledger capture ... --fit RUN`, or `predict --fit RUN` for a file)"}


def verdict_prediction(rv: RunView) -> list[dict]:
    """The registered prediction against the run, per request class and shape (prediction_check): each
    figure's median against its expected range: the step fit's where the prediction carries one (the engine
    as an earlier run measured it), else the sustained roofs' (`basis`)."""
    if not rv.has("prediction_check"):
        return []
    out = []
    rows = rv.all("SELECT class, prompt_tokens, n_attempts, ttft_p50_ms, ttft_sustained_low_ms, ttft_sustained_high_ms, "
                  "ttft_fit_low_ms, ttft_fit_high_ms, tpot_p50_ms, tpot_sustained_low_ms, tpot_sustained_high_ms, "
                  "tpot_fit_low_ms, tpot_fit_high_ms FROM prediction_check ORDER BY class, prompt_tokens")
    for cls, prompt, n, *vals in rows:
        for figure, (measured, s_low, s_high, f_low, f_high) in (("ttft", vals[0:5]), ("tpot", vals[5:10])):
            fitted = f_low is not None and f_high is not None
            low, high = (f_low, f_high) if fitted else (s_low, s_high)
            verdict, off = against_range(num(measured), num(low), num(high))
            out.append({"class": cls, "prompt_tokens": prompt, "n_attempts": n, "figure": figure,
                        "measured_p50_ms": num(measured), "predicted_low_ms": num(low), "predicted_high_ms": num(high),
                        "basis": "step fit" if fitted else "roofs", "verdict": verdict, "off_pct": off})
    return out


DIAGNOSIS_COLUMNS = ("diagnosed", "n_attempts", "n_late", "first_cause", "first_cause_share", "evidence")


def verdict_cause(rv: RunView) -> dict:
    """The first cause of the run's delay, its share and evidence: run_diagnosis' run row; `what` says whose
    delay it is (the late attempts', or every attempt's when none was late), and `next_cause` /
    `next_cause_share` the cause with the next largest share (None when no other cause shared the delay, or
    when the first cause's share is unknown). On a busy host the engine's wait for a CPU can be the largest
    cause; the next one is then what the run would show on a quiet host."""
    cols, rows = rv.dicts("SELECT * FROM run_diagnosis WHERE scope = 'run'") if rv.has("run_diagnosis") else ([], [])
    row = dict(zip(cols, rows[0])) if rows else {}
    out = {c: num(v) if isinstance(v, float) else v for c, v in ((c, row.get(c)) for c in DIAGNOSIS_COLUMNS)}
    out["what"] = None if not row else ("first cause of SLO misses" if row["diagnosed"] == "late"
                                        else "largest cause of delay (no request was late)")
    shares = {c[:-len("_share")]: num(v) for c, v in row.items()
              if c.endswith("_share") and c != "first_cause_share" and c[:-len("_share")] != row.get("first_cause")}
    known = {c: v for c, v in shares.items() if v}  # a cause with no share (0 or unknown) is not a next cause
    nxt = max(known, key=known.get) if known and out["first_cause_share"] is not None else None
    out["next_cause"], out["next_cause_share"] = nxt, (known[nxt] if nxt else None)
    return out


def client_bound(manifest: dict | None) -> dict:
    """The load client's own delay as the capture's manifest records it (docs/CAPTURE.md, "The client's own
    overhead"), and, for a client-bound run, what it does to each latency figure (`effect`; else None)."""
    c = (manifest or {}).get("client") or {}
    p99, worst, rule = num(c.get("loop_lag_p99_ms")), num(c.get("loop_lag_max_ms")), c.get("client_bound_rule")
    out = {"client_bound": c.get("client_bound"), "loop_lag_p99_ms": p99, "loop_lag_max_ms": worst, "rule": rule,
           "effect": None}
    if c.get("client_bound") is True and p99 is not None:
        how = "; ".join(x for x in (None if worst is None else f"{worst:.2f} ms at worst", rule) if x)
        out["effect"] = (f"client-bound: the client's event loop lagged {p99:.2f} ms at p99" + (f" ({how})" if how else "")
                         + ". Client TTFT and E2E include up to that lag, each client ITL gap can be off by up to it, "
                         "client TPOT by up to it over the attempt's output tokens less one; the server and engine "
                         "figures do not include it")
    return out
