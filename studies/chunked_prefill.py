"""chunked-prefill: what a long prompt's prefill costs the requests already decoding, by chunk size.

The book's chunked-prefill trade on the real engine: a few requests are decoding when one long prompt
arrives. Computed whole, its prefill is one long step, and every decoding request waits through it for
its next token; split into chunks of at most `chunk` tokens (long_prefill_token_threshold, with a step
budget of chunk + the running sequences), the prefill spreads over several steps, each with the decodes
beside it: a shorter longest output gap for the decoders, a longer TTFT for the long prompt (more steps,
each paying the step's fixed cost). The knob is chunked_prefill / the chunk size; everything else (the
requests, their arrivals, the model) is the same in every run. The comparison reads each run's ledger:
the decoders' longest output gap (request_metrics.itl_engine_max_ms), the long prompt's TTFT
(ttft_server_ms), its largest prefill chunk and its prefill steps (step_attribution).
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from inferledger.studies.framework import Option, Study, StudyError, StudyRun, StudyRuns, Table
from inferledger.studies.real import capture_run, check_order, workload

# scale -> (decoders, their prompt tokens, their outputs, long prompt tokens, its arrival ms, chunk sizes)
SCALES = {"default": (3, 48, 32, 1536, 300.0, (768, 384, 192, 96)),
          "tiny": (2, 32, 8, 192, 100.0, (64,))}
DECODERS, LONG = "T0000", "T0001"  # the task ids: the decoders' parallel task, then the long prompt


def shape(options: dict) -> tuple:
    if options["scale"] not in SCALES:
        raise StudyError(f"--set scale={options['scale']}: expected one of {', '.join(SCALES)}")
    return SCALES[options["scale"]]


def _workload(options: dict):
    n, prompt, out, long_tokens, at_ms, _ = shape(options)
    classes = [{"name": "decoders", "shape": "parallel", "branches": n, "prompt_tokens": prompt, "max_tokens": out},
               {"name": "long", "prompt_tokens": long_tokens, "max_tokens": 2}]
    return workload("chunked-prefill", classes, max_tokens=out, arrivals_ms=[0.0, at_ms])


def configs(options: dict) -> dict[str, dict]:
    n, _, _, long_tokens, _, chunks = shape(options)
    out = {"whole": {"chunked_prefill": False, "max_num_batched_tokens": long_tokens + 64}}
    for c in chunks:
        out[f"chunk-{c}"] = {"chunked_prefill": True, "long_prefill_token_threshold": c,
                             "max_num_batched_tokens": c + n + 1}
    return out


def _produce(options: dict, engine_config: dict, run_dir: Path, run_id: str, bundle) -> None:
    wl = _workload(options)
    check_order(wl, bundle.tokenizer, ["decoders", "long"])
    capture_run(run_dir, run_id, wl, bundle, max_num_seqs=8, engine_config=engine_config)


def runs(options: dict) -> list[StudyRun]:
    return [StudyRun(name, {"chunked_prefill": cfg["chunked_prefill"],
                            "long_prefill_token_threshold": cfg.get("long_prefill_token_threshold"),
                            "max_num_batched_tokens": cfg["max_num_batched_tokens"]},
                     partial(_produce, options, cfg)) for name, cfg in configs(options).items()]


KEY_SQL = f"""
WITH r AS (SELECT * FROM request_metrics),
long_steps AS (SELECT s.step_id, s.tokens FROM step_attribution s JOIN r USING (attempt_id)
               WHERE r.task_id = '{LONG}' AND s.kind = 'prefill')
