"""The grammar layer on the default model's real tokenizer: compile cache, errors that
name the problem, masks per verified position, forced-token drafts and rollback."""

from __future__ import annotations

import json

import pytest
import torch

from speclane.bench.structured_cases import CASES, FIXED_KEY_CASES
from speclane.grammar.compiler import GrammarCompiler, GrammarError
from speclane.grammar.spec import GrammarSpec
from speclane.models.tokenizer import Tokenizer


def test_a_grammar_is_compiled_once_per_distinct_spec(grammar_compiler: GrammarCompiler):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    first = grammar_compiler.compile(GrammarSpec.json_schema(schema))
    hits = grammar_compiler.hits
    assert grammar_compiler.compile(GrammarSpec.json_schema(dict(schema))) is first
    assert grammar_compiler.hits == hits + 1
    reordered = {"required": ["a"], "properties": {"a": {"type": "integer"}}, "type": "object"}
    assert grammar_compiler.compile(GrammarSpec.json_schema(reordered)) is not first  # key order is part of a schema


@pytest.mark.parametrize(("spec", "words"), [
    (lambda: GrammarSpec.json_schema({"type": "objekt"}), "objekt"),
    (lambda: GrammarSpec.json_schema({"type": "string", "format": "no-such-format"}), "no-such-format"),
    (lambda: GrammarSpec.json_schema({"type": "string", "pattern": "(("}), "regex"),
    (lambda: GrammarSpec.regex("[a-"), "regex"),
    (lambda: GrammarSpec.lark("start: undefined_rule"), "undefined_rule"),
])
def test_an_invalid_grammar_is_an_error_that_names_the_problem(grammar_compiler: GrammarCompiler, spec, words: str):
    with pytest.raises(GrammarError, match=words):
        grammar_compiler.compile(spec())


def test_specs_reject_empty_or_malformed_input():
    for build in (lambda: GrammarSpec.regex(""), lambda: GrammarSpec.choice([]), lambda: GrammarSpec.choice(["a", ""]),
                  lambda: GrammarSpec.lark("  "), lambda: GrammarSpec.json_schema([1, 2])):  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            build()


def walk(grammar_compiler: GrammarCompiler, default_tokenizer: Tokenizer, spec: GrammarSpec, text: str) -> list[int]:
    """The text's tokens, each checked against the mask of its position."""
    matcher = grammar_compiler.compile(spec).new_matcher()
    tokens = default_tokenizer.encode(text)
    for token in tokens:
        assert matcher.allowed()[token], f"{default_tokenizer.decode([token])!r} refused in {text!r}"
        assert matcher.consume([token])
    assert matcher.is_stopped or matcher.allowed()[sorted(default_tokenizer.eos_token_ids)].any()
    return tokens


@pytest.mark.parametrize("case", CASES + FIXED_KEY_CASES, ids=lambda c: c.name)
def test_each_schema_admits_its_example_in_the_served_layout(grammar_compiler, default_tokenizer, case):
    walk(grammar_compiler, default_tokenizer, GrammarSpec.json_schema(case.schema), json.dumps(case.example, ensure_ascii=False))


def admits(grammar_compiler: GrammarCompiler, default_tokenizer: Tokenizer, spec: GrammarSpec, text: str) -> bool:
    """Whether the grammar lets the model write ``text`` and end there."""
    matcher = grammar_compiler.compile(spec).new_matcher()
    for token in default_tokenizer.encode(text):
        if not matcher.allowed()[token]:
            return False
        assert matcher.consume([token])
    return matcher.is_stopped or bool(matcher.allowed()[sorted(default_tokenizer.eos_token_ids)].any())


