"""The MTP head's drafting step on the CPU kernels (``models/mtp_kernel_step.py``): it
computes what the torch reference computes on the same int4 weights; one C call per step
or per greedy round (``kernels/mtp_step.c``) gives the bits of the calls one by one; its
cache keeps every entry's absolute rotation when it drops old entries; and the engine
drafts with it without changing the output."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speclane.config import EngineConfig
from speclane.drafters.mtp import MTPDrafter, catch_up_and_draft, draft_recursively
from speclane.engine.engine import LLMEngine
from speclane.kernels.select import Kernels
from speclane.models import mtp_kernel_step
from speclane.models.linear import quantize_int4_groups
from speclane.models.mtp_head import MTPCache, MTPConfig, MTPHead
from speclane.models.mtp_kernel_step import KernelCache, KernelHead
from speclane.models.toy import toy_config, toy_model, toy_tokenizer
from speclane.request import SamplingParams

VOCAB = 64
WINDOW = 16
# head_dim 32 (hidden 128, 4 heads): the smallest shape the attention kernel takes.
CONFIG = toy_config(vocab_size=VOCAB, hidden_size=128)

KERNELS = Kernels.load("auto")  # what a model gets by default
# The same builds, the draft step called kernel by kernel instead of in one C call.
ONE_BY_ONE = dataclasses.replace(KERNELS, mtp_step=None)

pytestmark = pytest.mark.skipif(
    not mtp_kernel_step.supported(MTPConfig(128, 256, 4, 2, 16), KERNELS), reason="our kernels do not build here")
needs_fused = pytest.mark.skipif(KERNELS.mtp_step is None, reason="mtp_step.c does not build here")


def reference_head(model, seed: int = 0) -> MTPHead:
    torch.manual_seed(seed)
    cfg = model.config
    head = MTPHead(MTPConfig(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, 16, window=WINDOW))
    head.vocab_ids.copy_(torch.randperm(cfg.vocab_size)[:16])
    head.attach_target(model.embedding_table(), model.head_table())
    return head.eval()


def kernel_head(model, seed: int = 0, kernels: Kernels = KERNELS) -> KernelHead:
    return KernelHead(reference_head(model, seed), kernels)


def _int4_values(weight: torch.Tensor) -> torch.Tensor:
    """The weight as the int4 kernel computes with it: q * scale + minimum, scale and
    minimum in float16 as ``int4_cpu.pack`` stores them."""
    q, scale, minimum = quantize_int4_groups(weight.float())
    groups = q.float().unflatten(-1, (scale.shape[-1], -1))
    return (groups * scale.half().float()[..., None] + minimum.half().float()[..., None]).flatten(-2)


def on_int4_values(head: MTPHead) -> MTPHead:
    """The torch reference with ``head``'s weights replaced by their int4 values."""
    with torch.no_grad():
        for name in ("fc", "qkv", "o", "gate_up", "down"):
            linear = getattr(head, name)
            linear.weight.copy_(_int4_values(linear.weight))
        head.head_weight = _int4_values(head.head_weight)
    return head


def inputs(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, CONFIG.hidden_size, generator=gen), torch.randint(0, VOCAB, (n,), generator=gen)


def test_the_kernel_step_computes_what_the_torch_reference_computes():
    """A catch-up of 12 rows then one-row steps: the same block outputs as the float32
    torch reference on the same int4 weights' values, up to bfloat16 rounding of the
    matmuls' and the attention's inputs and outputs."""
    model = toy_model(CONFIG)
    head, reference = kernel_head(model), on_int4_values(reference_head(model))
    hidden, tokens = inputs(16)
    fast, slow = head.new_cache(0), reference.new_cache(0)
    assert isinstance(fast, KernelCache) and isinstance(slow, MTPCache)
    outputs = []
    for rows in (slice(0, 12), slice(12, 13), slice(13, 14), slice(14, 16)):
        positions = torch.arange(rows.start, rows.stop)
        a = head.extend(fast, hidden[rows], tokens[rows], positions)
        b = reference.extend(slow, hidden[rows], tokens[rows], positions)
        outputs.append((a, b))
    assert fast.end == slow.end == 16
    for a, b in outputs:
        torch.testing.assert_close(a, b, rtol=0.03, atol=0.03 * float(b.abs().mean()))
    # And the draft logits' order: the same argmax on (nearly) every row.
    with torch.inference_mode():
        a = head.draft_logits(torch.cat([a for a, _ in outputs]))
        b = reference.draft_logits(torch.cat([b for _, b in outputs]))
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9


@needs_fused
def test_the_fused_step_gives_the_bits_of_the_calls_one_by_one():
    """One C call per draft step (``FusedStep``) calls the same kernels in the same order:
    the same block outputs, cache entries, draft logits and argmax as the calls one by one
    (the same kernels without ``mtp_step``), for a catch-up (12 rows: the int4 matmul's tile
    kernel where there is AMX, in the calls one by one) and one-row steps."""
    model = toy_model(CONFIG)
    fused, plain = kernel_head(model), kernel_head(model, kernels=ONE_BY_ONE)
    assert fused.fused_step and not plain.fused_step
    hidden, tokens = inputs(20)
    a, b = fused.new_cache(0), plain.new_cache(0)
    for rows in (slice(0, 12), slice(12, 13), slice(13, 16), slice(16, 17)):
        x, y = fused.step(a, hidden[rows], tokens[rows].tolist()), plain.step(b, hidden[rows], tokens[rows].tolist())
        assert torch.equal(x.out, y.out) and torch.equal(x.logits, y.logits) and x.best == y.best
        assert x.best == int(torch.argmax(y.logits))
        assert fused.step(a, x.out[-1:], [3], want_logits=False).best == plain.step(b, y.out[-1:], [3]).best
        a.truncate(rows.stop)
        b.truncate(rows.stop)
    assert a.length == b.length == 17
    assert torch.equal(a.keys[:, :, :17], b.keys[:, :, :17]) and torch.equal(a.values[:, :, :17], b.values[:, :, :17])


