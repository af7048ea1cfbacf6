"""The tables of docs/BENCHMARKS.md, one function per table, each from results files' figures.

Every function takes the matching results files, oldest first, and returns Markdown. Most draw the
newest; a history table draws them all. The table ids (the keys of TABLES) are what the markers in
the doc name; benchmarks/render.py puts each table between its markers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

DASH = "—"  # an unknown figure: never 0


def fmt(value, spec: str = ".2f", unit: str = "") -> str:
    if value is None:
        return DASH
    return f"{value:{spec}}{unit}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def met(ok) -> str:
    return DASH if ok is None else ("met" if ok else "**not met**")


def load_span(r: dict) -> str:
    start, end = (r.get("load") or {}).get("start"), (r.get("load") or {}).get("end")
    return f"{fmt(start[0] if start else None)} → {fmt(end[0] if end else None)}"


def _cpu(r: dict) -> tuple[dict, set[str]]:
    """The run's CPU facts and its recorded flags."""
    cpu = (r.get("host") or {}).get("cpu") or {}
    return cpu, set(cpu.get("flags") or [])


def native_bf16(r: dict) -> bool:
    """Whether the run's CPU multiplies bf16 natively (AVX-512 BF16 or AMX): where its dtype `auto` is bf16."""
    return bool(_cpu(r)[1] & {"avx512_bf16", "amx_bf16"})


def cpu_label(r: dict) -> str:
    """The CPU kind the figures depend on: model, family / model number, widest vector and bf16 units."""
    cpu, flags = _cpu(r)
    if "amx_bf16" in flags:
        kind = "AMX"
    elif "avx512_bf16" in flags:
        kind = "AVX-512 BF16, no AMX"
    elif "avx512f" in flags:
        kind = "AVX-512, no native bf16"
    elif "avx2" in flags:
        kind = "AVX2 only"
    else:
        kind = "flags unknown" if cpu.get("flags") is None else "no AVX2"
    family = f" family {cpu['family']} model {cpu['model_number']}" if cpu.get("family") is not None else ""
    return f"{cpu.get('model') or 'CPU unknown'}{family}, {kind}"


