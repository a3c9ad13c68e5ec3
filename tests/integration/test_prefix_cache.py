"""The prefix cache and the paged pool through the engine, on the default model: greedy
and seeded outputs do not change with the cache on or off, with speculation or without,
with a pool small enough to preempt; cached tokens are reported per tenant and never
across tenants; under KV pressure a tenant never loses a running request to a tenant
holding more blocks."""

from __future__ import annotations

import pytest

from speclane.engine.engine import LLMEngine
from speclane.models.kv_cache import KVCache
from speclane.request import SamplingParams
from speclane.scheduler.block_pool import KV_BLOCK_SIZE

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


def _engine(llm, **changes) -> LLMEngine:
    base = llm.engine
    return LLMEngine.from_parts(base.config.replace(**changes), base.model, base.tokenizer)


def _run(engine: LLMEngine, requests: list[tuple[str, list[int], str]],
         sampling: SamplingParams = GREEDY) -> dict[str, tuple[list[int], int]]:
    """Run ``(id, prompt, tenant)`` requests to the end: per id, (output tokens, cached tokens)."""
    for rid, prompt, tenant in requests:
        engine.add_request(rid, prompt, sampling, tenant=tenant)
    out: dict[str, tuple[list[int], int]] = {rid: ([], 0) for rid, _, _ in requests}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id] = (out[o.request_id][0] + o.token_ids, o.cached_tokens)
            if o.finished:
                assert o.usage["prompt_tokens_details"] == {"cached_tokens": o.cached_tokens}
    engine.scheduler.kv.check()
    return out


def _conversation(engine: LLMEngine, turns: int = 10, sampling: SamplingParams = GREEDY) -> list[tuple[list[int], int]]:
    """A conversation of ``turns`` short turns: each prompt is the previous one, its answer
    and a new question."""
    encode = engine.tokenizer.encode
    prompt = encode("You are a helpful assistant. Answer briefly.\nUser: Name a colour.\nAssistant:")
    results = []
    for turn in range(turns):
        [(output, cached)] = _run(engine, [(f"turn{turn}", prompt, "alice")], sampling).values()
        results.append((output, cached))
        prompt = prompt + output + encode(f"\nUser: And another one, number {turn + 2}?\nAssistant:")
    return results


@pytest.mark.parametrize(("spec_mode", "sampling"), [
    ("off", GREEDY), ("slice", GREEDY),
    ("slice", SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.9, seed=11)),
], ids=["greedy", "greedy-speculative", "seeded-speculative"])
def test_a_conversation_answers_the_same_with_the_prefix_cache_on_and_off(our_kernels, llm_default, spec_mode,
                                                                          sampling):
    drafter = "ngram" if spec_mode == "slice" else "none"
    on = _conversation(_engine(llm_default, prefix_cache=True, spec_mode=spec_mode, drafter=drafter), sampling=sampling)
    off = _conversation(_engine(llm_default, prefix_cache=False, spec_mode=spec_mode, drafter=drafter),
                        sampling=sampling)
    assert [o for o, _ in on] == [o for o, _ in off]
    assert all(cached == 0 for _, cached in off)
    # From the second turn on, the previous turn's prompt and answer are read back.
    assert all(cached >= KV_BLOCK_SIZE for _, cached in on[1:]), on


def test_prompts_that_diverge_mid_block_read_every_shared_position(our_kernels, llm_default):
    """The full blocks before the divergence are shared; the shared positions of the block
    it falls in are copied from the first request's (cached, full) block."""
    encode = llm_default.engine.tokenizer.encode
    common = encode("The history of the lighthouse begins on a stormy night when the keeper wrote in his logbook, "
                    "as every evening, the wind, the waves and the ships that passed")
    first, second = common + encode(" climbed the stairs."), common[:-3] + encode(" slept soundly until dawn.")
    assert len(common) - 3 > KV_BLOCK_SIZE and (len(common) - 3) % KV_BLOCK_SIZE  # they diverge mid-block
    requests = [("first", first, "alice")]
    on_first = _run(_engine(llm_default), requests)
    engine = _engine(llm_default)
    _run(engine, requests)
    on = _run(engine, [("second", second, "alice")])
    off = _run(_engine(llm_default, prefix_cache=False), [("second", second, "alice")])
    assert on["second"][0] == off["second"][0]
    assert on["second"][1] == len(common) - 3
    assert on_first["first"][1] == 0


@pytest.mark.parametrize("spec_mode", ["off", "slice"])
def test_a_prompt_sent_again_computes_only_its_last_token_and_answers_the_same(our_kernels, llm_default, spec_mode):
    """Its first answer filled the block its prompt ended in: the prompt's positions there are
    copied, and only the last (its logits) is computed."""
    engine = _engine(llm_default, spec_mode=spec_mode, drafter="ngram" if spec_mode == "slice" else "none")
    prompt = engine.tokenizer.encode("Write a short poem about the sea and the lighthouse keeper who watches it.")
    assert len(prompt) % KV_BLOCK_SIZE not in (0, 1)  # the prompt ends mid-block
    sampling = SamplingParams(max_tokens=24, ignore_eos=True)
    first = _run(engine, [("first", prompt, "alice")], sampling)["first"]
    again = _run(engine, [("again", prompt, "alice")], sampling)["again"]
    off = _run(_engine(llm_default, prefix_cache=False), [("off", prompt, "alice")], sampling)["off"]
    assert again == (first[0], len(prompt) - 1) and first[0] == off[0]


