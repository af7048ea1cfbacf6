"""kv-layout: the book's §8.3.1–8.3.2 example, how much KV four requests take, reserved, paged and shared.

Four requests A, B, C, D of 9, 13, 5 and 15 tokens, each at most 16 long, on the simulated clock with the
book's step model and the same KV memory (256 token slots): A arrives first, B, C and D 1 ms later, so
they take their blocks in the second step, while A's first two blocks are already in the prefix cache.
The knob is the allocation: one 16-token block each with reservation admission (a reservation-style
allocator), 4-token blocks on demand, 4-token blocks with prefix caching where A and B share their first
eight tokens. Every figure comes from the block manager's own events through the ledger (`kv_holds`:
which attempt held which physical block, how and until when; `events`: the prompt lengths). A finishes
first, B after it: the release table shows the shared blocks staying with B, then back in the pool.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from inferledger.collectors.sim.declared import QWEN3_8B
from inferledger.collectors.sim.run import SimRequest, distinct_prompt, simulate
from inferledger.collectors.sim.step_time import BookStepModel
from inferledger.engine.params import EngineConfig
from inferledger.studies.framework import Study, StudyRun, StudyRuns, Table

POOL_TOKENS = 256  # the same KV memory in every run: 16 blocks of 16, or 64 blocks of 4
SHARED = 8  # A and B share their first eight tokens
# (request, arrival ms, prompt tokens, output tokens): each at most 16 long; A ends before B
REQUESTS = (("A", 0.0, 9, 2), ("B", 1.0, 13, 3), ("C", 1.0, 5, 3), ("D", 1.0, 15, 1))


def requests() -> list[SimRequest]:
    vocab = QWEN3_8B.shape.vocab
    prefix = distinct_prompt(100, SHARED, vocab)
    out = []
    for i, (rid, at, n, k) in enumerate(REQUESTS):
        own = distinct_prompt(i, n, vocab)
        prompt = prefix + own[SHARED:] if rid in ("A", "B") else own
        out.append(SimRequest(rid, at, prompt, k))
    return out


def configs() -> dict[str, EngineConfig]:
    kv = POOL_TOKENS * QWEN3_8B.shape.at(torch.bfloat16).kv_bytes_per_token
    common = dict(max_num_seqs=4, max_num_batched_tokens=64, kv_cache_bytes=kv)
    return {"reserved-16": EngineConfig(block_size=16, admission="reserve", enable_prefix_caching=False, **common),
            "paged-4": EngineConfig(block_size=4, enable_prefix_caching=False, **common),
            "shared-4": EngineConfig(block_size=4, enable_prefix_caching=True, **common)}


def _produce(cfg: EngineConfig, run_dir: Path, run_id: str) -> None:
    simulate(run_dir, requests(), engine_config=cfg, step_model=BookStepModel(), run_id=run_id,
             workload="the book's §8.3.1 four requests")


def runs(options: dict) -> list[StudyRun]:
    return [StudyRun(name, {"block_size": c.block_size, "admission": c.admission,
                            "enable_prefix_caching": c.enable_prefix_caching}, partial(_produce, c))
            for name, c in configs().items()]


# the instant the last of the four took its blocks, and what each held then
HELD_SQL = """
WITH t AS (SELECT max(start_ns) AS ns FROM kv_holds),
held AS (SELECT h.* FROM kv_holds h, t WHERE h.start_ns <= t.ns AND (h.end_ns IS NULL OR h.end_ns > t.ns)),
holders AS (SELECT block, count(*) AS n FROM held GROUP BY block),
prompt AS (SELECT attempt_id, value::BIGINT AS tokens FROM events WHERE name = 'engine.enqueued')
SELECT h.attempt_id, p.tokens, count(*) AS blocks, count(*) FILTER (WHERE o.n > 1) AS shared_blocks,
       count(*) FILTER (WHERE h.how = 'prefix_hit') AS from_cache
