"""The --server run of a load tool's import is read whole and checked before anything is written: a bad
manifest, a torn or foreign Parquet file, an event the join cannot read are refused by file (exit 2,
no traceback, nothing at --out); a failure while writing leaves nothing at --out either."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.rundir import writer
from inferledger.collectors.peers.importer import import_peer
from peer_util import SAMPLES

SAMPLE = SAMPLES / "aiperf-0.13.0"
PART = "events/part-00000.parquet"


def _server(tmp_path: Path) -> Path:
    srv = tmp_path / "server"
    shutil.copytree(SAMPLE / "server", srv)
    return srv


def _refused(tmp_path: Path, srv: Path) -> str:
    out = tmp_path / "runs" / "run"
    out.parent.mkdir(exist_ok=True)
    res = CliRunner().invoke(app, ["import", "--from", "aiperf", str(SAMPLE / "tool"), "--server", str(srv),
                                   "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert list(out.parent.iterdir()) == []
    return " ".join(res.output.split())


def _rewrite_events(srv: Path, edit) -> None:
    rows = pq.read_table(srv / PART).to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(srv / PART)), srv / PART)


def _first_write(rows):
    return next(r for r in rows if r["name"] == "server.write")


@pytest.mark.parametrize("damage, words", [
    (lambda s: (s / "manifest.json").write_text("{not json"), "manifest.json: not valid JSON"),
    (lambda s: (s / "manifest.json").write_text("[1]"), "manifest.json: expected a JSON object, got array"),
    (lambda s: (s / "manifest.json").write_text('{"model": "smol"}'), "manifest.json: model: expected object, got string"),
    (lambda s: (s / "manifest.json").write_bytes(b'{"a": "\xff"}'), "manifest.json: not valid JSON"),
    (lambda s: (s / "manifest.json").write_text('{"a":' * 5000 + "1" + "}" * 5000), "manifest.json: not valid JSON"),
    (lambda s: (s / PART).write_bytes((s / PART).read_bytes()[:5000]), "part-00000.parquet: not a readable Parquet file"),
    (lambda s: pq.write_table(pa.table({"x": [1]}), s / "events" / "part-00001.parquet"),
     "part-00001.parquet: a Parquet file of another kind (lacks column(s) run_id"),
    (lambda s: (s / "tasks.parquet").write_bytes((s / "tasks.parquet").read_bytes()[:100]), "tasks.parquet: not a readable Parquet file"),
    (lambda s: pq.write_table(pa.table({"clock": ["c"]}), s / "clocks.parquet"),
     "clocks.parquet: a Parquet file of another kind (lacks column(s) run_id"),
    (lambda s: pq.write_table(pq.read_table(s / "clocks.parquet").set_column(
        6, "offset_ns", pa.array(["x"] * pq.read_table(s / "clocks.parquet").num_rows)), s / "clocks.parquet"),
     "clocks.parquet: column types differ from a run's"),
    (lambda s: _rewrite_events(s, lambda rows: _first_write(rows).update(attrs="{kinds")),
     "(server.write) has attrs that are not a JSON object with a list of kinds"),
    (lambda s: _rewrite_events(s, lambda rows: _first_write(rows).update(attrs='{"kinds": "role"}')),
     "(server.write) has attrs that are not a JSON object with a list of kinds"),
])
def test_a_damaged_server_run_is_refused_by_file(tmp_path, damage, words):
    srv = _server(tmp_path)
    damage(srv)
    assert words in _refused(tmp_path, srv)


def test_a_failure_while_writing_leaves_nothing_at_out(tmp_path, monkeypatch):
    def full_disk(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer.RunWriter, "write_manifest", full_disk)
    out = tmp_path / "runs" / "run"
    with pytest.raises(OSError, match="No space left"):
        import_peer("aiperf", SAMPLE / "tool", out, server=SAMPLE / "server")
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
    monkeypatch.undo()
    res = import_peer("aiperf", SAMPLE / "tool", out, server=SAMPLE / "server")  # the same command, again
    assert res.joined == 40 and json.loads((out / "manifest.json").read_text())["counts"]["joined"] == 40
