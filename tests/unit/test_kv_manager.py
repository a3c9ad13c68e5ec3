"""The paged KV pool and the prefix cache as short stories, without a model (no torch).

Blocks of 4 positions. Each story admits requests (``Request`` is the token source the
manager reads), "computes" positions by committing them as the scheduler would after a
tick, and checks what a later request reads from the cache: tenant isolation and the
global scope, prefixes diverging mid-block, the last prompt token, speculative draft
positions, decode-time blocks for the next turn, recompute after preemption, a prompt
awaiting the blocks a live request of its scope is computing, and the
rules under KV pressure (eviction by weighted share, admission order, preemption from the
heaviest tenant, never from a lighter one). Every story ends with the manager's own invariant check.
"""

from __future__ import annotations

from speclane.request import Request
from speclane.scheduler.kv_manager import KVManager
from speclane.scheduler.prefix_cache import GLOBAL_SCOPE, tenant_scope

B = 4


def req(rid: str, tokens: list[int] | tuple[int, ...]) -> Request:
    return Request(request_id=rid, prompt_token_ids=tokens)


def run_prompt(kv: KVManager, r: Request, tenant: str, *, global_scope: bool = False, keep: bool = False,
               weight: float = 1.0) -> int:
    """Admit ``r``, compute its whole prompt, free it unless ``keep``; returns its cached tokens."""
    admission = kv.admit(r.request_id, r, tenant=tenant, weight=weight, global_scope=global_scope)
    assert admission is not None
    kv.commit(r.request_id, r.num_tokens, r)
    if not keep:
        kv.free(r.request_id)
    kv.check()
    return admission.num_cached_tokens


def probe(kv: KVManager, tokens: list[int], tenant: str, *, global_scope: bool = False) -> int:
    """Cached tokens a request of ``tenant`` would read for ``tokens`` (it writes nothing)."""
    admission = kv.admit("probe", req("probe", tokens), tenant=tenant, global_scope=global_scope)
    assert admission is not None
    kv.free("probe")
    return admission.num_cached_tokens


def decode(kv: KVManager, r: Request, drafts: list[int], accepted: int, bonus: int) -> None:
    """One decode step of ``r`` with ``drafts``: the last token is fed at its position, the
    drafts after it; ``accepted`` of them are kept, then ``bonus``."""
    assert kv.reserve(r.request_id, r.num_tokens + len(drafts)).ok
    num_computed = r.num_tokens + accepted
    r.output_token_ids.extend(drafts[:accepted] + [bonus])
    kv.commit(r.request_id, num_computed, r)
    kv.check()


PROMPT = list(range(100, 113))  # 13 tokens: 3 full blocks and one partial


def test_a_tenant_reads_only_blocks_its_own_requests_wrote():
    kv = KVManager(16, B)
    assert run_prompt(kv, req("a1", PROMPT), "A") == 0
    assert run_prompt(kv, req("b1", PROMPT), "B") == 0  # the exact prefix, another tenant
    assert run_prompt(kv, req("a2", PROMPT), "A") == 12
    assert run_prompt(kv, req("b2", PROMPT), "B") == 12  # b1's own blocks


def test_the_global_scope_is_shared_by_global_requests_and_read_by_no_other():
    kv = KVManager(32, B)
    assert run_prompt(kv, req("a1", PROMPT), "A", global_scope=True) == 0
    assert run_prompt(kv, req("b1", PROMPT), "B", global_scope=True) == 12
    assert run_prompt(kv, req("b2", PROMPT), "B") == 0
    assert run_prompt(kv, req("a2", PROMPT), "A") == 0  # the writer's own scope holds none either
    private = [7] * 9
    assert run_prompt(kv, req("a3", private), "A") == 0
    assert probe(kv, private, "A") == 8
    assert probe(kv, private, "B", global_scope=True) == 0  # a tenant's blocks stay its own
    assert probe(kv, private, "A", global_scope=True) == 0


def test_a_tenant_named_global_has_a_scope_of_its_own():
    assert tenant_scope("global") != GLOBAL_SCOPE
    kv = KVManager(16, B)
    run_prompt(kv, req("a", PROMPT), "A", global_scope=True)
    assert run_prompt(kv, req("g", PROMPT), "global") == 0


