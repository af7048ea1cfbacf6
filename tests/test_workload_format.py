"""The workload file's format: unknown keys refused in every section, values of exactly their key's
type (no string is a boolean, no 1.7 an integer), each refusal naming the file and the key; every
shipped sample still loads, and docs/CAPTURE.md lists exactly the keys the format has."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from inferledger.collectors.workload import Workload
from inferledger.collectors.workload.schema import SECTIONS, TaskClass, WorkloadFile

REPO = Path(__file__).resolve().parent.parent
GOOD = """name = "w"
seed = 3
[taskset]
file = "tasks.jsonl"
[arrivals]
rate_rps = 2.0
n_tasks = 4
[contract]
deadline_ms = 60000
[client]
timeout_ms = 2000
[generation]
max_tokens = 8
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"prompt": "q?", "answer": "a"}) + "\n")
    return tmp_path


def _load(folder: Path, toml: str, name: str = "cpu_demo.toml") -> Workload:
    path = folder / name
    path.write_text(toml)
    return Workload.load(path)


def _refused(folder: Path, toml: str) -> str:
    with pytest.raises(ValueError) as info:
        _load(folder, toml)
    return str(info.value)


def _with(section: str, line: str) -> str:
    """GOOD with `line` in [section] instead of its key's line there (a new table when GOOD has none;
    "" is the top level; GOOD's keys are all different, so the key's line is the one to take out)."""
    key = line.split("=")[0].strip()
    good = "".join(g for g in GOOD.splitlines(keepends=True) if section == "classes" or not g.startswith(f"{key} ="))
    if not section:
        return line + "\n" + good
    if section == "classes":
        return good + "[[classes]]\n" + line + "\n"
    head = f"[{section}]\n"
    return good.replace(head, head + line + "\n") if head in good else good + head + line + "\n"


def test_the_good_file_loads(folder):
    wl = _load(folder, GOOD)
    assert (wl.name, wl.seed, wl.n_tasks, wl.timeout_ms, wl.max_attempts) == ("w", 3, 4, 2000.0, 1)


def test_a_typo_in_client_is_refused_with_the_file_the_key_and_the_closest_key(folder):
    message = _refused(folder, _with("client", "timout = 5000"))
    assert message == f"{folder / 'cpu_demo.toml'}: [client].timout: unknown key (did you mean timeout_ms?)"


@pytest.mark.parametrize("section, key, where", [
    ("", "sede", "sede"),
    ("taskset", "fil", "[taskset].fil"),
    ("prompt", "tokeniser", "[prompt].tokeniser"),
    ("arrivals", "n_task", "[arrivals].n_task"),
    ("contract", "deadline", "[contract].deadline"),
    ("client", "max_attempt", "[client].max_attempt"),
    ("generation", "max_token", "[generation].max_token"),
    ("slo", "ttft", "[slo].ttft"),
    ("inject", "cancel_evry", "[inject].cancel_evry"),
    ("classes", "shap", "[[classes]][0].shap"),
])
def test_an_unknown_key_is_refused_in_every_section(folder, section, key, where):
    assert f": {where}: unknown key (did you mean " in _refused(folder, _with(section, f"{key} = 1"))


def test_a_key_with_nothing_close_lists_the_known_ones(folder):
    assert "[generation].zzz: unknown key (known: max_tokens, temperature, ignore_eos)" in \
        _refused(folder, _with("generation", "zzz = 1"))


@pytest.mark.parametrize("section, line, where", [
    ("generation", 'ignore_eos = "false"', "[generation].ignore_eos: must be true or false, not 'false'"),
    ("client", 'give_up_after_deadline = "no"', "[client].give_up_after_deadline: must be true or false, not 'no'"),
    ("client", "give_up_after_deadline = 0", "[client].give_up_after_deadline: must be true or false, not 0"),
    ("classes", 'ignore_eos = "yes"', "[[classes]][0].ignore_eos: must be true or false, not 'yes'"),
])
def test_a_string_or_number_is_not_a_boolean(folder, section, line, where):
    assert _refused(folder, _with(section, line)) == f"{folder / 'cpu_demo.toml'}: {where}"


