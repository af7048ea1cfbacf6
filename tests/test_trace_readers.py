"""The trace readers without a model: each shipped sample read to its exact rows and arrival offsets
after time scaling, the row window, and every bad row refused by file:line and field, all listed,
before anything runs."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.workload import Workload
from inferledger.collectors.workload.trace_read import read_trace

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "samples" / "traces"
WORKLOADS = REPO / "samples" / "workloads"


def _workload(tmp: Path, fmt: str, trace_file: str, **trace) -> Workload:
    (tmp / "tasks.jsonl").write_text(json.dumps({"prompt": "q?", "answer": "a"}) + "\n")
    spec = {"taskset": {"file": "tasks.jsonl"}, "arrivals": {"process": "trace", "speed": trace.pop("speed", 1.0)},
            "trace": {"format": fmt, "file": trace_file, **trace}, "contract": {"deadline_ms": 60_000},
            "client": {"timeout_ms": 30_000}, "generation": {"max_tokens": 64}}
    return Workload.from_dict(spec, base=tmp, where="w.toml")


def _refusal(path: Path, fmt: str, **kw) -> list[str]:
    with pytest.raises(ValueError) as info:
        read_trace(path, fmt, **kw)
    return str(info.value).splitlines()


def test_a_trace_and_a_replay_file_are_hashed_as_far_as_they_are_read(tmp_path):
    """A window at the start of a multi-GB trace costs the time of its rows: the input's identity is the
    sha256 of the lines read (through the one that filled the window), and it says how many bytes of the
    file it covers; the rest of the file is not the run's input. A file read to its end is hashed whole."""
    lines = [json.dumps({"timestamp": i * 1000, "input_length": 10, "output_length": 5, "hash_ids": [i]}) + "\n"
             for i in range(5)]
    trace, replay = tmp_path / "m.jsonl", tmp_path / "r.txt"
    trace.write_text("".join(lines))
    whole = _workload(tmp_path, "mooncake", "m.jsonl").trace.read
    size = len("".join(lines))
    assert (whole.sha256, whole.sha256_bytes, whole.file_bytes) == (
        hashlib.sha256("".join(lines).encode()).hexdigest(), size, size)
    with open(trace, "r+b") as f:  # a 4 GiB tail, never read (sparse: written at its end only)
        f.truncate(size + (4 << 30))
        f.seek(size + (4 << 30) - 2)
        f.write(b"x\n")
    window = _workload(tmp_path, "mooncake", "m.jsonl", max_rows=3)
    assert (window.trace.read.sha256, window.trace.read.sha256_bytes, window.trace.read.file_bytes) == (
        hashlib.sha256("".join(lines[:3]).encode()).hexdigest(), len("".join(lines[:3])), size + (4 << 30))
    trace.write_text("".join(lines[:3]) + "another tail\n")
    assert _workload(tmp_path, "mooncake", "m.jsonl", max_rows=3).sha256 == window.sha256
    trace.write_text("".join(lines[:2]) + lines[3])  # a line read differs: another input
    assert _workload(tmp_path, "mooncake", "m.jsonl", max_rows=3).sha256 != window.sha256
    replay.write_text("0\n10\n20\nnot an arrival, never read\n")
    spec = {"taskset": {"file": "tasks.jsonl"}, "arrivals": {"process": "replay", "file": "r.txt", "n_tasks": 3},
            "contract": {"deadline_ms": 60_000}, "client": {"timeout_ms": 30_000}, "generation": {"max_tokens": 8}}
    assert Workload.from_dict(spec, base=tmp_path, where="w.toml").replay == {
        "path": str(replay), "sha256": hashlib.sha256(b"0\n10\n20\n").hexdigest(), "sha256_bytes": 8,
        "file_bytes": 35}


