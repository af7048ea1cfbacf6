"""The importer against what an adversary (or a buggy exporter) writes: NaN, infinities, numbers past
int64, times whose differences would overflow, absurd nesting, one attempt id under two tasks, a bad
--out; and a hypothesis pass: whatever is imported with --lenient, `reconstruct` never fails."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from inferledger.collectors.rundir.e0_import import ArchiveError, OutDirError, import_archive
from inferledger.ledger.reconstruct import reconstruct

DECL = '{"name": "clock.domain", "clock": "cm", "attrs": {"host": "c1"}}'
SENT = {"name": "attempt.sent", "source": "client", "attempt_id": "A1", "ts_ns": 100, "clock": "cm"}


def _refused(tmp_path: Path, *lines: str) -> list[tuple[int, str]]:
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join((DECL,) + lines) + "\n")
    with pytest.raises(ArchiveError) as info:
        import_archive(path, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    return info.value.refusals


@pytest.mark.parametrize("line, words", [
    ('{"name": "attempt.sent", "source": "client", "attempt_id": "A1", "ts_ns": 100, "clock": "cm", "value": NaN}',
     "NaN is not a JSON number"),
    ('{"name": "task.start", "source": "client", "task_id": "T1", "ts_ns": 1, "clock": "cm", "attrs": {"deadline_ms": NaN}}',
     "a NaN deadline is an unreadable contract"),
    ('{"name": "attempt.sent", "source": "client", "attempt_id": "A1", "ts_ns": 100, "clock": "cm", "value": -Infinity}',
     "-Infinity is not a JSON number"),
    ('{"name": "attempt.sent", "source": "client", "attempt_id": "A1", "ts_ns": 100, "clock": "cm", "value": 1e400}',
     "the number 1e400 overflows a double"),
    (json.dumps({**SENT, "attrs": {"usage": {"completion_tokens": 2**63}}}),
     "attrs.usage.completion_tokens = 9223372036854775808 is outside the int64 span"),
    (json.dumps({**SENT, "value": -2.0**64}), "value = -1.8446744073709552e+19 is outside the int64 span"),
    (json.dumps({**SENT, "ts_ns": 2**61 + 1}), "ts_ns 2305843009213693953 is outside ±2^61 ns"),
    (json.dumps({**SENT, "ts_ns": -(2**63)}), "outside ±2^61 ns"),
    (json.dumps({**SENT, "attrs": {"x": json.loads("[" * 40 + "]" * 40)}}), "nested deeper than 32 levels"),
    ('{"name": "attempt.sent", "attrs": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than 32 levels"),
    ('{"name": "attempt.sent", "source": "client", "attempt_id": "A\\ud800", "ts_ns": 100, "clock": "cm"}',
     "the string 'A\\ud800' holds a lone UTF-16 surrogate: not valid Unicode"),
    ('{"name": "attempt.sent", "source": "client", "attempt_id": "A1", "ts_ns": 100, "clock": "cm", "attrs": {"k\\udfff": 1}}',
     "holds a lone UTF-16 surrogate"),
])
def test_unreadable_numbers_and_nesting_are_refused_at_their_line(tmp_path, line, words):
    got = _refused(tmp_path, line)
    assert [n for n, _ in got] == [2] and words in got[0][1], got


def test_a_clock_map_that_would_overflow_mapped_times_is_refused(tmp_path):
    decl_s = '{"name": "clock.domain", "clock": "sm", "attrs": {"host": "s1"}}'
    big = {"name": "clock.map", "attrs": {"from": "sm", "to": "cm", "offset_ns": -(2**63), "epsilon_ns": 2**62}}
    got = _refused(tmp_path, decl_s, json.dumps(big))
    assert got[0][0] == 3 and "offset_ns" in got[0][1] and "epsilon_ns" in got[0][1]


def test_one_attempt_under_two_tasks_or_requests_is_refused(tmp_path):
    a = {**SENT, "task_id": "T1", "request_id": "R1"}
    got = _refused(tmp_path, json.dumps(a), json.dumps({**a, "name": "attempt.done", "ts_ns": 200, "task_id": "T2"}),
                   json.dumps({**a, "name": "attempt.done", "ts_ns": 300, "request_id": "R9", "event_id": "x"}))
    assert [n for n, _ in got] == [3, 4]
    assert "attempt_id 'A1' belongs to task 'T1' (line 2); this line puts it under 'T2'" in got[0][1]
    assert "belongs to request 'R1' (line 2)" in got[1][1]


def test_lenient_keeps_unreadable_lines_as_gaps_and_the_run_rebuilds(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join([DECL, json.dumps(SENT), json.dumps({**SENT, "name": "attempt.done", "ts_ns": 150,
                                                                   "attrs": {"usage": {"completion_tokens": 2**64}}}),
                               '{"name": "attempt.done", "source": "client", "attempt_id": "A1", "ts_ns": NaN}']) + "\n")
    res = import_archive(path, tmp_path / "run", lenient=True)
    assert (res.events, res.refused) == (1, 2)
    summary = reconstruct(tmp_path / "run")
    assert summary.n_attempts == 1


def test_out_must_be_a_new_writable_folder(tmp_path):
    from inferledger.cli.app import app

    archive = tmp_path / "a.jsonl"
    archive.write_text(DECL + "\n" + json.dumps(SENT) + "\n")
    (tmp_path / "file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    cases = {tmp_path / "file": "is a file", tmp_path / "other": "holds files that are not a run",
             tmp_path / "file" / "run": "cannot create or write this folder",
             Path("/proc/inferledger-no/run"): "cannot create or write this folder"}
    runner = CliRunner()
    for out, words in cases.items():
        with pytest.raises(OutDirError, match=words):
            import_archive(archive, out)
        res = runner.invoke(app, ["import", str(archive), "--out", str(out)])
        assert res.exit_code == 2 and words in res.stderr and "Traceback" not in res.stderr, res.output
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine" and not (tmp_path / "file").is_dir()


# -- hypothesis: nothing imported makes the ledger fail --------------------------------------------
I64 = 2**63 - 1
_int = st.one_of(st.integers(0, 10**9), st.sampled_from([0, -1, 2**31, 2**60, 2**61, -(2**61), 2**62, I64, -I64 - 1]))
_leaf = st.one_of(st.none(), st.booleans(), _int, st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4),
                  st.sampled_from(["content", "finish", "usage", "stop", "length", "cancelled", "error"]))
_json = st.recursive(_leaf, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=3), c, max_size=3)),
                     max_leaves=6)
_KEYS = ["kinds", "usage", "reason", "finish_reason", "correct", "stream", "span", "after", "parent", "drafted",
         "accepted", "forward_passes", "deadline_ms", "required", "on_missing", "max_attempts", "expected", "status",
         "blocks", "tokens", "cached_tokens", "end_ns", "index", "pacing_error_ms", "retry_after_s"]
_OWN = {"A1": ("T1", "R1"), "A2": ("T1", "R2"), "A3": ("T2", "R3")}


def _owned(e: dict) -> dict:
    if e.get("attempt_id") in _OWN and e.get("task_id"):
        e["task_id"], e["request_id"] = _OWN[e["attempt_id"]]
    return {k: v for k, v in e.items() if v is not None}


def _names():
    from inferledger.probes.events import VOCABULARY
    return sorted(VOCABULARY)


_event = st.fixed_dictionaries({
    "name": st.sampled_from(_names()), "source": st.sampled_from(["client", "server", "engine", "checker", "tool"]),
    "ts_ns": st.one_of(st.integers(0, 10**9), _int), "clock": st.sampled_from(["c", "s"]),
    "attempt_id": st.sampled_from(["A1", "A2", "A3", None]), "task_id": st.sampled_from(["T1", "T2", None]),
    "request_id": st.sampled_from(["R1", None]), "step_id": st.one_of(st.none(), _int), "value": st.one_of(st.none(), _leaf),
    "attrs": st.one_of(st.dictionaries(st.sampled_from(_KEYS), _json, max_size=4).map(lambda d: {"span": "x", **d}),
                       st.fixed_dictionaries({"span": st.sampled_from(["a", "b"]), "correct": st.booleans(),
                                              "kinds": st.lists(st.sampled_from(["content", "finish", "usage", "done"]), max_size=3),
                                              "reason": st.sampled_from(["stop", "length", "cancelled", "error"]),
                                              "usage": st.fixed_dictionaries({"completion_tokens": _int}),
                                              "deadline_ms": st.one_of(_int, st.floats(0, 1e9))}))}).map(_owned)
_map = st.fixed_dictionaries({"name": st.just("clock.map"), "attrs": st.fixed_dictionaries(
    {"from": st.just("s"), "to": st.just("c"), "offset_ns": _int, "epsilon_ns": _int})})


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(_event, _event, _event, _event, _map), min_size=3, max_size=30))
def test_whatever_lenient_import_accepts_reconstruct_rebuilds(lines):
    tmp = Path(tempfile.mkdtemp())
    try:
        decl = [{"name": "clock.domain", "clock": c, "attrs": {"host": "h"}} for c in ("c", "s")]
        (tmp / "a.jsonl").write_text("\n".join(json.dumps(x) for x in decl + lines) + "\n")
        res = import_archive(tmp / "a.jsonl", tmp / "run", lenient=True)
        if res.events:
            reconstruct(tmp / "run")  # any exception here fails the test
    finally:
        shutil.rmtree(tmp)


@pytest.mark.parametrize("value", [-1, 2.5, 2 ** 60])
def test_a_token_count_that_is_no_whole_number_is_refused_at_its_line(tmp_path, value):
    # the ledger refuses a run holding such a count, so the importer must not write one, even leniently
    lines = [{"name": "clock.domain", "clock": "c", "attrs": {"host": "h"}},
             {"name": "engine.enqueued", "source": "engine", "clock": "c", "ts_ns": 1, "attempt_id": "A",
              "value": value},
             {"name": "engine.enqueued", "source": "engine", "clock": "c", "ts_ns": 2, "attempt_id": "B", "value": 4}]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = import_archive(tmp_path / "a.jsonl", tmp_path / "run", lenient=True)
    assert [(n, why) for n, why in res.refusals] == [
        (2, f"value {value!r} of engine.enqueued is not a token count (a whole number from 0 to {2 ** 53})")]
    reconstruct(tmp_path / "run")