@pytest.mark.parametrize("section, line, where", [
    ("", "seed = 1.7", "seed: must be an integer, not 1.7"),
    ("", 'seed = "abc"', "seed: must be an integer, not 'abc'"),
    ("", "seed = true", "seed: must be an integer, not True"),
    ("client", "max_attempts = 2.0", "[client].max_attempts: must be an integer, not 2.0"),
    ("arrivals", "concurrency = 1.5", "[arrivals].concurrency: must be an integer, not 1.5"),
    ("inject", "cancel_every = 2.5", "[inject].cancel_every: must be an integer, not 2.5"),
    ("inject", "cancel_tasks = [1, 2.5]", "[inject].cancel_tasks[1]: must be an integer, not 2.5"),
    ("classes", "turns = 1.5", "[[classes]][0].turns: must be an integer, not 1.5"),
    ("classes", "tool_before = [1.5]", "[[classes]][0].tool_before[0]: must be an integer, not 1.5"),
    ("client", 'timeout_ms = "5000"', "[client].timeout_ms: must be a number, not '5000'"),
    ("client", "jitter = true", "[client].jitter: must be a number, not True"),
    ("", "name = 7", "name: must be a string, not 7"),
    ("", "classes = 3", "[[classes]]: must be a list, not 3"),
    ("", "client = 3", "[client]: must be a table"),
])
def test_a_value_of_the_wrong_type_is_refused_by_its_key(folder, section, line, where):
    text = _with(section, line)
    if line.startswith("client = "):  # the table [client] becomes a number
        text = text.replace("[client]\ntimeout_ms = 2000\n", "")
    assert _refused(folder, text) == f"{folder / 'cpu_demo.toml'}: {where}"


@pytest.mark.parametrize("section, line, where", [
    ("contract", "on_missing = nan", "[contract].on_missing: must be one of 'failure' or 'partial_success', not nan"),
    ("arrivals", "cv2 = inf", "[arrivals].cv2: must be a finite number, not inf"),
    ("slo", "ttft_ms = -inf", "[slo].ttft_ms: must be a finite number, not -inf"),
    ("classes", "tool_ms = nan", "[[classes]][0].tool_ms: must be a finite number, not nan"),
])
def test_nan_and_inf_are_refused_by_their_key(folder, section, line, where):
    assert _refused(folder, _with(section, line)).endswith(where)


def test_every_refusal_is_listed_one_per_line(folder):
    text = _with("client", "timout = 1").replace("seed = 3", "seed = 1.5").replace("max_tokens = 8", "")
    lines = _refused(folder, text).splitlines()
    path = folder / "cpu_demo.toml"
    assert lines == [f"{path}: seed: must be an integer, not 1.5",
                     f"{path}: [client].timout: unknown key (did you mean timeout_ms?)",
                     f"{path}: [generation].max_tokens: required"]


@pytest.mark.parametrize("line, where", [
    ("[arrivals]\nprocess = \"closed\"", "[arrivals].concurrency: required for process = 'closed'"),
    ("[inject]\ntimeout_tasks = [1]", "[inject].timeout_ms: required by timeout_every / timeout_tasks"),
    ("[[classes]]\nprompt_tokens = 16\nshared_prefix_tokens = 32",
     "[[classes]][0].prompt_tokens: 16 is shorter than shared_prefix_tokens = 32"),
])
def test_rules_between_keys_name_the_key(folder, line, where):
    text = GOOD.replace("[arrivals]\n", line + "\n") if line.startswith("[arrivals]") else GOOD + line + "\n"
    assert where in _refused(folder, text)


