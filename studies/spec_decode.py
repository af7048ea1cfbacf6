"""spec-decode: what a longer draft buys per verify round, and what each round costs.

Speculative decoding by prompt lookup (engine/spec_decode.py) on the real engine: a draft of up to k
tokens copied from the context is verified in one forward, the accepted prefix plus one token
committed. The requests are copy tasks (the answer repeats text of the prompt, where lookup drafts
well), sent one at a time so a verify step holds one request and its duration is the round's. The
knob is the draft length k (no speculation, then k = 1, 2, 4, 8). From each run's ledger: per round
(spec.round events: attrs drafted, accepted; value = tokens committed) the tokens committed and the
acceptance, its step's duration (step_attribution of the same step), the plain decode steps (no draft
found) beside them, and the requests' TPOT.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from inferledger.studies.framework import Option, Study, StudyError, StudyRun, StudyRuns, Table
from inferledger.studies.real import capture_run, workload

COPY = ("Repeat this list exactly, three times: red apple, green pear, yellow lemon, purple plum, orange peach, "
        "black cherry, white grape.")
TASKS = ({"kind": "copy", "prompt": COPY, "answer": "."},)
# scale -> (requests, output tokens, draft lengths; 0 = no speculation)
SCALES = {"default": (3, 48, (0, 1, 2, 4, 8)), "tiny": (1, 12, (0, 4))}


def shape(options: dict) -> tuple:
    if options["scale"] not in SCALES:
        raise StudyError(f"--set scale={options['scale']}: expected one of {', '.join(SCALES)}")
    return SCALES[options["scale"]]


def _produce(options: dict, k: int, run_dir: Path, run_id: str, bundle) -> None:
    n, out, _ = shape(options)
    wl = workload("spec-decode", [{"name": "copy"}], max_tokens=out, tasks=TASKS,
                  arrivals={"process": "closed", "concurrency": 1, "n_tasks": n})
    cfg = {"speculative": {"method": "prompt_lookup", "k": k}} if k else {}
    capture_run(run_dir, run_id, wl, bundle, max_num_seqs=1, engine_config=cfg)


def runs(options: dict) -> list[StudyRun]:
    return [StudyRun(f"k{k}" if k else "off", {"speculative_k": k or None}, partial(_produce, options, k))
            for k in shape(options)[2]]


# one row per decode-phase step of each request: a verify round (spec.round) or a plain decode
ROUNDS_SQL = """
SELECT s.attempt_id, s.step_id, s.kind, s.step_ms, s.tokens AS step_tokens,
       e.value::BIGINT AS committed, json_extract(e.attrs, '$.drafted')::BIGINT AS drafted,
       json_extract(e.attrs, '$.accepted')::BIGINT AS accepted
FROM step_attribution s
LEFT JOIN events e ON e.name = 'spec.round' AND e.step_id = s.step_id AND e.attempt_id = s.attempt_id
WHERE s.kind IN ('decode', 'verify')"""

KEY_SQL = f"""
WITH r AS ({ROUNDS_SQL})
SELECT count(*) FILTER (WHERE drafted IS NOT NULL) AS rounds,
       count(*) FILTER (WHERE drafted IS NULL) AS plain_steps,
       avg(drafted) AS drafted_per_round,
       sum(accepted) / nullif(sum(drafted), 0) AS acceptance,
       avg(committed) AS tokens_per_round,
       median(step_ms) FILTER (WHERE drafted IS NOT NULL) AS round_ms_p50,
       median(step_ms) FILTER (WHERE drafted IS NULL) AS plain_step_ms_p50,
       (SELECT sum(n_output_tokens - 1) FROM request_metrics) / count(*) AS tokens_per_decode_step,
       (SELECT median(tpot_server_ms) FROM request_metrics) AS tpot_server_p50_ms,
       (SELECT sum(spec_accepted_tokens) FROM request_metrics) AS accepted_tokens
FROM r"""

COLUMNS = ["run", "k", "rounds", "plain_steps", "drafted_per_round", "acceptance", "tokens_per_round", "round_ms_p50",
           "plain_step_ms_p50", "tokens_per_decode_step", "tpot_server_p50_ms", "accepted_tokens"]


def compare(runs: StudyRuns) -> list[Table]:
    key, per_round = [], []
    for name in runs.names:
        spec = runs.manifest(name)["engine_config"].get("speculative") or {}
        key.append([name, spec.get("k", 0), *runs.one(name, KEY_SQL).values()])
        per_round += [[name, *r.values()] for r in runs.records(name, ROUNDS_SQL + " ORDER BY s.step_id")]
    return [Table("draft", "tokens per round, round time and acceptance against the draft length", COLUMNS, key,
                  "rounds: spec.round events; plain_steps: decode steps where lookup found no draft; "
                  "acceptance = Σ accepted / Σ drafted; tokens_per_round: mean tokens a round committed "
                  "(accepted + 1); round_ms_p50: the median duration of a round's step (step_attribution); "
                  "tokens_per_decode_step: output tokens after the first / decode-phase steps"),
            Table("rounds", "every decode-phase step: a verify round or a plain decode",
                  ["run", "request", "step_id", "kind", "step_ms", "step_tokens", "committed", "drafted", "accepted"],
                  per_round)]


STUDY = Study(
    name="spec-decode",
    question="With prompt-lookup drafts of up to k tokens, how many tokens does a verify round commit, how long "
             "does it take, and how much of each draft is accepted, as k grows?",
    knob="speculative.k, the draft length (no speculation, then 1, 2, 4, 8)",
    reading="tokens_per_round grows with k while acceptance falls (a longer draft is likelier to break); "
            "round_ms_p50 grows slowly (one forward over k + 1 positions), so tokens_per_decode_step and TPOT "
            "show whether the longer draft paid: it pays while tokens_per_round grows faster than round_ms_p50.",
    runs=runs, compare=compare, needs_model=True,
    options={"scale": Option("default", "default or tiny (one request of 12 tokens, k = 4 against none: the tests)")},
    figures=({"kind": "curve", "title": "tokens per round and per decode step against the draft length",
              "table": "draft", "x": "k", "y": ["tokens_per_round", "tokens_per_decode_step", "acceptance"]},
             {"kind": "curve", "title": "round and plain step time against the draft length",
              "table": "draft", "x": "k", "y": ["round_ms_p50", "plain_step_ms_p50", "tpot_server_p50_ms"]}),
)
