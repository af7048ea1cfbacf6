"""The sharded reconstruct on a local Ray of two workers: the same ledger as the single-node path and
the bounded-memory path, table for table, row for row, on a simulated engine
run (engine partitions, shared prefix blocks, a cancellation), the synthetic benchmark run and the
degenerate runs; and its refusals. (Every sample archive sharded: tests/test_e0_samples.py, beside
their default ledgers.)"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.collectors.rundir.repartition import repartition
from inferledger.collectors.sim.declared import QWEN3_8B
from inferledger.collectors.sim.run import SimRequest, distinct_prompt, simulate
from inferledger.collectors.sim.step_time import BookStepModel
from inferledger.engine.params import EngineConfig
from inferledger.ledger.reconstruct import PUBLIC_TABLES, BuildOptions, RunDirError, reconstruct
from ledger_util import build_run
from peer_util import import_sample
from scale_util import ledger_differences

ROOT = Path(__file__).resolve().parent.parent
E0 = ROOT / "samples" / "e0"


def three_ledgers(run: Path, tmp: Path, buckets: int, bounded: bool = True) -> tuple[Path, Path | None, Path]:
    """The default ledger of the run as recorded, then (partitioned) the bounded and the sharded one."""
    default = reconstruct(run, out=tmp / f"{run.name}-default.duckdb").path
    repartition(run, buckets)
    small = reconstruct(run, BuildOptions(memory_limit="96MiB"), out=tmp / f"{run.name}-bounded.duckdb").path if bounded else None
    sharded = reconstruct(run, BuildOptions(engine="ray"), out=tmp / f"{run.name}-ray.duckdb").path
    return default, small, sharded


def assert_same(default, bounded, sharded):
    if bounded is not None:
        assert ledger_differences(default, bounded) == []
    assert ledger_differences(default, sharded) == []


def test_an_engine_run_with_shared_prefixes_and_a_cancel_is_the_same_sharded(local_ray, tmp_path):
    shared = distinct_prompt(99, 32, QWEN3_8B.shape.vocab)  # two blocks every request shares
    requests = [SimRequest(f"q{i}", 5.0 * i, shared + distinct_prompt(i, 8 + i, QWEN3_8B.shape.vocab), 6 + i % 5,
                           cancel_at_ms=60.0 if i == 3 else None) for i in range(14)]
    cfg = EngineConfig(block_size=16, num_blocks=24, max_num_seqs=4, max_num_batched_tokens=64,
                       enable_prefix_caching=True)
    run = simulate(tmp_path / "sim", requests, engine_config=cfg, step_model=BookStepModel(), run_id="sim").run_dir
    default, bounded, sharded = three_ledgers(run, tmp_path, 4)
    folders = sorted(p.name for p in (run / "events").iterdir() if p.is_dir())
    assert len([f for f in folders if f.startswith("bucket-")]) == 4 and any(f.startswith("engine-") for f in folders)
    assert_same(default, bounded, sharded)


def test_the_synthetic_benchmark_run_is_the_same_sharded(local_ray, tmp_path):
    spec = importlib.util.spec_from_file_location("ledger_scale", ROOT / "benchmarks" / "ledger_scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run = tmp_path / "bench"
    bench.phase_import(run, 240, 16, 11)
    assert_same(*three_ledgers(run, tmp_path, 4))


def test_degenerate_runs_are_the_same_sharded(local_ray, tmp_path):
    # an engine-only attempt without a task; a run with no attempt or task at all
    engine_only = [{"name": n, "source": "engine", "ms": ms, "task_id": None, "value": v}
                   for n, ms, v in (("engine.enqueued", 1, 5), ("engine.scheduled", 2, None),
                                    ("engine.token", 5, 1), ("engine.finished", 9, 1))]
    build_run(tmp_path / "engine_only", engine_only).close()
    build_run(tmp_path / "nothing", [{"name": "mem.returned", "source": "engine", "ms": 1, "value": 4096,
                                      "request_id": None, "attempt_id": None}]).close()
    for name in ("engine_only", "nothing"):
        assert_same(*three_ledgers(tmp_path / name, tmp_path, 2))


def test_gaps_of_task_scope_modules_are_kept_from_every_shard(local_ray, tmp_path):
    """Each task's attempt has gaps its task-scope modules declare (two client terminals: marks; a done
    on a clock no mapping joins: figures): every shard keeps its own tasks' rows, none is lost or twice."""
    events = []
    for i in range(8):
        ids = {"task_id": f"T{i}", "request_id": f"R{i}", "attempt_id": f"A{i}"}
        events.append({"name": "attempt.sent", "ms": 10 * i, **ids})
        if i % 2:
            events += [{"name": "attempt.timeout", "ms": 10 * i + 5, **ids},
                       {"name": "attempt.done", "ms": 10 * i + 8, **ids}]
        else:
            events.append({"name": "attempt.done", "ms": 10 * i + 8, "clock": "d", **ids})
    build_run(tmp_path / "gapped", events, domains=("c", "d")).close()
    default, _, sharded = three_ledgers(tmp_path / "gapped", tmp_path, 4, bounded=False)
    buckets = [p for p in (tmp_path / "gapped" / "events").iterdir() if p.name.startswith("bucket-")]
    assert len(buckets) > 1
    assert ledger_differences(default, sharded) == []
    import duckdb

    with duckdb.connect(str(sharded), read_only=True) as con:
        per_attempt = con.execute("SELECT subject_id, count(*) FROM gaps WHERE subject_id LIKE 'A%' "
                                  "AND (affects LIKE 'client_status, e2e_client_ms%' OR affects = 'e2e_client') "
                                  "GROUP BY ALL ORDER BY 1").fetchall()
    assert per_attempt == [(f"A{i}", 1) for i in range(8)]