def test_a_pipe_or_a_device_as_a_trace_or_replay_file_is_refused_not_waited_on(tmp_path):
    """A FIFO with no writer blocked the workload's load for ever (a device may never end): refused by key."""
    import os

    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match=r"w\.toml: \[trace\]\.file: .*pipe cannot be read \(not a regular file"):
        _workload(tmp_path, "mooncake", "pipe")
    spec = {"taskset": {"file": "tasks.jsonl"}, "arrivals": {"process": "replay", "file": "/dev/zero"},
            "contract": {"deadline_ms": 60_000}, "client": {"timeout_ms": 30_000}, "generation": {"max_tokens": 8}}
    with pytest.raises(ValueError, match=r"w\.toml: \[arrivals\]\.file: /dev/zero cannot be read \(not a regular"):
        Workload.from_dict(spec, base=tmp_path, where="w.toml")


def test_line_ends_and_a_byte_order_mark_read_as_before_and_bare_carriage_returns_are_named(tmp_path):
    """The lines are read as bytes (to hash what is read): \\r\\n ends and a leading byte-order mark read
    as in text mode; a file whose lines end in a bare \\r is refused saying so."""
    head = "TIMESTAMP,ContextTokens,GeneratedTokens"
    (tmp_path / "crlf.csv").write_bytes(f"\ufeff{head}\r\n2024-05-10 00:00:00.5,10,2\r\n2024-05-10 00:00:01,12,3\r\n"
                                        .encode())
    assert [(r.line, r.t_ns, r.input_tokens) for r in read_trace(tmp_path / "crlf.csv", "azure").rows] == [
        (2, 0, 10), (3, 500_000_000, 12)]
    (tmp_path / "cr.csv").write_bytes(f"{head}\r2024-05-10 00:00:00,10,2\r".encode())
    assert _refusal(tmp_path / "cr.csv", "azure") == [
        f"{tmp_path / 'cr.csv'}:1: cannot be read as CSV (its lines end in a bare carriage return: lines end in \\n "
        f"or \\r\\n)"]


def test_mooncake_sample_arrives_at_its_timestamps_over_the_speed():
    wl = Workload.load(WORKLOADS / "trace_mooncake.toml")  # speed 4
    assert wl.process == "trace" and wl.n_tasks == 12 and wl.ignore_eos is True
    assert wl.arrival_offsets() == pytest.approx(
        [0.0, 0.175, 0.375, 0.65, 0.825, 1.05, 1.25, 1.525, 1.725, 1.9, 2.2, 2.375], abs=1e-12)
    rows = wl.trace.read.rows
    assert [(r.line, r.input_tokens, r.output_tokens) for r in rows[:3]] == [(1, 3000, 120), (2, 2600, 60),
                                                                            (3, 4300, 200)]
    assert rows[2].hash_ids == (1, 2, 3, 4, 5, 13, 14, 15, 16) and rows[2].t_ns == 1_500_000_000


def test_burstgpt_sample_keeps_failed_rows_on_the_time_axis_but_sends_none():
    wl = Workload.load(WORKLOADS / "trace_burstgpt.toml")  # speed 10; lines 4 and 8 have 0 response tokens
    assert wl.n_tasks == 10 and [c.name for c in wl.classes] == ["ChatGPT", "GPT-4"]
    assert [r.line for r in wl.trace.sent_rows] == [2, 3, 5, 6, 7, 9, 10, 11, 12, 13]
    assert wl.arrival_offsets() == pytest.approx([0.0, 0.2, 0.7, 0.8, 1.2, 1.5, 1.95, 2.4, 2.6, 3.0], abs=1e-12)
    assert [r.model for r in wl.trace.read.rows[:3]] == ["ChatGPT", "ChatGPT", "GPT-4"]


def test_azure_sample_timestamps_keep_every_digit_of_their_fraction():
    read = read_trace(TRACES / "azure_sample.csv", "azure")
    assert [r.t_ns for r in read.rows] == [0, 240_410_000, 749_660_000, 819_410_000, 1_329_410_000, 2_096_010_000,
                                          2_519_420_000, 2_978_410_000, 3_419_410_000, 4_161_410_000,
                                          4_619_410_000, 5_365_310_000]
    assert [(r.input_tokens, r.output_tokens) for r in read.rows[:2]] == [(1024, 86), (388, 12)]
    wl = Workload.load(WORKLOADS / "trace_azure.toml")  # speed 2
    assert wl.arrival_offsets()[:3] == pytest.approx([0.0, 0.120205, 0.37483], abs=1e-12)


