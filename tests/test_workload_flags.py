"""A workload from capture's flags (vLLM bench serve's names): the flags write the spec a workload file
parses to and the one format checks and plans it; over a file, the flags override its keys; a copied
sample finds its task set among the bundled ones."""
from __future__ import annotations

import math
import shutil
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferledger.cli.app import app
from inferledger.collectors.workload import Workload
from inferledger.collectors.workload.flags import FlagError, LoadFlags, flags_workload, parse_rate, workload_spec

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "samples" / "workloads" / "cpu_short_chat.toml"
BASIC = REPO / "samples" / "tasks" / "basic.jsonl"


def test_num_prompts_alone_gives_that_many_single_attempt_tasks_all_at_once():
    wl = flags_workload(None, LoadFlags(num_prompts=7, input_len=200, output_len=16))
    assert (wl.n_tasks, wl.max_attempts, wl.process, wl.concurrency) == (7, 1, "closed", 7)
    assert [(c.name, c.prompt_tokens, c.max_tokens) for c in wl.classes] == [("random", 200, 16)]
    assert wl.taskset["path"] == str(BASIC) and len(wl.taskset["sha256"]) == 64


def test_a_finite_rate_is_poisson_and_max_concurrency_caps_the_open_loop():
    wl = flags_workload(None, LoadFlags(request_rate=2.5, num_prompts=10, max_concurrency=3))
    assert (wl.process, wl.rate_rps, wl.n_tasks, wl.max_concurrency) == ("poisson", 2.5, 10, 3)
    wl = flags_workload(None, LoadFlags(request_rate=4.0, duration_s=2.6, burstiness=0.5))
    assert (wl.process, wl.n_tasks, wl.cv2) == ("gamma", 10, 2.0)  # round(4 x 2.6); CV^2 = 1 / shape
    wl = flags_workload(None, LoadFlags(request_rate=math.inf, num_prompts=6, max_concurrency=2))
    assert (wl.process, wl.concurrency, wl.n_tasks) == ("closed", 2, 6)


def test_the_range_ratio_draws_each_task_its_lengths_exactly_as_drawn():
    spec = workload_spec(LoadFlags(num_prompts=40, input_len=100, output_len=10, range_ratio=0.5, seed=3))
    assert all(50 <= c["prompt_tokens"] <= 150 and 5 <= c["max_tokens"] <= 15 for c in spec["classes"])
    wl = Workload.from_dict(spec, where="flags")
    dealt = Counter(c.name for c in wl.class_sequence())
    assert dealt == Counter({c["name"]: int(c["weight"]) for c in spec["classes"]}) and sum(dealt.values()) == 40


def test_flags_override_a_workload_files_keys():
    wl = flags_workload(SAMPLE, LoadFlags(request_rate=3.0, num_prompts=5, output_len=8, seed=9))
    assert (wl.process, wl.rate_rps, wl.n_tasks, wl.max_tokens, wl.seed) == ("poisson", 3.0, 5, 8, 9)
    assert wl.max_attempts == 2 and wl.timeout_ms == 6000  # the file's retries and timeout stay
    assert [c.prompt_tokens for c in wl.classes] == [128] and wl.path == str(SAMPLE)
    assert flags_workload(SAMPLE, LoadFlags()).sha256 == Workload.load(SAMPLE).sha256


def test_a_trace_dataset_replays_the_trace_and_refuses_a_rate():
    trace = REPO / "samples" / "traces" / "azure_sample.csv"
    spec = workload_spec(LoadFlags(dataset=f"azure:{trace}", num_prompts=3))
    assert spec["arrivals"] == {"process": "trace"} and spec["trace"] == {"format": "azure", "file": str(trace),
                                                                          "max_rows": 3}
    with pytest.raises(FlagError, match="carry their own arrival times") as exc:
        workload_spec(LoadFlags(dataset=f"azure:{trace}", request_rate=2.0))
    assert exc.value.flag == "--request-rate"


