"""Helpers for the engine tests: a recording sink, the single-request reference, event invariants."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import pyarrow as pa

from inferledger.engine.runner import ModelRunner, SeqChunk
from inferledger.probes import ListSink
from inferledger.probes.events import EVENT_SCHEMA, VOCABULARY, missing_requirements


class RecordingSink(ListSink):
    """Events and samples in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[dict] = []

    def sample(self, **row) -> None:
        self.samples.append(row)


def reference_greedy(bundle, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """The runner alone, one sequence, contiguous blocks: prefill, then argmax one token at a time."""
    bs = 16
    n_blocks = -(-(len(prompt_ids) + max_tokens) // bs)
    runner = ModelRunner(bundle.model, bundle.config, num_blocks=n_blocks, block_size=bs)
    table = list(range(n_blocks))
    logits = runner.forward([SeqChunk(list(prompt_ids), 0, table, "last")])[0]
    out, pos = [], len(prompt_ids)
    while True:
        tok = int(logits.argmax())
        out.append(tok)
        if tok in bundle.config.eos_ids or len(out) == max_tokens:
            return out
        logits = runner.forward([SeqChunk([tok], pos, table, "last")])[0]
        pos += 1


def attrs(row: dict) -> dict:
    return json.loads(row["attrs"] or "{}")


def check_events(sink: RecordingSink, outputs=()) -> dict[str, list[dict]]:
    """Every row is in the vocabulary, carries what its kind requires and fits the Arrow schema;
    per attempt: one enqueued, one finished, token values summing to its output, every allocated
    block released. Returns the rows by attempt id."""
    rows = sink.rows
    for r in rows:
        assert r["name"] in VOCABULARY, r["name"]
        assert missing_requirements(r) == [], (r["name"], missing_requirements(r))
        assert r["source"] == "engine" and r["clock"].startswith("mono:")
    pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    by_attempt: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["attempt_id"]:
            assert r["request_id"], r
            by_attempt[r["attempt_id"]].append(r)
    for aid, evs in by_attempt.items():
        names = Counter(e["name"] for e in evs)
        assert names["engine.enqueued"] == 1 and names["engine.finished"] == 1, (aid, names)
        assert evs[0]["name"] == "engine.enqueued"
        finished = next(e for e in evs if e["name"] == "engine.finished")
        assert attrs(finished)["reason"] in ("stop", "length", "cancelled", "error")
        tokens = sum(e["value"] for e in evs if e["name"] == "engine.token")
        assert tokens == finished["value"], (aid, tokens, finished["value"])
        alloc = {b for e in evs if e["name"] == "kv.alloc" for b in attrs(e)["blocks"]}
        released = {b for e in evs if e["name"] == "kv.release" for b in attrs(e)["blocks"]}
        assert alloc <= released, (aid, alloc - released)
        kv = [e["name"] for e in evs if e["name"].startswith("kv.")]
        assert kv[-2:] == ["kv.release", "kv.free"], (aid, kv)  # ends holding nothing, reallocatable
    for o in outputs:
        evs = by_attempt[o.attempt_id]
        assert sum(e["value"] for e in evs if e["name"] == "engine.token") == sum(len(c.token_ids) for c in o.outputs)
    starts = {r["step_id"] for r in rows if r["name"] == "step.start"}
    ends = {r["step_id"] for r in rows if r["name"] == "step.end"}
    assert starts == ends
    if rows:
        metrics = {s["metric"] for s in sink.samples}
        assert metrics == {"kv_blocks_used", "kv_blocks_cached", "kv_blocks_free"}
        assert all(s["unit"] == "blocks" for s in sink.samples)
    return by_attempt


def assert_no_leak(engine) -> None:
    assert engine.check_integrity()
    assert engine.block_manager.num_used_blocks == 0
    assert not engine.has_unfinished()
