"""Constrained decoding on the real model, in the engine: every output matches its
grammar, speculation changes nothing (greedy and seeded), forced tokens ride the lane,
logprobs and logit_bias, and the n sequences of one prompt share its prefill."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from speclane.bench.structured_cases import CASES, FIXED_KEY_CASES
from speclane.engine.engine import LLMEngine
from speclane.grammar.spec import GrammarSpec
from speclane.request import SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mtp_engine(llm_default) -> LLMEngine:
    """The default engine's model with the MTP drafter (its drafts carry probabilities)."""
    base = llm_default.engine
    return LLMEngine.from_parts(base.config.replace(drafter="mtp"), base.model, base.tokenizer)


def chat_ids(engine, text: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))


def run(engine, requests: dict[str, dict]) -> dict[str, dict]:
    """Add every request, tick to the end; per request: tokens, text, finish reason, usage, logprobs."""
    for rid, options in requests.items():
        engine.add_request(rid, **options)
    out: dict[str, dict] = {rid: {"ids": [], "logprobs": []} for rid in requests}
    for o in engine.run_until_done():
        out[o.request_id]["ids"] += o.token_ids
        out[o.request_id]["logprobs"] += o.logprobs or []
        if o.finished:
            out[o.request_id].update(finish=o.finish_reason, spec=o.speculative, completion=o.completion_tokens)
    for result in out.values():
        result["text"] = engine.tokenizer.decode(result["ids"])
    assert engine.runner.num_grammar_matchers == 0, "matchers of finished requests were kept"
    return out


def schema_requests(engine, cases, sampling: SamplingParams, speculative: bool) -> dict[str, dict]:
    return {case.name: dict(prompt_token_ids=chat_ids(engine, case.prompt), sampling=sampling, speculative=speculative,
                            grammar=engine.compile_grammar(GrammarSpec.json_schema(case.schema))) for case in cases}


@pytest.mark.parametrize("drafter", ["auto", "mtp"])
@pytest.mark.parametrize("sampling", [SamplingParams(max_tokens=160),
                                      SamplingParams(max_tokens=160, temperature=0.8, seed=11)],
                         ids=["greedy", "seeded"])
def test_json_schema_outputs_validate_and_speculation_changes_nothing(llm_default, mtp_engine, sampling, drafter):
    engine = llm_default.engine if drafter == "auto" else mtp_engine
    assert engine.drafter.name == drafter
    on = run(engine, schema_requests(engine, CASES, sampling, speculative=True))
    off = run(engine, schema_requests(engine, CASES, sampling, speculative=False))
    for case in CASES:
        assert on[case.name]["ids"] == off[case.name]["ids"], case.name
        assert on[case.name]["finish"] == "stop", (case.name, on[case.name]["text"])
        jsonschema.validate(json.loads(on[case.name]["text"]), case.schema)
    assert sum(r["spec"]["rounds"] for r in on.values()) > 0, "no request held the lane"


def test_forced_tokens_ride_the_lane_several_per_tick(llm_default):
    engine = llm_default.engine
    case = FIXED_KEY_CASES[0]
    result = run(engine, schema_requests(engine, [case], SamplingParams(max_tokens=200), speculative=True))[case.name]
    jsonschema.validate(json.loads(result["text"]), case.schema)
    spec = result["spec"]
    # The n-gram drafter alone finds little in a fresh JSON answer; its keys are forced.
    # Ticks taken = completion - accepted: under 0.7 tokens' worth of ticks per token.
    assert spec["accepted_tokens"] >= 0.3 * result["completion"], spec


def test_regex_and_choice_outputs(llm_default):
    engine = llm_default.engine
    requests = {
        "regex": dict(prompt_token_ids=chat_ids(engine, "Give a US phone number."), sampling=SamplingParams(max_tokens=24),
                      grammar=engine.compile_grammar(GrammarSpec.regex(r"\(\d{3}\) \d{3}-\d{4}"))),
        "choice": dict(prompt_token_ids=chat_ids(engine, "Is the sky green? Answer yes or no."),
                       sampling=SamplingParams(max_tokens=8), grammar=engine.compile_grammar(GrammarSpec.choice(["yes", "no"]))),
    }
    out = run(engine, requests)
    import re

    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", out["regex"]["text"]), out["regex"]["text"]
    assert out["choice"]["text"] in ("yes", "no")