def test_a_prompt_awaits_the_blocks_a_live_request_of_its_scope_is_still_computing():
    kv = KVManager(32, B)
    leader = req("a", PROMPT)
    assert kv.admit("a", leader, tenant="A") is not None
    follower = req("f", PROMPT[:10] + [7, 7, 7])  # shares blocks 0-1 with the leader
    assert kv.awaits_shared_prefix(follower, tenant="A")
    assert not kv.awaits_shared_prefix(follower, tenant="B")  # another tenant's prefill is not its to wait for
    assert not kv.awaits_shared_prefix(follower, tenant="A", global_scope=True)
    assert not kv.awaits_shared_prefix(req("g", [7] * 13), tenant="A")  # nothing in common
    kv.commit("a", 4, leader)  # block 0 computed and cached: block 1 still to come
    assert kv.awaits_shared_prefix(follower, tenant="A")
    kv.commit("a", 8, leader)  # both shared blocks are in the cache: nothing left to wait for
    assert not kv.awaits_shared_prefix(follower, tenant="A")
    assert kv.admit("f", follower, tenant="A").num_cached_tokens == 8
    kv.check()


def test_a_global_request_awaits_only_a_global_prefill():
    kv = KVManager(32, B)
    assert kv.admit("a", req("a", PROMPT), tenant="A", global_scope=True) is not None
    assert kv.awaits_shared_prefix(req("b", PROMPT), tenant="B", global_scope=True)
    assert not kv.awaits_shared_prefix(req("b", PROMPT), tenant="A")
    assert not KVManager(32, B, enable_prefix_cache=False).awaits_shared_prefix(req("b", PROMPT), tenant="A")


def test_prefixes_diverging_mid_block_share_the_full_blocks_and_copy_the_common_part_of_the_next():
    kv = KVManager(16, B)
    first = req("x", list(range(16)))
    run_prompt(kv, first, "A", keep=True)
    second = req("y", list(range(10)) + [99] * 6)  # diverges at position 10, inside block 2
    admission = kv.admit("y", second, tenant="A")
    assert admission is not None and admission.num_cached_tokens == 10
    assert admission.block_table[:2] == kv.block_table("x")[:2]
    assert set(admission.block_table[2:]).isdisjoint(kv.block_table("x"))  # block 2's first two positions: a copy
    assert admission.copy == (kv.block_table("x")[2], admission.block_table[2], 2)
    kv.check()


def test_a_block_matches_only_with_its_whole_prefix():
    kv = KVManager(16, B)
    run_prompt(kv, req("x", [1] * 4 + [2] * 4 + [3]), "A")
    assert run_prompt(kv, req("y", [9] * 4 + [2] * 4 + [3]), "A") == 0  # same block 1, other parent


def test_the_block_holding_the_last_prompt_token_is_computed_not_read():
    kv = KVManager(16, B)
    run_prompt(kv, req("x", list(range(12))), "A")  # exactly 3 full blocks, all cached
    assert run_prompt(kv, req("y", list(range(12))), "A") == 11  # block 2's first 3 positions copied, the 4th computed
    assert run_prompt(kv, req("z", list(range(13))), "A") == 12


def test_rejected_draft_positions_keep_no_block_and_are_never_cached():
    kv = KVManager(16, B)
    r = req("r", [5, 6, 7, 8, 9, 10])
    run_prompt(kv, r, "A", keep=True)
    r.output_token_ids.append(11)  # the prompt's sample
    free_before = kv.pool.num_free
    decode(kv, r, drafts=[12, 13, 14], accepted=0, bonus=20)  # positions 6..9 written, 7..9 rejected
    assert kv.pool.num_free == free_before and len(kv.block_table("r")) == 2
    assert kv.num_computed("r") == 7
    probe = req("p1", r.tokens_between(0, 8) + [0])  # r's first 8 tokens: position 7 is unverified
    assert run_prompt(kv, probe, "A") == 4
    decode(kv, r, drafts=[21, 22, 23], accepted=3, bonus=24)  # positions 7..10 verified
    assert kv.num_computed("r") == 11 and len(kv.block_table("r")) == 3
    probe = req("p2", r.tokens_between(0, 12) + [0])
    assert run_prompt(kv, probe, "A") == 8  # block 2 holds position 11, not yet computed


def test_blocks_filled_by_decoding_are_read_by_the_next_turn():
    kv = KVManager(16, B)
    turn1 = req("t1", [3, 1, 4, 1, 5])
    run_prompt(kv, turn1, "A", keep=True)
    turn1.output_token_ids.append(9)
    for token in range(30, 41):  # 16 tokens in all, the last one sampled, not computed
        decode(kv, turn1, drafts=[], accepted=0, bonus=token)
    kv.free("t1")
    turn2 = req("t2", list(turn1.token_ids()) + [7, 7, 7])
    assert run_prompt(kv, turn2, "A") == 16


