"""Per-request block tables over the KV pool and the prefix cache, and the rules under
KV pressure. No torch; docs/design.md, "Paged KV and the prefix cache", is the reference.

A request's block table maps its positions to pool blocks: position p lives in
``table[p // B]`` at offset ``p % B``. Its life:

- ``admit``: look up the longest run of cached full blocks of its known tokens (the
  prompt, or prompt + output when it resumes after preemption) in its scope, never the
  block holding the last known token (that position must be computed to give logits);
  take a reference to each hit and allocate private blocks for every other known
  position, so a chunked prefill never waits for memory midway. Past the hits, a cached
  block that continues the same prefix with the same first j tokens (an identical
  prompt sent again: its block went on with the earlier answer; the next turn of a chat)
  gives those j positions too (never the last known token): the admission asks for them
  to be copied into the request's own block before its first forward (``Admission.copy``),
  holding a reference to the cached block until then (its first ``commit``); where that
  held block is the one the pool is short of, the request goes without the copy.
  No room even after evicting cached blocks: ``None``, and nothing changes.
- ``awaits_shared_prefix`` (before ``admit``): whether the first full block of its
  tokens the cache lacks is one a live request of the same scope is still computing; the
  scheduler then admits it later, to read that block instead of computing it again.
- ``reserve``: blocks for positions up to ``upto`` before a tick (a decode step's fed
  token and a holder's K draft positions).
- ``commit``: after the tick, the verified length (``num_computed_tokens``: fed tokens
  plus accepted drafts). Blocks wholly past it and past the admitted tokens go back at
  once, so rejected draft positions never keep a block; each block whose B positions are
  all below the verified length is inserted into the cache (prefill and decode alike), so
  a block holding an unverified draft position never is.
- ``free``: finish or abort; every block is released, last block first, so a cached
  prefix is evicted tail first.

Under pressure (more blocks asked for than are free):

1. **Cached blocks go first.** Evictable blocks (cached, count 0) are evicted from the
   tenant with the most blocks held (live and cached) per unit of weight, least recently
   released first within it. Evicting another tenant's *cached* blocks is allowed.
2. **Admission is refused**, never paid for with a live request. The scheduler admits in
   the order of ``admission_key``: priority, then blocks held per unit of weight, then
   arrival; it stops at the first request that does not fit, so among equally urgent
   requests the tenant most over its weighted share is admitted last.
3. **Growth takes from the tenant most over its share, never from a lighter one.** A
   running request that cannot get its blocks preempts a live request of the tenant with
   the most blocks per unit of weight among the tenants holding more than its own tenant
   (only requests no more urgent than it), else of its own tenant (possibly itself):
   within that tenant the least urgent, most recently admitted. So a tenant never loses
   a live request to a tenant that holds more than it does; a tenant that fills the pool
   with many long requests makes its own requests wait. A preempted request loses
   nothing: its blocks are released (its full blocks stay cached until evicted) and it is
   admitted again later with every token it has as its prompt (recompute).

How the scheduler treats a preempted request so its output continues identically: back
to waiting with its output kept, ``num_computed_tokens`` = 0, out of the lane and out of
this tick's plan, its drafter state dropped by the runner (its sampling stream and
grammar matcher stay). Re-admitted with ``admit(rid, request)``, it prefills in
chunks up to ``num_tokens`` (not ``num_prompt_tokens``) and samples only at the last
position; that token is its next output. The K/V recomputed, or read from the cache, are
the bits it had (the native kernels give a position the same bits in every batch shape),
and a seeded sample at position i draws the noise seeded by (seed, i), so the text is the
same as without preemption. ``max_tokens``, ``usage.prompt_tokens`` and
``cached_tokens`` count from the first admission.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from speclane.scheduler.block_pool import KV_BLOCK_SIZE, BlockPool
from speclane.scheduler.prefix_cache import (
    GLOBAL_SCOPE,
    ROOT_HASH,
    PrefixCache,
    Scope,
    block_hash,
    chain_hashes,
    tenant_scope,
)


class TokenSource(Protocol):
    """A request's tokens as the manager reads them (``speclane.request.Request`` is one)."""

    @property
    def num_tokens(self) -> int: ...

    def tokens_between(self, start: int, end: int) -> Sequence[int]: ...


