"""Property tests of the paged KV pool, the prefix cache and the manager, over random
traffic of several tenants (hypothesis's state machines; no torch, no model).

The machine admits requests (fresh prompts from a few shared stems, follow-up turns that
resend a finished request's tokens, requests preempted earlier), runs steps (a prefill
chunk, or a decode step with up to 3 draft positions of which any number is accepted),
finishes and aborts requests and evicts cached blocks, in a pool small enough that
admissions are refused and requests preempted. A fake device records, for every block
position written, the scope and the exact token prefix whose K/V it holds. After every
step:

- the manager's invariants hold (``KVManager.check``) and, read from outside, each
  block's reference count is the number of block tables holding it, every free block is
  unreferenced, and the blocks charged to tenants plus the free ones are the pool;
- every position a request reads from the cache holds the K/V of its own token prefix,
  written under its own scope (so a hit is exact, and no tenant reads another's blocks
  unless both are global-scope requests), positions copied from part of a cached block
  (``Admission.copy``, which the fake device carries out) included;
- a step only writes into blocks no other table and no cache entry holds;
- after ``commit`` a table holds exactly the blocks of its verified or admitted
  positions (rejected drafts keep none);
- growth preempts requests of the growing request's tenant or of a tenant holding more
  blocks per unit of weight before the step, never of a lighter one; every table not
  preempted is unchanged;
- an eviction takes a block of the tenant with the most blocks held per unit of weight.

At the end every request finishes, the cache is cleared and the pool is full again.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from speclane.request import Request
from speclane.scheduler.kv_manager import KVManager

B = 4
TENANTS = ("A", "B", "C")
WEIGHTS = {"A": 1.0, "B": 2.0, "C": 0.5}
STEMS = ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 4, 5, 6, 0, 0, 0), (4, 4, 4, 4), ())
MAX_OUTPUT = 12
MAX_FOLLOW_UP = 20  # tokens a follow-up turn may resend
tokens_st = st.lists(st.integers(0, 3), max_size=6)


@dataclass
class Live:
    request: Request
    tenant: str
    global_scope: bool
    num_admitted: int = 0
    computed: int = 0
    copy_source: int | None = None  # the cached block its admission copies from, held until its first step

    @property
    def scope(self) -> tuple[str, ...]:
        return ("global",) if self.global_scope else ("tenant", self.tenant)


class KVMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(10, 20), cache=st.booleans())
    def setup(self, num_blocks: int, cache: bool) -> None:
        self.kv = KVManager(num_blocks, B, enable_prefix_cache=cache)
        self.live: dict[str, Live] = {}
        self.waiting: list[Live] = []  # refused or preempted, to be admitted again
        self.history: list[Live] = []  # finished requests, for follow-up turns
        self.device: dict[tuple[int, int], tuple[tuple[str, ...], tuple[int, ...]]] = {}
        self.next_id = 0
        self.copies = 0  # admissions that copied part of a cached block

    # -- requests in ----------------------------------------------------------------
    def _admit(self, item: Live) -> None:
        r = item.request
        admission = self.kv.admit(r.request_id, r, tenant=item.tenant, weight=WEIGHTS[item.tenant],
                                  global_scope=item.global_scope)
        if admission is None:
            self.waiting.append(item)
            return
        tokens = r.token_ids()
        assert admission.num_cached_tokens < r.num_tokens
        if admission.copy is not None:  # the runner copies part of a cached block before the first forward
            source, target, j = admission.copy
            assert target == admission.block_table[admission.num_cached_tokens // B]
            assert self.kv.cache.key_of(source) is not None and self.kv.pool.ref_count(target) == 1
            for k in range(j):
                self.device[(target, k)] = self.device[(source, k)]
            item.copy_source = source
            self.copies += 1
        for p in range(admission.num_cached_tokens):
            held = self.device.get((admission.block_table[p // B], p % B))
            assert held == (item.scope, tokens[: p + 1]), f"position {p} of {r.request_id} reads {held}"
        item.num_admitted, item.computed = r.num_tokens, admission.num_cached_tokens
        self.live[r.request_id] = item

    @rule(tenant=st.sampled_from(TENANTS), global_scope=st.booleans(), stem=st.sampled_from(STEMS), tail=tokens_st)
    def add(self, tenant: str, global_scope: bool, stem: tuple[int, ...], tail: list[int]) -> None:
        self._new(tenant, global_scope, list(stem) + tail)

    @precondition(lambda self: self.history)
    @rule(i=st.integers(0, 99), tail=tokens_st)
    def follow_up(self, i: int, tail: list[int]) -> None:
        prev = self.history[i % len(self.history)]
        tokens = list(prev.request.token_ids())[:MAX_FOLLOW_UP] + tail
        self._new(prev.tenant, prev.global_scope, tokens)

    def _new(self, tenant: str, global_scope: bool, tokens: list[int]) -> None:
        self.next_id += 1
        self._admit(Live(Request(request_id=f"r{self.next_id}", prompt_token_ids=tokens or [0]), tenant, global_scope))

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 99))
    def readmit(self, i: int) -> None:
        self._admit(self.waiting.pop(i % len(self.waiting)))

    # -- a tick of one request --------------------------------------------------------
    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), chunk=st.integers(1, 8), drafts=st.lists(st.integers(0, 3), max_size=3),
          accepted=st.integers(0, 3), bonus=st.integers(0, 3))
    def step(self, i: int, chunk: int, drafts: list[int], accepted: int, bonus: int) -> None:
        rid = sorted(self.live)[i % len(self.live)]
        item, r = self.live[rid], self.live[rid].request
        end = min(item.computed + chunk, r.num_tokens)
        sample = end == r.num_tokens
        drafts = drafts if sample else []
        others = {o: self.kv.block_table(o) for o, x in self.live.items() if x.tenant != item.tenant}
        loads = {x.tenant: self.kv.load(x.tenant) for x in self.live.values()}
        reservation = self.kv.reserve(rid, end + len(drafts))
        for victim in reservation.preempted:
            taken = self.live[victim]
            if taken.tenant != item.tenant:  # only from a tenant holding more per unit of weight
                assert loads[taken.tenant] > loads[item.tenant], (loads, taken.tenant, item.tenant)
        assert {o: self.kv.block_table(o) for o in others if o not in reservation.preempted} == {
            o: t for o, t in others.items() if o not in reservation.preempted}
        for victim in reservation.preempted:
            self.live[victim].copy_source = None  # freed: its reference went with it
            self.waiting.append(self.live.pop(victim))
        if not reservation.ok:
            assert reservation.preempted[-1] == rid
            return
        table, tokens = self.kv.block_table(rid), r.token_ids()
        for p in range(item.computed, end + len(drafts)):
            block = table[p // B]
            assert self.kv.pool.ref_count(block) == 1 and self.kv.cache.key_of(block) is None, "a write into a shared block"
            prefix = tokens[: p + 1] if p < end else tokens[:end] + tuple(drafts[: p - end + 1])
            self.device[(block, p % B)] = (item.scope, prefix)
        item.computed = end
        item.copy_source = None  # released by this commit
        if sample:
            accepted = min(accepted, len(drafts))
            r.output_token_ids.extend(drafts[:accepted] + [bonus])
            item.computed += accepted
        self.kv.commit(rid, item.computed, r)
        assert len(self.kv.block_table(rid)) == self.kv.pool.blocks_needed(max(item.computed, item.num_admitted))
        if r.num_output_tokens >= MAX_OUTPUT:
            self.finish(i)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def finish(self, i: int) -> None:  # also an abort: the manager sees the same call
        rid = sorted(self.live)[i % len(self.live)]
        self.kv.free(rid)
        self.live[rid].copy_source = None
        self.history.append(self.live.pop(rid))

    @rule(n=st.integers(1, 4))
    def evict(self, n: int) -> None:
        for _ in range(n):
            if not self.kv.cache.num_evictable:
                return
            loads = {t: self.kv.load(t) for t, _ in self.kv.cache.evictable_tenants()}
            before = Counter(self.kv.pool.held_by_tenant())
            assert self.kv.evict(1) == 1
            (tenant,) = (before - Counter(self.kv.pool.held_by_tenant())).keys()
            assert loads[tenant] == max(loads.values())

    # -- after every step -----------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        self.kv.check()
        pool = self.kv.pool
        uses = Counter(b for rid in self.live for b in self.kv.block_table(rid))
        uses.update(x.copy_source for x in self.live.values() if x.copy_source is not None)
        assert all(pool.ref_count(b) == uses[b] for b in range(pool.num_blocks))
        assert all(pool.ref_count(b) == 0 for b in range(pool.num_blocks) if pool.owner(b) is None)
        assert sum(pool.held_by_tenant().values()) + pool.num_free == pool.num_blocks

    def teardown(self) -> None:
        for rid in list(self.live):
            self.kv.free(rid)
        self.kv.clear_cache()
        self.kv.check()
        assert self.kv.pool.num_free == self.kv.pool.num_blocks and not self.kv.pool.held_by_tenant()


KVMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])
TestKVMachine = KVMachine.TestCase


def test_random_traffic_reaches_hits_refusals_evictions_and_preemptions():
    """The machine's space covers the pressure paths and partial-block copies: driven at random, they all occur."""
    rng = random.Random(7)
    machine = KVMachine()
    machine.setup(num_blocks=12, cache=True)
    for _ in range(3000):
        action = rng.random()
        if action < 0.2:
            machine.add(rng.choice(TENANTS), rng.random() < 0.3, rng.choice(STEMS),
                        [rng.randrange(4) for _ in range(rng.randrange(7))])
        elif action < 0.3 and machine.history:
            machine.follow_up(rng.randrange(100), [rng.randrange(4) for _ in range(rng.randrange(7))])
        elif action < 0.4 and machine.waiting:
            machine.readmit(rng.randrange(100))
        elif action < 0.9 and machine.live:
            drafts = [rng.randrange(4) for _ in range(rng.randrange(4))]
            machine.step(rng.randrange(100), rng.randrange(1, 9), drafts, rng.randrange(4), rng.randrange(4))
        elif action < 0.97 and machine.live:
            machine.finish(rng.randrange(100))
        else:
            machine.evict(rng.randrange(1, 5))
        machine.consistent()
    stats = machine.kv.stats
    assert stats.cached_tokens > 0 and stats.refused_admissions > 0
    assert stats.evicted_blocks > 0 and stats.preemptions > 0 and machine.copies > 0
    machine.teardown()
