"""Rebuild a capture of a peer engine from its raw evidence: the client's events plus the engine's own
spans and scrapes.

A recorded run (samples/peers/vllm-0.32-cpu/, samples/peers/llamacpp/) keeps what each side produced,
not what we made of it: `client/` (the client's, checker's and tool's event parts, clocks, tasks; the
per-response reports the client received ride on its `attempt.done`: vLLM's `server_metrics`,
llama.cpp's `server_timings`), `otlp/traces.jsonl` (the OTLP requests vLLM exported, as received;
llama.cpp exports none), `scrapes/metrics.jsonl.gz` (every /metrics scrape) and `manifest.json`, and
what capture refused (`otlp/refused.jsonl`, `scrapes/refused.jsonl`) where it refused anything.
`rejoin()` joins them again exactly as capture does (collectors.evidence.vllm_spans,
collectors.evidence.metrics_scrape), the refusals as the same gap rows, into a run directory the ledger
reads, so the join is checked on real engine output without the engine installed.
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from inferledger.collectors.evidence.metrics_scrape import SOURCE, refused_gaps as scrape_gaps, unit_of
from inferledger.collectors.evidence.otlp_checks import dumps
from inferledger.collectors.evidence.otlp_file import read_otlp_file, refused_gaps
from inferledger.collectors.evidence.vllm_spans import map_spans
from inferledger.collectors.rundir.writer import RunWriter, write_table_atomic
from inferledger.probes.events import EVENT_SCHEMA, GAP_SCHEMA
from inferledger.probes.run_folder import MANIFEST_FILE, Manifest, RunFolderError

CLIENT_SOURCES = ("client", "checker", "tool")


def is_recording(path: str | Path) -> bool:
    """A recorded sample (raw evidence for `rejoin`), not yet a run directory."""
    path = Path(path)
    return (path / "client" / "events.parquet").is_file() and ((path / "otlp").is_dir() or (path / "scrapes").is_dir()) \
        and not (path / "events").exists()


class RecordingError(ValueError):
    """A recorded sample that cannot be joined again: the message names the file missing or unreadable."""


CLIENT_FILES = ("events.parquet", "clocks.parquet", "tasks.parquet", "gaps.parquet")


def check_recording(path: str | Path) -> None:
    """Every file `rejoin` reads, there and readable, before anything is written: the manifest, the client's
    four tables, and the engine's spans and scrapes where the manifest says the capture recorded them (a
    sample without them would join as if the engine had reported nothing)."""
    path = Path(path)
    if not Manifest.exists(path):
        raise RecordingError(f"{path}: a damaged recording: no {MANIFEST_FILE} (the run's identity and what it recorded)")
    try:
        ev = Manifest.read(path).block("engine_evidence")
    except RunFolderError as exc:
        raise RecordingError(str(exc)) from None
    missing = [f"client/{name}" for name in CLIENT_FILES if not (path / "client" / name).is_file()]
    if (ev.get("otlp") or {}).get("spans") and not (path / "otlp" / "traces.jsonl").is_file():
        missing.append("otlp/traces.jsonl (the manifest's engine_evidence.otlp recorded spans)")
    if (ev.get("metrics") or {}).get("scrapes") and not (path / "scrapes" / "metrics.jsonl.gz").is_file():
        missing.append("scrapes/metrics.jsonl.gz (the manifest's engine_evidence.metrics recorded scrapes)")
    if missing:
        raise RecordingError(f"{path}: a damaged recording: no {', no '.join(missing)}")
    for name in CLIENT_FILES:  # a table cut short (no footer) is refused here, not copied on or read half
        try:
            pq.read_metadata(path / "client" / name)
        except (pa.ArrowException, OSError) as exc:
            raise RecordingError(f"{path / 'client' / name}: not a whole parquet table ({exc}): a damaged "
                                 "recording") from None


def record(run_dir: str | Path, sample_dir: str | Path) -> None:
    """Keep a capture's raw evidence as a sample: client-side events only, the OTLP and scrape files."""
    run_dir, sample_dir = Path(run_dir), Path(sample_dir)
    (sample_dir / "client").mkdir(parents=True, exist_ok=True)
    table = ds.dataset(str(run_dir / "events"), format="parquet").to_table()
    mask = pa.compute.is_in(table["source"], value_set=pa.array(CLIENT_SOURCES))
    pq.write_table(table.filter(mask), sample_dir / "client" / "events.parquet", compression="zstd")
    for name in ("clocks.parquet", "tasks.parquet"):
        shutil.copyfile(run_dir / name, sample_dir / "client" / name)
    gaps = pq.read_table(run_dir / "gaps.parquet").to_pylist()  # the collectors' own, less the join's
    regenerated = ("otlp:", "metrics:")  # rebuilt by rejoin() from the raw files
    write_table_atomic(pa.Table.from_pylist([g for g in gaps if not g["gap_id"].startswith(regenerated)],
                                            schema=GAP_SCHEMA), sample_dir / "client" / "gaps.parquet")
    for rel in ("otlp/traces.jsonl", MANIFEST_FILE, "otlp/refused.jsonl", "scrapes/refused.jsonl"):
        if (run_dir / rel).exists():
            (sample_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run_dir / rel, sample_dir / rel)
    if (run_dir / "scrapes" / "metrics.jsonl").exists():  # 2 Hz of ~2.5 kB lines: kept compressed
        (sample_dir / "scrapes").mkdir(exist_ok=True)
        with (run_dir / "scrapes" / "metrics.jsonl").open("rb") as src, \
                (sample_dir / "scrapes" / "metrics.jsonl.gz").open("wb") as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _scrapes(path: Path) -> list[dict]:
    """The recorded scrapes, one object a line; RecordingError naming the file (and line) when the file is
    cut short or a line is not a scrape."""
    if not path.exists():
        return []
    try:
        with gzip.open(path, "rt") as f:
            lines = f.read().splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise RecordingError(f"{path}: cannot be read whole ({exc}): a damaged recording") from None
    out = []
    for n, line in enumerate(lines, 1):
        try:
            s = json.loads(line)
            if not isinstance(s.get("values"), dict) or not all(isinstance(s.get(k), int) for k in ("t0_ns", "t1_ns")):
                raise ValueError("expected an object with values, t0_ns and t1_ns")
        except (ValueError, AttributeError) as exc:
            raise RecordingError(f"{path}:{n}: not a scrape ({exc}): a damaged recording") from None
        out.append(s)
    return out