def test_azure_timestamps_with_a_zone_are_placed_in_utc(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.5+00:00,10,2\n"
                    "2024-05-10T02:00:01+02:00,10,2\n2024-05-10 00:00:02Z,10,2\n")
    assert [r.t_ns for r in read_trace(path, "azure").rows] == [0, 500_000_000, 1_500_000_000]


def test_the_window_skips_and_limits_rows_and_starts_the_replay_at_its_first_row(tmp_path):
    # trace time of the sample's rows (s): 0 .7 1.5 2.6 3.3 4.2 5.0 6.1 6.9 7.6 8.8 9.5
    wl = _workload(tmp_path, "mooncake", str(TRACES / "mooncake_sample.jsonl"), start_s=1.0, end_s=7.0,
                   skip_rows=1, max_rows=3)
    assert [r.line for r in wl.trace.read.rows] == [4, 5, 6]
    assert wl.trace.read.rows_read == 6 and wl.n_tasks == 3  # reading stopped when the window was full
    assert wl.arrival_offsets() == pytest.approx([0.0, 0.7, 1.6], abs=1e-12)
    ended = _workload(tmp_path, "mooncake", str(TRACES / "mooncake_sample.jsonl"), start_s=6.0, end_s=7.6)
    assert [r.line for r in ended.trace.read.rows] == [8, 9]


def test_every_bad_mooncake_row_is_refused_by_line_and_field(tmp_path):
    path = tmp_path / "m.jsonl"
    ok = lambda t: json.dumps({"timestamp": t, "input_length": 100, "output_length": 10, "hash_ids": [1]})
    path.write_text("\n".join([
        ok(0),
        '{"timestamp": 10, "input_length": "a lot", "output_length": 10, "hash_ids": [1]}',
        '{"timestamp": 20, "output_length": -1, "hash_ids": [1]}',
        "{not json",
        ok(30),
        ok(25),
        '{"timestamp": NaN, "input_length": 10.5, "output_length": 1, "hash_ids": [1, -2]}',
        "[1, 2]",
        "",
        ok(40),
    ]) + "\n")
    assert _refusal(path, "mooncake") == [
        f"{path}:2: input_length: must be a number, not \"a lot\"",
        f"{path}:3: input_length: missing",
        f"{path}:3: output_length: must be >= 0, not -1",
        f"{path}:4: row: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        f"{path}:6: timestamp: earlier than line 5's; a trace's rows must be in time order",
        f"{path}:7: timestamp: must be a finite number, not nan",
        f"{path}:7: input_length: must be a whole number of tokens, not 10.5",
        f"{path}:7: hash_ids: must be a list of whole numbers >= 0, not [1, -2]",
        f"{path}:8: row: must be a JSON object, not [1, 2]",
    ]


def test_every_bad_burstgpt_row_is_refused_by_line_and_column(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "0,ChatGPT,10,5,15,Conversation log\n"
                    "abc,ChatGPT,10,5,15,Conversation log\n"
                    "5,GPT-4,10,5,15,API log\n"
                    "6,ChatGPT,-5,nan,15,Conversation log\n"
                    "7,GPT-4,10\n"
                    "1,ChatGPT,10,5,15,API log\n")
    assert _refusal(path, "burstgpt") == [
        f"{path}:3: Timestamp: must be a number, not 'abc'",
        f"{path}:5: Request tokens: must be >= 0, not '-5'",
        f"{path}:5: Response tokens: must be a finite number, not 'nan'",
        f"{path}:6: Response tokens: missing",
        f"{path}:6: Total tokens: missing",
        f"{path}:6: Log Type: missing",
        f"{path}:7: Timestamp: earlier than line 4's; a trace's rows must be in time order",
    ]