@pytest.mark.parametrize("flags, flag, words", [
    (LoadFlags(num_prompts=3, duration_s=2.0, request_rate=1.0), "--duration", "not both"),
    (LoadFlags(duration_s=2.0), "--duration", "needs a finite --request-rate"),
    (LoadFlags(request_rate=math.inf, burstiness=2.0), "--burstiness", "finite --request-rate"),
    # (the derived task count was refused as [arrivals].n_tasks, a key the command line has not, with 300 digits)
    (LoadFlags(request_rate=2.0, duration_s=1e300), "--duration", r"--duration 1e\+300 s at 2 requests/s makes "
     r"2e\+300 requests: at most 100000 in one workload \(--duration <= 50000 s at this rate\)"),
])
def test_contradicting_flags_are_refused_naming_the_flag(flags, flag, words):
    with pytest.raises(FlagError, match=words) as exc:
        workload_spec(flags)
    assert exc.value.flag == flag


def test_request_rate_takes_a_number_or_inf():
    assert parse_rate("inf") == math.inf and parse_rate("2.5") == 2.5
    with pytest.raises(FlagError, match="'0': must be > 0"):
        parse_rate("0")


def test_a_copied_sample_finds_its_task_set_among_the_bundled_ones(tmp_path):
    copy = tmp_path / "mine.toml"
    shutil.copy(SAMPLE, copy)
    wl = Workload.load(copy)
    assert wl.taskset["path"] == str(BASIC)
    (tmp_path / "x").mkdir()
    bad = tmp_path / "x" / "bad.toml"
    bad.write_text(SAMPLE.read_text().replace("../tasks/basic.jsonl", "../tasks/mine.jsonl"))
    with pytest.raises(ValueError) as exc:
        Workload.load(bad)
    assert str(exc.value) == (f"{bad}: [taskset].file: '../tasks/mine.jsonl' is neither at "
                              f"{tmp_path / 'x' / '../tasks/mine.jsonl'} nor a bundled task set "
                              f"({REPO / 'samples' / 'tasks' / 'mine.jsonl'})")


def test_capture_refuses_bad_load_flags_with_exit_2_naming_the_flag(tmp_path):
    res = CliRunner().invoke(app, ["capture", "-o", str(tmp_path / "r"), "--duration", "3"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "--duration" in res.output and "needs a finite --request-rate" in res.output
    res = CliRunner().invoke(app, ["capture", "-o", str(tmp_path / "r"), "--target", "http://127.0.0.1:9",
                                   "--block-size", "32"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "--block-size" in res.output and "a URL target's server has its own" in res.output
    assert not (tmp_path / "r").exists()


def test_the_engine_flags_under_vllms_names_set_engine_config_fields():
    import typer

    from inferledger.cli.engine_flags import engine_fields
    from inferledger.engine.params import EngineConfig

    fields = engine_fields(max_num_seqs=4, max_num_batched_tokens=64, chunked_prefill=False, enable_prefix_caching=False,
                           block_size=32, num_blocks=100, long_prefill_token_threshold=None, max_model_len=None,
                           speculative='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}')
    assert fields == {"max_num_seqs": 4, "max_num_batched_tokens": 64, "chunked_prefill": False,
                      "enable_prefix_caching": False, "block_size": 32, "num_blocks": 100,
                      "speculative": {"method": "prompt_lookup", "k": 3, "ngram_max": 2}}
    cfg = EngineConfig(**fields)
    assert (cfg.speculative.k, cfg.speculative.ngram_max, cfg.resolve_num_blocks(1)) == (3, 2, 100)
    with pytest.raises(typer.BadParameter, match="max_num_batched_tokens=4 is out of range") as exc:
        engine_fields(max_num_seqs=16, max_num_batched_tokens=4)
    assert exc.value.param_hint == "--max-num-batched-tokens"
    with pytest.raises(typer.BadParameter, match="prompt lookup only"):
        engine_fields(speculative='{"method": "eagle"}')


@pytest.mark.parametrize("command, args, flag", [
    ("capture", ["--num-warmups", "100000000"], "--num-warmups"),  # warmed up for days before the run
    ("capture", ["--drain-timeout", "1e300"], "--drain-timeout"),
    ("serve", ["--drain-timeout", "1e300"], "--drain-timeout"),
])
def test_a_flag_past_any_meaning_is_refused_before_anything_loads(tmp_path, command, args, flag):
    out = tmp_path / "r"
    res = CliRunner().invoke(app, [command, "-o", str(out), *args], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and f"Invalid value for '{flag}'" in res.output, res.output
    assert not out.exists()
