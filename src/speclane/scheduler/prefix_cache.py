"""The prefix cache: full KV blocks indexed by (scope, chain hash), kept until evicted.

- **Chain hash.** Block i of a sequence hashes its parent's hash (block i - 1's, or
  ``ROOT_HASH``) and its own B token ids (SHA-256). Equal hashes mean equal token
  prefixes, so a block matches only together with its whole prefix, and its K/V (which
  depend on every earlier position) are the ones the request would compute itself.
  SHA-256 rather than Python's ``hash``: a prompt crafted to collide with another
  prefix would otherwise read that prefix's K/V.
- **Scope.** The key's first part says who may read a block: ``tenant_scope(t)`` for
  tenant t's requests, ``GLOBAL_SCOPE`` for requests marked global. A lookup reads one
  scope and an insert writes one; nothing crosses between scopes (docs/design.md, "Paged
  KV and the prefix cache", says which threat this closes).
- **Only full, computed blocks** are inserted (the caller, ``kv_manager.py``, inserts a
  block once every position in it holds a verified token's K/V). A key already present
  keeps its block; the second copy stays private to its request and is freed with it.
- **Part of a block.** Each cached block is also filed under (scope, its parent's hash,
  its first token id) with its token ids, so a prompt that matches only the first j < B tokens of a block
  after its matched prefix finds it (``longest_child``): those j positions' K/V are the
  prompt's own (they depend only on the shared prefix and themselves), and the caller
  copies them into a block of its own (the cached block stays as it is).
- **Eviction.** A cached block with reference count 0 is *evictable*. Evictable blocks
  are kept per owning tenant in least-recently-released order; the caller picks the
  tenant (``kv_manager.py``'s fairness rule) and ``evict_from`` frees that tenant's
  least recently used block. A lookup hit that is evictable stops being so once the
  caller takes a reference (``acquire``).

Pure bookkeeping over ``BlockPool``: no torch, no time (an internal counter orders
releases).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence

from speclane.scheduler.block_pool import BlockPool

ROOT_HASH = b""
GLOBAL_SCOPE: tuple[str, ...] = ("global",)
Scope = tuple[str, ...]


def tenant_scope(tenant: str) -> Scope:
    """The scope of a tenant's own blocks (never equal to ``GLOBAL_SCOPE``, whatever the name)."""
    return ("tenant", tenant)


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The chain hash of a block holding ``token_ids`` after the block hashed ``parent``."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