def test_an_object_that_lists_its_properties_gets_no_others(grammar_compiler, default_tokenizer):
    """As vLLM, llama.cpp and OpenAI's strict mode generate it; Pydantic's schemas say nothing
    of other keys, and a small model added some (a weather tool's "temperature")."""
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    nested = {"type": "object", "properties": {"where": city, "list": {"type": "array", "items": city}}}
    for schema, closed, extra in (
            (city, '{"city": "Paris"}', '{"city": "Paris", "temperature": 25}'),
            (nested, '{"where": {"city": "Oslo"}, "list": [{"city": "Rome"}]}', '{"where": {"city": "Oslo", "x": 1}}'),
            (nested, '{"list": []}', '{"list": [{"city": "Rome", "x": 1}]}'),
            ({"type": "object", "$defs": {"C": city}, "properties": {"c": {"$ref": "#/$defs/C"}}}, '{"c": {"city": "A"}}',
             '{"c": {"city": "A", "x": 1}}')):
        spec = GrammarSpec.json_schema(schema)
        assert admits(grammar_compiler, default_tokenizer, spec, closed)
        assert not admits(grammar_compiler, default_tokenizer, spec, extra)
    temperature = {"type": "object", "properties": {"temperature": {"type": "number"}}}
    open_ones = (  # said so; no properties listed; or properties that join another schema's
        {**city, "additionalProperties": True}, {"type": "object"}, {"allOf": [city, temperature]},
        {"$defs": {"City": city}, "$ref": "#/$defs/City", "properties": {"temperature": {"type": "number"}}},
        {"$defs": {"City": city}, "allOf": [{"$ref": "#/$defs/City"}, temperature]},
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city", "temperature"]})
    for schema in open_ones:
        assert admits(grammar_compiler, default_tokenizer, GrammarSpec.json_schema(schema),
                      '{"city": "Paris", "temperature": 25}'), schema
    branches = {**temperature, "anyOf": [city, {"type": "object", "properties": {"town": {"type": "string"}}}]}
    assert admits(grammar_compiler, default_tokenizer, GrammarSpec.json_schema(branches),
                  '{"temperature": 25, "city": "Paris"}')  # the branch's key beside the parent's (in that order)


def test_choice_and_regex_admit_only_their_language(grammar_compiler, default_tokenizer):
    walk(grammar_compiler, default_tokenizer, GrammarSpec.choice(["yes", 'no, "never"']), 'no, "never"')
    matcher = grammar_compiler.compile(GrammarSpec.choice(["yes", "no"])).new_matcher()
    assert not matcher.allowed()[default_tokenizer.encode("maybe")[0]]
    walk(grammar_compiler, default_tokenizer, GrammarSpec.regex(r"[0-9]{3}-[a-z]+"), "123-abc")
    matcher = grammar_compiler.compile(GrammarSpec.regex(r"[0-9]{3}")).new_matcher()
    assert not matcher.allowed()[default_tokenizer.encode("a")[0]]


def test_once_the_grammar_is_complete_only_end_of_sequence_is_allowed(grammar_compiler, default_tokenizer):
    matcher = grammar_compiler.compile(GrammarSpec.choice(["yes"])).new_matcher()
    assert matcher.consume(default_tokenizer.encode("yes"))
    assert matcher.is_stopped
    assert set(matcher.allowed().nonzero().flatten().tolist()) == set(default_tokenizer.eos_token_ids)
    ends = sorted(default_tokenizer.eos_token_ids)
    assert matcher.consume(ends + ends) and matcher.error is None, \
        "any end-of-sequence token, again and again (ignore_eos), is no grammar failure"


def test_forced_tokens_are_drafted_and_drafting_leaves_the_state_unchanged(grammar_compiler, default_tokenizer):
    case = FIXED_KEY_CASES[0]
    matcher = grammar_compiler.compile(GrammarSpec.json_schema(case.schema)).new_matcher()
    before = matcher.allowed().clone()
    forced = matcher.draft([], 8)
    assert default_tokenizer.decode(forced).startswith('{"first_name"'), default_tokenizer.decode(forced)
    assert torch.equal(matcher.allowed(), before)
    example = default_tokenizer.encode(json.dumps(case.example))
    # A draft that breaks the grammar is cut at the first refused token.
    bad = example[:3] + default_tokenizer.encode("}}}")
    assert matcher.draft(bad, 8)[:3] == example[:3]
    assert len(matcher.draft(bad, 8)) <= 8 and default_tokenizer.encode("}}}")[0] not in matcher.draft(bad, 8)[3:4]
    assert torch.equal(matcher.allowed(), before)


def test_masks_give_each_verified_position_the_state_after_the_drafts_before_it(grammar_compiler, default_tokenizer):
    case = CASES[0]
    spec = GrammarSpec.json_schema(case.schema)
    matcher = grammar_compiler.compile(spec).new_matcher()
    draft = default_tokenizer.encode(json.dumps(case.example))[:6]
    masks = matcher.masks(draft)
    assert masks.shape == (7, default_tokenizer.vocab_size)
    reference = grammar_compiler.compile(spec).new_matcher()
    for i in range(7):
        assert torch.equal(masks[i], reference.allowed()), f"row {i}"
        if i < len(draft):
            reference.consume([draft[i]])
    assert torch.equal(matcher.allowed(), masks[0])  # rolled back


def test_a_matcher_that_consumed_a_refused_token_allows_only_end_of_sequence(grammar_compiler, default_tokenizer):
    matcher = grammar_compiler.compile(GrammarSpec.regex("[0-9]+")).new_matcher()
    assert not matcher.consume(default_tokenizer.encode("abc"))
    assert matcher.error
    assert set(matcher.allowed().nonzero().flatten().tolist()) == set(default_tokenizer.eos_token_ids)


def test_a_draft_that_ends_the_grammar_with_end_of_sequence_leaves_the_state_unchanged(grammar_compiler, default_tokenizer):
    # llguidance does not count a consumed end-of-sequence token in its rollback history,
    # so trying a draft must not consume it on the request's own matcher.
    matcher = grammar_compiler.compile(GrammarSpec.choice(["yes please"])).new_matcher()
    tokens = default_tokenizer.encode("yes please")
    eos = sorted(default_tokenizer.eos_token_ids)[0]
    assert matcher.draft(tokens + [eos], 8) == tokens + [eos]
    masks = matcher.masks(tokens + [eos])
    assert masks.shape[0] == len(tokens) + 2
    assert not matcher.is_stopped and matcher.consume(tokens) and matcher.is_stopped
    assert matcher.consume([eos])