def test_a_preempted_request_reads_its_own_blocks_back_when_admitted_again():
    kv = KVManager(16, B)
    r = req("r", [1, 2, 3, 4, 5])
    run_prompt(kv, r, "A", keep=True)
    r.output_token_ids.append(6)
    for token in range(7, 14):
        decode(kv, r, drafts=[], accepted=0, bonus=token)
    kv.free("r")  # preempted: 13 tokens known, 12 computed
    again = kv.admit("r", r, tenant="A")
    assert again is not None and again.num_cached_tokens == 12 and len(again.block_table) == 4
    kv.check()


def test_with_the_cache_off_nothing_is_read_and_finished_blocks_are_free():
    kv = KVManager(8, B, enable_prefix_cache=False)
    assert run_prompt(kv, req("a1", PROMPT), "A") == 0
    assert run_prompt(kv, req("a2", PROMPT), "A") == 0
    assert kv.pool.num_free == 8 and kv.cache.num_cached == 0


def test_no_room_refuses_admission_and_changes_nothing():
    kv = KVManager(4, B)
    assert kv.admit("a", req("a", list(range(12))), tenant="A") is not None
    assert kv.admit("b", req("b", list(range(50, 58))), tenant="B") is None
    assert kv.pool.num_free == 1 and "b" not in kv and kv.stats.refused_admissions == 1
    kv.check()


def test_cached_blocks_a_request_would_read_do_not_count_as_room_for_it():
    kv = KVManager(4, B)
    run_prompt(kv, req("a1", list(range(12))), "A")  # 3 cached blocks, 1 free
    longer = req("a2", list(range(20)))  # reads the 3, needs 2 more: only 1 is left
    assert kv.admit("a2", longer, tenant="A") is None
    assert kv.cache.num_evictable == 3 and kv.pool.num_free == 1
    kv.check()


def test_eviction_takes_from_the_tenant_most_over_its_weighted_share():
    kv = KVManager(8, B)
    run_prompt(kv, req("b", [50] * 8), "B")  # released first: the least recently used blocks
    run_prompt(kv, req("a1", [60] * 12), "A")
    run_prompt(kv, req("a2", [70] * 12), "A")
    assert kv.pool.num_free == 0 and kv.pool.held("A") == 6 and kv.pool.held("B") == 2
    run_prompt(kv, req("c", [80] * 8), "C", keep=True)  # needs 2 blocks: A's go, not B's older ones
    assert kv.pool.held("A") == 4 and kv.pool.held("B") == 2
    # Weighted: A at weight 4 holds 4 / 4 = 1 per unit, B at weight 1 holds 2: B's go first.
    assert kv.admit("a3", req("a3", [90]), tenant="A", weight=4.0) is not None
    assert kv.pool.held("B") == 1 and kv.pool.held("A") == 5
    kv.check()


def test_admission_order_prefers_the_tenant_holding_less_per_unit_of_weight():
    kv = KVManager(16, B)
    for i in range(3):
        kv.admit(f"a{i}", req(f"a{i}", [i] * 16), tenant="A")  # 12 blocks live
    waiting = [("a3", "A", 1.0, 1.0), ("b0", "B", 1.0, 2.0)]  # (id, tenant, weight, arrival)
    order = sorted(waiting, key=lambda w: kv.admission_key(0, w[1], w[2], w[3]))
    assert [w[0] for w in order] == ["b0", "a3"]
    assert kv.admission_key(-1, "A", 1.0, 1.0) < kv.admission_key(0, "B", 1.0, 2.0)  # priority first
    assert kv.load("A", weight=4.0) == 3.0 and kv.load("B") == 0.0  # blocks per unit of weight


def test_growth_of_the_heavier_tenant_preempts_its_own_requests():
    kv = KVManager(8, B)
    a1, a2, b1 = req("a1", [1] * 8), req("a2", [2] * 8), req("b1", [3] * 12)
    for r, tenant in ((a1, "A"), (a2, "A"), (b1, "B")):
        run_prompt(kv, r, tenant, keep=True)
    b_table = kv.block_table("b1")
    grown = kv.reserve("a1", 16)  # two more blocks, one free: A (4 blocks) may not take B's (3)
    assert grown.ok and grown.preempted == ("a2",)
    assert kv.block_table("b1") == b_table and len(kv.block_table("a1")) == 4
    kv.check()
    # B (3 blocks) grows by three: A holds more (4 live, a2's 2 cached), so A's request goes.
    grown = kv.reserve("b1", 24)
    assert grown.ok and grown.preempted == ("a1",) and len(kv.block_table("b1")) == 6
    assert kv.stats.preemptions == 2
    kv.check()