def chain_hashes(token_ids: Sequence[int], block_size: int, parent: bytes = ROOT_HASH) -> list[bytes]:
    """The chain hashes of the full blocks of ``token_ids`` (a partial last block has none)."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


class PrefixCache:
    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self._index: dict[tuple[Scope, bytes], int] = {}
        self._key_of: dict[int, tuple[Scope, bytes]] = {}  # block -> its key, for cached blocks
        # (scope, parent hash, first token id) -> {cached block: its token ids}, and block ->
        # that key: a lookup compares only the blocks that start like the prompt's next token
        self._children: dict[tuple[Scope, bytes, int], dict[int, tuple[int, ...]]] = {}
        self._parent_of: dict[int, tuple[Scope, bytes, int]] = {}
        # owner -> evictable blocks, least recently released first (block -> release stamp)
        self._evictable: dict[str, OrderedDict[int, int]] = {}
        self._num_evictable = 0
        self._stamp = 0

    # -- reading --------------------------------------------------------------------
    @property
    def num_cached(self) -> int:
        """Blocks in the index, live or evictable."""
        return len(self._key_of)

    @property
    def num_evictable(self) -> int:
        return self._num_evictable

    def key_of(self, block: int) -> tuple[Scope, bytes] | None:
        """The (scope, chain hash) ``block`` is indexed under; None when it is not cached."""
        return self._key_of.get(block)

    def evictable_tenants(self) -> Iterator[tuple[str, int]]:
        """(tenant, release stamp of its least recently used evictable block), per tenant
        that has evictable blocks."""
        for tenant, blocks in self._evictable.items():
            yield tenant, next(iter(blocks.values()))

    def lookup(self, scope: Scope, hashes: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest run of ``hashes`` from the first, in ``scope``."""
        found = []
        for h in hashes:
            block = self._index.get((scope, h))
            if block is None:
                break
            found.append(block)
        return found

    def longest_child(self, scope: Scope, parent: bytes, token_ids: Sequence[int]) -> tuple[int, int] | None:
        """(block, j): the cached block after ``parent`` in ``scope`` whose first j token ids
        are the first j of ``token_ids``, for the largest j >= 1 (the first such block on a
        tie); None when no block after ``parent`` starts with ``token_ids[0]``."""
        best: tuple[int, int] | None = None
        wanted = tuple(token_ids)
        if not wanted:
            return None
        for block, tokens in self._children.get((scope, parent, wanted[0]), {}).items():
            j = 0
            for a, b in zip(tokens, wanted, strict=False):
                if a != b:
                    break
                j += 1
            if j and (best is None or j > best[1]):
                best = (block, j)
        return best

    # -- changes --------------------------------------------------------------------
    def acquire(self, block: int) -> None:
        """Take a reference to a cached block (it is no longer evictable)."""
        if self.pool.ref_count(block) == 0:
            owner = self.pool.owner(block)
            assert owner is not None
            del self._evictable[owner][block]
            if not self._evictable[owner]:
                del self._evictable[owner]
            self._num_evictable -= 1
        self.pool.incref(block)

    def insert(self, scope: Scope, h: bytes, block: int, parent: bytes, token_ids: Sequence[int]) -> bool:
        """Index a live, full, computed ``block`` holding ``token_ids`` after the block hashed
        ``parent`` under (scope, h), h = block_hash(parent, token_ids); False (and nothing
        changes) when the key already has a block or the block is indexed already."""
        key = (scope, h)
        if key in self._index or block in self._key_of:
            return False
        self._index[key] = block
        self._key_of[block] = key
        self._children.setdefault((scope, parent, token_ids[0]), {})[block] = tuple(token_ids)
        self._parent_of[block] = (scope, parent, token_ids[0])
        return True

    def release(self, block: int) -> None:
        """Drop one reference; at 0 a cached block becomes evictable (most recently
        used) and any other block goes back to the free list."""
        if self.pool.decref(block):
            return
        if block not in self._key_of:
            self.pool.free(block)
            return
        owner = self.pool.owner(block)
        assert owner is not None
        self._stamp += 1
        self._evictable.setdefault(owner, OrderedDict())[block] = self._stamp
        self._num_evictable += 1

    def evict_from(self, tenant: str) -> int:
        """Free ``tenant``'s least recently used evictable block; returns it."""
        blocks = self._evictable[tenant]
        block, _ = blocks.popitem(last=False)
        if not blocks:
            del self._evictable[tenant]
        self._num_evictable -= 1
        del self._index[self._key_of.pop(block)]
        siblings = self._children[filed := self._parent_of.pop(block)]
        del siblings[block]
        if not siblings:
            del self._children[filed]
        self.pool.free(block)
        return block

    # -- invariants -----------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError unless the index and the block -> key map agree, every
        indexed block is owned, and the evictable blocks are exactly the indexed blocks
        with count 0, each filed under its owner."""
        assert len(self._index) == len(self._key_of), "the index and the key map differ in size"
        assert set(self._parent_of) == set(self._key_of), "a cached block without its parent's entry, or the reverse"
        for (scope, parent, first), children in self._children.items():
            assert children, "an empty list of children is kept"
            for block, tokens in children.items():
                assert self._parent_of[block] == (scope, parent, first) and tokens[0] == first, (
                    f"block {block} filed under another parent or first token")
                assert self._key_of[block] == (scope, block_hash(parent, tokens)), f"block {block}'s tokens are not its key's"
        for block, key in self._key_of.items():
            assert self._index.get(key) == block, f"block {block}'s key points elsewhere"
            assert self.pool.owner(block) is not None, f"cached block {block} is free"
        filed = {b: t for t, blocks in self._evictable.items() for b in blocks}
        assert len(filed) == self._num_evictable == sum(map(len, self._evictable.values()))
        expected = {b for b in self._key_of if self.pool.ref_count(b) == 0}
        assert set(filed) == expected, f"evictable {sorted(filed)} != unreferenced cached {sorted(expected)}"
        for block, tenant in filed.items():
            assert self.pool.owner(block) == tenant, f"block {block} filed under {tenant}"
        assert all(self._evictable.values()), "an empty evictable list is kept"
