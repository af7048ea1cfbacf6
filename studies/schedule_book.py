"""schedule-book: the book's §8.2.2 example under fixed batching, continuous batching and chunked prefill.

Four requests on the simulated clock with the book's step model (26.22 ms a step + 30.4 µs a new token
+ 3 ns a causal query–key pair), at most two running: r0 and r1 at 0 ms with 2048 prompt tokens and 8
and 2 outputs, r2 at 20 ms with 8192 and 2, r3 at 30 ms with 2048 and 4. The knob is how the scheduler
admits and splits prefills; everything else is the real scheduler as it is. The comparison reads each
run's ledger: the total (run_metrics.t_obs_s: first arrival to last finish) and the longest gap between
two output tokens of one request (request_metrics.itl_engine_max_ms), beside the book's figures.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from inferledger.collectors.sim.declared import QWEN3_8B
from inferledger.collectors.sim.run import SimRequest, distinct_prompt, simulate
from inferledger.collectors.sim.step_time import BookStepModel
from inferledger.engine.params import EngineConfig
from inferledger.studies.framework import Option, Study, StudyRun, StudyRuns, Table

KV_CACHE_BYTES = 12 * 2**30  # the book's instance gives its KV cache 12 GiB
# (request, arrival ms, prompt tokens, output tokens)
REQUESTS = (("r0", 0.0, 2048, 8), ("r1", 0.0, 2048, 2), ("r2", 20.0, 8192, 2), ("r3", 30.0, 2048, 4))
# the book's rounded figures: total ms and the longest output gap ms (figs 8-5, 8-6, 8-7)
BOOK = {"fixed": (870.5, 26.3), "continuous": (765.6, 376.0), "chunked": (844.3, 132.6)}


def requests() -> list[SimRequest]:
    return [SimRequest(rid, at, distinct_prompt(i, n, QWEN3_8B.shape.vocab), out)
            for i, (rid, at, n, out) in enumerate(REQUESTS)]


def configs(options: dict) -> dict[str, EngineConfig]:
    # without chunking the budget fits r0's decode beside r2's whole 8192-token prompt (and r2 with r3)
    whole = dict(max_num_seqs=2, max_num_batched_tokens=16384, chunked_prefill=False, kv_cache_bytes=KV_CACHE_BYTES)
    return {"fixed": EngineConfig(batching="fixed", **whole),
            "continuous": EngineConfig(**whole),
            "chunked": EngineConfig(max_num_seqs=2, max_num_batched_tokens=options["budget"], chunked_prefill=True,
                                    long_prefill_token_threshold=options["chunk"], kv_cache_bytes=KV_CACHE_BYTES)}


def _produce(cfg: EngineConfig, run_dir: Path, run_id: str) -> None:
    simulate(run_dir, requests(), engine_config=cfg, step_model=BookStepModel(), run_id=run_id,
             workload="the book's §8.2.2 four requests")


def runs(options: dict) -> list[StudyRun]:
    out = []
    for name, cfg in configs(options).items():
        knob = {"batching": cfg.batching, "chunked_prefill": cfg.chunked_prefill,
                "max_num_batched_tokens": cfg.max_num_batched_tokens,
                "long_prefill_token_threshold": cfg.long_prefill_token_threshold}
        out.append(StudyRun(name, knob, partial(_produce, cfg)))
    return out


KEY_SQL = """
SELECT (SELECT t_obs_s * 1000 FROM run_metrics) AS total_ms,
       max(itl_engine_max_ms) AS longest_gap_ms,
       arg_max(attempt_id, itl_engine_max_ms) AS longest_gap_request
FROM request_metrics"""

REQUEST_SQL = """
WITH t0 AS (SELECT min(enqueued_ns) AS ns FROM attempts)
SELECT a.attempt_id, (a.enqueued_ns - t0.ns) / 1e6 AS arrival_ms, r.queue_ms, r.ttft_server_ms,
       r.e2e_server_ms, (a.server_end_ns - t0.ns) / 1e6 AS finished_ms, r.itl_engine_max_ms, r.n_output_tokens
FROM attempts a JOIN request_metrics r USING (attempt_id), t0
ORDER BY a.attempt_id"""


def compare(runs: StudyRuns) -> list[Table]:
    key, per_request = [], []
    for name in runs.names:
        k = runs.one(name, KEY_SQL)
        book_total, book_gap = BOOK.get(name, (None, None))
        matches = (book_total is not None and round(k["total_ms"], 1) == book_total
                   and round(k["longest_gap_ms"], 1) == book_gap)
        key.append([name, k["total_ms"], book_total, k["longest_gap_ms"], book_gap, k["longest_gap_request"],
                    matches])
        for r in runs.records(name, REQUEST_SQL):
            per_request.append([name, *r.values()])
    return [Table("schedule", "total time and longest output gap, from each run's ledger, beside the book's",
                  ["run", "total_ms", "book_total_ms", "longest_gap_ms", "book_gap_ms", "gap_request",
                   "matches_book"], key,
                  "total_ms = run_metrics.t_obs_s (first arrival to last finish); longest_gap_ms = the largest "
                  "request_metrics.itl_engine_max_ms; matches_book compares both at the book's rounding (0.1 ms)"),
            Table("requests", "each request, from the ledger (ms from the first arrival)",
                  ["run", "request", "arrival_ms", "queue_ms", "ttft_server_ms", "e2e_server_ms", "finished_ms",
                   "itl_engine_max_ms", "n_output_tokens"], per_request)]


STUDY = Study(
    name="schedule-book",
    question="Continuous batching finishes the book's four requests sooner than fixed batches; what does it "
             "cost the running requests' output gaps, and how much of that does chunked prefill win back?",
    knob="how prefills are admitted and split: fixed batches, continuous batching with whole prefills, "
         "continuous batching with prefill chunks",
    reading="total_ms falls from fixed to continuous (the short request's slot is reused at once) while "
            "longest_gap_ms jumps (r0 waits for r2's whole 8K prefill); chunks of `chunk` tokens under a "
            "`budget` spread that prefill over several steps: a shorter gap for a slightly longer total.",
    runs=runs, compare=compare,
    options={"chunk": Option(2048, "chunked run: long_prefill_token_threshold, tokens per prefill chunk", 1, 65536),
             "budget": Option(4096, "chunked run: max_num_batched_tokens, the step's token budget: at least the "
                              "2 running sequences' decodes", 2, 65536)},
    figures=({"kind": "timeline", "title": "the four requests under each schedule, on one time scale",
              "runs": ["fixed", "continuous", "chunked"]},),
)