def rejoin(sample_dir: str | Path, out: str | Path) -> dict:
    """Write run directory `out` from a recorded sample; returns the span join's summary (without spans:
    the attempts and how many carry the engine's per-response timings)."""
    sample_dir, out = Path(sample_dir), Path(out)
    manifest = Manifest.read(sample_dir)
    run_id, host = manifest.run_id, manifest.block("host").get("name")
    ev = manifest.block("engine_evidence")
    engine_clock = (ev.get("spans") or {}).get("clock") or f"wall:{host}"
    scrapes = _scrapes(sample_dir / "scrapes" / "metrics.jsonl.gz")  # read whole before anything is written
    writer = RunWriter(out, run_id=run_id)
    client = pq.read_table(sample_dir / "client" / "events.parquet").cast(EVENT_SCHEMA)
    for row in client.to_pylist():
        writer.emit(row)
    sent = client.filter(pa.compute.equal(client["name"], "attempt.sent")).to_pylist()
    attempts = {r["attempt_id"]: {"task_id": r["task_id"], "request_id": r["request_id"], "session_id": r["session_id"]}
                for r in sent}
    gaps: list[dict] = []
    if (sample_dir / "otlp" / "traces.jsonl").exists():
        spans, late = read_otlp_file(sample_dir / "otlp" / "traces.jsonl")
        refused = _records(sample_dir / "otlp" / "refused.jsonl") + [{**r.record(), "from": "otlp/traces.jsonl"}
                                                                      for r in late]
        join = map_spans(spans, run_id=run_id, host=engine_clock.split(":", 1)[1],
                         reporter=ev.get("reporter", "unknown"), attempts=attempts, trace_salt=run_id)
        for row in join.rows:
            writer.emit(row)
        gaps += join.gaps + refused_gaps(run_id, refused, "otlp/refused.jsonl")
        if refused:
            (out / "otlp").mkdir(parents=True, exist_ok=True)
            (out / "otlp" / "refused.jsonl").write_text("".join(dumps(r) + "\n" for r in refused))
        summary = join.summary()
    else:
        done = client.filter(pa.compute.equal(client["name"], "attempt.done")).to_pylist()
        summary = {"attempts": len(attempts),
                   "with_timings": sum("server_timings" in json.loads(r["attrs"] or "{}") for r in done)}
    metrics = ev.get("metrics") or {}
    types, source = metrics.get("types") or {}, metrics.get("source") or SOURCE
    gaps += scrape_gaps(run_id, _records(sample_dir / "scrapes" / "refused.jsonl"), len(scrapes))
    for s in scrapes:
        for name, value in s["values"].items():
            writer.sample(ts_ns=(s["t0_ns"] + s["t1_ns"]) // 2, clock=s["clock"], source=source,
                          host=host, metric=name, value=value, unit=unit_of(name, types))
    writer.close()
    for name in ("clocks.parquet", "tasks.parquet"):  # the client's clocks and contracts, as captured
        shutil.copyfile(sample_dir / "client" / name, out / name)
    collector_gaps = pq.read_table(sample_dir / "client" / "gaps.parquet").to_pylist()
    write_table_atomic(pa.Table.from_pylist(collector_gaps + gaps, schema=GAP_SCHEMA), out / "gaps.parquet")
    shutil.copyfile(Manifest.file(sample_dir), Manifest.file(out))
    return summary