def test_another_tenants_exact_prefix_is_not_read(our_kernels, llm_default):
    engine = _engine(llm_default)
    prompt = engine.tokenizer.encode("Summarize the following contract between two companies. " * 4)
    assert _run(engine, [("a1", prompt, "tenant-a")])["a1"][1] == 0
    assert _run(engine, [("b1", prompt, "tenant-b")])["b1"][1] == 0
    assert _run(engine, [("a2", prompt, "tenant-a")])["a2"][1] > 0


@pytest.mark.parametrize("spec_mode", ["off", "slice"])
def test_a_small_pool_finishes_every_request_with_the_large_pools_output(our_kernels, llm_default, spec_mode):
    """Long requests of one tenant in a pool of 14 or 15 blocks: two fit, the others wait,
    and a growing request preempts the other, which is recomputed; the outputs do not change."""
    encode = llm_default.engine.tokenizer.encode
    prompts = [encode(f"Story {i}: " + "the quick brown fox jumps over the lazy dog and " * 10) for i in range(5)]
    sampling = SamplingParams(max_tokens=16, ignore_eos=True)
    # Seven blocks each at admission, an eighth while decoding (the last token is never fed).
    assert all(6 * KV_BLOCK_SIZE < len(p) < 7 * KV_BLOCK_SIZE < len(p) + sampling.max_tokens - 1 for p in prompts), [
        len(p) for p in prompts]
    c = llm_default.engine.model.config
    per_block = KVCache.bytes_per_block(c.num_layers, KV_BLOCK_SIZE, c.num_kv_heads, c.head_dim,
                                        llm_default.engine.cache.dtype)
    mib = 15 * per_block // 2**20
    drafter = "ngram" if spec_mode == "slice" else "none"
    small = _engine(llm_default, kv_cache_mib=mib, spec_mode=spec_mode, drafter=drafter)
    assert 14 <= small.cache.num_blocks <= 15
    requests = [(f"r{i}", p, "alice") for i, p in enumerate(prompts)]
    got = _run(small, requests, sampling)
    expected = _run(_engine(llm_default, spec_mode=spec_mode, drafter=drafter), requests, sampling)
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in expected.items()}
    assert small.scheduler.kv.stats.preemptions > 0
    if spec_mode == "slice":
        assert small.counters.accepted_tokens > 0, "drafts were accepted around the preemptions"


def test_a_tenant_with_many_long_requests_does_not_push_out_another_tenants(our_kernels, llm_default, monkeypatch):
    """Alice sends four requests of 110 prompt tokens, Bob one of 82, 16 tokens each, into
    a pool of 14 blocks. Alice's first request (7 blocks) and Bob's (6) are admitted;
    Alice's grows first (position 112) and takes the last free block, so when Bob's grows
    (position 96) the pool is full: it takes its block from Alice, who holds more (under a
    rule of preempting only within the tenant Bob's request would preempt itself). Bob's
    request is never preempted and every output equals the large pool's. Speculation is
    off so the ticks at which each request grows are known; the speculative path through
    preemption is the small-pool test's. The tick budget holds both first requests' whole
    prompts, so both are admitted in the first tick."""
    encode = llm_default.engine.tokenizer.encode
    long = [encode(f"Story {i}: " + "the quick brown fox jumps over the lazy dog and " * 12)[:110] for i in range(4)]
    short = encode("A poem about the sea: " + "waves roll in and out and " * 14)[:82]
    sampling = SamplingParams(max_tokens=16, ignore_eos=True)
    assert all(len(p) == 110 for p in long) and len(short) == 82
    c = llm_default.engine.model.config
    per_block = KVCache.bytes_per_block(c.num_layers, KV_BLOCK_SIZE, c.num_kv_heads, c.head_dim,
                                        llm_default.engine.cache.dtype)
    mib = 14 * per_block // 2**20 + 1
    small = _engine(llm_default, kv_cache_mib=mib, spec_mode="off", drafter="none", max_num_batched_tokens=256)
    assert small.cache.num_blocks == 14, (mib, small.cache.num_blocks)
    preempted: list[str] = []
    original = small.scheduler._preempt

    def record(request_id: str, now: float) -> None:
        preempted.append(request_id)
        original(request_id, now)

    monkeypatch.setattr(small.scheduler, "_preempt", record)
    requests = [(f"alice{i}", p, "alice") for i, p in enumerate(long)] + [("bob", short, "bob")]
    got = _run(small, requests, sampling)
    expected = _run(_engine(llm_default, spec_mode="off", drafter="none"), requests, sampling)
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in expected.items()}
    assert "alice0" in preempted and "bob" not in preempted, preempted