@dataclass(frozen=True)
class Admission:
    num_cached_tokens: int  # positions read from the cache: prefill starts here
    block_table: tuple[int, ...]
    # (cached block, the request's block, j): copy the first j positions' K/V before the
    # request's first forward (they are among num_cached_tokens); None: nothing to copy.
    copy: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class Reservation:
    ok: bool  # the request has its blocks (False: it was preempted itself)
    preempted: tuple[str, ...]  # requests preempted to make room, in order (may end with it)


@dataclass
class KVStats:
    queried_tokens: int = 0  # known tokens of admitted requests
    cached_tokens: int = 0  # of them, read from the cache
    evicted_blocks: int = 0
    preemptions: int = 0
    refused_admissions: int = 0


@dataclass
class _Seq:
    tenant: str
    scope: Scope
    priority: int
    order: int  # admission sequence number
    num_admitted: int  # tokens known at admission: the table never shrinks below them
    blocks: list[int]
    hashes: list[bytes]  # chain hashes of the full blocks known so far
    num_computed: int
    num_indexed: int  # blocks [0, num_indexed) were offered to the cache
    copy_source: int | None = None  # a cached block held until the admission's copy has run


def _scope(tenant: str, global_scope: bool) -> Scope:
    """The cache scope a request reads and writes: its tenant's, or the global one."""
    return GLOBAL_SCOPE if global_scope else tenant_scope(tenant)