def test_a_csv_without_a_column_of_its_format_is_refused_at_its_header(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens\n0,ChatGPT,10,5\n")
    assert _refusal(path, "burstgpt") == [
        f"{path}:1: header: no column 'Total tokens', 'Log Type' for a burstgpt trace "
        "(columns: 'Timestamp', 'Model', 'Request tokens', 'Response tokens')"]


def test_every_bad_azure_row_is_refused_by_line_and_column(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,100,10\n"
                    "16/11/2023 18:15,100,10\n"
                    "2023-11-16 18:15:47.0,,inf\n"
                    "2023-11-16 18:15:46.0,100,10\n")
    assert _refusal(path, "azure") == [
        f"{path}:3: TIMESTAMP: must be a datetime like '2023-11-16 18:15:46.6805900', not '16/11/2023 18:15'",
        f"{path}:4: ContextTokens: missing",
        f"{path}:4: GeneratedTokens: must be a finite number, not 'inf'",
        f"{path}:5: TIMESTAMP: earlier than line 2's; a trace's rows must be in time order",
    ]


def test_a_flood_of_bad_rows_is_listed_up_to_a_bound_and_counted(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "2023-11-16 18:15:46,x,1\n" * 60)
    lines = _refusal(path, "azure")
    assert len(lines) == 51 and lines[49] == f"{path}:51: ContextTokens: must be a number, not 'x'"
    assert lines[50] == f"{path}: … and 10 more bad rows"


def test_a_window_with_no_row_or_no_output_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"no row in the window \(\[trace\] skip_rows = 0, start_s = 20.0"):
        _workload(tmp_path, "mooncake", str(TRACES / "mooncake_sample.jsonl"), start_s=20.0)
    (tmp_path / "b.csv").write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                    "0,ChatGPT,10,0,10,API log\n")
    with pytest.raises(ValueError, match="every row of the window has 0 output tokens"):
        _workload(tmp_path, "burstgpt", "b.csv")


def test_a_missing_trace_file_names_the_workload_key(tmp_path):
    with pytest.raises(ValueError, match=r"^w\.toml: \[trace\]\.file: .*nope\.jsonl cannot be read"):
        _workload(tmp_path, "mooncake", "nope.jsonl")


@pytest.mark.parametrize("toml_lines, where", [
    ('[trace]\nformat = "azure"', "[trace]: only with [arrivals].process = 'trace'"),
    ('[arrivals]\nprocess = "trace"', "[trace].format: required for process = 'trace'"),
    ('[arrivals]\nprocess = "trace"\nn_tasks = 3\n[trace]\nformat = "azure"\nfile = "a.csv"',
     "[arrivals].n_tasks: a trace's rows are its tasks: limit them with [trace].max_rows"),
    ('[arrivals]\nprocess = "trace"\n[trace]\nformat = "azure"\nfile = "a.csv"\n[[classes]]\nname = "x"',
     "[[classes]]: a trace's rows are its tasks (single calls): no classes with process = 'trace'"),
    ('[arrivals]\nprocess = "trace"\n[trace]\nformat = "azure"\nfile = "a.csv"\nstart_s = 5\nend_s = 5',
     "[trace].end_s: 5.0 is not after start_s = 5.0"),
    ('[arrivals]\nprocess = "trace"\n[trace]\nformat = "azure"\nfile = "a.csv"\nblock_tokens = 16',
     "[trace].block_tokens: only Mooncake traces have blocks, not 'azure'"),
    ('[arrivals]\nprocess = "trace"\n[trace]\nformat = "sharegpt"\nfile = "a.csv"',
     "[trace].format: must be one of 'mooncake', 'burstgpt' or 'azure', not 'sharegpt'"),
    ('[arrivals]\nprocess = "trace"\n[trace]\nformat = "azure"\nfile = "a.csv"\nmax_rows = 1.5',
     "[trace].max_rows: must be an integer, not 1.5"),
    ('[arrivals]\nprocess = "trace"\n[trace]\nformat = "azure"\nfile = "a.csv"\nstrict = "yes"',
     "[trace].strict: must be true or false, not 'yes'"),
    ('[arrivals]\nprocess = "trace"\n[trace]\nformat = "azure"\nfile = "a.csv"\ntoken_scal = 0.5',
     "[trace].token_scal: unknown key (did you mean token_scale?)"),
    ('[arrivals]\nprocess = "trace"\n[trace]\nformat = "azure"\nfile = "a.csv"\ntoken_scale = 0',
     "[trace].token_scale: must be > 0.0, not 0"),
])
def test_the_trace_section_is_checked_like_every_other(tmp_path, toml_lines, where):
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"prompt": "q?", "answer": "a"}) + "\n")
    head = ('[taskset]\nfile = "tasks.jsonl"\n[contract]\ndeadline_ms = 1000\n[client]\ntimeout_ms = 1000\n'
            '[generation]\nmax_tokens = 4\n')
    if not toml_lines.startswith("[arrivals]"):
        head += "[arrivals]\nrate_rps = 1.0\nn_tasks = 1\n"
    path = tmp_path / "w.toml"
    path.write_text(head + toml_lines + "\n")
    with pytest.raises(ValueError) as info:
        Workload.load(path)
    assert f"{path}: {where}" in str(info.value).splitlines()