def test_growth_never_preempts_a_lighter_tenant_or_a_more_urgent_request():
    kv = KVManager(6, B)
    run_prompt(kv, req("a1", [1] * 8), "A", keep=True)  # A: 2 blocks
    run_prompt(kv, req("b1", [2] * 12), "B", keep=True)  # B: 3 blocks
    grown = kv.reserve("b1", 20)  # two more, one free; A is lighter: B preempts itself
    assert not grown.ok and grown.preempted == ("b1",) and "a1" in kv
    kv.check()
    kv = KVManager(6, B)
    kv.admit("urgent", req("urgent", [1] * 12), tenant="A", priority=-1)  # A: 3 blocks
    kv.admit("b1", req("b1", [2] * 8), tenant="B", priority=0)  # B: 2 blocks
    grown = kv.reserve("b1", 16)  # two more, one free; A is heavier but more urgent
    assert not grown.ok and grown.preempted == ("b1",) and "urgent" in kv
    kv.check()


def test_the_least_urgent_request_of_the_tenant_is_preempted_first():
    kv = KVManager(5, B)
    kv.admit("low", req("low", [1] * 8), tenant="A", priority=5)
    kv.admit("high", req("high", [2] * 8), tenant="A", priority=0)
    grown = kv.reserve("high", 16)
    assert grown.ok and grown.preempted == ("low",)
    kv.check()


def test_a_cached_block_a_request_holds_is_not_evicted():
    kv = KVManager(8, B)
    run_prompt(kv, req("a1", PROMPT), "A")
    run_prompt(kv, req("a2", PROMPT), "A", keep=True)  # holds the 3 cached blocks again
    assert kv.clear_cache() == 0
    kv.free("a2")
    assert kv.clear_cache() == 3 and kv.pool.num_free == 8
    kv.check()


def test_an_identical_prompt_reads_all_but_its_last_token_from_the_block_its_answer_filled():
    """The earlier request's prompt ended mid-block; its answer filled that block, which was
    cached: the same prompt again copies the prompt's positions of it (never the last)."""
    kv = KVManager(16, B)
    x = req("x", [1, 2, 3, 4, 5, 6])  # block 1 holds 5, 6 and then the answer
    run_prompt(kv, x, "A", keep=True)
    x.output_token_ids.append(7)
    decode(kv, x, drafts=[], accepted=0, bonus=8)  # position 6 computed
    decode(kv, x, drafts=[], accepted=0, bonus=9)  # position 7: block 1 full and cached
    source = kv.block_table("x")[1]
    kv.free("x")
    assert kv.cache.key_of(source) is not None and kv.pool.ref_count(source) == 0
    admission = kv.admit("y", req("y", [1, 2, 3, 4, 5, 6]), tenant="A")
    assert admission.num_cached_tokens == 5 and admission.copy == (source, admission.block_table[1], 1)
    assert kv.pool.ref_count(source) == 1  # held until the copy has run: not evictable meanwhile
    kv.check()
    assert kv.clear_cache() == 0 and kv.cache.key_of(source) is not None  # block 0 is y's, the source held
    kv.commit("y", 6, req("y", [1, 2, 3, 4, 5, 6]))  # the first forward ran (the copy before it)
    assert kv.pool.ref_count(source) == 0
    kv.check()
    assert probe(kv, [1, 2, 3, 4, 5, 6], "B") == 0  # another tenant never reads part of A's block


def test_where_the_copy_source_is_the_one_block_short_a_request_goes_without_the_copy():
    """A pool of 4 blocks: x's 12-token prompt is cached (3 blocks). y shares x's first 10
    tokens and needs all 4 blocks; holding x's third block as a copy source besides would
    take a fifth. y reads the two full blocks and computes the rest, where it would
    otherwise wait forever in an idle engine."""
    kv = KVManager(4, B)
    run_prompt(kv, req("x", list(range(12))), "A")
    y = req("y", list(range(10)) + [90, 91, 92, 93, 94, 95])
    admission = kv.admit("y", y, tenant="A")
    assert admission is not None and admission.copy is None and admission.num_cached_tokens == 8
    kv.check()
    kv.commit("y", y.num_tokens, y)
    kv.free("y")
    kv.check()
    # x's third block made room for y's; with room to spare, y's own third block (8, 9, 90,
    # 91) is a copy source again: x's prompt reads 8 positions and copies 2.
    assert probe(kv, list(range(12)), "A") == 10


def test_a_request_freed_before_its_first_forward_lets_the_copy_source_go():
    kv = KVManager(16, B)
    run_prompt(kv, req("x", list(range(8))), "A")
    admission = kv.admit("y", req("y", list(range(7))), tenant="A")
    assert admission.copy is not None and admission.num_cached_tokens == 6
    kv.free("y")
    assert kv.pool.ref_count(admission.copy[0]) == 0
    kv.check()