FROM held h JOIN holders o USING (block) JOIN prompt p USING (attempt_id)
GROUP BY h.attempt_id, p.tokens ORDER BY h.attempt_id"""

PHYSICAL_SQL = """
WITH t AS (SELECT max(start_ns) AS ns FROM kv_holds)
SELECT count(DISTINCT block) AS blocks FROM kv_holds h, t
WHERE h.start_ns <= t.ns AND (h.end_ns IS NULL OR h.end_ns > t.ns)"""

RELEASE_SQL = """
WITH t0 AS (SELECT min(ts_ns) AS ns FROM events WHERE name = 'engine.enqueued'),
rel AS (SELECT attempt_id, block, end_ns, freed_ns FROM kv_holds WHERE end_ns IS NOT NULL),
refs AS (  -- for each released block: how many other attempts still held it just after the release
  SELECT r.attempt_id, r.block,
         (SELECT count(*) FROM kv_holds o WHERE o.block = r.block AND o.attempt_id <> r.attempt_id
             AND o.start_ns <= r.end_ns AND (o.end_ns IS NULL OR o.end_ns > r.end_ns)) AS refs_left
  FROM rel r)
SELECT r.attempt_id, (max(r.end_ns) - any_value(t0.ns)) / 1e6 AS released_ms, count(*) AS blocks_released,
       count(r.freed_ns) AS back_in_pool, count(*) - count(r.freed_ns) AS still_held_by_others,
       max(f.refs_left) AS most_refs_left
FROM rel r JOIN refs f USING (attempt_id, block), t0
GROUP BY r.attempt_id ORDER BY released_ms, r.attempt_id"""


def compare(runs: StudyRuns) -> list[Table]:
    key, per_request, release = [], [], []
    for name in runs.names:
        bs = runs.manifest(name)["engine_config"]["block_size"]  # declared: the slots of one block
        held = runs.records(name, HELD_SQL)
        physical = runs.one(name, PHYSICAL_SQL)["blocks"]
        tokens = sum(h["tokens"] for h in held)
        referenced = sum(h["blocks"] for h in held)
        unused = sum(h["blocks"] * bs - h["tokens"] for h in held)  # shared blocks are full: no tail in them
        key.append([name, bs, len(held), tokens, physical * bs, referenced * bs, unused,
                    sum(h["shared_blocks"] for h in held) // 2 if held else 0])
        per_request += [[name, h["attempt_id"], h["tokens"], h["blocks"], h["blocks"] * bs, h["blocks"] * bs - h["tokens"],
                         h["shared_blocks"], h["from_cache"]] for h in held]
        release += [[name, *r.values()] for r in runs.records(name, RELEASE_SQL)]
    return [Table("layout", "KV token slots the four requests take at once, from the block manager's events",
                  ["run", "block_size", "requests", "tokens", "slots_allocated", "slots_referenced", "unused_slots",
                   "shared_blocks"], key,
                  "at the instant the last request took its blocks: slots_allocated = distinct physical blocks "
                  "held × block_size; slots_referenced counts a shared block once per block table; unused_slots = "
                  "Σ (a request's slots − its tokens); shared_blocks = physical blocks held by two requests"),
            Table("requests", "each request's blocks at that instant",
                  ["run", "request", "tokens", "blocks", "slots", "unused_slots", "shared_blocks", "from_cache"],
                  per_request),
            Table("release", "releases by reference count: who let go of what, and what went back to the pool",
                  ["run", "request", "released_ms", "blocks_released", "back_in_pool", "still_held_by_others",
                   "most_refs_left"], release,
                  "back_in_pool: blocks whose last reference this release dropped (kv.free); still_held_by_others: "
                  "blocks another request kept using; most_refs_left: their holders just after the release")]


STUDY = Study(
    name="kv-layout",
    question="How much KV memory do four requests of 9, 13, 5 and 15 tokens (at most 16 each) take when it is "
             "reserved whole, paged in 4-token blocks, and paged with A and B's common prefix stored once; and "
             "when does a shared block go back to the pool?",
    knob="the KV allocation: 16-token reservations, 4-token blocks on demand, 4-token blocks with prefix caching",
    reading="slots_allocated falls 64 → 52 → 44: paging cuts the unused tails (unused_slots 22 → 10), sharing "
            "stores A and B's two common blocks once (slots_referenced stays 52); in the release table A's "
            "release leaves the two shared blocks with B (refs 2 → 1) and B's puts them back in the pool.",
    runs=runs, compare=compare,
    figures=({"kind": "kv_blocks", "title": "which request held which physical block, and when",
              "runs": ["reserved-16", "paged-4", "shared-4"]},),
)
