"""Block manager: allocation, prefix hits by chained hashes, LRU eviction, copy-on-write, integrity."""
from __future__ import annotations

import pytest

from inferledger.engine.block_manager import BlockManager, chain_hash
from inferledger.engine.params import SamplingParams
from inferledger.engine.sequence import Sequence

BS = 4


def seq(tokens, **kw):
    return Sequence(list(tokens), SamplingParams(max_tokens=8, **kw), request_id="r")


def compute(bm, s, n=None):
    """Allocate and 'compute' n more tokens of s (all uncomputed ones by default)."""
    n = s.num_uncomputed_tokens if n is None else n
    res = bm.allocate_slots(s, n)
    assert res is not None
    s.mark_computed(s.num_computed_tokens, n)
    bm.cache_full_blocks(s)
    return res


def test_alloc_and_free_return_every_block():
    bm = BlockManager(8, BS)
    a = seq(range(10))
    new, copies = compute(bm, a)
    assert len(new) == 3 and copies == [] and a.block_table == new
    assert (bm.num_used_blocks, bm.num_free_blocks + bm.num_cached_blocks) == (3, 5)
    assert bm.check_integrity()
    bm.free(a)
    assert bm.num_used_blocks == 0 and bm.num_cached_blocks == 2  # two full blocks stay cached
    assert bm.check_integrity()


def test_allocation_refused_when_pool_is_short():
    bm = BlockManager(2, BS)
    a = seq(range(12))
    assert bm.allocate_slots(a, 12) is None
    assert a.block_table == [] and bm.num_free_blocks == 2
    assert bm.check_integrity()


def test_prefix_hit_follows_the_chain_of_full_blocks():
    bm = BlockManager(16, BS)
    a = seq(range(13))  # 3 full blocks + 1 token
    compute(bm, a)
    b = seq(list(range(8)) + [99, 98, 97, 96, 95])  # shares the first two blocks only
    hits = bm.find_cached_prefix(b)
    assert hits == a.block_table[:2]
    bm.acquire_cached(b, hits)
    assert all(bm.blocks[x].ref_count == 2 for x in hits)
    # the chain: block 1's hash depends on block 0's, so equal tokens after a different block miss
    c = seq([7, 7, 7, 7] + list(range(4, 8)) + [1])
    assert bm.find_cached_prefix(c) == []
    assert bm.blocks[a.block_table[1]].hash == chain_hash(chain_hash(None, range(4)), range(4, 8))
    # at least one token is left to compute: an exact 2-block prompt hits only one block
    d = seq(range(8))
    assert bm.find_cached_prefix(d) == a.block_table[:1]
    assert bm.check_integrity()
    for s in (a, b):
        bm.free(s)
    assert bm.num_used_blocks == 0 and bm.check_integrity()


def test_cached_blocks_survive_until_evicted_lru_first():
    bm = BlockManager(4, BS)
    a, b = seq(range(9)), seq(range(100, 109))
    compute(bm, a)  # 2 full + 1 partial
    bm.free(a)
    assert bm.num_cached_blocks == 2 and bm.num_free_blocks == 2
    compute(bm, seq(range(200, 203)))  # takes a free block, not a cached one
    assert bm.num_cached_blocks == 2
    hits = bm.find_cached_prefix(seq(range(9)))
    assert len(hits) == 2
    compute(bm, b)  # needs 3 blocks: 1 free + 2 evicted, least recently used first
    assert bm.num_evictions == 2 and bm.find_cached_prefix(seq(range(9))) == []
    assert bm.check_integrity()


def test_lru_order_keeps_the_recently_used_prefix():
    bm = BlockManager(5, BS)
    old, new = seq(range(5)), seq(range(50, 55))
    compute(bm, old)
    bm.free(old)
    compute(bm, new)
    bm.free(new)  # cached: old's block (older), new's block (newer); free: 3
    compute(bm, seq(range(90, 102)))  # 3 free blocks; then one more needs an eviction
    compute(bm, seq(range(300, 301)))
    assert bm.find_cached_prefix(seq(range(5))) == []  # the older one went
    assert len(bm.find_cached_prefix(seq(range(50, 55)))) == 1
    assert bm.check_integrity()


def test_copy_on_write_of_a_shared_partial_block():
    bm = BlockManager(8, BS)
    parent = seq(range(6), n=2)  # 1 full + 1 partial block
    compute(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    shared = parent.block_table[1]
    assert bm.blocks[shared].ref_count == 2
    parent.append_token(42)
    child.append_token(43)
    new, copies = bm.allocate_slots(child, 1)  # writes position 6 into the shared partial block
    assert copies == [(shared, child.block_table[1])] and new == [child.block_table[1]]
    assert child.block_table[0] == parent.block_table[0]  # the full block stays shared
    assert bm.blocks[shared].ref_count == 1
    new, copies = bm.allocate_slots(parent, 1)  # now the parent is alone: writes in place
    assert copies == [] and new == [] and parent.block_table[1] == shared
    assert bm.check_integrity()
    bm.free(parent)
    bm.free(child)
    assert bm.num_used_blocks == 0 and bm.check_integrity()


def test_trim_drops_blocks_beyond_the_kept_tokens():
    bm = BlockManager(8, BS)
    a = seq(range(3))
    compute(bm, a)
    bm.allocate_slots(a, 9)  # room for drafts: positions 3..11
    assert len(a.block_table) == 3
    dropped = bm.trim(a, 5)
    assert len(dropped) == 1 and len(a.block_table) == 2
    assert bm.check_integrity()
    bm.free(a)
    assert bm.num_used_blocks == 0


def test_integrity_violations_are_detected():
    bm = BlockManager(6, BS)
    a = seq(range(6))
    compute(bm, a)
    bm.blocks[a.block_table[0]].ref_count += 1  # a reference nobody holds
    with pytest.raises(AssertionError, match="ref_count"):
        bm.check_integrity()
    bm.blocks[a.block_table[0]].ref_count -= 1
    bm.free_block_ids.append(a.block_table[1])  # a used block also in the free list
    with pytest.raises(AssertionError, match="total"):
        bm.check_integrity()
    bm.free_block_ids.pop()
    a.block_table.pop()  # a leaked block: in use, held by no table
    with pytest.raises(AssertionError):
        bm.check_integrity()


def test_prefix_caching_off_hashes_nothing():
    bm = BlockManager(6, BS, enable_prefix_caching=False)
    a = seq(range(9))
    compute(bm, a)
    bm.free(a)
    assert bm.num_cached_blocks == 0 and bm.find_cached_prefix(seq(range(9))) == []
    assert bm.check_integrity()