# ------------------------------------------------------------------------------------------------
def engine_throughput(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    return table(["concurrency", "ours tok/s", "HF tok/s", "ours / HF", "engine steps"],
                 [[t["concurrency"], fmt(t["ours_tok_s"], ".1f"), fmt(t["hf_tok_s"], ".1f"),
                   f"**{fmt(t['ours_over_hf_ratio'])}**", t["steps"]] for t in f["throughput"]])


def engine_bandwidth(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = [[d["batch"], d["steps"], fmt(d["median_step_ms"], ".1f"), f"{d['weights_mib']:.0f} + {d['kv_mib']:.0f} MiB",
             fmt(d["achieved_gib_s"], ".1f", " GiB/s"), f"**{fmt(d['mbu_ratio'])}**", fmt(d["fastest_step_ms"], ".1f"),
             fmt(d["fastest_mbu_ratio"])] for d in f["decode"]]
    return (table(["batch", "decode steps", "median step ms", "weights + KV read", "achieved", "MBU",
                   "fastest step ms", "fastest MBU"], rows)
            + f"\n\nmemcpy (best of `dst.copy_(src)` over 256 MiB, read + write, {f['torch_threads']} thread(s), "
              f"same run): {fmt(f['memcpy_gib_s'], '.1f')} GiB/s.")


def engine_probes(rs: list[dict]) -> str:
    p = rs[-1]["figures"].get("probes")
    if not p:
        return "Not measured in this run (`--probe-repeats 0`)."
    return (f"- *Direct*: {fmt(p['direct_share_pct'])} % of the wall time inside the event calls "
            f"({p['events']} events and their KV samples, {fmt(p['per_event_us'], '.1f')} µs per event).\n"
            f"- *A/B*: probes on over off, {p['pairs']} pairs in alternating order: median paired ratio "
            f"{fmt(p['paired_median_ratio'], '.3f')}, range {fmt(p['paired_min_ratio'], '.3f')}–"
            f"{fmt(p['paired_max_ratio'], '.3f')}.")


def mbu_batch1(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    (d,), (t,) = f["decode"], f["throughput"]
    return table(["median step", "achieved", "MBU", "fastest step", "fastest MBU", "memcpy", "ours / HF tok/s"],
                 [[fmt(d["median_step_ms"], ".1f", " ms"), fmt(d["achieved_gib_s"], ".1f", " GiB/s"),
                   f"**{fmt(d['mbu_ratio'])}**", fmt(d["fastest_step_ms"], ".1f", " ms"), f"**{fmt(d['fastest_mbu_ratio'])}**",
                   fmt(f["memcpy_gib_s"], ".1f", " GiB/s"),
                   f"{fmt(t['ours_over_hf_ratio'])} ({fmt(t['ours_tok_s'], '.1f')} / {fmt(t['hf_tok_s'], '.1f')})"]])


def linear_dtypes(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    packed = any("bf16_packed_ms" in r for r in f["rows"])  # files before the column have none
    cols = ["rows", "fp32", "bf16", "fp16"] + (["bf16 prepacked (the engine's)"] if packed else [])
    rows = [[r["rows"], fmt(r["fp32_ms"], ".1f", " ms"),
             f"{fmt(r['bf16_ms'], '.1f', ' ms')} ({fmt(r['bf16_over_fp32_ratio'])}×)",
             f"{fmt(r['fp16_ms'], '.1f', ' ms')} ({fmt(r['fp16_over_fp32_ratio'])}×)"]
            + ([f"{fmt(r['bf16_packed_ms'], '.1f', ' ms')} ({fmt(r['bf16_packed_over_fp32_ratio'])}×)"
                if r.get("bf16_packed_ms") is not None else "not used (bf16 emulated)"] if packed else [])
            for r in f["rows"]]
    return (table(cols, rows)
            + f"\n\ntorch ISA {f['torch_isa']}, oneDNN bf16 path {'available' if f['onednn_bf16'] else 'unavailable'}, "
              f"{f['threads']} thread(s), best of {f['repeats']}; × = over fp32.")


def thread_placement(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = [[r["run"], r["placement"], fmt(r["tok_s"]), fmt(r["load_1m_before"])] for r in f["runs"]]
    return (table(["run", "placement", "tok/s", "load (1 min) before"], rows)
            + f"\n\nMedian free {fmt(f['free_median_tok_s'])} tok/s, pinned {fmt(f['pinned_median_tok_s'])} tok/s: "
              f"**pinned / free {fmt(f['pinned_over_free_ratio'])}** (pinned to CPU {f['pinned_cpu']}).")


def loop_lag(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = [[r["run"], r["placement"], fmt(r["loop_lag_p99_ms"], ".1f", " ms"), fmt(r["loop_lag_max_ms"], ".1f", " ms"),
             fmt(r["bare_loop_p99_ms"], ".1f", " ms"), fmt(r["wall_s"], ".1f", " s"), fmt(r["load_1m_before"], ".1f")]
            for r in f["runs"]]
    return (table(["run", "cpu_threads", "loop lag p99", "loop lag max", "bare loop p99 (beside it)", "wall",
                   "load before"], rows)
            + f"\n\nMedian of the paired ratios auto / none: loop lag p99 **{fmt(f['auto_over_none_p99_ratio'])}**, "
              f"wall {fmt(f['auto_over_none_wall_ratio'])}.")


def ledger_scale(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    labels = {"import": "import (generate + Parquet write)", "ledger": "reconstruct (the whole ledger)",
              "peer": "per-request pandas loop (4 figures)"}
    rows = [[labels[k], fmt(p["wall_s"]), fmt(p["cpu_s"]), fmt(p["peak_gib"]), f"{p['events_per_s']:,.0f}"]
            for k, p in f["phases"].items()]
    return (table(["phase", "wall s", "CPU s", "peak GiB", "events/s"], rows)
            + f"\n\n{f['events']:,} events ({f['attempts']:,} attempts × {f['output_tokens']} tokens); "
              f"**ratio loop / ledger {fmt(f['loop_over_ledger_ratio'])}×**; the two agree on every attempt: "
              f"{'yes' if f['agree'] else '**no**'} (max |Δ| {max(f['max_abs_diff_ms'].values()):.3g} ms).\n\n"
            + targets(f["targets"]))


def ledger_scale_history(rs: list[dict]) -> str:
    rows = [[r["date_utc"][:10], f"`{(r['git'].get('commit') or '?')[:7]}`", cpu_label(r), load_span(r),
             fmt(r["figures"]["phases"]["ledger"]["wall_s"]), fmt(r["figures"]["phases"]["peer"]["wall_s"]),
             fmt(r["figures"]["loop_over_ledger_ratio"])] for r in rs]
    return table(["date", "commit", "CPU", "load", "reconstruct s", "loop s", "loop / ledger"], rows)


def follow_refresh(rs: list[dict]) -> str:
    """Each timed refresh of the newest run: how it was built, its wall time and its steps; the whole rebuild beside."""
    f = rs[-1]["figures"]
    names = ["copy", "run_scope", "touched", "shard", "merge", "rollups", "write"]
    rows = []
    for r in f["refreshes"]:
        steps = r.get("steps") or {}
        rows.append([r["part"], r["how"], f"{r['events']:,}", f"{r['new_events']:,}", fmt(r["wall_s"]),
                     fmt(r.get("cpu_s")), *(fmt(steps.get(f"{n}_s")) for n in names), fmt(r["load_1m"], ".1f")])
    differ = f["tables_differing"]
    return (table(["last part", "how", "events", "new events", "wall s", "CPU s",
                   *(n.replace("_", " ") + " s" for n in names),
                   "load (1 min)"], rows)
            + f"\n\n{f['events']:,} events ({f['attempts']:,} attempts × {f['output_tokens']} tokens) in {f['flushes']} "
              f"parts of {f['flush_s']:g} s; the first row is the first refresh (whole, over the parts written at once). "
              f"A whole rebuild of the same parts as the last timed refresh: **{fmt(f['whole_s'])} s**, its tables against "
              f"the incremental ledger's: {'the same' if not differ else '**differ: ' + ', '.join(differ) + '**'}; the final "
              f"refresh (the manifest complete, whole): {fmt(f['final_s'])} s.\n\n" + targets(f["targets"]))


def ledger_scale_large(rs: list[dict]) -> str:
    """Every run off the default size: the bounded-memory and the sharded paths, the loop where it fit."""
    rows = []
    for r in rs:
        f = r["figures"]
        led, peer = f["phases"]["ledger"], f["phases"].get("peer")
        ray, query = f.get("ray") or {}, f.get("query") or {}
        path = (f"ray, {f.get('workers')} workers, {ray.get('shards')} shards" if f.get("engine") == "ray"
                else "single node") + (f", limit {f['memory_limit']}" if f.get("memory_limit") else
                                       f", default limit {f['memory_limit_default']}" if f.get("memory_limit_default") else "")
        rep = f.get("repartition") or {}
        rows.append([r["date_utc"][:16].replace("T", " "), f"`{(r['git'].get('commit') or '?')[:7]}`", cpu_label(r),
                     load_span(r), f"{f['events']:,}", path, fmt(rep.get("wall_s"), ".1f"), fmt(led["wall_s"], ".1f"), f"{led['events_per_s']:,.0f}",
                     fmt(led["peak_gib"]), ", ".join(fmt(x) for x in ray.get("worker_peak_gib", [])) or DASH,
                     fmt(ray.get("largest_shard_input_mib"), ".0f"),
                     f"{fmt(query['wall_s'], '.1f')} ({fmt(query['peak_gib'])})" if query else DASH,
                     fmt(peer["wall_s"], ".1f") if peer else DASH, fmt(f.get("loop_over_ledger_ratio"))])
    return table(["date", "commit", "CPU", "load", "events", "path", "repartition s", "reconstruct s", "events/s", "peak GiB",
                  "Ray worker peaks GiB", "largest shard MiB", "query s (peak GiB)", "loop s", "loop / ledger"], rows)


def targets(rows: list[dict]) -> str:
    return table(["target", "measured", ""], [[t["target"], t["measured"], met(t["met"])] for t in rows])


def report_scale(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rep = f["report"]
    rows = [["`report.html`", f"{fmt(rep['wall_s'], '.3f')} s wall, {fmt(rep['cpu_s'], '.3f')} s CPU", fmt(rep["size_mb"], ".2f", " MB")]]
    names = {"perfetto": "Perfetto trace JSON", "otlp": "OTLP spans as JSON lines"}
    rows += [[names.get(e["format"], e["format"]), fmt(e["wall_s"], ".1f", " s"), fmt(e["size_mb"], ".1f", " MB")]
             for e in f["exports"]]
    return (table(["output", "time", "size"], rows)
            + f"\n\n{f['attempts']:,} attempts × {f['output_tokens']} tokens, {f['kv_samples']:,} KV samples; "
              f"reconstruct {fmt(f['reconstruct_s'], '.1f')} s (not a target).\n\n" + targets(f["targets"]))


def parts_compaction(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = [[r["parts"], fmt(r["reconstruct_s"], ".2f", " s"), fmt(r["compaction_s"], ".2f", " s"),
             fmt(r["reconstruct_one_part_s"], ".2f", " s"), f"**{fmt(r['many_over_one_ratio'])}**",
             "yes" if r["counts_agree"] else "**no**"] for r in f["rows"]]
    return (table(["parts", "reconstruct", "compaction", "reconstruct, 1 part", "ratio many / one",
                   "ledger rows agree"], rows)
            + f"\n\n{f['events']:,} events ({f['attempts']:,} attempts × {f['output_tokens']} tokens); "
              f"each reconstruct the best of {f['repeat']}.")


def engine_vs_vllm(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = [[r["round"], r["server"], r["client"], r["concurrency"], fmt(r["tok_s"], ".1f"),
             f"{fmt(r['ttft_p50_ms'], '.0f')} / {fmt(r['ttft_p99_ms'], '.0f')}",
             f"{fmt(r['tpot_p50_ms'], '.0f')} / {fmt(r['tpot_p99_ms'], '.0f')}", fmt(r["load_1m_before"])]
            for r in f["rows"]]
    ratios = [[r["client"], r["concurrency"], ", ".join(fmt(x) for x in r["ours_over_vllm_tok_s_ratio"]),
               ", ".join(fmt(x) for x in r["vllm_over_ours_tpot_p50_ratio"])] for r in f["ratios"]]
    return (table(["round", "server", "client", "c", "tok/s", "TTFT p50 / p99 ms", "TPOT p50 / p99 ms",
                   "load (1 min) before"], rows)
            + "\n\n" + table(["client", "c", "ours / vLLM tok/s, per round", "vLLM / ours TPOT p50, per round"], ratios)
            + _vllm_environment(f))


def _vllm_environment(f: dict) -> str:
    """Which environment vLLM ran in, as the run recorded it (runs before the record name none: nothing drawn)."""
    env = ((f.get("servers") or {}).get("vllm") or {}).get("environment")
    return f"\n\nvLLM's environment: {env}." if env else ""


def decode_step_account(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = [[r["batch"], ", ".join(r[k] for k in ("kind", "attention", "linear") if k in r), fmt(r["median_step_ms"]), f"{r['compiled_steps']} / {r['steps']}",
             fmt(r["matmul_ms"]), fmt(r["attention_ms"]), fmt(r["elementwise_ms"]), fmt(r["compiled_kernels_ms"]),
             fmt(r["host_ms"]), fmt(r["profiled_step_ms"]),
             f"{fmt(r.get('mbu_ratio'))} ({fmt(r.get('achieved_gib_s'), '.1f')} GiB/s)" if r["batch"] == 1 else DASH]
            for r in f["rows"]]
    return (table(["batch", "step", "median step ms", "steps compiled", "matmul ms", "attention ms",
                   "elementwise ms", "compiled kernels ms", "host ms", "profiled step ms", "MBU"], rows)
            + f"\n\n{f['dtype']}, {f['torch_threads']} intra-op thread(s), {f['prompt_tokens']}-token prompts; "
              f"memcpy {fmt(f['memcpy_gib_s'], '.1f')} GiB/s (read + write) in the same run.")


def paged_attention(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = [[r["dtype"], r["kind"], r["rows"], r["context_tokens"], fmt(r["gather_ms"], ".3f"), fmt(r["paged_ms"], ".3f"),
             f"**{fmt(r['gather_over_paged_ratio'])}**"] for r in f["rows"]]
    return (table(["dtype", "attention of", "query rows", "context tokens", "gather + SDPA ms", "paged kernel ms",
                   "gather / paged"], rows)
            + f"\n\nOne layer, {f['shape']}; {f['torch_threads']} intra-op thread(s); chunks of up to "
              f"{f['paged_max_chunk_tokens']} tokens take the kernel in the engine.")


def linear_kernel(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    bf16 = f.get("dtype") == "bfloat16"
    base, kernel = ("oneDNN", "panel kernel") if bf16 else ("torch", "gemv kernel")
    rows = [[r["matrix"], f"{r['out_features']} × {r['in_features']}", r["rows"], fmt(r["torch_gib_s"], ".1f"),
             fmt(r["kernel_gib_s"], ".1f"), f"**{fmt(r['torch_over_kernel_ratio'])}**"] for r in f["rows"]]
    what = ("bf16, the panel kernel against oneDNN's linear over its reordered weight" if bf16
            else "fp32, the gemv kernel against F.linear")
    return (table(["matrix", "out × in", "token rows", f"{base} GiB/s", f"{kernel} GiB/s", f"{base} / kernel"], rows)
            + f"\n\n{what}, {f['torch_threads']} intra-op thread(s); weight bytes read per second. The memory in "
              f"the same run: a read-only sum {fmt(f['read_sum_gib_s'], '.1f')} GiB/s, a copy "
              f"{fmt(f['memcpy_gib_s'], '.1f')} GiB/s (read + write).")


def study_load(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    common = [[p["run"], fmt(p["offered_per_s"], ".3f"), fmt(p["completed_per_s"], ".3f"), fmt(p["goodput_per_s"], ".3f"),
               fmt(p["good_share"]), f"{fmt(p['little_l_ratio'], '.2f')} / {fmt(p['little_lambda_w_ratio'], '.2f')}",
               fmt(p["ttft_p50_ms"], ".0f"), fmt(p["e2e_p99_ms"], ".0f")] for p in f["points"]]
    head = ["run", "offered req/s", "completed req/s", "goodput req/s", "good share", "Little L / λW", "TTFT p50 ms",
            "E2E p99 ms"]
    if "first_cause_share" in f["points"][0]:  # the point's diagnosis (run_diagnosis)
        rows = [c + [p["first_cause"] or DASH, fmt(p["first_cause_share"])] for c, p in zip(common, f["points"])]
        head += ["first cause", "its share of the delay"]
    else:  # results recorded before the study read run_diagnosis: its own indicators
        rows = [c + [fmt(p["queue_share"]), fmt(p["kv_peak_share"]), p["preemptions"], fmt(p["mixed_step_share"])]
                for c, p in zip(common, f["points"])]
        head += ["queue share", "KV peak share", "preemptions", "mixed-step share"]
    measured = f"{fmt(f['study_wall_s'], '.0f')} s; {f['first_cause']}"
    return (table(head, rows)
            + f"\n\n{f['capacity_note']}\n\n"
            + targets([{"target": "the knee found and its first cause named within 600 s", "measured": measured,
                        "met": f["target_met"]}]))


def study_fidelity(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = [[r["figure"], fmt(r["real_ms"], ".1f"), fmt(r["sim_ms"], ".1f"),
             DASH if r["error_ratio"] is None else f"{r['error_ratio']:+.1%}",
             DASH if r["target_ratio"] is None else f"±{r['target_ratio']:.0%}",
             met(r["met"]) if r["target_ratio"] is not None else ""] for r in f["figures"]]
    fit = f["fit"]
    steps = ", ".join(f"{s['run']} {s['steps']} steps (p50 {fmt(s['step_p50_ms'], '.1f')} ms)" for s in f["steps"])
    return (table(["figure", "real ms", "simulated ms", "error", "target", ""], rows)
            + f"\n\n{f['figures'][0]['requests']} requests; the step fit (run fit: {fit['n_train']} training steps, "
              f"{fit['n_held_out']} held out, held-out median error {fmt(fit['held_out_median_abs_pct'], '.1f')} %): "
              f"α {fmt(fit['alpha_ms'], '.2f')} ms, {fmt(fit['per_gflop_ms'], '.3f')} ms/GFLOP, "
              f"{fmt(fit['per_mb_ms'], '.4f')} ms/MB, host gap {fmt(fit['gap_alpha_ms'], '.2f')} ms + "
              f"{fmt(fit['gap_per_seq_ms'], '.3f')} ms/seq; {steps}; study {fmt(f['study_wall_s'], '.0f')} s.")


def _share(v) -> str:
    return DASH if v is None else f"{v:.1%}"


def fidelity_bench(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    judged = ("TPOT p50", "TTFT p50", "E2E p99")
    rows = []
    for w in f["workloads"]:
        for k, run in enumerate(w["runs"], 1):
            figs = {x["figure"]: x for x in run["figures"]}
            cells = [f"{fmt(figs[n]['real_ms'], '.1f')} / {fmt(figs[n]['sim_ms'], '.1f')}: "
                     + (DASH if figs[n]["error_ratio"] is None else f"{figs[n]['error_ratio']:+.1%}")
                     + ("" if figs[n].get("error_lo_ratio") is None else
                        f" ({figs[n]['error_lo_ratio']:+.1%} to {figs[n]['error_hi_ratio']:+.1%})")
                     + ("" if figs[n]["met"] else " **not met**") for n in judged]
            rows.append([w["workload"], k, *cells, _share(run["real_contention_share"]),
                         _share(run["fit_contention_share"]), fmt(run["fit_held_out_median_abs_pct"], ".1f", " %"),
                         fmt(run.get("real_decode_time_ratio"), ".3f")
                         + ("" if run.get("real_decode_p10_ratio") is None else
                            f" ({run['real_decode_p10_ratio']:.2f}–{run['real_decode_p90_ratio']:.2f} by the second)"),
                         f"{run['replayed_whole']} + {run['replayed_until_cancel']}", fmt(run["study_wall_s"], ".0f", " s")])
    # results recorded before the errors had an interval over the attempts have no such column
    overlaps = all("intervals_overlap" in s for w in f["workloads"] for s in w["spreads"])
    spreads = [[w["workload"], s["figure"], fmt(s["spread_pct"], ".1f", " points"), met(s["spread_within"])]
               + ([DASH if s["intervals_overlap"] is None else "yes" if s["intervals_overlap"] else "no"]
                  if overlaps else [])
               for w in f["workloads"] for s in w["spreads"]]
    return (table(["workload", "repeat", "TPOT p50 real / sim ms (±5 %)", "TTFT p50 (±10 %)", "E2E p99 (±10 %)",
                   "real waiting for a CPU", "fit waiting for a CPU", "fit held-out median error",
                   "real's decodes against the fit", "replayed whole + until cancel", "study"], rows)
            + "\n\n" + table(["workload", "figure", "spread over the repeats", f"within {f['spread_target_pct']:g}",
                               *(["the repeats' intervals overlap"] if overlaps else [])], spreads)
            + "\n\n" + targets([{"target": "every judged figure within its target, every repeat",
                                  "measured": f"{sum(bool(x['met']) for w in f['workloads'] for r in w['runs'] for x in r['figures'] if x['target_ratio'] is not None)} of "
                                              f"{sum(1 for w in f['workloads'] for r in w['runs'] for x in r['figures'] if x['target_ratio'] is not None)}",
                                  "met": f["all_met"]},
                                 {"target": f"two repeats within {f['spread_target_pct']:g} points",
                                  "measured": f"{sum(bool(s['spread_within']) for w in f['workloads'] for s in w['spreads'])} of "
                                              f"{sum(1 for w in f['workloads'] for s in w['spreads'])}",
                                  "met": f["all_spreads_within"]}]
                                + ([_overlap_row(f)] if overlaps else [])))


def _overlap_row(f: dict) -> dict:
    """The repeats' intervals over their attempts: the pairs whose intervals share a value, of those with one."""
    known = [s["intervals_overlap"] for w in f["workloads"] for s in w["spreads"] if s["intervals_overlap"] is not None]
    return {"target": "(beside it) two repeats differing by no more than their attempts can tell: their 95 % "
                      "intervals overlap", "measured": f"{sum(known)} of {len(known)} with intervals",
            "met": all(known) if known else None}


def microbench_cost(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = [[r["round"], fmt(r["wall_s"], ".2f", " s"), fmt(r["memory_peak_gb_s"]), fmt(r["memory_median_gb_s"]),
             r["memcpy_from"], fmt(r["matmul_peak_tflop_per_s"], ".3f"), fmt(r["matmul_median_tflop_per_s"], ".3f"),
             r["matmul_at"], fmt(r["load_1m_after"], ".1f")] for r in f["rounds"]]
    return (table(["round", "wall", "memory peak GB/s", "memory median GB/s", "from", "matmul peak TFLOP/s",
                   "matmul median TFLOP/s", "at", "load after"], rows)
            + f"\n\n{f['dtype']}, {f['threads']} intra-op thread(s), {f['shapes']} matmul shapes, a {f['stream_mib']} MiB "
              f"stream; median {fmt(f['median_wall_s'], '.2f')} s.\n\n" + targets(f["targets"]))


def model_fit(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    names = {"below_bound_pct": "steps faster than their lower bound", "held_out_median_abs_pct":
             "step fit, run A's held-out shapes: median \\|error\\|", "held_out_p90_abs_pct":
             "step fit, run A's held-out shapes: p90 \\|error\\|", "run_b_median_abs_pct":
             "step fit of A on run B: median \\|error\\|", "run_b_p90_abs_pct": "step fit of A on run B: p90 \\|error\\|",
             "ttft_median_abs_pct": "run B's TTFT given its schedule: median \\|error\\|",
             "tpot_median_abs_pct": "run B's TPOT given its schedule: median \\|error\\|"}
    rows = [[names[t["figure"]], f"≤ {fmt(t['target_pct'], '.0f')} %", fmt(t["measured_pct"], ".2f", " %"), met(t["met"])]
            for t in f["targets"]]
    return (table(["target", "bound", "measured", ""], rows)
            + f"\n\n{f['steps']} steps with a bound ({f['steps_below_bound']} below it) on {f['roof_source']} peak roofs "
              f"{fmt(f['roof_compute_tflop_per_s'], '.3f')} TFLOP/s and {fmt(f['roof_memory_gb_s'], '.2f')} GB/s; "
              f"{f['dtype']}, {f['threads']} intra-op thread(s). Fit on run A ({f['fit_n_train']} training, "
              f"{f['fit_n_held_out']} held-out steps): α {fmt(f['fit_alpha_ms'], '.2f')} ms, P_eff "
              f"{fmt(f['fit_p_eff_tflop_per_s'], '.3f')} TFLOP/s, B_eff {fmt(f['fit_b_eff_gb_s'], '.2f')} GB/s, "
              f"host time between steps {fmt(f['fit_gap_alpha_ms'], '.2f')} ms + {fmt(f['fit_gap_per_seq_ms'], '.3f')} ms "
              f"per sequence. Run B: {f['run_b_steps']} steps ({f['run_b_extrapolated']} outside A's covered range), "
              f"{f['requests_b']} requests; its dominant residual source: {f['dominant_residual'] or DASH}.")


def step_records_cost(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = [[label, fmt(f[f"{key}_us"], ".2f", " µs"), fmt(f.get(f"{key}_mean_us"), ".2f", " µs"),
             fmt(f.get(f"{key}_cpu_us"), ".2f", " µs")]
            for key, label in (("step_thread_alone", "step thread alone (1 intra-op thread)"),
                               ("with_workers", f"with its workers ({f['threads']} intra-op threads, "
                                                f"{f['workers']} worker(s) read)"))]
    return (table(["records per step", "wall (median batch)", "wall (mean, preemption included)", "CPU"], rows)
            + f"\n\nMedian decode-only step {fmt(f['median_decode_step_ms'], '.2f')} ms ({f['decode_steps']} steps, "
              f"{f['dtype']}); the records' share of it: {fmt(f['share_of_decode_step_pct'], '.3f')} %.\n\n"
            + targets(f["targets"]))


def _captured(r: dict) -> str:
    """When a fit_transfer run's first workload was captured (a rerun with --reuse is later), HH:MM UTC."""
    at = next(iter(r["figures"]["runs"].values())).get("captured_utc") or r["date_utc"]
    return at[11:16]


def fit_transfer(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    rows = []
    for p in f["pairs"]:
        for block in (p, p["wall"]):  # results before the fit left out blocked_ms: against cpu_ms
            against, k = block.get("against", "cpu_ms" if block is p else "wall"), block["by_kind"]
            rows.append([f"{p['train']} → {p['test']}", against, block["n_steps"],
                         fmt(block["held_out_median_abs_error_pct"], ".1f", " %"),
                         fmt(block["held_out_p90_abs_error_pct"], ".1f", " %")]
                        + [fmt(k[x]["median_abs_error_pct"], ".1f", " %") for x in ("prefill", "decode", "mixed")])
    runs = "; ".join(f"{name}: {r['steps']} steps ({r['steps_below_bound']} below their bound"
                     + (f", {r['cpu_wait_share']:.1%} of their time waiting for a CPU"
                        if r.get("cpu_wait_share") is not None else "")
                     + (f", load (1 min) {fmt(r['load_1m_min'], '.2f')} to {fmt(r['load_1m_max'], '.2f')} while it ran"
                        if r.get("load_1m_max") is not None else "") + "), memory "
                     f"{fmt(r['memory_gb_s'], '.1f')} GB/s and matmul {fmt(r['matmul_tflop_per_s'], '.3f')} TFLOP/s, the "
                     f"best of {len(r['repeats']) or 1} measurement(s) ("
                     + ", ".join(f"{x['at']} {fmt(x['memory_gb_s'], '.1f')} GB/s" for x in r["repeats"]) + ")"
                     for name, r in f["runs"].items())
    fits = "; ".join(f"{p['train']}: α {fmt(p['fit']['alpha_ms'], '.2f')} ms, {fmt(p['fit']['per_seq_ms'], '.2f')} "
                     f"ms per sequence, compute efficiency {fmt(p['fit']['compute_efficiency_ratio'], '.2f')}"
                     + (f", {fmt(p['fit']['on_cpu_ms_per_wait_ms_ratio'], '.2f')} ms on a CPU per ms waited for one"
                        if "on_cpu_ms_per_wait_ms_ratio" in p["fit"] else "")
                     for p in f["pairs"])
    # the repeats: every run of this selection at the newest one's commit (the same fit), each with its load
    same = [r for r in rs if r["git"]["commit"] == rs[-1]["git"]["commit"]]
    repeats = [[_captured(r), f"{p['train']} → {p['test']}", fmt(p["held_out_median_abs_error_pct"], ".1f", " %"),
                fmt(p["held_out_p90_abs_error_pct"], ".1f", " %"),
                ", ".join(f"{fmt(x.get('load_1m_min'), '.1f')} to {fmt(x.get('load_1m_max'), '.1f')}"
                          for x in r["figures"]["runs"].values()),
                ", ".join(DASH if x.get("cpu_wait_share") is None else f"{x['cpu_wait_share']:.1%}"
                          for x in r["figures"]["runs"].values())]
               for r in same for p in r["figures"]["pairs"]]
    return (table(["train → test", "against", "steps", "median \\|error\\|", "p90 \\|error\\|", "prefill median",
                   "decode median", "mixed median"], rows)
            + f"\n\nRuns: {runs}. Fits: {fits}.\n\n"
            + (table(["captured (UTC)", "train → test", "median \\|error\\|", "p90 \\|error\\|",
                      "load (1 min) during the captures", "time waiting for a CPU"], repeats) + "\n\n"
               if len(same) > 1 else "")
            + table(["pair", "target", "bound", "measured", ""],
                    [[t["pair"], t["figure"].replace("_abs_error_pct", " \\|error\\|").replace("_", " "),
                      f"≤ {fmt(t['target_pct'], '.0f')} %", fmt(t["measured_pct"], ".1f", " %"), met(t["met"])]
                     for t in f["targets"]]))


def _first_beside_host(c: dict) -> str | None:
    """The cause with the largest share of a case's delay other than the host's wait for a CPU (what the
    run's diagnosis names next when a busy host's wait is truly the largest cause)."""
    shares = {k[:-len("_share")]: v for k, v in c["shares"].items() if v and k != "host_contention_share"}
    return max(shares, key=shares.get) if shares else None


def diagnosis_bench(rs: list[dict]) -> str:
    f = rs[-1]["figures"]
    conf = f["confusion"]
    cases = [[c["expected"], c["named"] or DASH, fmt(c["shares"].get(f"{c['expected']}_share"), ".2f"),
              fmt((c["shares"].get(f"{c['named']}_share") if c["named"] else None), ".2f"),
              _first_beside_host(c) or DASH,
              DASH if c["cpu_wait_share"] is None else f"{c['cpu_wait_share']:.1%}",
              f"{fmt(c['load_before_1m'], '.2f')} → {fmt(c['load_after_1m'], '.2f')}", c["n_attempts"],
              fmt(c["wall_s"], ".0f", " s")] for c in f["cases"]]
    right = sum(c["expected"] == c["named"] for c in f["cases"])
    beside = sum(c["expected"] in (c["named"], _first_beside_host(c)) for c in f["cases"])
    return (table(conf["columns"], [[str(v) for v in r] for r in conf["rows"]])
            + "\n\n" + table(["constructed", "named first", "its share", "named share",
                               "first beside the host's wait", "steps waiting for a CPU", "load (1 min)", "attempts",
                               "wall"], cases)
            + "\n\n" + targets([{"target": "every constructed cause named first",
                                  "measured": f"{right} of {len(f['cases'])}", "met": f["target_met"]},
                                 {"target": "named first, or first beside the host's wait where that is larger",
                                  "measured": f"{beside} of {len(f['cases'])}", "met": beside == len(f["cases"])}]))


@dataclass(frozen=True)
class TableSpec:
    benchmark: str
    render: Callable[[list[dict]], str]
    select: Callable[[dict], bool] = lambda params: True  # on the results file's parameters
    isa_held: bool = False  # True: only runs with oneDNN held to a narrower ISA; False: only runs without
    native_bf16: bool | None = None  # True: only runs on a CPU that multiplies bf16 natively; False: only others


def _against_vllm(p: dict) -> bool:
    """An engine_vs_vllm run that served vLLM (one of ours alone, `--servers ours`, has no ratio to show)."""
    return "vllm" in (p.get("servers") or ["ours", "vllm"])


def _ledger_default(p: dict) -> bool:
    """ledger_scale's default run: 10,000 attempts × 256 tokens, single node, no limit, with the loop."""
    return ((p.get("attempts"), p.get("tokens")) == (10_000, 256) and not p.get("memory_limit")
            and not p.get("buckets") and not p.get("no_peer") and not p.get("reuse")
            and p.get("engine", "local") == "local")


def _default_sweep(p: dict) -> bool:
    return len(p.get("concurrency") or []) > 1


TABLES = {
    "study_load": TableSpec("study_load", study_load),
    "study_fidelity": TableSpec("study_fidelity", study_fidelity),
    "fidelity_bench": TableSpec("fidelity_bench", fidelity_bench),
    "engine_throughput": TableSpec("engine_throughput", engine_throughput, _default_sweep),
    "engine_throughput.bandwidth": TableSpec("engine_throughput", engine_bandwidth, _default_sweep),
    "engine_throughput.probes": TableSpec("engine_throughput", engine_probes, _default_sweep),
    "engine_throughput.mbu_batch1": TableSpec("engine_throughput", mbu_batch1,
                                          lambda p: p.get("concurrency") == [1] and p.get("threads") == 1),
    "engine_vs_vllm": TableSpec("engine_vs_vllm", engine_vs_vllm, _against_vllm, native_bf16=True),
    "engine_vs_vllm.avx2": TableSpec("engine_vs_vllm", engine_vs_vllm, _against_vllm, native_bf16=False),
    "paged_attention": TableSpec("paged_attention", paged_attention, native_bf16=False),
    "paged_attention.bf16": TableSpec("paged_attention", paged_attention, native_bf16=True),
    "linear_kernel": TableSpec("linear_kernel", linear_kernel, lambda p: p.get("dtype", "float32") == "float32"),
    "linear_kernel.bf16": TableSpec("linear_kernel", linear_kernel, lambda p: p.get("dtype") == "bfloat16"),
    "decode_step_account": TableSpec("decode_step_account", decode_step_account, native_bf16=True),
    "decode_step_account.avx2": TableSpec("decode_step_account", decode_step_account, native_bf16=False),
    "linear_dtypes": TableSpec("linear_dtypes", linear_dtypes),
    "linear_dtypes.held_to_avx2": TableSpec("linear_dtypes", linear_dtypes, isa_held=True),
    "thread_placement": TableSpec("thread_placement", thread_placement),
    "loop_lag": TableSpec("loop_lag", loop_lag),
    "ledger_scale": TableSpec("ledger_scale", ledger_scale, _ledger_default),
    "ledger_scale.history": TableSpec("ledger_scale", ledger_scale_history, _ledger_default),
    "ledger_scale.large": TableSpec("ledger_scale", ledger_scale_large, lambda p: not _ledger_default(p)),
    "follow_refresh": TableSpec("follow_refresh", follow_refresh,
                                lambda p: (p.get("attempts"), p.get("tokens")) == (10_000, 256)),
    "report_scale": TableSpec("report_scale", report_scale, lambda p: bool(p.get("exports"))),
    "parts_compaction": TableSpec("parts_compaction", parts_compaction),
    "model_fit": TableSpec("model_fit", model_fit),
    "microbench_cost": TableSpec("microbench_cost", microbench_cost),
    "step_records_cost": TableSpec("step_records_cost", step_records_cost),
    "fit_transfer": TableSpec("fit_transfer", fit_transfer, lambda p: not int(p.get("co_tenants") or 0)),
    "fit_transfer.co_tenants": TableSpec("fit_transfer", fit_transfer, lambda p: int(p.get("co_tenants") or 0) > 0),
    "diagnosis_bench": TableSpec("diagnosis_bench", diagnosis_bench,
                                 lambda p: p.get("scale") == "default" and len(p.get("cases") or []) >= 7),
    "diagnosis_bench.held_to_avx2": TableSpec("diagnosis_bench", diagnosis_bench,
                                              lambda p: p.get("scale") == "default" and len(p.get("cases") or []) >= 7,
                                              isa_held=True),
}