def test_a_load_tools_imported_run_has_the_same_peer_views_sharded(local_ray, tmp_path):
    """peer_views and peer_comparison pool their samples from per-attempt rows each task shard computes
    (the chunks vLLM bench kept, labelled by the server; its reporter; the gaps between chunks, client
    and server): attempts in several buckets, one pooled row each."""
    run, con = import_sample("vllm-bench", "vllm-bench-0.32.0", tmp_path, extra=("--tool-version", "0.32.0"))
    con.close()
    default, _, sharded = three_ledgers(run, tmp_path, 3, bounded=False)
    import duckdb

    with duckdb.connect(str(sharded), read_only=True) as led:
        itl = led.execute("SELECT min(n) FROM peer_views WHERE metric = 'ITL' AND tool IN ('inferledger', 'vLLM bench')"
                          ).fetchone()[0]
        imported = led.execute("SELECT count(*) FROM peer_comparison WHERE imported").fetchone()[0]
    assert len([p for p in (run / "events").glob("bucket-*") if any(p.glob("*.parquet"))]) > 1
    assert itl > 0 and imported > 0
    assert ledger_differences(default, sharded) == []


def test_a_kv_block_shared_by_tasks_of_two_buckets_and_held_to_the_runs_end_is_split_the_same_sharded(local_ray, tmp_path):
    """kv_holds is each attempt's own (task scope); the split of a block among its holders and the end of a
    hold never released (the last event on its clock: here A1's done, in the other task's bucket, after a
    run-level event in `run/`) are the rollup's."""
    def kv(name, ms, aid, task, blocks):
        return {"name": name, "ms": ms, "attempt_id": aid, "request_id": "R" + aid, "task_id": task,
                "source": "engine", "attrs": {"blocks": blocks}, "value": len(blocks)}

    events = [{"name": "attempt.sent", "ms": 0, "attempt_id": "A1", "request_id": "RA1", "task_id": "T1"},
              kv("kv.alloc", 0, "A1", "T1", [1, 2]),
              {"name": "attempt.sent", "ms": 100, "attempt_id": "A3", "request_id": "RA3", "task_id": "T3"},
              kv("kv.prefix_hit", 100, "A3", "T3", [1]), kv("kv.alloc", 100, "A3", "T3", [3]),
              kv("kv.release", 1000, "A1", "T1", [1, 2]), kv("kv.free", 1000, "A1", "T1", [2]),
              {"name": "mem.returned", "ms": 2000, "source": "engine", "value": 1, "request_id": None, "attempt_id": None},
              {"name": "attempt.done", "ms": 2500, "attempt_id": "A1", "request_id": "RA1", "task_id": "T1"}]
    build_run(tmp_path / "kv", events, manifest={"model": {"kv_bytes_per_token": 2 ** 26},
                                                 "engine_config": {"block_size": 16}}).close()  # 1 GiB a block
    default, _, sharded = three_ledgers(tmp_path / "kv", tmp_path, 4, bounded=False)
    assert sorted(p.name for p in (tmp_path / "kv" / "events").iterdir() if p.is_dir()) == ["bucket-0001", "bucket-0002", "run"]
    assert ledger_differences(default, sharded) == []
    import duckdb

    with duckdb.connect(str(sharded), read_only=True) as led:
        got = dict(led.execute("SELECT attempt_id, kv_gib_s FROM accounts").fetchall())
    # block 1: A1 alone 0.1 s, shared 0.9 s (0.45 each), A3 alone to the clock's last event 1.5 s; block 2:
    # A1 1.0 s; block 3: A3 from 0.1 s to 2.5 s, never released
    assert got == {"A1": pytest.approx(1.55), "A3": pytest.approx(4.35)}