SELECT (SELECT max(tokens) FROM long_steps) AS largest_chunk_tokens,
       (SELECT sum(tokens) FROM long_steps) AS long_prefill_tokens,
       (SELECT count(DISTINCT step_id) FROM long_steps) AS long_prefill_steps,
       (SELECT max(itl_engine_max_ms) FROM r WHERE task_id = '{DECODERS}') AS longest_gap_ms,
       (SELECT ttft_server_ms FROM r WHERE task_id = '{LONG}') AS long_ttft_ms,
       (SELECT median(tpot_server_ms) FROM r WHERE task_id = '{DECODERS}') AS decoders_tpot_p50_ms,
       (SELECT max(e2e_server_ms) FROM r WHERE task_id = '{DECODERS}') AS decoders_e2e_max_ms"""

STEPS_SQL = f"""
WITH r AS (SELECT attempt_id, task_id FROM request_metrics),
steps AS (SELECT s.step_id, any_value(s.step_ms) AS step_ms,
                 sum(s.tokens) FILTER (WHERE r.task_id = '{LONG}' AND s.kind = 'prefill') AS long_tokens,
                 count(*) FILTER (WHERE s.kind = 'decode') AS decodes
          FROM step_attribution s JOIN r USING (attempt_id) GROUP BY s.step_id)
SELECT count(*) FILTER (WHERE long_tokens > 0 AND decodes > 0) AS mixed_steps,
       max(step_ms) FILTER (WHERE long_tokens > 0) AS longest_prefill_step_ms,
       median(step_ms) FILTER (WHERE long_tokens IS NULL AND decodes > 0) AS decode_only_step_p50_ms
FROM steps"""

COLUMNS = ["run", "largest_chunk_tokens", "long_prefill_tokens", "long_prefill_steps", "longest_gap_ms", "long_ttft_ms",
           "decoders_tpot_p50_ms", "decoders_e2e_max_ms"]


def compare(runs: StudyRuns) -> list[Table]:
    key, steps = [], []
    for name in runs.names:
        k = runs.one(name, KEY_SQL)
        key.append([name, *k.values()])
        steps.append([name, *runs.one(name, STEPS_SQL).values()])
    key.sort(key=lambda row: -(row[1] or 0))  # the curve runs from the whole prefill to the smallest chunk
    return [Table("chunks", "the decoders' longest output gap against the long prompt's TTFT, by prefill chunk",
                  COLUMNS, key,
                  "largest_chunk_tokens / long_prefill_tokens / long_prefill_steps: the long prompt's prefill chunks "
                  "(step_attribution; a first chunk can be smaller, when the prompt arrived beside other prefills); "
                  "longest_gap_ms: the largest request_metrics.itl_engine_max_ms of the decoding requests; "
                  "long_ttft_ms: the long prompt's ttft_server_ms"),
            Table("steps", "the steps the long prefill shared with decodes",
                  ["run", "mixed_steps", "longest_prefill_step_ms", "decode_only_step_p50_ms"], steps,
                  "mixed_steps: steps with a chunk of the long prompt and at least one decode; "
                  "decode_only_step_p50_ms: the median step with decodes and no long-prompt chunk")]


STUDY = Study(
    name="chunked-prefill",
    question="A long prompt arrives while requests are decoding: how much does splitting its prefill into "
             "chunks shorten the decoders' longest output gap, and what does it cost the long prompt's TTFT?",
    knob="chunked_prefill and long_prefill_token_threshold (the prefill chunk), the step budget following it",
    reading="going down the chunks table the chunk shrinks: longest_gap_ms falls with it (each step carries "
            "one chunk beside the decodes), long_ttft_ms rises (more steps, each paying a step's fixed cost); "
            "the whole run is the far end: one step as long as the whole prefill.",
    runs=runs, compare=compare, needs_model=True,
    options={"scale": Option("default", "default or tiny (a long prompt of 192 tokens, one chunk size: the tests)")},
    figures=({"kind": "curve", "title": "longest output gap and long-prompt TTFT against the prefill chunk",
              "table": "chunks", "x": "largest_chunk_tokens", "y": ["longest_gap_ms", "long_ttft_ms"]},
             {"kind": "timeline", "title": "the requests' steps under each chunk size, on one time scale"}),
)