def test_capture_refuses_a_bad_trace_with_exit_2_and_writes_nothing(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"timestamp": 0, "input_length": 100, "output_length": "ten", "hash_ids": []}\n')
    wl = tmp_path / "w.toml"
    wl.write_text(f'[taskset]\nfile = "{REPO / "samples" / "tasks" / "basic.jsonl"}"\n[arrivals]\nprocess = "trace"\n'
                  '[trace]\nformat = "mooncake"\nfile = "m.jsonl"\n[contract]\ndeadline_ms = 1000\n'
                  '[client]\ntimeout_ms = 1000\n[generation]\nmax_tokens = 4\n')
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["capture", "-w", str(wl), "-o", str(out)])
    flat = "".join(res.output.split()).replace("│", "")
    assert res.exit_code == 2 and "m.jsonl:1:output_length:mustbeanumber,not\"ten\"" in flat
    assert not out.exists()


def test_generated_mooncake_traces_load_within_the_bounds_or_are_refused_by_line_or_key(tmp_path):
    """Rows of hostile values (huge, negative, fractional, non-finite, text, a timestamp 10^21 ms away):
    the workload loads with every arrival within the horizon, or a ValueError names the file and line
    or the key; never another exception."""
    import re

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from inferledger.collectors.workload.schema import MAX_HORIZON_S

    number = st.sampled_from([0, 1, 2, 7, 100, 3000, -1, 10 ** 21, 2 ** 63, 0.5, 1e300, "1", None]) \
        | st.integers(0, 5000)
    row = st.fixed_dictionaries({"timestamp": number, "input_length": number, "output_length": number,
                                 "hash_ids": st.lists(st.integers(-3, 10 ** 20), max_size=4) | number})
    named = re.compile(r"^(\S+:\d+: |\S+: |w\.toml: \[\w+\]\.\w+: |a context )")

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(row, min_size=1, max_size=5), st.sampled_from([0.001, 1.0, 1000.0]))
    def check(rows, speed):
        (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        try:
            wl = _workload(tmp_path, "mooncake", "t.jsonl", speed=speed)
        except ValueError as exc:
            assert all(named.match(line) for line in str(exc).splitlines()), str(exc)
            return
        assert all(0 <= t <= MAX_HORIZON_S for t in wl.arrival_offsets())

    check()


# ---- bounds of reading: rows read, rows kept, line length, magnitudes (docs/CAPTURE.md "Bounds") ----------

BURST_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def _burst(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "b.csv"
    path.write_text(BURST_HEAD + "".join(r + "\n" for r in rows))
    return path


def test_a_trace_is_read_for_at_most_its_bound_of_rows_naming_the_line_and_the_window(tmp_path, monkeypatch):
    from inferledger.collectors.workload import trace_read

    monkeypatch.setattr(trace_read, "MAX_TRACE_ROWS_READ", 5)
    path = _burst(tmp_path, [f"{i},ChatGPT,10,5,15,API log" for i in range(10)])
    assert [r.line for r in read_trace(path, "burstgpt", skip_rows=2, max_rows=3).rows] == [4, 5, 6]
    assert _refusal(path, "burstgpt", skip_rows=8) == [
        f"{path}:7: 5 rows read and the window ([trace] skip_rows = 8, start_s = 0.0, end_s = None, max_rows = None) "
        f"is not complete: a trace is read for at most 5 rows (about 5 s); cut the rows to replay into a file of "
        f"their own"]


def test_a_window_of_more_rows_than_a_workload_may_send_is_refused_while_reading(tmp_path, monkeypatch):
    from inferledger.collectors.workload import trace_plans

    monkeypatch.setattr(trace_plans, "MAX_TASKS", 3)
    _burst(tmp_path, [f"{i},ChatGPT,10,{i % 2 * 5},15,API log" for i in range(9)])  # every other row has an output
    with pytest.raises(ValueError) as info:
        _workload(tmp_path, "burstgpt", "b.csv")
    assert str(info.value) == (f"{tmp_path / 'b.csv'}:9: the window ([trace] skip_rows = 0, start_s = 0.0, end_s = "
                               f"None, max_rows = None) holds more than 3 rows with an output: at most 3 tasks in one "
                               f"workload; set [trace].max_rows (at most 3) or a shorter window")
    assert _workload(tmp_path, "burstgpt", "b.csv", max_rows=6).n_tasks == 3


def test_a_line_past_the_bound_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    from inferledger.collectors.workload import trace_read

    monkeypatch.setattr(trace_read, "MAX_TRACE_LINE_BYTES", 100)
    path = _burst(tmp_path, ["0,ChatGPT,10,5,15,API log", "1," + "G" * 200 + ",10,5,15,API log"])
    assert _refusal(path, "burstgpt") == [
        f"{path}:3: a line longer than 100 bytes (allowed: at most 100: one row of a trace)"]
    moon = tmp_path / "m.jsonl"
    moon.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [' + "1, " * 60 + "1]}\n")
    assert _refusal(moon, "mooncake") == [
        f"{moon}:1: a line longer than 100 bytes (allowed: at most 100: one row of a trace)"]


def test_values_past_their_bounds_and_unreadable_csv_are_refused_by_line_and_column(tmp_path):
    """A timestamp 10^400 s away (it overflowed the arrival offsets), a token count whose digits would
    take forever to spell out, a field past the csv module's own limit: each named by line, at once."""
    import time

    path = _burst(tmp_path, ["0,ChatGPT,10,5,15,API log", "1e400,ChatGPT,10,5,15,API log",
                             "2,ChatGPT,1e999999999,5,15,API log", "3,ChatGPT,10,1" + "0" * 20 + ",15,API log"])
    t0 = time.perf_counter()
    assert _refusal(path, "burstgpt") == [
        f"{path}:3: Timestamp: must be <= 10000000000 (1e+10 s), not '1e400'",
        f"{path}:4: Request tokens: must be <= 1000000000 tokens, not '1e999999999'",
        f"{path}:5: Response tokens: must be <= 1000000000 tokens, not '100000000000000000000'"]
    assert time.perf_counter() - t0 < 1
    big = _burst(tmp_path, ["0,ChatGPT,10,5,15,API log", '1,"' + "x" * 200_000 + '",10,5,15,API log'])
    assert _refusal(big, "burstgpt") == [f"{big}:3: cannot be read as CSV (field larger than field limit (131072))"]
    moon = tmp_path / "m.jsonl"
    moon.write_text('{"timestamp": 1e17, "input_length": 1, "output_length": 1, "hash_ids": []}\n' + "[" * 5000 + "\n")
    assert _refusal(moon, "mooncake") == [
        f"{moon}:1: timestamp: must be <= 10000000000000 (1e+10 s), not 1e+17",
        f"{moon}:2: row: not JSON (nested too deeply)"]


def _generated_csv_check(tmp_path, fmt: str, head: str, good, hostile, examples: int):
    """Files of good rows (`good`: a strategy of one row's cells, timestamps sorted) with up to three
    cells made hostile (huge, negative, fractional, non-finite, exponents, text, quotes, empty): the
    workload loads with every arrival within the horizon and its rows exactly the file's numbers, or a
    ValueError names the file and line or the key; never another exception, never a hang."""
    import csv
    import io
    import re
    import time

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from inferledger.collectors.workload.schema import MAX_HORIZON_S, MAX_TASKS

    named = re.compile(r"^(\S+:\d+: |\S+: |w\.toml: \[\w+\]\.\w+: )")
    columns = FIELDS_OF[fmt]
    n_cols = len(head.split(","))
    edit = st.tuples(st.integers(0, 5), st.integers(0, n_cols - 1), st.sampled_from(hostile))

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(good, min_size=1, max_size=6), st.lists(edit, max_size=3), st.sampled_from([0.001, 1.0, 1000.0]),
           st.sampled_from([{}, {"max_rows": 2}, {"skip_rows": 1}, {"start_s": 1.0, "end_s": 1e9}]))
    def check(rows, edits, speed, window):
        rows = [list(r) for r in sorted(rows)]  # time order (the good cells' first is the time)
        for i, j, value in edits:
            rows[i % len(rows)][j] = value
        text = head + "".join(",".join(r) + "\n" for r in rows)
        (tmp_path / "t.csv").write_text(text)
        t0 = time.perf_counter()
        try:
            wl = _workload(tmp_path, fmt, "t.csv", speed=speed, **window)
        except ValueError as exc:
            assert all(named.match(line) for line in str(exc).splitlines()), str(exc)
            return
        finally:
            assert time.perf_counter() - t0 < 5
        assert 1 <= wl.n_tasks <= MAX_TASKS and all(0 <= t <= MAX_HORIZON_S for t in wl.arrival_offsets())
        reader = csv.reader(io.StringIO(text))
        header = next(reader)
        cells = {reader.line_num: dict(zip(header, values)) for values in reader}
        for r in wl.trace.read.rows:  # no silently different plan: each row read is its line's numbers
            read = cells[r.line]
            assert (r.input_tokens, r.output_tokens) == (int(float(read[columns[1]])), int(float(read[columns[2]])))

    check()


FIELDS_OF = {"burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
             "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens")}
HOSTILE_CELLS = ["0", "1", "7", "100", "3000", "-1", "0.5", "1e3", "1e400", "1e999999999", "nan", "inf", "",
                 "abc", "10" + "0" * 25, '"5"', '"', "1_000", " 12 "]


def test_generated_burstgpt_traces_load_within_the_bounds_or_are_refused_by_line_or_key(tmp_path):
    from hypothesis import strategies as st

    count = st.integers(0, 5000).map(str)
    good = st.tuples(st.integers(0, 10 ** 6).map(str), st.sampled_from(["ChatGPT", "GPT-4"]), count, count, count,
                     st.sampled_from(["Conversation log", "API log"]))
    _generated_csv_check(tmp_path, "burstgpt", BURST_HEAD, good, HOSTILE_CELLS + ["1e10", "9999999999", '"a,b"'],
                         examples=60)


def test_generated_azure_traces_load_within_the_bounds_or_are_refused_by_line_or_key(tmp_path):
    from datetime import datetime

    from hypothesis import strategies as st

    stamps = ["9999-12-31 23:59:59", "0001-01-01 00:00:00", "2023-11-16 18:15:46+05:00", "2023-02-30 00:00:00",
              "16/11/2023 18:15", "2023-11-16T18:15:48Z"]
    count = st.integers(0, 5000).map(str)
    when = st.datetimes(min_value=datetime(2023, 11, 16), max_value=datetime(2023, 11, 17))
    good = st.tuples(when.map(lambda d: d.strftime("%Y-%m-%d %H:%M:%S.%f")), count, count)
    _generated_csv_check(tmp_path, "azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n", good, HOSTILE_CELLS + stamps,
                         examples=60)
