"""Speculation never changes what is generated: the sampling side.

A toy model with a 6-token vocabulary runs through the real scheduler, runner and
verification. Greedy and one-hot drafts must reproduce classic decoding token for
token; a drafter with its own distribution q (the MTP path) must reproduce the
distribution of classic sampling, checked with a chi-square test — and the same test
must catch a deliberately broken verification rule, so it is known to have power.
"""

from __future__ import annotations

import random

import pytest
import torch
from scipy.stats import chi2_contingency

from speclane.config import EngineConfig
from speclane.drafters.base import Draft
from speclane.engine import sampling
from speclane.engine.engine import LLMEngine
from speclane.models.toy import toy_config, toy_model, toy_tokenizer
from speclane.request import Request, SamplingParams

VOCAB = 6
SIGNIFICANCE = 0.001  # reject "same distribution" only below this p-value


class WrongDrafter:
    """One-hot drafts (no q), uniformly random: usually wrong, sometimes right."""

    name = "wrong"
    needs_hidden_states = False

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def propose(self, request: Request, k: int, may_seed: bool = True) -> Draft:
        return Draft([self.rng.randrange(VOCAB) for _ in range(k)])

    def finish(self, request: Request) -> None:
        pass

    def release(self, request_id: str) -> None:
        pass


class WrongTreeDrafter(WrongDrafter):
    """One-hot draft trees: k random tokens, each under a random earlier node or the root."""

    name = "wrong-tree"

    def propose(self, request: Request, k: int, may_seed: bool = True) -> Draft:
        parents = tuple(self.rng.randrange(-1, j) for j in range(k))
        return Draft([self.rng.randrange(VOCAB) for _ in range(k)], parents=parents)


class RandomQDrafter:
    """Samples drafts from a fixed distribution q that differs from the target's."""

    name = "random-q"
    needs_hidden_states = False

    def __init__(self, seed: int = 0):
        self.rng = torch.Generator().manual_seed(seed)
        q = torch.tensor([0.4, 0.05, 0.2, 0.05, 0.2, 0.1])
        self.q = q / q.sum()

    def propose(self, request: Request, k: int, may_seed: bool = True) -> Draft:
        tokens = torch.multinomial(self.q, k, replacement=True, generator=self.rng).tolist()
        return Draft(tokens, self.q.expand(k, VOCAB).clone())

    def finish(self, request: Request) -> None:
        pass

    def release(self, request_id: str) -> None:
        pass


def make_engine(drafter, spec_mode: str = "slice", slots: int = 64, num_draft_tokens: int = 3) -> LLMEngine:
    config = EngineConfig().replace(
        dtype="float32", quantization="none", max_model_len=64, max_num_seqs=64, max_queue=100_000,
        spec_mode=spec_mode, spec_slots=slots, spec_grant_rounds=0, num_draft_tokens=num_draft_tokens,
        drafter="ngram" if drafter is not None else "none", max_num_batched_tokens=4096,
        spec_adaptive_k=False,  # the rejection rule at full K; draft_length.py has its own tests
    )
    model = toy_model(toy_config(vocab_size=VOCAB), seed=3)
    return LLMEngine.from_parts(config, model, toy_tokenizer(VOCAB), drafter=drafter)


def generate_all(engine: LLMEngine, n: int, sp_of, prompt=(1, 2, 3)) -> dict[str, list[int]]:
    for i in range(n):
        engine.add_request(f"r{i}", list(prompt), sp_of(i))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(n)}
    for out in engine.run_until_done():
        tokens[out.request_id].extend(out.token_ids)
    assert engine.scheduler.kv.num_holders == 0 and engine.scheduler.kv.num_available_blocks == engine.cache.num_blocks
    return tokens


def test_greedy_with_wrong_drafts_equals_classic():
    sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    off = generate_all(make_engine(None, "off"), 4, lambda i: sp, prompt=(1, 2, 3, 1, 2))
    on_engine = make_engine(WrongDrafter())
    on = generate_all(on_engine, 4, lambda i: sp, prompt=(1, 2, 3, 1, 2))
    assert on == off
    assert 0 < on_engine.counters.accepted_tokens < on_engine.counters.draft_tokens


def test_seeded_sampling_with_one_hot_drafts_is_token_identical():
    """With (seed, position) noise, verification of one-hot drafts reproduces classic sampling exactly."""
    def sp(i):
        return SamplingParams(max_tokens=8, temperature=1.5, seed=1000 + i, ignore_eos=True)

    off = generate_all(make_engine(None, "off"), 50, sp)
    on_engine = make_engine(WrongDrafter())
    on = generate_all(on_engine, 50, sp)
    assert on == off
    assert on_engine.counters.accepted_tokens > 0, "some drafts must have been accepted for this to mean anything"
    assert on_engine.counters.accepted_tokens < on_engine.counters.draft_tokens, "and some rejected"


