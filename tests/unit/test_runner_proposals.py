"""The runner's drafter proposals (``RunnerResult``, ``SeqResult``), on a toy model with the
suffix drafter: a proposal that seeded its request's drafter state goes to
``seed_timings`` (the seed's time), its drafting beside it with no catch-up, and later
proposals time their catch-up; a shadow (``ScheduledSeq.shadow``) is the drafter's first
token compared with the token the tick chose."""

from __future__ import annotations

import dataclasses

from speclane.config import EngineConfig
from speclane.engine.engine import LLMEngine
from speclane.models.toy import toy_config, toy_model, toy_tokenizer
from speclane.request import SamplingParams
from speclane.scheduler.plan import RunnerResult

VOCAB = 16


def _engine(**lane: object) -> LLMEngine:
    config = EngineConfig().replace(dtype="float32", quantization="none", max_model_len=256, num_threads=1,
                                    spec_mode="slice", drafter="suffix", **lane)
    return LLMEngine.from_parts(config, toy_model(toy_config(vocab_size=VOCAB), seed=2), toy_tokenizer(VOCAB))


def test_a_seeding_proposal_is_timed_as_a_seed_and_later_ones_as_rounds():
    engine = _engine(spec_adaptive_k=False)
    results: list[RunnerResult] = []
    execute = engine.runner.execute
    engine.runner.execute = lambda plan: results.append(execute(plan)) or results[-1]
    engine.add_request("a", [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], SamplingParams(max_tokens=12, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    proposals = [r for r in results if r.seed_timings or r.draft_timings]
    first, later = proposals[0], proposals[1:]
    assert [rid for rid, _ in first.seed_timings] == ["a"] and first.seed_timings[0][1] > 0
    assert [catch_up for _, _, catch_up in first.draft_timings] == [None]  # its drafting, no round's catch-up
    assert later and all(not r.seed_timings for r in later)
    assert all(catch_up is not None for r in later for _, _, catch_up in r.draft_timings)


def test_a_shadow_compares_the_drafters_first_token_with_the_chosen_one_and_drafts_no_row():
    engine = _engine(spec_adaptive_k=False)
    asked: list[int | None] = []
    shadow = engine.runner.drafter.shadow
    engine.runner.drafter.shadow = lambda request: asked.append(shadow(request)) or asked[-1]
    seen: list[tuple[int | None, int, bool | None, int]] = []  # shadow's token, chosen token, hit, rows
    execute = engine.runner.execute

    def shadowing(plan):
        decode = [s.sample and s.start >= s.request.num_prompt_tokens for s in plan.seqs]
        plan = dataclasses.replace(plan, seqs=tuple(dataclasses.replace(s, shadow=d, num_draft_tokens=0) if d else s
                                                    for s, d in zip(plan.seqs, decode, strict=True)))
        before = len(asked)
        result = execute(plan)
        for res, d in zip(result.seqs, decode, strict=True):
            if d:
                seen.append((asked[before], res.token_ids[0], res.shadow_hit, len(res.token_ids)))
            else:
                assert res.shadow_hit is None
        return result

    engine.runner.execute = shadowing
    engine.add_request("a", [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2], SamplingParams(max_tokens=16, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert len(seen) == 15 and all(rows == 1 for *_, rows in seen)  # one token a tick: no draft verified
    assert all(hit == (None if token is None else token == chosen) for token, chosen, hit, _ in seen)
    assert sum(hit is not None for _, _, hit, _ in seen) >= 5, seen  # the repeated prompt gives the drafter matches
