"""The paged KV pool: physical blocks, block tables, prefix caching and copy-on-write.

Every block is in exactly one of three states: free (no content worth keeping), cached (no reference
but a registered hash, so a later prompt with the same prefix can reuse it; evicted LRU-first when
the free list runs dry) or used (ref_count > 0: that many block tables hold it). Only FULL blocks of
computed tokens are hashed, by the chain hash(parent_hash, tokens), so a hit on block i implies the
whole prefix up to it matches. A block shared by several tables is copied before it is written.
"""
from __future__ import annotations

from collections import OrderedDict, deque

from .sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


def chain_hash(parent: int | None, token_ids) -> int:
    return hash((parent, tuple(token_ids)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.cached_block_ids: OrderedDict[int, None] = OrderedDict()  # unreferenced, LRU first
        self.hash_to_block_id: dict[int, int] = {}
        self.seqs: dict[int, Sequence] = {}  # sequences holding blocks (for the integrity check)
        self.num_evictions = 0

    # -- occupancy --------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks - self.num_cached_blocks

    @property
    def num_available_blocks(self) -> int:
        """Blocks an allocation can take: free ones, then cached ones by eviction."""
        return self.num_free_blocks + self.num_cached_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -----------------------------------------------------------------------------
    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks matching the leading full blocks of seq's tokens (no side effect). At least
        one token is always left to compute: its logits start the output."""
        if not self.enable_prefix_caching:
            return []
        bs, hits, parent = self.block_size, [], None
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            parent = chain_hash(parent, tokens)
            bid = self.hash_to_block_id.get(parent)
            if bid is None or self.blocks[bid].token_ids != tokens:
                break
            hits.append(bid)
        return hits

    def num_evictable_among(self, block_ids: list[int]) -> int:
        return sum(1 for b in block_ids if b in self.cached_block_ids)

    def acquire_cached(self, seq: Sequence, block_ids: list[int]) -> None:
        """seq (holding no blocks) takes references on a prefix hit."""
        assert not seq.block_table, "prefix hits only start an empty block table"
        for bid in block_ids:
            self._ref(bid)
            seq.block_hashes.append(self.blocks[bid].hash)
        seq.block_table.extend(block_ids)
        self.seqs[seq.seq_id] = seq

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the hashes of blocks that are full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(seq.block_hashes[-1] if seq.block_hashes else None, tokens)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and h not in self.hash_to_block_id:
                block.hash, block.token_ids = h, tokens
                self.hash_to_block_id[h] = block.block_id

    # -- allocation -------------------------------------------------------------------------------
    def _ref(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:
            self.cached_block_ids.pop(bid, None)
        block.ref_count += 1

    def _unref(self, bid: int) -> bool:
        """Drop one reference; True when the block is now unreferenced (back in the pool)."""
        block = self.blocks[bid]
        block.ref_count -= 1
        if block.ref_count > 0:
            return False
        if block.hash is not None:
            self.cached_block_ids[bid] = None
        else:
            self.free_block_ids.append(bid)
        return True

    def _take_block(self) -> int:
        if self.free_block_ids:
            bid = self.free_block_ids.popleft()
        else:
            bid, _ = self.cached_block_ids.popitem(last=False)  # evict least recently used
            block = self.blocks[bid]
            if self.hash_to_block_id.get(block.hash) == bid:
                del self.hash_to_block_id[block.hash]
            block.hash, block.token_ids = None, ()
            self.num_evictions += 1
        self.blocks[bid].ref_count = 1
        return bid

    def allocate_slots(self, seq: Sequence, num_new_tokens: int):
        """Make room to write KV for positions [num_computed, num_computed + num_new_tokens).

        Returns (new_block_ids, copies) where copies are (src, dst) pairs the runner must copy
        before the step writes (copy-on-write of a shared partial block), or None when the pool
        cannot supply the blocks (then nothing changed).
        """
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens
        need = max(0, self.blocks_for(end) - len(seq.block_table))
        first = start // self.block_size
        cow = [i for i in range(first, min(self.blocks_for(end), len(seq.block_table)))
               if self.blocks[seq.block_table[i]].ref_count > 1]
        if need + len(cow) > self.num_available_blocks:
            return None
        new, copies = [], []
        for i in cow:
            src = seq.block_table[i]
            dst = self._take_block()
            self._unref(src)
            seq.block_table[i] = dst
            copies.append((src, dst))
            new.append(dst)
            seq.num_cow_copies += 1
        for _ in range(need):
            bid = self._take_block()
            seq.block_table.append(bid)
            new.append(bid)
        if seq.block_table:
            self.seqs[seq.seq_id] = seq
        return new, copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares every block of parent (ref counts up); writes will copy first."""
        for bid in parent.block_table:
            self._ref(bid)
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        self.seqs[child.seq_id] = child

    def trim(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Keep only the blocks covering the first num_tokens positions (rejected drafts' slots)."""
        keep = self.blocks_for(num_tokens)
        dropped = seq.block_table[keep:]
        del seq.block_table[keep:]
        for bid in reversed(dropped):
            self._unref(bid)
        return dropped

    def free(self, seq: Sequence) -> list[int]:
        """seq drops all its references; returns its former table. Tail blocks go to the LRU end
        that is evicted first, so shared prefixes outlive the tails."""
        table = seq.block_table
        for bid in reversed(table):
            self._unref(bid)
        seq.block_table = []
        seq.block_hashes = []
        self.seqs.pop(seq.seq_id, None)
        return table

    def is_unreferenced(self, bid: int) -> bool:
        return self.blocks[bid].ref_count == 0

    # -- invariants -------------------------------------------------------------------------------
    def integrity_errors(self) -> list[str]:
        errors = []
        refs = [0] * self.num_blocks
        for seq in self.seqs.values():
            for bid in seq.block_table:
                refs[bid] += 1
        free, cached = set(self.free_block_ids), set(self.cached_block_ids)
        if len(free) != len(self.free_block_ids):
            errors.append("a block appears twice in the free list")
        if free & cached:
            errors.append(f"blocks both free and cached: {sorted(free & cached)}")
        used = {b.block_id for b in self.blocks if b.ref_count > 0}
        if len(free) + len(cached) + len(used) != self.num_blocks or used & (free | cached):
            errors.append(f"free {len(free)} + cached {len(cached)} + used {len(used)} "
                          f"!= total {self.num_blocks} (or overlapping)")
        for b in self.blocks:
            if b.ref_count != refs[b.block_id]:
                errors.append(f"block {b.block_id}: ref_count {b.ref_count} but {refs[b.block_id]} "
                              "block tables hold it")
            if b.block_id in cached and b.hash is None:
                errors.append(f"block {b.block_id} is cached without a hash")
        for h, bid in self.hash_to_block_id.items():
            if self.blocks[bid].hash != h:
                errors.append(f"hash index points at block {bid}, which holds another hash")
        return errors

    def check_integrity(self) -> bool:
        """True when free + cached + used == total and every ref count equals the number of block
        tables holding the block; otherwise raises AssertionError listing what is wrong."""
        errors = self.integrity_errors()
        if errors:
            raise AssertionError("KV block integrity violated: " + "; ".join(errors))
        return True
