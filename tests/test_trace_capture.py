"""The Mooncake sample replayed through the embedded engine: every request's prefix-cache hit at
admission (kv.prefix_hit) is exactly what the trace's shared hash ids imply, given which earlier rows'
blocks the engine had computed by then, and the manifest says what was done to the trace's rows."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from inferledger.collectors.capture.run import capture
from inferledger.collectors.capture.options import CaptureOptions
from inferledger.collectors.workload import Workload

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "samples" / "traces" / "mooncake_sample.jsonl"
BLOCK = 16  # the engine's KV block, and the sample's 512-token blocks at 1/32
HEAD = 3  # the bundled chat template before the system message
IDS = [json.loads(line)["hash_ids"] for line in TRACE.read_text().splitlines()]
INPUT = [94, 81, 134, 69, 163, 97, 56, 188, 84, 122, 66, 144]  # the sample's input lengths at 1/32


def _filler_end(tok, n_tokens: int, question: str) -> int:
    """Where the row's own tail (the template's end around its question) starts."""
    text = tok.apply_chat_template([{"role": "system", "content": ""}, {"role": "user", "content": question}],
                                   add_generation_prompt=True)
    return n_tokens - (len(tok.encode(text, add_special=False)) - HEAD)


def _implied_blocks(a: int, b: int, ends: list[int]) -> int:
    """Leading blocks of row b identical to row a's by the trace: the same hash id at each, and filler in both."""
    n = 0
    while n < min(len(IDS[a]), len(IDS[b])) and IDS[a][n] == IDS[b][n] and (n + 1) * BLOCK <= min(ends[a], ends[b]):
        n += 1
    return n


def test_replaying_mooncake_hits_the_prefix_cache_where_its_hash_ids_are_shared(bundle, tmp_path):
    wl = Workload.load(REPO / "samples" / "workloads" / "trace_mooncake.toml")
    res = capture(wl, tmp_path / "run", CaptureOptions(max_num_seqs=8), bundle=bundle)
    assert res.load.completed == 12
    events = [e for e in pq.read_table(tmp_path / "run" / "events").to_pylist() if e["source"] == "engine"]
    by_task = defaultdict(list)
    for e in events:
        if e["task_id"]:
            by_task[int(e["task_id"][1:])].append(e)
    questions = [p.requests[0].user for p in wl.plan(bundle.tokenizer)]
    ends = [_filler_end(bundle.tokenizer, n, q) for n, q in zip(INPUT, questions)]

    def admitted(i: int) -> int:
        return min(e["step_id"] for e in by_task[i] if e["name"] == "engine.scheduled")

    def computed_blocks(a: int, before_step: int) -> int:
        """Full blocks of row a's prompt that had KV before that step (its own hit, then its chunks)."""
        chunks = [e for e in by_task[a] if e["name"] == "engine.prefill" and e["step_id"] < before_step]
        cached = sum(json.loads(e["attrs"]).get("cached_tokens", 0) for e in chunks)
        return (cached + sum(int(e["value"]) for e in chunks)) // BLOCK

    observed, expected = [], []
    for b in range(12):
        hit = [e for e in by_task[b] if e["name"] == "kv.prefix_hit"]
        observed.append(int(hit[0]["value"]) if hit else 0)
        step = admitted(b)
        best = max([min(_implied_blocks(a, b, ends), computed_blocks(a, step)) for a in range(b)], default=0)
        expected.append(min(best, (INPUT[b] - 1) // BLOCK))  # one prompt token is always computed
    assert observed == expected
    assert sum(observed) >= 10  # the sample's shared ids did reach the cache (rows arrive >= 175 ms apart)
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())["workload"]
    assert m["arrivals"] == "trace" and m["n_tasks"] == 12 and m["classes"] == {"mooncake": 12}
    t = m["trace"]
    assert (t["format"], t["sent"], t["context_tokens"], t["context_source"], t["clipped"]["rows"]) == \
        ("mooncake", 12, 8192, "engine", 0)
    created = [json.loads(e["attrs"]) for e in pq.read_table(tmp_path / "run" / "events").to_pylist()
               if e["name"] == "attempt.created"]
    assert sorted(c["prompt_tokens"] for c in created) == sorted(INPUT)
    assert sorted(c["max_tokens"] for c in created) == sorted([4, 2, 6, 3, 5, 1, 9, 3, 2, 6, 2, 4])
