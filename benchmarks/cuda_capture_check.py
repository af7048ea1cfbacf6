"""The capture phase of benchmarks/cuda_check.py: an embedded `capture` on the device, then what can
be checked without the ledger (the GPU machine has no DuckDB; the run directory comes back and
`inferledger reconstruct` rebuilds it where DuckDB is).

Checked: one `device.step` per `step.end`; how the steps ran (eager, graph, graph_capture); device ms
against host ms; the cuda clock's mapping (epsilon) and the drift the timer measured (manifest
`device_clock`); the NVML energy samples of the GPU whose UUID is the engine's CUDA device's (not
NVML's device 0); joules over the sampled window and per good result (correct answers) as a
provisional figure: the ledger's `energy_per_good_j`, which subtracts the idle baseline, is the one
to record.
"""
from __future__ import annotations

import json
from pathlib import Path


def capture_run(bundle, run_dir: Path, max_num_seqs: int, workload: Path) -> dict:
    import pyarrow.parquet as pq

    from inferledger.collectors.capture.run import capture
    from inferledger.collectors.capture.options import CaptureOptions

    capture(workload, run_dir, CaptureOptions(max_num_seqs=max_num_seqs), bundle=bundle)
    events = pq.read_table(run_dir / "events").to_pylist()
    samples = pq.read_table(run_dir / "samples").to_pylist() if (run_dir / "samples").exists() else []
    clocks = pq.read_table(run_dir / "clocks.parquet").to_pylist()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return summarise(events, samples, clocks, manifest, _gaps(run_dir))


def summarise(events: list[dict], samples: list[dict], clocks: list[dict], manifest: dict, gaps: list[str]) -> dict:
    ends = {e["step_id"]: json.loads(e["attrs"]) for e in events if e["name"] == "step.end"}
    starts = {e["step_id"]: e["ts_ns"] for e in events if e["name"] == "step.start"}
    host_ms = {e["step_id"]: (e["ts_ns"] - starts[e["step_id"]]) / 1e6
               for e in events if e["name"] == "step.end" and e["step_id"] in starts}
    dev = [e for e in events if e["name"] == "device.step"]
    modes: dict[str, int] = {}
    for a in ends.values():
        modes[a.get("mode", "?")] = modes.get(a.get("mode", "?"), 0) + 1
    mapping = [c for c in clocks if c.get("from_clock") and c["from_clock"].startswith("cuda:")]
    device_clock = manifest.get("device_clock") or {}
    uuid = device_clock.get("device_uuid")
    energy, matched = gpu_energy(samples, uuid)
    result = (manifest.get("client") or {}).get("result") or {}
    good = result.get("correct")
    joules = energy["joules"]
    return {
        "steps": len(ends), "device_steps": len(dev),
        "every_step_has_device_time": sorted(d["step_id"] for d in dev) == sorted(ends),
        "step_modes": modes,
        "device_ms_total": round(sum(d["value"] for d in dev), 3),
        "host_step_ms_total": round(sum(host_ms.values()), 3),
        "device_ms_over_host_ms": round(sum(d["value"] for d in dev) / sum(host_ms.values()), 3)
        if dev and sum(host_ms.values()) else None,
        "cuda_mapping": [{k: c[k] for k in ("from_clock", "to_clock", "offset_ns", "epsilon_ns", "method")}
                         for c in mapping],
        "device_clock": device_clock,
        "nvml_device_matched": matched, "gpu_energy": energy,
        "output_tokens": sum(e["value"] for e in events if e["name"] == "engine.token"),
        "client_result": result,
        "provisional_j_per_good": round(joules / good, 4) if joules is not None and good else None,
        "loop_lag_p99_ms": (manifest.get("client") or {}).get("loop_lag_p99_ms"),
        "gaps": gaps,
    }


def gpu_energy(samples: list[dict], uuid: str | None) -> tuple[dict, str | None]:
    """Joules of the GPU with this UUID over its sampled window (first to last counter reading);
    -> (figures, the matched NVML device label or None). No match, no joules: never another GPU's."""
    want = (uuid or "").lower().removeprefix("gpu-")
    devices = sorted({s["device"] for s in samples if s["metric"] == "gpu_energy_mj" and s.get("device")})
    matched = next((d for d in devices if want and d.lower().endswith(want)), None)
    readings = sorted((s["ts_ns"], s["value"]) for s in samples
                      if s["metric"] == "gpu_energy_mj" and s.get("device") == matched)
    ok = matched is not None and len(readings) > 1 and readings[-1][1] >= readings[0][1]
    return ({"nvml_devices": devices, "readings": len(readings),
             "window_s": round((readings[-1][0] - readings[0][0]) / 1e9, 3) if len(readings) > 1 else None,
             "joules": round((readings[-1][1] - readings[0][1]) / 1e3, 3) if ok else None,
             "why_none": None if ok else _why_no_joules(uuid, devices, matched)}, matched)


def _why_no_joules(uuid: str | None, devices: list[str], matched: str | None) -> str:
    if not devices:
        return "no NVML energy samples in the run"
    if not uuid:
        return "the engine recorded no CUDA device UUID (no device timer), so no NVML device can be matched"
    if matched is None:
        return f"no NVML device has the CUDA device's UUID {uuid} (NVML saw {', '.join(devices)})"
    return "fewer than two readings, or the counter went back (driver reload)"


def _gaps(run_dir: Path) -> list[str]:
    import pyarrow.parquet as pq

    path = run_dir / "gaps.parquet"
    if not path.exists():
        return []
    return [f"{g['scope']}: {g['affects']}: {g['detail']}" for g in pq.read_table(path).to_pylist()]