def test_device_time_of_two_engines_and_the_run_folder_is_summed_once_sharded(local_ray, tmp_path):
    """gpu_s_per_good sums the engine-scope device_steps each engine shard keeps (device.step events of two
    engine instances and one without an engine id, in `run/`) over the good attempts of two buckets."""
    def step(ms, step_id, device_ms, engine=None):
        return {"name": "device.step", "ms": ms, "source": "device", "step_id": step_id, "value": device_ms,
                "request_id": None, "attempt_id": None, "attrs": {"engine_id": engine} if engine else {}}

    events = [step(1, 1, 2.0, "e0"), step(2, 2, 3.0, "e0"), step(3, 3, 5.0, "e1"), step(4, 4, 10.0)]
    for aid, task in (("A1", "T1"), ("A3", "T3")):
        ids = {"attempt_id": aid, "request_id": "R" + aid, "task_id": task}
        events += [{"name": "attempt.sent", "ms": 0, **ids}, {"name": "attempt.done", "ms": 50, **ids},
                   {"name": "verdict", "ms": 60, "source": "checker", "attrs": {"correct": True}, **ids}]
    build_run(tmp_path / "dev", events).close()
    default, _, sharded = three_ledgers(tmp_path / "dev", tmp_path, 4, bounded=False)
    assert sorted(p.name for p in (tmp_path / "dev" / "events").iterdir() if p.is_dir()) == [
        "bucket-0001", "bucket-0002", "engine-e0", "engine-e1", "run"]
    assert ledger_differences(default, sharded) == []
    import duckdb

    with duckdb.connect(str(sharded), read_only=True) as led:
        got = led.execute("SELECT n_good, gpu_s_per_good FROM run_metrics").fetchone()
        gap = led.execute("SELECT count(*) FROM gaps WHERE affects = 'gpu_s_per_good'").fetchone()[0]
    assert got == (2, pytest.approx(0.010)) and gap == 0  # (2 + 3 + 5 + 10) ms / 2 good


def test_the_cli_shards_a_partitioned_run_and_refuses_an_unpartitioned_one(local_ray, tmp_path):
    run = tmp_path / "run"
    import_archive(E0 / "r2_timeout_retry" / "archive.jsonl", run)
    res = CliRunner().invoke(app, ["reconstruct", str(run), "--engine", "ray", "-q"], env={"COLUMNS": "500"})
    assert res.exit_code == 2 and f"run `inferledger repartition {run}` first" in res.output
    assert "Traceback" not in res.output and not (run / "ledger.duckdb").exists()
    repartition(run, 2)
    res = CliRunner().invoke(app, ["reconstruct", str(run), "--engine", "ray", "--workers", "2", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["ledger"]["n_attempts"] == 2
    # the query surface over the sharded ledger of a partitioned run, and over two that share a run_id
    res = CliRunner().invoke(app, ["query", str(run), "select count(*) AS n from request_metrics", "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.output) == [{"n": 2}]
    # built inside its run folder, the sharded ledger reads the events in place: the same tables as a copy's
    copied = reconstruct(run, out=tmp_path / "copied.duckdb")
    assert ledger_differences(run / "ledger.duckdb", copied.path, tables=PUBLIC_TABLES) == []
    copied.path.unlink()
    res = CliRunner().invoke(app, ["query", str(run), "select count(*) AS n from events", "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.output) == [{"n": copied.n_events}]
    shutil.copytree(run, tmp_path / "copy")
    res = CliRunner().invoke(app, ["query", str(tmp_path / "*"), "select 1"], env={"COLUMNS": "500"})
    assert res.exit_code == 2 and str(run) in res.output and str(tmp_path / "copy") in res.output


def test_without_ray_the_error_says_what_to_install_and_the_default_path_never_imports_it(tmp_path, monkeypatch):
    run = tmp_path / "run"
    import_archive(E0 / "r1_sample_b0" / "archive.jsonl", run)
    repartition(run, 2)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed
    with pytest.raises(RunDirError, match=r"pip install 'inferledger\[ray\]'"):
        reconstruct(run, BuildOptions(engine="ray"))
    code = ("import sys; from inferledger.ledger.reconstruct import reconstruct; "
            f"reconstruct({str(run)!r}); assert 'ray' not in sys.modules, 'ray imported'")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


def test_a_partitioned_run_whose_parts_disagree_with_its_record_is_refused_before_ray_starts(tmp_path):
    run = tmp_path / "run"
    import_archive(E0 / "r2_timeout_retry" / "archive.jsonl", run)
    repartition(run, 4)
    victim = next((run / "events").glob("bucket-*/part-*.parquet"))
    victim.unlink()
    with pytest.raises(RunDirError, match=rf"{victim.parent.name}/{victim.name}: recorded in layout.json"):
        reconstruct(run, BuildOptions(engine="ray"))


def test_bucket_folders_of_another_count_than_the_record_are_refused_not_a_smaller_ledger(tmp_path):
    from inferledger.ledger.load import RunFiles
    from inferledger.ledger.sharded import ShardError, _plan

    run = tmp_path / "run"
    import_archive(E0 / "r2_timeout_retry" / "archive.jsonl", run)
    repartition(run, 2)
    _plan(RunFiles(run, []))  # as written: every task in its bucket
    (run / "events" / "layout.json").write_text('{"format": 1, "buckets": 7}')  # a record of another layout
    with pytest.raises(ShardError, match=r"bucket-000\d: task '.+' belongs to bucket \d of the 7 buckets"):
        _plan(RunFiles(run, []))