@needs_fused
def test_a_greedy_round_in_one_call_drafts_what_the_steps_draft():
    """``mtp_draft_greedy`` (the catch-up and every argmax draft in one C call) against the
    step-by-step round on the calls one by one: the same drafts, round after round, and the
    same true entries left in the cache (its speculative ones dropped)."""
    model = toy_model(CONFIG)
    fused, plain = kernel_head(model), kernel_head(model, kernels=ONE_BY_ONE)
    hidden, tokens = inputs(40)
    ids = tokens.tolist()
    a, b = fused.new_cache(0), plain.new_cache(0)
    start = 0
    for catch_up in (9, 1, 3, 2, 1):
        rows = slice(start, start + catch_up)
        x = catch_up_and_draft(fused, a, hidden[rows], [0] + ids, 4)
        y = catch_up_and_draft(plain, b, hidden[rows], [0] + ids, 4)
        assert x.token_ids == y.token_ids and len(x.token_ids) == 4
        assert x.catch_up_ms > 0
        start += catch_up
        assert a.end == b.end == start
    assert torch.equal(a.keys[:, :, : a.length], b.keys[:, :, : b.length])


def test_dropping_old_entries_keeps_each_entrys_absolute_rotation():
    """After ``keep_last`` moved the newest entries to the front, the next step's output is
    bit for bit what a fresh cache of exactly those positions gives: the kernel rotates by
    cache index, so the cache hands it the tables from its first position on."""
    head = kernel_head(toy_model(CONFIG))
    n = 3 * WINDOW + 7
    hidden, tokens = inputs(n + 1)
    cache = head.new_cache(0)
    for p in range(n):
        head.extend(cache, hidden[p : p + 1], tokens[p : p + 1], torch.tensor([p]))
        cache.keep_last(WINDOW)
    assert cache.first > 0 and cache.end == n, "the cache should have dropped old entries"
    fresh = head.new_cache(cache.first)
    head.extend(fresh, hidden[cache.first : n], tokens[cache.first : n], torch.arange(cache.first, n))
    step = (hidden[n : n + 1], tokens[n : n + 1], torch.tensor([n]))
    assert torch.equal(head.extend(cache, *step), head.extend(fresh, *step))


def test_a_catch_up_past_the_capacity_grows_the_cache_and_keeps_its_entries():
    head = kernel_head(toy_model(CONFIG))
    hidden, tokens = inputs(200)
    cache = head.new_cache(0)
    capacity = cache.capacity
    grown = head.extend(cache, hidden[:150], tokens[:150], torch.arange(150))
    assert cache.capacity >= 150 > capacity and cache.end == 150
    twice = head.new_cache(0)
    head.extend(twice, hidden[:100], tokens[:100], torch.arange(100))
    again = head.extend(twice, hidden[100:150], tokens[100:150], torch.arange(100, 150))
    assert torch.equal(grown[100:], again)


def test_a_rounds_drafts_leave_nothing_behind():
    """``draft_recursively`` extends the cache past its true entries and truncates them at
    the end; the next true entry sees only true ones (what the drafter relies on)."""
    head = kernel_head(toy_model(CONFIG))
    hidden, tokens = inputs(11)
    drafted, clean = head.new_cache(0), head.new_cache(0)
    out = head.extend(drafted, hidden[:10], tokens[:10], torch.arange(10))[-1:]
    head.extend(clean, hidden[:10], tokens[:10], torch.arange(10))
    assert len(draft_recursively(head, drafted, out, 9, 4).token_ids) == 4
    assert drafted.end == 10
    step = (hidden[10:11], tokens[10:11], torch.tensor([10]))
    assert torch.equal(head.extend(drafted, *step), head.extend(clean, *step))


@pytest.mark.parametrize("grant_rounds", [0, 1])
def test_engine_drafts_with_the_kernel_step_and_keeps_greedy_output(grant_rounds):
    """grant_rounds=1 with one slot: every request yields after each round, waits, and its
    drafter state catches up (or re-seeds) on the kernel cache."""
    model = toy_model(CONFIG, seed=2)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 3, 9, 3, 9]]
    sp = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)

    def run(drafter_object=None, **changes) -> dict[str, list[int]]:
        options = dict(dtype="float32", quantization="none", max_model_len=128, max_num_seqs=8,
                       max_num_batched_tokens=512, spec_adaptive_k=False)
        engine = LLMEngine.from_parts(EngineConfig().replace(**{**options, **changes}), model, toy_tokenizer(VOCAB),
                                      drafter=drafter_object)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, sp)
        tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
        for out in engine.run_until_done():
            tokens[out.request_id].extend(out.token_ids)
        if drafter_object is not None:
            assert engine.counters.draft_tokens > 0
        return tokens

    drafter = MTPDrafter(kernel_head(model), VOCAB)
    caches: list[object] = []
    propose = drafter._propose

    def spy(request, k, may_seed):
        draft = propose(request, k, may_seed)
        state = drafter.states.get(request.request_id)
        if state is not None and state.cache is not None:
            caches.append(state.cache)
        return draft

    drafter._propose = spy  # type: ignore[method-assign]
    spec = run(drafter, drafter="mtp", spec_mode="slice", spec_slots=1, spec_grant_rounds=grant_rounds, num_draft_tokens=3)
    assert spec == run(spec_mode="off")
    assert caches and all(isinstance(c, KernelCache) for c in caches)
