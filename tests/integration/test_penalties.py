"""Penalties and min_tokens on the real model: speculation changes nothing (greedy and
seeded, chains and draft trees), drafts are verified under them, and they do what they say
(a penalised answer repeats itself less; min_tokens carries an answer past its end)."""

from __future__ import annotations

from collections import Counter

import pytest

from speclane.engine.engine import LLMEngine, RequestOutput
from speclane.request import SamplingParams

pytestmark = pytest.mark.slow

PROMPT = ("Copy this line exactly: the cat and the dog and the bird and the fish and the cow and the horse and the "
          "goat and the sheep and the duck and the hen and the pig.")


@pytest.fixture(scope="module")
def engines(llm_default) -> dict[str, LLMEngine]:
    base = llm_default.engine
    return {"auto": base,
            "ngram": LLMEngine.from_parts(base.config.replace(drafter="ngram"), base.model, base.tokenizer),
            "suffix trees": LLMEngine.from_parts(base.config.replace(drafter="suffix", suffix_tree_branches=3),
                                                 base.model, base.tokenizer)}


def answer(engine: LLMEngine, sampling: SamplingParams, *, speculative: bool) -> tuple[list[int], dict]:
    ids, final = finished(engine, sampling, speculative=speculative)
    return ids, final.speculative or {}


def finished(engine: LLMEngine, sampling: SamplingParams, *, speculative: bool) -> tuple[list[int], RequestOutput]:
    """The answer's token ids and its last output."""
    tok = engine.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True))
    engine.add_request("p", prompt, sampling, speculative=speculative)
    ids: list[int] = []
    outputs = engine.run_until_done()
    for out in outputs:
        ids += out.token_ids
    assert engine.runner.num_token_histories == 0, "a finished request's token history was kept"
    return ids, outputs[-1]


@pytest.mark.parametrize("drafter", ["auto", "ngram", "suffix trees"])
@pytest.mark.parametrize("sampling", [
    SamplingParams(max_tokens=48, frequency_penalty=1.5, presence_penalty=0.5),
    SamplingParams(max_tokens=48, frequency_penalty=-1.0),
    SamplingParams(max_tokens=48, temperature=0.8, seed=7, frequency_penalty=0.5, presence_penalty=0.5),
    SamplingParams(max_tokens=48, repetition_penalty=1.1),
    SamplingParams(max_tokens=48, temperature=1.0, seed=3, repetition_penalty=1.05, min_p=0.1),
    SamplingParams(max_tokens=64, min_tokens=56),
    SamplingParams(max_tokens=64, temperature=0.8, seed=5, min_tokens=56),
], ids=["greedy", "greedy-negative", "seeded", "greedy-repetition", "seeded-repetition-min-p", "greedy-min-tokens",
        "seeded-min-tokens"])
def test_speculation_changes_nothing_under_penalties(engines, drafter: str, sampling: SamplingParams) -> None:
    engine = engines[drafter]
    off, _ = answer(engine, sampling, speculative=False)
    on, spec = answer(engine, sampling, speculative=True)
    assert on == off
    assert spec.get("draft_tokens", 0) > 0, "drafts were verified under the penalties"


def test_a_repetition_penalty_makes_the_answer_repeat_the_prompt_less(engines) -> None:
    engine = engines["auto"]
    plain, _ = answer(engine, SamplingParams(max_tokens=48), speculative=True)
    penalised, _ = answer(engine, SamplingParams(max_tokens=48, repetition_penalty=1.8), speculative=True)
    assert max(Counter(penalised).values()) < max(Counter(plain).values())


def test_min_p_narrows_what_sampling_may_pick(engines) -> None:
    """At min_p 1 only the likeliest token survives: sampling at any temperature is greedy."""
    engine = engines["auto"]
    greedy, _ = answer(engine, SamplingParams(max_tokens=24), speculative=False)
    hot = [answer(engine, SamplingParams(max_tokens=24, temperature=1.5, seed=s, min_p=1.0), speculative=True)[0]
           for s in (1, 2)]
    assert hot == [greedy, greedy]
    loose = {tuple(answer(engine, SamplingParams(max_tokens=24, temperature=1.5, seed=s), speculative=True)[0])
             for s in (1, 2)}
    assert tuple(greedy) not in loose or len(loose) > 1


def test_a_frequency_penalty_makes_the_answer_repeat_itself_less_and_a_negative_one_more(engines) -> None:
    engine = engines["auto"]
    plain, spec = answer(engine, SamplingParams(max_tokens=48), speculative=True)
    penalised, _ = answer(engine, SamplingParams(max_tokens=48, frequency_penalty=1.5), speculative=True)
    assert spec.get("accepted_tokens", 0) > 0, "the plain answer is a copy the drafts follow"
    rewarded, _ = answer(engine, SamplingParams(max_tokens=48, frequency_penalty=-1.0), speculative=True)
    assert penalised != plain != rewarded
    assert max(Counter(penalised).values()) < max(Counter(plain).values()) < max(Counter(rewarded).values())


def test_min_tokens_carries_the_answer_past_its_end(engines) -> None:
    """The plain answer ends with end-of-sequence; with min_tokens it goes on from the same
    tokens, past that point, and may end only once it holds min_tokens tokens."""
    engine = engines["auto"]
    eos = engine.tokenizer.eos_token_id
    plain, end = finished(engine, SamplingParams(max_tokens=96), speculative=True)
    assert end.finish_reason == "stop" and plain[-1] == eos and len(plain) < 80
    minimum = len(plain) + 8
    longer, last = finished(engine, SamplingParams(max_tokens=96, min_tokens=minimum), speculative=True)
    assert longer[: len(plain) - 1] == plain[:-1]
    assert eos not in longer[:minimum] and len(longer) >= minimum
    assert last.finish_reason in ("stop", "length")


def test_min_tokens_lets_no_stop_string_end_the_answer_before_it(engines) -> None:
    engine = engines["auto"]
    plain, _ = finished(engine, SamplingParams(max_tokens=40), speculative=False)
    text = engine.tokenizer.decode(plain, skip_special_tokens=True)
    stop = " and"
    assert stop in text
    early, cut = finished(engine, SamplingParams(max_tokens=40, stop=(stop,)), speculative=True)
    late, kept = finished(engine, SamplingParams(max_tokens=40, stop=(stop,), min_tokens=20), speculative=True)
    assert cut.finish_reason == kept.finish_reason == "stop"
    assert len(early) < 20 <= len(late) - 1, "the stop string ended neither answer before min_tokens"
    assert late == plain[: len(late)]
