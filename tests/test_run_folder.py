"""The run folder's records read and write through one schema (probes/run_folder.py): old manifests
read, bad content is refused naming the file and the key, the SLO's one precedence, and the key
reference in docs/ARCHITECTURE.md is the one generated from the schema."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferledger.probes import run_folder
from inferledger.probes.run_folder import Layout, Manifest, PartRecord, RunFolderError, StudyIndex

ARCHITECTURE_MD = Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md"
HEAD = {"source": "inferledger capture", "state": "running",
        "target": {"kind": "url", "url": "http://h:1"}, "workload": {"name": "w", "spec": {"slo": {"ttft_ms": 9}}}}


def test_a_manifest_writes_the_same_json_plus_its_version_and_reads_back(tmp_path):
    path = Manifest({"run_id": "r1", **HEAD}).write(tmp_path)
    assert path == tmp_path / "manifest.json"
    on_disk = json.loads(path.read_text())
    assert on_disk == {"format": 1, "run_id": "r1", **HEAD}
    assert path.read_text() == json.dumps(on_disk, indent=2, sort_keys=True) + "\n"
    back = Manifest.read(tmp_path)
    assert back.body == {"run_id": "r1", **HEAD} and back.run_id == "r1"


def test_a_manifest_without_the_version_key_still_reads(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"run_id": "old", "state": "complete"}))
    assert Manifest.read(tmp_path).body == {"run_id": "old", "state": "complete"}
    assert Manifest.read(tmp_path / "none").body == {}  # a run folder without a manifest


@pytest.mark.parametrize("text, words", [
    ("{", "manifest.json: not valid JSON"),
    ("[1]", "manifest.json: expected a JSON object, got array"),
    ('{"slo": "fast"}', "manifest.json: slo: expected object, got string"),
    ('{"slo": {"ttft_ms": "9"}}', "manifest.json: slo.ttft_ms: expected number or null, got string"),
    ('{"engine_config": {"block_size": 1.5}}', "manifest.json: engine_config.block_size: expected integer, got number"),
    ('{"state": "paused"}', "manifest.json: state: 'paused' is not one of starting, running, complete, interrupted"),
    ('{"format": 2}', "manifest.json: format: 2 is not 1"),
])
def test_bad_manifest_content_is_refused_naming_file_and_key(tmp_path, text, words):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(RunFolderError) as err:
        Manifest.read(tmp_path)
    assert str(err.value).startswith(str(tmp_path)) and words in str(err.value)


def test_another_writers_extra_key_is_kept_but_ours_may_write_only_declared_keys(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"run_id": "x", "colour": "red"}))
    assert Manifest.read(tmp_path).body == {"run_id": "x", "colour": "red"}
    with pytest.raises(RunFolderError, match=r"manifest.json: colour: not a key of the run manifest"):
        Manifest({"colour": "red"}).write(tmp_path / "ours")


def test_the_slo_comes_from_the_manifest_else_the_workload_spec():
    assert Manifest(HEAD).slo == {"ttft_ms": 9}
    assert Manifest({**HEAD, "slo": {"ttft_ms": 3, "e2e_ms": 50}}).slo == {"ttft_ms": 3, "e2e_ms": 50}
    assert Manifest({}).slo == {}


def test_kv_block_bytes_and_the_registered_prediction():
    m = Manifest({"model": {"kv_bytes_per_token": 23_040}, "engine_config": {"block_size": 16}})
    assert m.kv_block_bytes == 368_640
    assert Manifest({"model": {"kv_bytes_per_token": 23_040}}).kv_block_bytes is None
    assert Manifest({"prediction": {"skipped": "no file"}}).registered_prediction is None
    assert Manifest({"prediction": {"sha256": "ab"}}).registered_prediction == {"sha256": "ab"}


def test_the_layout_record_reads_old_and_new_and_refuses_bad_ones(tmp_path):
    assert Layout.read(tmp_path) is None
    (tmp_path / "layout.json").write_text('{"buckets": 4, "events": 10}\n')  # as written before its version
    assert Layout.read(tmp_path) == Layout(4, 10)
    (tmp_path / "layout.json").write_text('{"format": 1, "buckets": 4, "events": 10}\n')  # format 1: no parts
    assert Layout.read(tmp_path) == Layout(4, 10)
    Layout(8, 3).write(tmp_path)
    assert json.loads((tmp_path / "layout.json").read_text()) == {"format": 2, "buckets": 8, "events": 3}
    assert Layout.read(tmp_path) == Layout(8, 3)
    parts = {"bucket-0001": (PartRecord("part-00000.parquet", 5, 900, "ab" * 32),)}
    Layout(8, 3, parts).write(tmp_path)
    assert Layout.read(tmp_path) == Layout(8, 3, parts)
    (tmp_path / "layout.json").write_text('{"buckets": 0}')
    with pytest.raises(RunFolderError, match="layout.json: buckets: not a layout record"):
        Layout.read(tmp_path)
    (tmp_path / "layout.json").write_text('{"format": 2, "buckets": 2, "parts": {"run": [{"name": "p", "rows": "5"}]}}')
    with pytest.raises(RunFolderError, match=r"layout.json: parts.run\[0\].rows: not a part record"):
        Layout.read(tmp_path)


def test_the_study_index_names_the_key_that_is_wrong(tmp_path):
    doc = {"format": 1, "name": "s", "question": "q", "knob": "k", "state": "running",
           "runs": [{"name": "a", "dir": "runs/a", "knob": {"x": 1}}]}
    StudyIndex(doc).write(tmp_path)
    assert StudyIndex.read(tmp_path).doc == doc
    (tmp_path / "study.json").write_text(json.dumps({**doc, "runs": [{"name": "a"}]}))
    with pytest.raises(RunFolderError, match=r"study.json: runs\[0\].dir: expected str"):
        StudyIndex.read(tmp_path)
    with pytest.raises(RunFolderError, match="no study.json"):
        StudyIndex.read(tmp_path / "elsewhere")


def test_the_key_reference_in_the_docs_is_current():
    text = ARCHITECTURE_MD.read_text()
    assert run_folder.DOC_BEGIN in text and run_folder.DOC_END in text
    assert run_folder.splice_reference(text) == text, \
        "docs/ARCHITECTURE.md is stale: run `python -m inferledger.probes.run_folder --write`"
    for key in ("slo.ttft_ms", "workload.spec.slo", "model.kv_bytes_per_token", "engine_config.block_size"):
        assert f"| `{key}` |" in text
