"""A capture's manifest from its first second to its end, and what a clean end writes besides.

`StartingManifest`: the manifest with state "starting" while the model loads and the prompts are
built, taken away again when that fails. `finish_run`: after a clean run, the clock mappings, the
client's lag trace, the gap rows and the full manifest (state "complete").
"""
from __future__ import annotations

import platform
import shutil
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa

from inferledger.collectors.capture.clocksync import ClockSyncFailure
from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.capture.steps import Driven, Live, Prepared
from inferledger.collectors.rundir.out_dir import check_new_run_dir
from inferledger.collectors.rundir.writer import write_table_atomic
from inferledger.probes.events import GAP_SCHEMA
from inferledger.probes.quantile import quantile
from inferledger.probes.probe import boot_id
from inferledger.probes.run_folder import Manifest

CLIENT_BOUND_LAG_MS = 1.0  # p99 event-loop lag above which the client's own delay taints its figures


def lag_p99_ms(values: list[float]) -> float:
    return quantile(values, 0.99)  # never empty: the watcher records a sample before it checks for the stop


class StartingManifest:
    """The manifest with state "starting" before anything slow, in a folder that holds no run yet; on a
    failure inside the block (a bad workload, a model that does not load, a run that cannot be opened)
    everything written into the folder goes again, and the folder too when this capture made it: no run
    is left."""

    def __init__(self, out: Path, body: dict) -> None:
        check_new_run_dir(out)  # so the clean-up below can only take away what this capture wrote
        self.out, self.made = out, [p for p in (out, *out.parents) if not p.exists()]
        out.mkdir(parents=True, exist_ok=True)
        Manifest({"run_id": out.name, **body}).write(out)

    def __enter__(self) -> "StartingManifest":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            return
        for p in self.out.iterdir():  # new or empty before (check_new_run_dir): all of it is this capture's
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        for p in self.made:  # innermost first; a folder something else wrote into stays
            try:
                p.rmdir()
            except OSError:
                break


