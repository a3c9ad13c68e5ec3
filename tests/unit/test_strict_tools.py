"""Strict tools under tool_choice "auto": the reply's text stays free, and a call the model
opens with ``<tool_call>`` is held to the tool's schema (the default model's real tokenizer)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from speclane.grammar.compiler import GrammarCompiler
from speclane.grammar.spec import GrammarSpec
from speclane.models.tokenizer import Tokenizer
from speclane.server.errors import APIError
from speclane.server.prompts import Vocabulary, chat_input
from speclane.server.protocol import ChatCompletionRequest, Tool
from speclane.server.tools import call_text, opened_calls_grammar

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}


def tool(name: str, parameters: dict[str, Any] | None = None, *, strict: bool | None = True) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "strict": strict}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def follows(grammar_compiler: GrammarCompiler, default_tokenizer: Tokenizer, tools: list[dict[str, Any]], text: str, *,
            parallel: bool = True) -> bool:
    """Whether the grammar lets the model write ``text`` and then end its reply."""
    lark = opened_calls_grammar([Tool.model_validate(t) for t in tools], parallel=parallel)
    matcher = grammar_compiler.compile(GrammarSpec.lark(lark)).new_matcher()
    for token in default_tokenizer.encode(text):
        if not matcher.allowed()[token]:
            return False
        assert matcher.consume([token])
    return bool(matcher.allowed()[sorted(default_tokenizer.eos_token_ids)].any())


def test_text_is_free_and_an_opened_call_follows_the_schema(grammar_compiler, default_tokenizer):
    tools = [tool("get_weather", WEATHER)]
    assert follows(grammar_compiler, default_tokenizer, tools, "It is sunny. Use <tool call> tags, {\"json\": 1} or `code`.")
    assert follows(grammar_compiler, default_tokenizer, tools, "Let me check.\n" + call_text("get_weather", {
        "city": "Oslo", "unit": "celsius"}) + "\nDone.")
    assert not follows(grammar_compiler, default_tokenizer, tools, "Let me check.\n" + call_text("get_weather", {
        "city": "Oslo", "unit": "kelvin"}))
    assert not follows(grammar_compiler, default_tokenizer, tools, call_text("get_weather", {"city": "Oslo"}))
    assert not follows(grammar_compiler, default_tokenizer, tools, call_text("get_time", {}))
    assert not follows(grammar_compiler, default_tokenizer, tools, "<tool_call>\nnot a call")
    assert not follows(grammar_compiler, default_tokenizer, tools, "cut short <tool_call>\n{\"name\": ")  # no end inside a call


def test_a_tool_that_is_not_strict_takes_any_object_beside_a_strict_one(grammar_compiler, default_tokenizer):
    tools = [tool("get_weather", WEATHER), tool("note", {"type": "object", "required": ["text"]}, strict=False)]
    assert follows(grammar_compiler, default_tokenizer, tools, call_text("note", {"anything": [1, 2]}))
    assert not follows(grammar_compiler, default_tokenizer, tools, call_text("note", [1]))
    assert not follows(grammar_compiler, default_tokenizer, tools, call_text("get_weather", {"anything": 1}))


def test_without_parallel_calls_a_reply_opens_at_most_one(grammar_compiler, default_tokenizer):
    tools = [tool("get_weather", WEATHER)]
    one = call_text("get_weather", {"city": "Oslo", "unit": "celsius"})
    assert follows(grammar_compiler, default_tokenizer, tools, f"{one}\nand the text after it", parallel=False)
    assert not follows(grammar_compiler, default_tokenizer, tools, f"{one}\n{one}", parallel=False)
    assert not follows(grammar_compiler, default_tokenizer, tools, f"{one} then <tool_call> as text", parallel=False)
    assert follows(grammar_compiler, default_tokenizer, tools, f"{one}\n{one}", parallel=True)


def request(tools: list[dict[str, Any]], **fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": tools, **fields})


def test_auto_compiles_a_grammar_only_where_a_tool_is_strict(grammar_compiler, default_tokenizer):
    vocab = Vocabulary(default_tokenizer, 2048, default_tokenizer.vocab_size, grammar_compiler.compile)
    strict = chat_input(request([tool("get_weather", WEATHER)]), vocab)
    assert strict.grammar is not None and strict.tool_parsing == "tagged"  # bare JSON would be unchecked
    for loose in (tool("get_weather", WEATHER, strict=False), tool("get_weather", WEATHER, strict=None)):
        plain = chat_input(request([loose]), vocab)
        assert plain.grammar is None and plain.tool_parsing == "auto"
    required = chat_input(request([tool("get_weather", WEATHER)], tool_choice="required"), vocab)
    assert required.tool_parsing == "forced" and required.grammar is not strict.grammar
    answer = chat_input(request([tool("get_weather", WEATHER)], response_format={"type": "json_object"}), vocab)
    assert answer.tool_parsing == "auto"  # calls or the JSON answer: the existing grammar of both


def test_a_strict_schema_the_engine_cannot_enforce_is_refused_naming_the_tool(grammar_compiler, default_tokenizer):
    vocab = Vocabulary(default_tokenizer, 2048, default_tokenizer.vocab_size, grammar_compiler.compile)
    tags = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(APIError, match=r"tools\[1\]\.function\.parameters: .*uniqueItems") as info:
        chat_input(request([tool("get_weather", WEATHER), tool("label", tags)]), vocab)
    assert info.value.status == 400
    assert chat_input(request([tool("get_weather", WEATHER), tool("label", tags, strict=False)]), vocab).grammar


def test_strict_tools_leave_a_template_opened_think_block_to_the_model(grammar_compiler, default_tokenizer):
    thinking = copy.copy(default_tokenizer)
    thinking.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}<think>\n"
    vocab = Vocabulary(thinking, 2048, default_tokenizer.vocab_size, grammar_compiler.compile)
    assert chat_input(request([tool("get_weather", WEATHER)]), vocab).opens_thinking
    assert not chat_input(request([tool("get_weather", WEATHER)], tool_choice="required"), vocab).opens_thinking

