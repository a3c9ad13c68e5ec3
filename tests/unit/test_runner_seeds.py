"""The runner's timing of drafter proposals (``RunnerResult``): a proposal that seeded its
request's drafter state goes to ``seed_timings`` (the seed's time and the call's), not to
the per-round timings; later proposals time their drafting and catch-up. A toy model, the
suffix drafter."""

from __future__ import annotations

from dataclasses import replace

from speclane.config import EngineConfig
from speclane.engine.engine import LLMEngine
from speclane.models.toy import toy_config, toy_model, toy_tokenizer
from speclane.request import SamplingParams
from speclane.scheduler.plan import RunnerResult

VOCAB = 16


def suffix_engine() -> LLMEngine:
    config = EngineConfig().replace(dtype="float32", quantization="none", max_model_len=256, num_threads=1,
                                    spec_mode="slice", drafter="suffix", spec_adaptive_k=False)
    return LLMEngine.from_parts(config, toy_model(toy_config(vocab_size=VOCAB), seed=2), toy_tokenizer(VOCAB))


def runner_results(engine: LLMEngine) -> list[RunnerResult]:
    """Every tick's ``RunnerResult`` while the engine answers request "a" (a text that repeats)."""
    results: list[RunnerResult] = []
    execute = engine.runner.execute
    engine.runner.execute = lambda plan: results.append(execute(plan)) or results[-1]
    engine.add_request("a", [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], SamplingParams(max_tokens=12, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return results


def test_a_seeding_proposal_is_timed_as_a_seed_and_later_ones_as_rounds():
    proposals = [r for r in runner_results(suffix_engine()) if r.seed_timings or r.draft_timings]
    first, later = proposals[0], proposals[1:]
    ((rid, seed_ms, call_ms),) = first.seed_timings
    assert rid == "a" and 0 < seed_ms <= call_ms
    assert not first.draft_timings  # a fresh state's first drafts say nothing of a round's per token
    assert later and all(not r.seed_timings and r.draft_timings for r in later)


def test_a_round_drafted_the_cheap_way_is_timed_whole_for_its_request():
    """A drafter that drafts a round another way than its costly one (``catch_up_ms`` None: a
    lookup, the suffix drafter under ``--drafter auto``) is timed all the same, the call whole,
    under its request's id: adaptive K prices that request's rounds by it."""
    engine = suffix_engine()
    drafter = engine.runner.drafter
    propose = drafter.propose

    def cheap(request, k, may_seed=True):
        draft = propose(request, k, may_seed)
        return draft if draft.seeded else replace(draft, catch_up_ms=None)

    drafter.propose = cheap
    timings = [t for r in runner_results(engine) for t in r.draft_timings]
    assert timings and all(rid == "a" and ms > 0 and catch_up is None for rid, ms, _, catch_up in timings)
