"""The paged KV pool as the scheduler sees it: N blocks of B token positions, no torch.

A block is in one of three states, told apart by its reference count and its owner:

- **free**: on the free list, count 0, no owner;
- **live**: count > 0 (the number of block tables that hold it), owned by the tenant
  that allocated it;
- **cached**: count 0 but still owned: the prefix cache (``prefix_cache.py``) keeps it
  for a later request and may evict it, which ``free``s it.

A block is charged to the tenant that allocated it, from ``allocate`` to ``free``,
whoever else references it meanwhile; ``held(tenant)`` is what the fairness rule of
``kv_manager.py`` weighs (live and cached blocks alike). The pool knows nothing of
tokens or hashes; ``check`` states its invariants and the tests call it after every step.
"""

from __future__ import annotations

from collections import Counter

# Token positions per KV block. 16 is vLLM's default: a prefix matches in steps of 16
# tokens, and a sequence wastes at most 15 positions in its last block.
KV_BLOCK_SIZE = 16


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int = KV_BLOCK_SIZE) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a KV pool needs >= 1 block of >= 1 position; got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._owner: list[str | None] = [None] * num_blocks
        # A stack, lowest id on top: allocation order is deterministic (block ids never
        # change a position's bits: the kernel reads each position alone).
        self._free = list(range(num_blocks - 1, -1, -1))
        self._held: Counter[str] = Counter()

    # -- reading --------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def owner(self, block: int) -> str | None:
        """The tenant charged for ``block``; None while it is free."""
        return self._owner[block]

    def held(self, tenant: str) -> int:
        """Blocks charged to ``tenant``: live and cached."""
        return self._held[tenant]

    def held_by_tenant(self) -> dict[str, int]:
        return {t: n for t, n in self._held.items() if n}

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` positions."""
        return -(-num_tokens // self.block_size)

    # -- changes --------------------------------------------------------------------
    def allocate(self, tenant: str) -> int:
        """A free block, live with count 1 and charged to ``tenant``."""
        if not self._free:
            raise RuntimeError("no free KV block (the caller evicts or preempts first)")
        block = self._free.pop()
        self._ref[block] = 1
        self._owner[block] = tenant
        self._held[tenant] += 1
        return block

    def incref(self, block: int) -> int:
        """One more table holds ``block`` (a cached block becomes live again)."""
        if self._owner[block] is None:
            raise AssertionError(f"block {block} is free: only a live or cached block can be shared")
        self._ref[block] += 1
        return self._ref[block]

    def decref(self, block: int) -> int:
        """One table fewer holds ``block``; at 0 the caller caches or frees it."""
        if self._ref[block] <= 0:
            raise AssertionError(f"block {block} released more often than it was held")
        self._ref[block] -= 1
        return self._ref[block]

    def free(self, block: int) -> None:
        """Back to the free list; no table may hold it any more."""
        owner = self._owner[block]
        if owner is None:
            raise AssertionError(f"block {block} freed twice")
        if self._ref[block]:
            raise AssertionError(f"block {block} freed while {self._ref[block]} tables hold it")
        self._owner[block] = None
        self._held[owner] -= 1
        if not self._held[owner]:
            del self._held[owner]
        self._free.append(block)

    # -- invariants -----------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError unless: the free list holds each free block once; a free
        block has count 0 and no owner; an owned block is off the free list; counts are
        never negative; each tenant's charge is the number of blocks it owns."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        owned: Counter[str] = Counter()
        for block in range(self.num_blocks):
            ref, owner = self._ref[block], self._owner[block]
            assert ref >= 0, f"block {block} has count {ref}"
            if block in free:
                assert ref == 0 and owner is None, f"free block {block} is held ({ref}) or owned ({owner})"
            else:
                assert owner is not None, f"block {block} is neither free nor owned (leaked)"
                owned[owner] += 1
        assert owned == +self._held, f"charges {dict(self._held)} differ from owners {dict(owned)}"