def finish_run(live: Live, prep: Prepared, driven: Driven, options: CaptureOptions, *, wall_s: float,
               registered: dict | None = None) -> dict:
    """After a clean run: clock mappings, the client's lag trace, gaps and the full manifest."""
    writer, out, host, url, wall = live.writer, live.out, live.host, live.url, live.wall
    server, sampler, evidence = live.server, live.sampler, live.evidence
    client_clock, engine_clock = live.client_clock, live.engine_clock
    wl, plans, tokenizer, calibration = prep.wl, prep.plans, prep.tokenizer, prep.calibration
    result, lags, mappings = driven.result, driven.lags, driven.mappings
    separate_clocks, switch_interval_s = options.separate_clocks, options.switch_interval_s
    engine_clock_epsilon_ms = options.evidence.engine_clock_epsilon_ms
    evidence_gaps, evidence_manifest = evidence.finish(result.completed + result.abandoned) if evidence else ([], None)
    failed = [m for m in mappings if isinstance(m, ClockSyncFailure)]
    mappings = [m for m in mappings if not isinstance(m, ClockSyncFailure)]
    for m in mappings:
        writer.clock_domain(m.from_clock, host=host if server else None, kind="monotonic")
        writer.clock_map(m.from_clock, m.to_clock, m.offset_ns, m.epsilon_ns, m.method)
    # both of this process's monotonic domains (one clock, two names in a separate-clocks run); a
    # black-box server's clock is another host's and gets no wall mapping from here
    wall.write(writer, [client_clock] + ([engine_clock] if server is not None else []), host)
    if evidence is not None:
        evidence.write_clock(wall, client_clock, engine_clock_epsilon_ms)
    lag_values = [lag for _, lag in lags]
    lag_p99 = lag_p99_ms(lag_values)
    trace_every = max(1, len(lags) // 2000)  # a bounded trace of the client's own lag: every wake below 4000
    for ts_ns, lag in lags[::trace_every]:
        writer.sample(ts_ns=ts_ns, clock=client_clock, source="client", host=host, metric="client_loop_lag_ms",
                      value=lag, unit="ms")
    gaps = list(sampler.gap_rows(writer.run_id)) + evidence_gaps
    gaps += [{"run_id": writer.run_id, "gap_id": f"collector:clock-sync:{f.label}", "scope": "run", "subject_id": None,
              "affects": "the clock mapping's drift check between the start and end of the run",
              "needs": "a server whose /clock answers within its deadline when the run ends",
              "detail": f.reason} for f in failed]
    if live.router is not None:  # the router's counters: a failed or refused scrape
        gaps += live.router.gap_rows(writer.run_id)
    if live.replicas is not None:  # the replicas declared by URL: which attempts each served, its scrapes
        gaps += live.replicas.gap_rows(writer.run_id, router_spans=live.router_tries is not None)
    if live.router_tries is not None:  # the router's spans: what they lacked
        gaps += live.router_tries.gaps
    if live.servers is not None:  # the --server folders: what they lacked, by folder and attempt
        gaps += live.servers.gap_rows(writer.run_id)
    elif server is None and not (evidence_manifest or {}).get("spans", {}).get("joined"):
        gaps.append({"run_id": writer.run_id, "gap_id": "collector:black-box", "scope": "run", "subject_id": None,
                     "affects": "server_status, ttft_server_ms, e2e_server_ms, queue/prefill/decode, resources",
                     "needs": "server-side events: serve with `inferledger serve --out S` and capture with `--server S`, "
                              "or import the server's trace",
                     "detail": f"black-box target {url}: only the client's events were recorded"})
    applies, why = live.host_sampler.applies_to_server
    if not applies:
        gaps.append({"run_id": writer.run_id, "gap_id": "collector:host-contention", "scope": "run", "subject_id": None,
                     "affects": "the server's host contention (host samples, run-queue wait)",
                     "needs": "the capture on the server's host, or the server's own run (`inferledger serve --out`)",
                     "detail": why})
    write_table_atomic(pa.Table.from_pylist(gaps, schema=GAP_SCHEMA), out / "gaps.parquet")
    client_bound = lag_p99 > CLIENT_BOUND_LAG_MS
    classes = Counter(p.cls.name for p in plans)
    manifest = {
        "source": "inferledger capture",
        "target": {"kind": "embedded" if server else "url", "url": url},
        "workload": {"path": wl.path, "name": wl.name, "sha256": wl.sha256, "spec": wl.spec, "taskset": wl.taskset,
                     "arrivals": wl.process, "n_tasks": wl.n_tasks, "classes": dict(classes),
                     "requests": sum(len(p.requests) for p in plans),
                     **({"replay": wl.replay} if wl.replay else {}),
                     **({"trace": wl.trace.summary} if wl.trace else {})},  # what was done to the trace's rows
        **({"slo": wl.slo} if wl.slo else {}),  # vLLM-style goodput thresholds (after calibration)
        "prompts": {"tokenizer": (tokenizer.hash if tokenizer is not None else None),
                    "tokenizer_source": (wl.tokenizer or ("embedded model" if server else "bundled"))
                    if tokenizer is not None else None,
                    "exact_prompt_tokens": sorted({r.prompt_tokens for p in plans for r in p.requests
                                                   if r.prompt_tokens})},
        "calibration": calibration,
        "state": "complete",
        "wall_s": round(wall_s, 3),
        "client": {"clock": client_clock, "loop_lag_p99_ms": round(lag_p99, 3),
                   "loop_lag_max_ms": round(max(lag_values), 3), "loop_lag_wakes": len(lag_values),
                   "loop_lag_trace_every": trace_every, "client_bound": client_bound,
                   "client_bound_rule": f"event-loop lag p99 > {CLIENT_BOUND_LAG_MS} ms",
                   "pacing_error_ms": result.pacing_summary(), "switch_interval_s": switch_interval_s,
                   "result": result.counts(), "warmups": prep.warmups, "thread": result.thread},
        "clock_mappings": [m.__dict__ for m in mappings],
        "clock_mappings_failed": [f.__dict__ for f in failed],
        "system_under_test": {
            "inside": ["reference engine", "OpenAI-compatible HTTP front end"] if server else
                      [url] + (["its reference engine and HTTP front end, joined from their `serve --out` folders"]
                               if live.servers is not None else []),
            "outside": ["load client", "checker", "simulated tools"]},
        "host": {"name": host, "boot_id": boot_id(), "platform": platform.platform(), "python": platform.python_version(),
                 "processor": platform.processor()},
        "evidence": {"engine_config": "declared", "model": "declared", "events": "observed",
                     "clock_mapping": "observed (round trips)" if separate_clocks else "same domain",
                     "client_overhead": "observed (loop lag, pacing error)",
                     **(evidence.evidence_kinds() if evidence is not None else {})},
    }
    manifest.update(registered or {})  # device_params and the registered prediction, as written before the load
    manifest["energy"] = sampler.manifest()
    manifest["host_samples"] = live.host_sampler.manifest()
    if evidence_manifest is not None:
        manifest["engine_evidence"] = evidence_manifest
    if live.router is not None:
        manifest["router"] = {**live.router.summary(), "replicas": live.router.replicas,
                              "scraped": "once before the load, once after it (samples of source vllm-router)"}
        manifest["evidence"]["router_metrics"] = "reported (the router's /metrics)"
    if live.router_tries is not None:
        manifest["router_traces"] = live.router_tries.summary
        manifest["evidence"]["router_traces"] = "reported (the router's own spans of its upstream tries)"
    if live.servers is not None:
        manifest.update(live.servers.manifest())
        manifest["evidence"]["events"] = "observed (the client's here; the server's and engine's in the --server folders)"
    if live.replicas is not None or (live.servers is not None and len(live.servers.joined) > 1):
        manifest["deployment"] = {
            "router": options.target, "router_metrics": options.router_metrics,
            **({"router_traces": str(options.router_traces)} if options.router_traces is not None else {}),
            "replicas": [{"replica_id": j.replica_id, "url": j.folder.own_url(options.target), "kind": "ours",
                          "records": f"its `serve --out` folder {j.folder.path}"}
                         for j in (live.servers.joined if live.servers is not None else [])]
            + (live.replicas.manifest() if live.replicas is not None else [])}
    if server is not None:
        manifest.update(server.engine.manifest())
        manifest["drain"] = asdict(server.drain)
    writer.flush()  # every part on disk before the manifest says "complete" (a failed write says interrupted)
    writer.write_manifest(manifest)
    return manifest
