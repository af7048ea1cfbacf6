"""A join by position must prove itself, and a mapping needs three agreeing joins: vLLM bench's records
against another tool's server run, against their own run in the wrong order, or too few of them, join
nothing and map no clock; AIPerf's ids join two requests, but two are no mapping."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
from typer.testing import CliRunner

from inferledger.cli.app import app
from peer_util import SAMPLES

VLLM = SAMPLES / "vllm-bench-0.32.0"
RESULT = json.loads((VLLM / "tool" / "result.json").read_text())
PER_REQUEST = ("start_times", "ttfts", "itls", "latencies", "output_lens", "input_lens", "errors", "queue_times",
               "generated_texts")


def _import(tmp_path, tool, path, server, *extra):
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["import", "--from", tool, str(path), "--server", str(server), "--out", str(run), *extra])
    assert res.exit_code == 0, res.output
    manifest = json.loads((run / "manifest.json").read_text())
    gaps = pq.read_table(run / "gaps.parquet").to_pylist()
    tool_clocks = [c for c in pq.read_table(run / "clocks.parquet").to_pylist()
                   if c["from_clock"] == manifest["clock"]["tool_clock"]]
    return res, manifest, gaps, tool_clocks


def _result(tmp_path, doc):
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    return path


def test_vllm_bench_against_another_tools_server_joins_nothing(tmp_path):
    # GuideLLM's server run: its ids (srv-<hex>) end in digits, but none is bench-<8 hex>-<index>
    res, manifest, gaps, tool_clocks = _import(tmp_path, "vllm-bench", VLLM / "tool" / "result.json",
                                               SAMPLES / "guidellm-0.8.1" / "server")
    assert (manifest["counts"]["joined"], manifest["counts"]["unjoined"]) == (0, 40)
    assert manifest["input"]["request_id_prefix"] == "vllm-bench-"
    joins = [g for g in gaps if g["gap_id"].startswith("peer-join:")]
    assert len(joins) == 40 and all("bench-<8 hex>-<index>" in g["detail"] for g in joins)
    assert [g["detail"] for g in gaps if g["gap_id"] == "peer-clock"] == ["no request joined"]
    assert manifest["clock"]["mapping"] is None and tool_clocks == []


def test_vllm_bench_records_out_of_order_are_not_joined_by_position(tmp_path):
    # the right server run and ids of the right scheme, but request i's times belong to request 39 - i:
    # no one clock offset holds for all pairs, so the join by position is refused whole
    doc = dict(RESULT, **{k: RESULT[k][::-1] for k in PER_REQUEST})
    res, manifest, gaps, tool_clocks = _import(tmp_path, "vllm-bench", _result(tmp_path, doc), VLLM / "server")
    assert (manifest["counts"]["joined"], manifest["counts"]["unjoined"]) == (0, 40)
    [(rule, n)] = manifest["join"]["key_rules"].items()
    assert n == 40 and rule.startswith("prefix+index, refused (the join by prefix + index did not prove itself: "
                                       "the bounds contradict")
    assert len([g for g in gaps if g["gap_id"].startswith("peer-join:")]) == 40
    assert manifest["clock"]["mapping"]["offset_ns"] is None and tool_clocks == []
    assert "no clock mapping: the join by prefix + index did not prove itself" in " ".join(res.output.split())


def test_two_vllm_bench_requests_prove_no_join(tmp_path):
    doc = dict(RESULT, **{k: RESULT[k][:2] for k in PER_REQUEST})
    _res, manifest, gaps, tool_clocks = _import(tmp_path, "vllm-bench", _result(tmp_path, doc), VLLM / "server")
    assert (manifest["counts"]["joined"], manifest["counts"]["unjoined"]) == (0, 2)
    clock_gap = [g["detail"] for g in gaps if g["gap_id"] == "peer-clock"]
    assert clock_gap == ["the join by prefix + index did not prove itself: only 2 joined request(s) on the "
                         "server's clock: a mapping needs at least 3 whose bounds agree"]
    assert tool_clocks == []


def test_two_requests_joined_by_their_ids_are_no_mapping(tmp_path):
    records = (SAMPLES / "aiperf-0.13.0" / "tool" / "profile_export.jsonl").read_text().splitlines()[:2]
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join(records) + "\n")
    _res, manifest, gaps, tool_clocks = _import(tmp_path, "aiperf", path, SAMPLES / "aiperf-0.13.0" / "server")
    assert manifest["counts"]["joined"] == 2 and manifest["join"]["key_rules"] == {"x-request-id, exact": 2}
    assert manifest["clock"]["mapping"]["offset_ns"] is None
    assert [g["detail"] for g in gaps if g["gap_id"] == "peer-clock"] == [
        "only 2 joined request(s) on the server's clock: a mapping needs at least 3 whose bounds agree"]
    assert tool_clocks == []


def test_vllm_bench_joined_to_its_own_server_keeps_every_join(tmp_path):
    _res, manifest, gaps, tool_clocks = _import(tmp_path, "vllm-bench", VLLM / "tool" / "result.json", VLLM / "server")
    assert manifest["counts"]["joined"] == 40 and manifest["join"]["key_rules"] == {"prefix+index, exact": 40}
    assert len(tool_clocks) == 1 and tool_clocks[0]["epsilon_ns"] == manifest["clock"]["mapping"]["epsilon_ns"]
    assert not [g for g in gaps if g["gap_id"].startswith("peer-") ]