def test_logprobs_are_the_models_own_and_the_same_with_speculation(llm_default):
    engine = llm_default.engine
    prompt = chat_ids(engine, FIXED_KEY_CASES[1].prompt)
    grammar = engine.compile_grammar(GrammarSpec.json_schema(FIXED_KEY_CASES[1].schema))
    sampling = SamplingParams(max_tokens=40, logprobs=3)
    on = run(engine, {"on": dict(prompt_token_ids=prompt, sampling=sampling, grammar=grammar)})["on"]
    off = run(engine, {"off": dict(prompt_token_ids=prompt, sampling=sampling, grammar=grammar, speculative=False)})["off"]
    assert [lp.token_id for lp in on["logprobs"]] == on["ids"] == off["ids"]
    for a, b in zip(on["logprobs"], off["logprobs"], strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        values = [v for _, v in a.top]
        assert values == sorted(values, reverse=True) and len(values) == 3
        assert a.logprob <= values[0] + 1e-6 and sum(torch.tensor(values).exp().tolist()) <= 1 + 1e-5
    # Raw logprobs: a forced token (a fixed key) is still improbable to the model itself.
    assert min(lp.logprob for lp in on["logprobs"]) < -1.0
    # Without a grammar, greedy picks the model's most likely token: its logprob is the top one.
    free = run(engine, {"free": dict(prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=12, logprobs=1))})["free"]
    for lp in free["logprobs"]:
        assert lp.top[0][0] == lp.token_id and lp.top[0][1] == pytest.approx(lp.logprob)


def test_logit_bias_forces_and_forbids_tokens(llm_default):
    engine = llm_default.engine
    prompt = chat_ids(engine, "What is the capital of France?")
    plain = run(engine, {"plain": dict(prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=6))})["plain"]
    first = plain["ids"][0]
    banned = run(engine, {"banned": dict(prompt_token_ids=prompt,
                                         sampling=SamplingParams(max_tokens=6, logit_bias=((first, -100.0),)))})["banned"]
    assert banned["ids"][0] != first
    forced_id = engine.tokenizer.encode(" banana")[0]
    forced = run(engine, {"forced": dict(prompt_token_ids=prompt,
                                         sampling=SamplingParams(max_tokens=4, logit_bias=((forced_id, 100.0),)))})["forced"]
    assert forced["ids"] == [forced_id] * 4
    with pytest.raises(ValueError, match="logit_bias"):
        engine.add_request("bad", prompt, SamplingParams(logit_bias=((10**7, 1.0),)))


def test_n_sequences_share_one_prefill_and_equal_single_requests(llm_default):
    engine = llm_default.engine
    prompt = chat_ids(engine, "Write one sentence about the sea.")
    grammar = None
    singles = run(engine, {f"single{i}": dict(prompt_token_ids=prompt, sampling=SamplingParams(
        max_tokens=16, temperature=1.0, seed=5 + i), grammar=grammar) for i in range(3)})
    prefill_before = engine.scheduler.counts.prefill_tokens
    shared = run(engine, {f"n{i}": dict(prompt_token_ids=prompt, sampling=SamplingParams(
        max_tokens=16, temperature=1.0, seed=5 + i), prefill_source="n0" if i else None) for i in range(3)})
    # The prompt is read from the prefix cache (the singles computed it, and their answers
    # filled the block it ends in): each sequence computes only its last position.
    cached = len(prompt) - 1
    assert cached > 0 and engine.scheduler.counts.prefill_tokens - prefill_before == 3 * (len(prompt) - cached)
    for i in range(3):
        assert shared[f"n{i}"]["ids"] == singles[f"single{i}"]["ids"], i
    assert len({tuple(r["ids"]) for r in shared.values()}) > 1


def test_only_greedy_rows_that_nothing_else_reads_take_the_argmax_screen(llm_default, monkeypatch):
    """The runner flags a request's rows for the head's int4 screen (LlamaModel.logits) when
    its token is the row's largest raw logit: greedy, no logprobs, no grammar."""
    engine = llm_default.engine
    model = engine.model
    seen: set[bool] = set()  # the flags of every row given logits
    logits = model.logits

    def record(hidden, argmax_rows=None):
        seen.update(argmax_rows or [False] * hidden.shape[0])
        return logits(hidden, argmax_rows)

    monkeypatch.setattr(model, "logits", record)
    prompt = chat_ids(engine, "Is the sky green? Answer yes or no.")
    for options, flag in ((dict(sampling=SamplingParams(max_tokens=3, temperature=0.0)), True),
                          (dict(sampling=SamplingParams(max_tokens=3, temperature=0.0, logprobs=1)), False),
                          (dict(sampling=SamplingParams(max_tokens=3, temperature=0.9, seed=1)), False),
                          (dict(sampling=SamplingParams(max_tokens=3, temperature=0.0),
                                grammar=engine.compile_grammar(GrammarSpec.choice(["yes", "no"]))), False)):
        seen.clear()
        run(engine, {"r": dict(prompt_token_ids=prompt, speculative=False, **options)})
        assert seen == {flag}, options