def test_draft_trees_reproduce_classic_decoding_greedy_and_seeded():
    """Trees of wrong one-hot drafts: the walk takes branches other than the first and
    the output is still classic decoding's, token for token."""
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)

    def seeded(i):
        return SamplingParams(max_tokens=8, temperature=1.5, seed=1000 + i, ignore_eos=True)

    for sp_of, n in ((lambda i: greedy, 4), (seeded, 50)):
        off = generate_all(make_engine(None, "off"), n, sp_of, prompt=(1, 2, 3, 1, 2))
        engine = make_engine(WrongTreeDrafter(), num_draft_tokens=6)
        assert generate_all(engine, n, sp_of, prompt=(1, 2, 3, 1, 2)) == off
        assert engine.runner.tree_rounds > 0 and engine.runner.branch_rounds > 0  # trees verified, branches taken


def test_seeded_sampling_with_draft_trees_matches_classic_distribution(classic_counts):
    """Other seeds than the classic run: the joint distribution of the tokens after the first,
    made in a round of up to 6 tree nodes (more tokens to go than the classic run's 3, so
    the round is not cut to one node; what follows them does not change their law)."""
    def sp(i):
        return SamplingParams(max_tokens=8, temperature=2.0, seed=3 * 10**6 + i, ignore_eos=True)

    engine = make_engine(WrongTreeDrafter(), num_draft_tokens=6)
    counts = _joint_counts(generate_all(engine, 4000, sp))
    assert engine.runner.branch_rounds > 100
    assert _p_value(classic_counts, counts) > SIGNIFICANCE


def _joint_counts(tokens: dict[str, list[int]]) -> list[int]:
    counts = [0] * (VOCAB * VOCAB)
    for seq in tokens.values():
        counts[seq[1] * VOCAB + seq[2]] += 1  # both made inside rounds
    return counts


def _p_value(a: list[int], b: list[int]) -> float:
    cells = [i for i in range(len(a)) if a[i] + b[i] > 0]
    return chi2_contingency([[a[i] for i in cells], [b[i] for i in cells]])[1]


@pytest.fixture(scope="module")
def classic_counts() -> list[int]:
    def sp(i):
        return SamplingParams(max_tokens=3, temperature=2.0, seed=i, ignore_eos=True)

    return _joint_counts(generate_all(make_engine(None, "off"), 4000, sp))


def test_rejection_rule_with_draft_probabilities_matches_classic_distribution(classic_counts):
    """Different seeds than the classic run, so the samples are independent."""
    def sp(i):
        return SamplingParams(max_tokens=3, temperature=2.0, seed=10**6 + i, ignore_eos=True)

    engine = make_engine(RandomQDrafter())
    counts = _joint_counts(generate_all(engine, 4000, sp))
    assert engine.counters.draft_tokens > 1000
    rate = engine.counters.accepted_tokens / engine.counters.draft_tokens
    assert 0.05 < rate < 0.95, f"acceptance {rate:.2f}: the test needs both outcomes"
    assert _p_value(classic_counts, counts) > SIGNIFICANCE


def test_chi_square_catches_a_broken_rule(classic_counts, monkeypatch):
    """Negative control: always accepting q's drafts samples from q, not p; the test must see it."""
    def accept_all(probs, draft, draft_probs, seed, first_position):
        bonus = sampling.sample_at(probs[len(draft)], seed, first_position + len(draft))
        return sampling.Verdict(list(draft) + [bonus], len(draft))

    monkeypatch.setattr(sampling, "_rejection_rule", accept_all)

    def sp(i):
        return SamplingParams(max_tokens=3, temperature=2.0, seed=2 * 10**6 + i, ignore_eos=True)

    counts = _joint_counts(generate_all(make_engine(RandomQDrafter()), 4000, sp))
    assert _p_value(classic_counts, counts) < SIGNIFICANCE


def test_choose_tokens_first_token_distribution_matches_p():
    """Unit level: the rejection rule's emitted token follows p for any q."""
    p_logits = torch.log(torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.05, 0.05]] * 2))
    q = torch.tensor([[0.05, 0.05, 0.1, 0.1, 0.2, 0.5]])
    params = SamplingParams(temperature=1.0)
    rng = random.Random(0)
    counts = [0] * VOCAB
    n = 6000
    for seed in range(n):
        draft = [rng.choices(range(VOCAB), weights=q[0].tolist())[0]]
        verdict = sampling.choose_tokens(p_logits, params, seed, 0, draft, q)
        counts[verdict.token_ids[0]] += 1
    expected = [n * p for p in [0.5, 0.2, 0.1, 0.1, 0.05, 0.05]]
    from scipy.stats import chisquare

    assert chisquare(counts, expected).pvalue > SIGNIFICANCE


