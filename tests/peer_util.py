"""Shared by tests/test_peer_import_*.py: import a recorded tool sample with its server run, reconstruct,
and check the per-request join against the server's own evidence."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.ledger.reconstruct import reconstruct

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "peers"


def import_sample(tool: str, sample: str, tmp: Path, *, tool_path: str = "tool",
                  extra: tuple[str, ...] = ()) -> tuple[Path, duckdb.DuckDBPyConnection]:
    """`inferledger import --from TOOL sample/tool --server sample/server --out RUN`, then reconstruct."""
    run = tmp / f"{tool}-run"
    res = CliRunner().invoke(app, ["import", "--from", tool, str(SAMPLES / sample / tool_path),
                                   "--server", str(SAMPLES / sample / "server"), "--out", str(run), *extra])
    assert res.exit_code == 0, res.output
    summary = reconstruct(run)
    return run, duckdb.connect(str(summary.path), read_only=True)


def peer_row(con, metric: str, tool: str) -> dict:
    row = con.execute("SELECT n, mean_ms, p50_ms, p90_ms, p99_ms FROM peer_views WHERE metric = ? AND tool = ?",
                      [metric, tool]).fetchone()
    return dict(zip(("n", "mean", "p50", "p90", "p99"), row))


def mapping_eps_ms(run: Path) -> float:
    m = json.loads((run / "manifest.json").read_text())["clock"]["mapping"]
    assert m["offset_ns"] is not None, m
    return m["epsilon_ns"] / 1e6


def assert_every_request_joins(con, run: Path, n_records: int) -> None:
    """Each tool request has its server attempt: the server completed it, the client's TTFT is no
    shorter than the engine's (give or take the estimated mapping's epsilon), the request crossed
    the wire forwards (sent before received) and back (first write before the first chunk)."""
    eps = mapping_eps_ms(run)
    rows = con.execute("""
        SELECT a.attempt_id, a.client_status, a.server_status, m.ttft_client_ms, m.ttft_server_ms,
               m.uplink_ms, m.downlink_first_ms
        FROM attempts a JOIN request_metrics m USING (attempt_id)
        WHERE a.attempt_id IN (SELECT attempt_id FROM events WHERE source = 'client')""").fetchall()
    assert len(rows) == n_records
    for aid, client, server, ttft_c, ttft_s, up, down in rows:
        assert (client, server) == ("completed", "completed"), aid
        assert ttft_c is not None and ttft_s is not None, aid
        assert ttft_c >= ttft_s - eps, (aid, ttft_c, ttft_s, eps)
        assert up is not None and up >= -eps, (aid, up, eps)
        assert down is not None and down >= -eps, (aid, down, eps)
    joins = con.execute("SELECT count(*) FROM gaps WHERE gap_id LIKE 'peer-join:%' OR gap_id = 'peer-clock'").fetchone()[0]
    assert joins == 0
