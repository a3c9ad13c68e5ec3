"""``prompt_logprobs`` on the real model: each prompt token's logprob is the model's own
distribution at the position before it, the same as one forward of the whole prompt gives,
whether the prompt is computed in one chunk or many, and when its blocks are already in the
prefix cache (they are computed again, not read)."""

from __future__ import annotations

import math

import pytest
import torch
from slot_pool import SlotPool

from speclane.engine.engine import LLMEngine, RequestOutput
from speclane.request import SamplingParams

pytestmark = pytest.mark.slow

TEXT = ("The quick brown fox jumps over the lazy dog. One, two, three, four, five, six, seven, eight, nine, ten. "
        "The capital of France is Paris.")


def reference(engine: LLMEngine, ids: list[int]) -> list[float]:
    """Each token's logprob after the ones before it, from one forward of the whole prompt
    and the float32 product of its hidden states with every row of the head."""
    model = engine.model
    pool = SlotPool(model.config, 1, len(ids) + 16, model.dtype)
    with torch.inference_mode():
        hidden = model(pool.batch([(0, 0, ids)]), pool).float()
        head = model.lm_head.rows(torch.arange(model.config.vocab_size))
        logprobs = torch.log_softmax(hidden @ head.T, dim=-1)
    return [logprobs[p, ids[p + 1]].item() for p in range(len(ids) - 1)]


def first_output(engine: LLMEngine, ids: list[int], sampling: SamplingParams, rid: str) -> RequestOutput:
    engine.add_request(rid, ids, sampling)
    outputs = [out for out in engine.run_until_done() if out.request_id == rid]
    assert all(out.prompt_logprobs is None for out in outputs[1:]), "only the first output carries them"
    return outputs[0]


@pytest.fixture(scope="module")
def engines(llm_f32, llm_default) -> dict[str, LLMEngine]:
    base = llm_f32.engine
    return {"one chunk": base,
            "chunks of 8": LLMEngine.from_parts(base.config.replace(max_num_batched_tokens=8), base.model,
                                                base.tokenizer),
            "the default model": llm_default.engine}


# Every logit is a float32 product with the head's rows, for the default model's bfloat16
# head too (its coarse logits, top candidates refined, were ~0.009 off).
TOLERANCE = {"one chunk": 1e-4, "chunks of 8": 1e-4, "the default model": 1e-4}


@pytest.mark.parametrize("name", list(TOLERANCE))
def test_prompt_logprobs_are_the_models_distribution_at_each_position(engines, name: str) -> None:
    engine = engines[name]
    ids = engine.tokenizer.encode(TEXT)
    expected = reference(engine, ids)
    for attempt in ("fresh", "its blocks cached"):  # the second run finds the prompt in the prefix cache
        out = first_output(engine, ids, SamplingParams(max_tokens=2, prompt_logprobs=2, temperature=0.0),
                           f"{name}-{attempt}")
        entries = out.prompt_logprobs
        assert entries is not None and [e.token_id for e in entries] == ids[1:], attempt
        got = [e.logprob for e in entries]
        assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < TOLERANCE[name], attempt  # type: ignore[operator]
        for entry in entries:
            assert len(entry.top) == 2 and entry.top[0][1] >= entry.top[1][1]
            assert entry.logprob <= entry.top[0][1] + 1e-6  # type: ignore[operator]
        assert out.cached_tokens == 0, "a prompt whose logprobs are asked for is computed, not read from the cache"
    counting = [e.logprob for e in out.prompt_logprobs or ()][ids.index(engine.tokenizer.encode(" seven")[0]):]
    assert max(counting[:6]) > math.log(0.5), "the counting continues as the model expects"


def test_without_prompt_logprobs_nothing_is_computed_or_sent(engines) -> None:
    engine = engines["one chunk"]
    ids = engine.tokenizer.encode(TEXT)
    first_output(engine, ids, SamplingParams(max_tokens=2), "warm")
    out = first_output(engine, ids, SamplingParams(max_tokens=2), "plain")
    assert out.prompt_logprobs is None and out.cached_tokens > 0, "the prefix cache serves a plain request"