@pytest.mark.parametrize("path", sorted((REPO / "samples" / "workloads").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_sample_workload_loads(path):
    wl = Workload.load(path)
    assert wl.n_tasks >= 1 and wl.classes and wl.questions and len(wl.sha256) == 64


def _documented_keys() -> dict[str, set[str]]:
    """The keys of docs/CAPTURE.md's workload table, by section ('' for the top level)."""
    text = (REPO / "docs" / "CAPTURE.md").read_text()
    table = text.split("## The workload file", 1)[1].split("\n### ", 1)[0]
    out, section = {"": set()}, ""
    for row in table.splitlines():
        if not row.startswith("| "):
            continue
        first = row.split("|")[1]
        head = re.fullmatch(r"\s*\*\*`\[{1,2}(\w+)\]{1,2}`\*\*\s*", first)
        if head:
            section = head.group(1)
            out[section] = set()
        elif first.strip() not in ("key", "---"):
            out[section] |= set(re.findall(r"`(\w+)`", first))
    return out


def test_docs_list_exactly_the_keys_of_the_format():
    expected = {"": {k for k in WorkloadFile.model_fields if k not in (*SECTIONS, "classes")},
                "classes": set(TaskClass.model_fields)}
    for section in SECTIONS:
        expected[section] = set(WorkloadFile.model_fields[section].annotation.model_fields)
    assert _documented_keys() == expected


# ---- values that pass their own key but not each other, and the bounds of planning ---------------------

@pytest.mark.parametrize("extra, where", [
    ("[[classes]]\nname = \"a\"\n[[classes]]\nname = \"a\"", "[[classes]][1].name: 'a' is already the name of [[classes]][0]"),
    ("[[classes]]\nweight = 0", "[[classes]][0].weight: must be > 0.0, not 0"),
    ("[[classes]]\nshape = \"session\"\nturns = 2\ntool_before = [3]",
     "[[classes]][0].tool_before: turn(s) [3] past turns = 2 (allowed: 1..2)"),
    ("[inject]\ncancel_tasks = [5]", "[inject].cancel_tasks: task(s) [5] past the 4 tasks (allowed: 1..4)"),
    ("[[classes]]\nprompt_tokens = 2000000", "[[classes]][0].prompt_tokens: must be <= 262144, not 2000000"),
    ("[[classes]]\nshape = \"parallel\"\nbranches = 100000", "[[classes]][0].branches: must be <= 256, not 100000"),
])
def test_values_that_do_not_fit_together_are_refused_by_key(folder, extra, where):
    assert where in _refused(folder, GOOD + extra + "\n")


@pytest.mark.parametrize("old, new, where", [
    ("n_tasks = 4", "n_tasks = 1000000000", "[arrivals].n_tasks: must be <= 100000, not 1000000000"),
    ("rate_rps = 2.0", "rate_rps = 1e-18", "[arrivals].rate_rps: 1e-18 tasks/s puts 4 tasks' arrivals 3e+18 s away"),
    ("rate_rps = 2.0", "rate_rps = 1e300", "[arrivals].rate_rps: must be <= 100000.0, not 1e+300"),
    ("deadline_ms = 60000", "deadline_ms = 1e30", "[contract].deadline_ms: must be <= 86400000.0, not 1e+30"),
    ("n_tasks = 4", "n_tasks = 60000\n[[classes]]\nshape = \"session\"\nturns = 2",
     "[arrivals].n_tasks: 60000 tasks send 120000 requests (turns, branches): allowed at most 100000"),
    ("n_tasks = 4", "n_tasks = 2000\n[[classes]]\nprompt_tokens = 2000",
     "[arrivals].n_tasks: 2000 tasks need 4000000 prompt tokens built to an exact count: allowed at most 1500000"),
])
def test_counts_rates_and_horizons_past_the_planning_bounds_are_refused(folder, old, new, where):
    assert where in _refused(folder, GOOD.replace(old, new))


def test_a_workload_file_too_long_to_parse_in_the_bound_is_refused_before_it_is_parsed(folder):
    """3,000,000 task numbers in one [inject] list took 11 s to parse and were taken; 200,000 classes 7 s:
    the file is bounded by its size before it is parsed, its lists by their length."""
    assert _refused(folder, GOOD + "#" * (2 << 20)) == (
        f"{folder / 'cpu_demo.toml'}: {len(GOOD) + (2 << 20)} bytes: a workload file is at most 2097152 bytes (its "
        "keys take a few KiB; the task set, a replay file or a trace are files of their own)")
    many = GOOD.replace("n_tasks = 4", "n_tasks = 100000") + "[inject]\nabandon_tasks = [" + "1," * 100_001 + "]\n"
    assert _refused(folder, many).endswith("[inject].abandon_tasks: must hold at most 100000 entries, not 100001")
    classes = "".join(f'[[classes]]\nname = "c{i}"\n' for i in range(10_001))
    assert _refused(folder, GOOD + classes).endswith("[[classes]]: must hold at most 10000 entries, not 10001")


def test_a_task_set_that_is_a_folder_or_a_device_is_named_as_such(folder):
    for name in (".", "/dev/zero"):
        assert _refused(folder, GOOD.replace('file = "tasks.jsonl"', f'file = "{name}"')).endswith(
            f"[taskset].file: {folder / name} is not a regular file (a folder, a pipe or a device): a task set is a "
            "JSON Lines file, read whole")


def test_the_planning_bounds_are_stated_in_the_docs():
    from inferledger.collectors.workload import schema

    text = (REPO / "docs" / "CAPTURE.md").read_text().split("### Bounds", 1)[1].split("\n## ", 1)[0]
    for name in ("MAX_TASKS", "MAX_REQUESTS", "MAX_BUILT_TOKENS", "MAX_PROMPT_TOKENS", "MAX_FANOUT", "MAX_LENGTH",
                 "MAX_HORIZON_S"):
        assert f"{int(getattr(schema, name)):,}" in text, name


def test_a_replay_past_the_horizon_is_refused_before_planning(folder):
    (folder / "arrivals.txt").write_text("0\n1e15\n")
    text = GOOD.replace('rate_rps = 2.0\nn_tasks = 4', 'process = "replay"\nfile = "arrivals.txt"')
    assert "[arrivals].speed: 1 puts the last of 2 arrivals 1e+12 s away" in _refused(folder, text)


@pytest.mark.parametrize("row, where", [
    ({"prompt": None, "answer": "a"}, "tasks.jsonl:1: prompt: must be a non-empty string, not None"),
    ({"prompt": "  ", "answer": "a"}, "tasks.jsonl:1: prompt: must be a non-empty string, not '  '"),
    ({"prompt": "q", "answer": 4}, "tasks.jsonl:1: answer: must be a string, not 4"),
    ([1, 2], "tasks.jsonl:1: a task is a JSON object"),
])
def test_a_task_without_a_prompt_is_refused_by_line_and_key(folder, row, where):
    (folder / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    assert where in _refused(folder, GOOD)


def test_a_task_set_past_its_bounds_is_refused_before_it_is_read(folder):
    """A task set is read whole: past 64 MiB it is refused from its size, unread; past 100,000 rows, by count."""
    big = folder / "tasks.jsonl"
    with open(big, "wb") as f:  # sparse: 64 MiB + 1 byte without writing them
        f.truncate((64 << 20) + 1)
    assert f"tasks.jsonl: the task set is {(64 << 20) + 1} bytes: at most {64 << 20} (64 MiB) are read" in \
        _refused(folder, GOOD)
    big.write_text((json.dumps({"prompt": "q", "answer": "a"}) + "\n") * 100_001)
    assert "tasks.jsonl: the task set has 100001 rows: at most 100000" in _refused(folder, GOOD)


def test_prompt_and_output_are_checked_against_the_models_context(folder):
    wl = _load(folder, GOOD + "[[classes]]\nname = \"long\"\nprompt_tokens = 5000\nmax_tokens = 64\n")
    with pytest.raises(ValueError) as info:
        wl.check_context(4096, "the model file's context length")
    assert str(info.value) == (f"{folder / 'cpu_demo.toml'}: [[classes]][0].prompt_tokens: 5000 + max_tokens 64 = "
                               f"5064 exceeds the model's context of 4096 tokens (allowed: prompt_tokens <= 4032) "
                               f"(the model file's context length)")
    assert wl.check_context(8192, "x") == {"tokens": 8192, "source": "x", "checked": True}
    skipped = wl.check_context(None, "a URL target")
    assert skipped["checked"] is False and "unknown" in skipped["why"]


def test_every_turn_of_a_session_is_checked_against_the_context_as_the_chat_grows(folder):
    """Turn k's prompt holds the first turn's, each earlier answer and each question in the chat template:
    counted with the tokenizer, every earlier answer at its max_tokens, the earliest turn that cannot fit is
    refused with its task, its length and the context; the lengths are those of the real conversation."""
    from inferledger.engine.loader import load_tokenizer

    tok = load_tokenizer()
    questions = ["What is the capital of France?", "And of Italy, in one word please?", "Name a river there."]
    (folder / "tasks.jsonl").write_text("".join(json.dumps({"prompt": q, "answer": "x"}) + "\n" for q in questions))
    wl = _load(folder, GOOD.replace("max_tokens = 8", "max_tokens = 100")
               + '[[classes]]\nname = "chat"\nshape = "session"\nturns = 6\n')
    answer = " the" * 100  # an answer of exactly max_tokens tokens
    assert len(tok.encode(answer, add_special=False)) == 100

    def real(k: int) -> int:  # turn k's prompt as the client sends it, the answers at their longest
        messages = []
        for j in range(k):
            messages += [{"role": "user", "content": questions[j % 3]}] + \
                ([{"role": "assistant", "content": answer}] if j < k - 1 else [])
        return len(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special=False))

    assert [real(k) for k in (1, 4, 5)] == [37, 391, 511]
    with pytest.raises(ValueError) as info:
        wl.check_context(500, "the model file's context length", tok)
    assert str(info.value) == (
        f"{folder / 'cpu_demo.toml'}: [[classes]][0].turns: task T0000's turn 5 of 6 reaches 511 prompt tokens "
        f"(the first turn's 37, then 4 answer(s) at max_tokens 100 and the questions in the chat template) "
        f"+ max_tokens 100 = 611 exceeds the model's context of 500 tokens (allowed: turns <= 4, or a smaller "
        f"max_tokens) (the model file's context length)")
    # the last turn fits exactly (627 + 100) or not at all; without the tokenizer only the first turns are
    # checked, and the record says so
    assert real(6) == 627 and wl.check_context(727, "x", tok) == {"tokens": 727, "source": "x", "checked": True}
    with pytest.raises(ValueError, match=r"turn 6 of 6 reaches 627 prompt tokens .* = 727 exceeds the model's "
                                         r"context of 726 tokens \(allowed: turns <= 5"):
        wl.check_context(726, "x", tok)
    unchecked = wl.check_context(500, "x")
    assert unchecked["checked"] is False and "later turns" in unchecked["why"]


def test_a_large_session_task_set_is_cleared_by_a_bound_not_tokenized_question_by_question(folder):
    """A task whose turns all fit by the rendered text's bytes (at least one byte a token) is not counted
    token by token: 2,000 questions are checked with the head's count alone; where the bound does not
    clear a task, it is counted exactly, with the same verdict and message as counting every turn."""
    from inferledger.engine.loader import load_tokenizer

    tok = load_tokenizer()
    (folder / "tasks.jsonl").write_text("".join(json.dumps({"prompt": f"Question {i}: what is {i} + 1?",
                                                            "answer": "x"}) + "\n" for i in range(2000)))
    wl = _load(folder, GOOD.replace("n_tasks = 4", "n_tasks = 1000")
               + '[[classes]]\nname = "chat"\nshape = "session"\nturns = 2\n')
    encodes = []

    class Counting:
        backend, apply_chat_template = tok.backend, tok.apply_chat_template

        def encode(self, text, add_special=False):
            encodes.append(text)
            return tok.encode(text, add_special)

    assert wl.check_context(4096, "x", Counting())["checked"] is True
    assert len(encodes) == 1  # the head's tokens, once (each of the 2,000 questions before)
    # near the context the bound clears nothing: every task counted exactly, the earliest miss named
    exact = [len(tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Question {i}: what is {i} + 1?"}])))
             for i in range(0, 2000, 2)]
    worst = max(range(1000), key=lambda t: exact[t])
    with pytest.raises(ValueError, match=rf"task T{worst:04d}'s turn 1 has {exact[worst]} prompt tokens "):
        wl.check_context(exact[worst] + 7, "x", Counting())


def test_a_session_whose_built_first_turn_leaves_no_room_names_its_first_turn(folder):
    from inferledger.engine.loader import load_tokenizer

    wl = _load(folder, GOOD + '[[classes]]\nname = "chat"\nshape = "session"\nturns = 3\nprompt_tokens = 200\n')
    with pytest.raises(ValueError, match=r"\[\[classes\]\]\[0\]\.turns: task T0000's turn 2 of 3 reaches 2\d\d "
                                         r"prompt tokens \(the first turn's 200, then 1 answer\(s\) at max_tokens 8 "):
        wl.check_context(220, "x", load_tokenizer())


# ---- generated workloads: they load and plan within the bounds, or are refused naming a key ---------------

HOSTILE_NUMBERS = [0, -1, 1, 2, 3, 7, 64, 10 ** 6, 2 ** 63 - 1, -2 ** 63, 0.0, 0.5, -0.5, 1e-18, 1e300,
                   float("inf"), float("-inf"), float("nan")]
KEYS = [("arrivals", "n_tasks"), ("arrivals", "rate_rps"), ("arrivals", "cv2"), ("arrivals", "process"),
        ("arrivals", "concurrency"), ("arrivals", "think_ms"), ("arrivals", "speed"), ("contract", "deadline_ms"),
        ("client", "timeout_ms"), ("client", "max_attempts"), ("client", "backoff_ms"), ("client", "jitter"),
        ("generation", "max_tokens"), ("generation", "temperature"), ("inject", "cancel_every"),
        ("inject", "cancel_tasks"), ("inject", "timeout_ms"), ("slo", "ttft_ms"), ("", "seed"),
        ("classes", "weight"), ("classes", "turns"), ("classes", "branches"), ("classes", "shape"),
        ("classes", "name"), ("classes", "tool_before"), ("classes", "max_tokens"), ("classes", "deadline_ms")]


def _values():
    from hypothesis import strategies as st

    number = st.sampled_from(HOSTILE_NUMBERS) | st.integers(-5, 40) | st.floats(-1e3, 1e3)
    return number | st.sampled_from(["poisson", "gamma", "closed", "session", "parallel", "a", "", "1"]) \
        | st.booleans() | st.lists(number, max_size=3)


def test_generated_workloads_load_and_plan_within_the_bounds_or_are_refused_by_key(folder):
    import time

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from inferledger.collectors.workload.schema import MAX_REQUESTS

    base = {"name": "w", "taskset": {"file": "tasks.jsonl"}, "arrivals": {"rate_rps": 2.0, "n_tasks": 4},
            "contract": {"deadline_ms": 60000}, "client": {"timeout_ms": 2000}, "generation": {"max_tokens": 8}}
    key_pattern = re.compile(r"^\S+: (seed|\[\w+\]|\[\[classes\]\])(\.\w+|\[\d+\])*: .+")

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.sampled_from(KEYS), _values()), min_size=1, max_size=4),
           st.integers(0, 2))
    def check(changes, n_classes):
        spec = json.loads(json.dumps(base))
        spec["classes"] = [{} for _ in range(n_classes)] or None
        for (section, key), value in changes:
            if section == "classes":
                if spec["classes"]:
                    spec["classes"][0][key] = value
            elif section:
                spec.setdefault(section, {})[key] = value
            else:
                spec[key] = value
        try:
            wl = Workload.from_dict(spec, base=folder, where="w.toml")
        except ValueError as exc:
            assert all(key_pattern.match(line) for line in str(exc).splitlines()), str(exc)
            return
        t0 = time.perf_counter()
        plans, offsets = wl.plan(), wl.arrival_offsets()
        assert time.perf_counter() - t0 < 10 and sum(len(p.requests) for p in plans) <= MAX_REQUESTS
        assert offsets is None or all(0 <= t <= 7 * 86_400 for t in offsets)

    check()