def test_kv_after_a_round_holds_exactly_the_accepted_tokens():
    engine = make_engine(WrongDrafter(), slots=1)
    engine.add_request("a", [1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_tokens=10, ignore_eos=True))
    engine.step()  # prefill
    request = engine.scheduler.running["a"]
    kv = engine.scheduler.kv
    for _ in range(4):
        engine.step()
        # After each tick: committed length == computed tokens == all tokens but the newest,
        # and the table holds no block wholly past the newest token's position.
        assert kv.num_computed("a") == request.num_computed_tokens == request.num_tokens - 1
        assert len(kv.block_table("a")) == -(-request.num_tokens // engine.cache.block_size)
    assert request.spec.rounds >= 4
    # The cached K/V equal those of a fresh prefill of the same tokens (no rejected leftovers).
    from speclane.models.kv_cache import KVCache, gather
    from speclane.models.llama import RaggedBatch

    cfg = engine.model.config
    fresh = KVCache(cfg.num_layers, 4, 16, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    tokens = list(request.token_ids())[: request.num_computed_tokens]
    engine.model(RaggedBatch(torch.tensor(tokens), torch.arange(len(tokens)), [[0, 1, 2, 3]], [0], [len(tokens)]), fresh)
    n = len(tokens)
    table, fresh_table = torch.tensor([kv.block_table("a")]), torch.tensor([[0, 1, 2, 3]])
    for layer in range(cfg.num_layers):
        for ours, theirs in ((engine.cache.keys, fresh.keys), (engine.cache.values, fresh.values)):
            torch.testing.assert_close(gather(ours[layer], table, n), gather(theirs[layer], fresh_table, n),
                                       atol=1e-5, rtol=1e-5)


def test_rejection_rule_with_mtp_head_probabilities_matches_classic_distribution(classic_counts):
    """The MTP drafter sampling its drafts from its own q (an untrained head over a reduced
    vocabulary of 4 of the 6 tokens) keeps the target's distribution."""
    from speclane.drafters.mtp import MTPDrafter
    from speclane.models.mtp_head import MTPConfig, MTPHead

    target = toy_model(toy_config(vocab_size=VOCAB), seed=3)  # the weights make_engine uses
    cfg = target.config
    torch.manual_seed(0)
    head = MTPHead(MTPConfig(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, draft_vocab=4))
    head.vocab_ids.copy_(torch.tensor([0, 2, 3, 5]))
    head.attach_target(target.embedding_table(), target.head_table())
    drafter = MTPDrafter(head.eval(), VOCAB, sample_drafts=True)

    def sp(i):
        return SamplingParams(max_tokens=3, temperature=2.0, seed=3 * 10**6 + i, ignore_eos=True)

    engine = make_engine(drafter)
    counts = _joint_counts(generate_all(engine, 4000, sp))
    assert engine.counters.draft_tokens > 1000
    rate = engine.counters.accepted_tokens / engine.counters.draft_tokens
    assert 0.05 < rate < 0.95, f"acceptance {rate:.2f}: the test needs both outcomes"
    assert _p_value(classic_counts, counts) > SIGNIFICANCE


def test_greedy_verification_takes_the_ticks_argmax_when_given():
    """The runner takes one argmax for a whole tick's rows and hands each sequence its slice:
    the verdict is the same as the per-sequence argmax, and it is that slice that decides."""
    logits = torch.randn(3, 50)
    own = logits.argmax(-1).tolist()
    greedy = SamplingParams(temperature=0.0)
    draft = own[:2]
    assert sampling.choose_tokens(logits, greedy, 0, 10, draft) == sampling.choose_tokens(logits, greedy, 0, 10, draft, argmax=own)
    other = [own[0], (own[1] + 1) % 50, own[2]]  # the slice says the second draft is wrong
    verdict = sampling.choose_tokens(logits, greedy, 0, 10, draft, argmax=other)
    assert verdict.num_accepted == 1 and verdict.token_ids == [own[0], other[1]]


def test_a_zero_uniform_draw_never_picks_a_token_of_probability_zero(monkeypatch):
    # torch.rand returns exactly 0 about once in 2**24 draws; E = -log1p(-0) = 0 made
    # p / E NaN for a forbidden (p = 0) token, and argmax took the NaN.
    probs = torch.tensor([0.0, 0.25, 0.75, 0.0])
    monkeypatch.setattr(sampling, "_uniform", lambda seed, position, size, stream=0: torch.tensor([0.0, 0.5, 0.5, 0.0]))
    assert sampling.sample_at(probs, seed=1, position=0) == 2
    # A zero draw for a token with p > 0 gives it a small but finite E, as its bin [0, 2**-24) would.
    monkeypatch.setattr(sampling, "_uniform", lambda seed, position, size, stream=0: torch.tensor([0.5, 0.0, 0.5, 0.5]))
    assert sampling.sample_at(probs, seed=1, position=0) == 1
