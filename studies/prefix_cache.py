"""prefix-cache: TTFT with and without a prompt prefix every request shares.

The book's long-context shape (each prompt's first three quarters, 6144 of 8192 tokens, identical
across requests, the last quarter its own) scaled to a CPU: prompts of `prompt` tokens whose first
`shared` tokens are the same, sent one after another (a closed loop of one client), so each TTFT is
the prefill alone and no request queues. Three runs: prompts sharing nothing (`distinct`), sharing
the prefix with prefix caching on (`shared`), and sharing it with prefix caching off (`shared-off`,
which isolates the cache from the prompt shape). From each run's ledger: the prompt tokens served
from the prefix cache (run_metrics.prompt_tokens_cached, and per request request_metrics'), the
tokens the engine computed (prefill_tokens_computed) and the TTFT of the first request (which finds
the cache empty) and of the requests after it.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from inferledger.studies.framework import Option, Study, StudyError, StudyRun, StudyRuns, Table
from inferledger.studies.real import capture_run, workload

# scale -> (requests, prompt tokens, shared prefix tokens): the book's 3 : 1 split of shared and own
SCALES = {"default": (6, 2048, 1536), "tiny": (2, 128, 96)}
# run -> (prefix shared, prefix caching on)
RUNS = {"distinct": (False, True), "shared": (True, True), "shared-off": (True, False)}


def shape(options: dict) -> tuple[int, int, int]:
    if options["scale"] not in SCALES:
        raise StudyError(f"--set scale={options['scale']}: expected one of {', '.join(SCALES)}")
    return SCALES[options["scale"]]


def _produce(options: dict, shared: bool, caching: bool, run_dir: Path, run_id: str, bundle) -> None:
    n, prompt, prefix = shape(options)
    cls = {"name": "long_context", "prompt_tokens": prompt, "shared_prefix_tokens": prefix if shared else 0}
    wl = workload("prefix-cache", [cls], max_tokens=4,
                  arrivals={"process": "closed", "concurrency": 1, "n_tasks": n})
    capture_run(run_dir, run_id, wl, bundle, max_num_seqs=4,
                engine_config={"enable_prefix_caching": caching, "max_num_batched_tokens": max(512, prompt)})


def runs(options: dict) -> list[StudyRun]:
    n, prompt, prefix = shape(options)
    return [StudyRun(name, {"shared_prefix_tokens": prefix if shared else 0, "enable_prefix_caching": caching},
                     partial(_produce, options, shared, caching)) for name, (shared, caching) in RUNS.items()]


PER_REQUEST_SQL = """
SELECT attempt_id, prompt_tokens, prompt_tokens_cached AS cached_tokens, prefill_tokens_computed AS computed_tokens,
       ttft_server_ms, ttft_client_ms
FROM request_metrics JOIN attempts USING (attempt_id)
WHERE prompt_tokens_cached IS NOT NULL
ORDER BY enqueued_ns"""

KEY_SQL = f"""
WITH q AS ({PER_REQUEST_SQL}), n AS (SELECT *, row_number() OVER () AS k FROM q)
SELECT (SELECT prompt_tokens FROM run_metrics) AS prompt_tokens,
       (SELECT prompt_tokens_cached FROM run_metrics) AS cached_tokens,
       (SELECT prefill_tokens_computed FROM run_metrics) AS computed_tokens,
       (SELECT prompt_tokens_cached FROM run_metrics) / (SELECT prompt_tokens FROM run_metrics) AS hit_share,
       (SELECT ttft_server_ms FROM n WHERE k = 1) AS first_ttft_ms,
       (SELECT median(ttft_server_ms) FROM n WHERE k > 1) AS later_ttft_p50_ms,
       (SELECT median(ttft_client_ms) FROM n WHERE k > 1) AS later_ttft_client_p50_ms"""

COLUMNS = ["run", "shared_prefix_tokens", "prefix_caching", "prompt_tokens", "cached_tokens", "computed_tokens",
           "hit_share", "first_ttft_ms", "later_ttft_p50_ms", "later_ttft_client_p50_ms"]


def compare(runs: StudyRuns) -> list[Table]:
    key, per_request = [], []
    for name in runs.names:
        cfg = runs.manifest(name)["workload"]["spec"]["classes"][0]
        caching = runs.manifest(name)["engine_config"]["enable_prefix_caching"]
        key.append([name, cfg["shared_prefix_tokens"], caching, *runs.one(name, KEY_SQL).values()])
        per_request += [[name, *r.values()] for r in runs.records(name, PER_REQUEST_SQL)]
    return [Table("prefix", "TTFT with and without a shared prefix, and the prompt tokens the cache served",
                  COLUMNS, key,
                  "cached_tokens = run_metrics.prompt_tokens_cached (engine.prefill attrs.cached_tokens); "
                  "computed_tokens = prefill_tokens_computed; first_ttft_ms: the first request (an empty cache); "
                  "later_ttft_p50_ms: the median ttft_server_ms of the requests after it"),
            Table("requests", "each request in arrival order",
                  ["run", "request", "prompt_tokens", "cached_tokens", "computed_tokens", "ttft_server_ms",
                   "ttft_client_ms"], per_request,
                  "request_metrics.prompt_tokens, prompt_tokens_cached (at first admission), prefill_tokens_computed, "
                  "ttft_server_ms, ttft_client_ms, of the attempts the engine counted, in the order it enqueued them")]


STUDY = Study(
    name="prefix-cache",
    question="Prompts whose first three quarters are identical: how much of each prompt does the prefix cache "
             "serve, and how much TTFT does that save against prompts that share nothing?",
    knob="the prompts' shared prefix (none, or the first three quarters) and prefix caching (on, off)",
    reading="in shared, every request after the first gets the shared prefix from the cache (cached_tokens = "
            "(requests - 1) × the prefix rounded down to whole blocks) and its TTFT falls to the prefill of its own "
            "quarter; distinct and shared-off compute every prompt token and keep the first request's TTFT.",
    runs=runs, compare=compare, needs_model=True,
    options={"scale": Option("default", "default or tiny (two prompts of 128 tokens, 96 shared: the tests)")},
    figures=({"kind": "timeline", "title": "each request's prefill and decode, with and without the shared prefix"},),
)
