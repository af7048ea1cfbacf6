"""Bounded memory: the size strings, the limit DuckDB is held to, the spill folder, the same ledger."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.rundir.e0_import import import_archive
from inferledger.ledger import memory
from inferledger.ledger.memory import SizeError, bound, parse_size
from inferledger.ledger.reconstruct import BuildOptions, reconstruct
from scale_util import ledger_differences

pytestmark = pytest.mark.slow  # synthetic runs rebuilt under memory limits

ROOT = Path(__file__).resolve().parent.parent


def bench_module():
    spec = importlib.util.spec_from_file_location("ledger_scale", ROOT / "benchmarks" / "ledger_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("text, size", [("4GB", 4_000_000_000), ("512MiB", 536_870_912), ("1.5GiB", 1_610_612_736),
                                        ("100000000", 100_000_000), (" 2 gb ", 2_000_000_000)])
def test_sizes_read_as_people_write_them(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "4 parsecs", "-1GB", "1MB", "", "10000000TB"])
def test_a_size_that_cannot_be_read_or_is_too_small_is_named(text):
    with pytest.raises(SizeError, match="memory limit"):
        parse_size(text)


@pytest.mark.parametrize("cpus, physical_gib, limit_mib", [
    (2, 23.4, 2560),              # two CPUs: 1.25 GiB each, under a quarter of 23.4 GiB
    (16, 128, 20 * 1024),         # sixteen: 20 GiB, a quarter of 128 GiB is 32
    (16, 64, 16 * 1024),          # sixteen on 64 GiB: the quarter (16 GiB) is the smaller
    (1, 0.2, 64),                 # a tiny container (a quarter is 51 MiB): never under the 64 MiB the joins need
])
def test_the_default_limit_is_per_cpu_and_at_most_a_quarter_of_memory(monkeypatch, cpus, physical_gib, limit_mib):
    monkeypatch.setattr(memory, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(memory, "physical_memory_bytes", lambda: int(physical_gib * 2 ** 30))
    assert memory.default_memory_limit() == limit_mib * 2 ** 20


def test_the_connection_is_held_to_the_limit_and_spills_where_told(tmp_path):
    con = duckdb.connect()
    bound(con, parse_size("1.5GiB"), tmp_path / "spill")
    assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == "1.5 GiB"
    assert con.execute("SELECT current_setting('temp_directory')").fetchone()[0] == str(tmp_path / "spill")
    assert (tmp_path / "spill").is_dir()


def test_a_synthetic_run_under_a_small_limit_builds_the_same_ledger(tmp_path):
    bench = bench_module()
    run = tmp_path / "bench"
    bench.phase_import(run, 400, 32, 3)  # 400 attempts, 16k events
    default = reconstruct(run, out=tmp_path / "default.duckdb")
    spill = tmp_path / "spill"
    bounded = reconstruct(run, BuildOptions(memory_limit="64MiB", temp_directory=spill), out=tmp_path / "bounded.duckdb")
    assert bounded.n_events == default.n_events == 400 * (6 + 32 + 7 + 32 // 8 + 1)  # client, chunks, engine, tokens, verdict
    assert ledger_differences(default.path, bounded.path) == []
    assert spill.is_dir()  # a named folder is the caller's; the default one beside the ledger is removed
    assert not list(tmp_path.glob(".*.spill-*"))


def test_the_cli_refuses_a_bad_limit_naming_it(tmp_path):
    archive = ROOT / "samples" / "e0" / "r1_sample_b0" / "archive.jsonl"
    import_archive(archive, tmp_path / "run")
    res = CliRunner().invoke(app, ["reconstruct", str(tmp_path / "run"), "--memory-limit", "lots", "-q"])
    assert res.exit_code == 2 and "memory limit 'lots'" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "run" / "ledger.duckdb").exists()
    res = CliRunner().invoke(app, ["reconstruct", str(tmp_path / "run"), "--memory-limit", "256MiB", "-q"])
    assert res.exit_code == 0, res.output