class KVManager:
    def __init__(self, num_blocks: int, block_size: int = KV_BLOCK_SIZE, *, enable_prefix_cache: bool = True) -> None:
        self.pool = BlockPool(num_blocks, block_size)
        self.cache = PrefixCache(self.pool)
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.stats = KVStats()
        self._seqs: dict[str, _Seq] = {}
        self._weight: dict[str, float] = {}  # tenants holding blocks or live requests
        self._live: Counter[str] = Counter()
        self._order = 0

    # -- reading --------------------------------------------------------------------
    def __contains__(self, request_id: str) -> bool:
        return request_id in self._seqs

    @property
    def num_holders(self) -> int:
        """Requests holding a block table (admitted and not yet freed)."""
        return len(self._seqs)

    @property
    def num_available_blocks(self) -> int:
        """Blocks an allocation can get without preempting: free plus evictable."""
        return self.pool.num_free + self.cache.num_evictable

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return tuple(self._seqs[request_id].blocks)

    def num_computed(self, request_id: str) -> int:
        return self._seqs[request_id].num_computed

    def load(self, tenant: str, weight: float | None = None) -> float:
        """Blocks ``tenant`` holds (live and cached) per unit of its weight (``weight``, or
        the one its last admitted request carried, or 1)."""
        w = weight if weight is not None else self._weight.get(tenant, 1.0)
        return self.pool.held(tenant) / w

    def admission_key(self, priority: int, tenant: str, weight: float, arrival_s: float) -> tuple[int, float, float]:
        """The order to admit waiting requests in (lowest first): the most urgent priority,
        then the tenant holding the fewest blocks per unit of weight, then arrival."""
        return (priority, self.load(tenant, weight), arrival_s)

    def awaits_shared_prefix(self, tokens: TokenSource, *, tenant: str, global_scope: bool = False) -> bool:
        """True when the first full block of ``tokens`` the cache does not hold is one a live
        request in the same scope is still prefilling: admitted now, the request would
        compute that block (and what follows it in the shared prefix) a second time; admitted
        once it is computed, it reads it from the cache. Only the request's own scope is
        looked at, so whether it waits says nothing about another tenant's prompts."""
        if not self.enable_prefix_cache:
            return False
        scope, size = _scope(tenant, global_scope), self.block_size
        pending = {h for s in self._seqs.values() if s.scope == scope
                   for h in s.hashes[s.num_computed // size : s.num_admitted // size]}
        if not pending:
            return False
        parent = ROOT_HASH
        for i in range((tokens.num_tokens - 1) // size):  # the blocks admit may read
            parent = block_hash(parent, tokens.tokens_between(i * size, (i + 1) * size))
            if not self.cache.lookup(scope, [parent]):
                return parent in pending
        return False

    # -- a request's life -------------------------------------------------------------
    def admit(self, request_id: str, tokens: TokenSource, *, tenant: str, weight: float = 1.0, priority: int = 0,
              global_scope: bool = False, read_cache: bool = True) -> Admission | None:
        """Blocks for every known token of a request (cache hits first, unless not
        ``read_cache``: a request that needs every position computed), or None when even
        evicting every cached block would not make room (nothing changes then)."""
        if request_id in self._seqs:
            raise ValueError(f"request {request_id!r} already holds KV blocks")
        if weight <= 0:
            raise ValueError(f"a tenant's weight must be > 0; got {weight}")
        n, size = tokens.num_tokens, self.block_size
        scope = _scope(tenant, global_scope)
        hashes: list[bytes] = []
        hits: list[int] = []
        part: tuple[int, int] | None = None  # (cached block, j) continuing the hits
        if self.enable_prefix_cache:
            hashes = chain_hashes(tokens.tokens_between(0, n - n % size), size)
            hits = self.cache.lookup(scope, hashes[: (n - 1) // size]) if read_cache else []
            start = len(hits) * size
            if read_cache and start < n - 1:  # positions [start, n - 1): the last known token is computed
                part = self.cache.longest_child(scope, hashes[len(hits) - 1] if hits else ROOT_HASH,
                                                tokens.tokens_between(start, min(start + size, n - 1)))
        need = self.pool.blocks_needed(n) - len(hits)
        if part and need > self.num_available_blocks - self._evictable_among(hits + [part[0]]):
            # The copy source is held on top of the request's own blocks: where that one
            # block is what is short, go without the copy (else a request that fits the
            # pool could wait forever, and everything queued behind it).
            part = None
        held = hits + ([part[0]] if part else [])
        if need > self.num_available_blocks - self._evictable_among(held):
            self.stats.refused_admissions += 1
            return None
        self._weight[tenant] = weight
        self._live[tenant] += 1
        for block in held:
            self.cache.acquire(block)
        blocks = hits + [self._allocate(tenant) for _ in range(need)]
        num_cached = len(hits) * size + (part[1] if part else 0)
        copy = (part[0], blocks[len(hits)], part[1]) if part else None
        self._order += 1
        self._seqs[request_id] = _Seq(tenant, scope, priority, self._order, n, blocks, hashes, num_cached, len(hits),
                                      part[0] if part else None)
        self.stats.queried_tokens += n
        self.stats.cached_tokens += num_cached
        return Admission(num_cached, tuple(blocks), copy)

    def _evictable_among(self, blocks: list[int]) -> int:
        """Of ``blocks`` (cached ones a request would hold), those now counted as available."""
        return sum(1 for b in blocks if self.pool.ref_count(b) == 0)

    def reserve(self, request_id: str, upto: int) -> Reservation:
        """Blocks for positions ``[0, upto)``. When there is no room, a live request is
        preempted by rule 3 (``growth_victim``), again until there is; if that is this
        request, it is preempted too and ``ok`` is False."""
        seq = self._seqs[request_id]
        need = self.pool.blocks_needed(upto) - len(seq.blocks)
        preempted: list[str] = []
        while need > self.num_available_blocks:
            victim = self.growth_victim(request_id)
            self.free(victim)
            self.stats.preemptions += 1
            preempted.append(victim)
            if victim == request_id:
                return Reservation(False, tuple(preempted))
        for _ in range(need):
            seq.blocks.append(self._allocate(seq.tenant))
        return Reservation(True, tuple(preempted))

    def growth_victim(self, request_id: str) -> str:
        """The live request that ``request_id``'s growth preempts when the pool is full:
        from the heaviest tenant (blocks per unit of weight) holding more than its own
        tenant, among requests no more urgent than it; else from its own tenant. Within the
        tenant, the least urgent and then the most recently admitted."""
        seq = self._seqs[request_id]
        own_load = self.load(seq.tenant)
        heavier = {s.tenant for s in self._seqs.values()
                   if s.priority >= seq.priority and self.load(s.tenant) > own_load}
        tenant = max(heavier, key=lambda t: (self.load(t), t)) if heavier else seq.tenant
        return max((rid for rid, s in self._seqs.items()
                    if s.tenant == tenant and (tenant == seq.tenant or s.priority >= seq.priority)),
                   key=lambda rid: (self._seqs[rid].priority, self._seqs[rid].order))

    def commit(self, request_id: str, num_computed: int, tokens: TokenSource) -> None:
        """``num_computed`` positions hold verified tokens' K/V: free the blocks past them
        (and past the admitted tokens), and cache each block that became full."""
        seq, size = self._seqs[request_id], self.block_size
        if not seq.num_computed <= num_computed <= len(seq.blocks) * size:
            raise ValueError(f"request {request_id!r}: {num_computed} computed positions, after "
                             f"{seq.num_computed}, in {len(seq.blocks)} blocks of {size}")
        seq.num_computed = num_computed
        self._release_copy_source(seq)  # the admission's copy ran before this tick's forward
        keep = self.pool.blocks_needed(max(num_computed, seq.num_admitted))
        for block in reversed(seq.blocks[keep:]):
            self.cache.release(block)  # private: never indexed, so freed
        del seq.blocks[keep:]
        if not self.enable_prefix_cache:
            return
        full = num_computed // size
        for i in range(len(seq.hashes), full):
            parent = seq.hashes[i - 1] if i else ROOT_HASH
            seq.hashes.append(block_hash(parent, tokens.tokens_between(i * size, (i + 1) * size)))
        for i in range(seq.num_indexed, full):
            self.cache.insert(seq.scope, seq.hashes[i], seq.blocks[i], seq.hashes[i - 1] if i else ROOT_HASH,
                              tokens.tokens_between(i * size, (i + 1) * size))
        seq.num_indexed = max(seq.num_indexed, full)

    def free(self, request_id: str) -> None:
        """The request finished, was aborted or is preempted: release its blocks."""
        seq = self._seqs.pop(request_id)
        self._release_copy_source(seq)
        for block in reversed(seq.blocks):
            self.cache.release(block)
        self._live[seq.tenant] -= 1
        self._forget_if_idle(seq.tenant)

    # -- eviction -------------------------------------------------------------------
    def evict(self, num_blocks: int) -> int:
        """Evict up to ``num_blocks`` cached blocks by the fairness rule; returns how many."""
        evicted = 0
        while evicted < num_blocks and self.cache.num_evictable:
            self._evict_one()
            evicted += 1
        return evicted

    def clear_cache(self) -> int:
        """Evict every cached block no request holds; returns how many."""
        return self.evict(self.cache.num_evictable)

    def _evict_one(self) -> None:
        # The most blocks held per unit of weight, then the least recently released block.
        tenant, _ = max(self.cache.evictable_tenants(), key=lambda ts: (self.load(ts[0]), -ts[1]))
        self.cache.evict_from(tenant)
        self.stats.evicted_blocks += 1
        self._forget_if_idle(tenant)

    def _release_copy_source(self, seq: _Seq) -> None:
        if seq.copy_source is not None:
            self.cache.release(seq.copy_source)
            seq.copy_source = None

    def _allocate(self, tenant: str) -> int:
        if not self.pool.num_free:
            self._evict_one()
        return self.pool.allocate(tenant)

    def _forget_if_idle(self, tenant: str) -> None:
        if not self._live[tenant] and not self.pool.held(tenant):
            self._live.pop(tenant, None)
            self._weight.pop(tenant, None)

    # -- invariants -----------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError unless the pool and the cache keep their invariants and:
        each block's count is the number of tables holding it; a table holds a block at
        most once and covers its computed and admitted positions; a block shared by tables
        is cached; a cached block in a table sits at the index and under the scope and
        chain hash of that table's own prefix; no block past a table's verified full
        blocks is cached; each tenant's live count is its number of tables."""
        self.pool.check()
        self.cache.check()
        uses = Counter(b for s in self._seqs.values() for b in s.blocks)
        uses.update(s.copy_source for s in self._seqs.values() if s.copy_source is not None)
        for block in range(self.pool.num_blocks):
            assert self.pool.ref_count(block) == uses[block], (
                f"block {block}: count {self.pool.ref_count(block)}, held by {uses[block]} tables")
            assert uses[block] <= 1 or self.cache.key_of(block) is not None, f"block {block} shared but not cached"
        for rid, s in self._seqs.items():
            assert s.copy_source is None or self.cache.key_of(s.copy_source) is not None, f"{rid} copies from an uncached block"
        size = self.block_size
        for rid, s in self._seqs.items():
            assert len(set(s.blocks)) == len(s.blocks), f"{rid} holds a block twice"
            assert len(s.blocks) >= self.pool.blocks_needed(max(s.num_computed, s.num_admitted)), f"{rid}'s table is short"
            for i, block in enumerate(s.blocks):
                key = self.cache.key_of(block)
                if key is not None:
                    assert i < s.num_computed // size, f"{rid}: block {i} cached before it is full and verified"
                    assert key == (s.scope, s.hashes[i]), f"{rid}: block {i} is cached under another prefix or scope"
        assert +self._live == Counter(s.tenant for s in self._seqs.values()), "live counts differ from the tables"
        assert self.enable_prefix_cache or not self.cache.num_cached, "blocks cached with the cache off"
