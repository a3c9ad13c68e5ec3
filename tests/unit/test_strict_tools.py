"""Strict tools under tool_choice "auto": the reply's text stays free, and a call the model
opens with ``<tool_call>`` is held to the tool's schema (the default model's real tokenizer)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from speclane.engine.engine import RequestOutput
from speclane.grammar.compiler import GrammarCompiler
from speclane.grammar.spec import GrammarSpec
from speclane.models.tokenizer import Tokenizer
from speclane.server.errors import APIError
from speclane.server.prompts import Vocabulary, chat_input
from speclane.server.protocol import ChatCompletionRequest, Tool
from speclane.server.streaming import ChoiceState, Reading
from speclane.server.tool_grammar import Thinking, opened_calls_grammar, tool_call_grammar
from speclane.server.tools import call_text

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}


def tool(name: str, parameters: dict[str, Any] | None = None, *, strict: bool | None = True) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "strict": strict}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


@pytest.fixture
def follows(grammar_compiler: GrammarCompiler, default_tokenizer: Tokenizer) -> Callable[..., bool]:
    """Whether the grammar lets the model write ``text`` and then end its reply."""
    def check(tools: list[dict[str, Any]], text: str, *, parallel: bool = True, thinking: Thinking = "none",
              forced: bool = False) -> bool:
        parsed = [Tool.model_validate(t) for t in tools]
        lark = (tool_call_grammar(parsed, parallel=parallel) if forced  # "required"
                else opened_calls_grammar(parsed, parallel=parallel, thinking=thinking))
        matcher = grammar_compiler.compile(GrammarSpec.lark(lark)).new_matcher()
        for token in default_tokenizer.encode(text):
            if not matcher.allowed()[token]:
                return False
            assert matcher.consume([token])
        return bool(matcher.allowed()[sorted(default_tokenizer.eos_token_ids)].any())
    return check


def weather(unit: str = "celsius", city: str = "Oslo") -> str:
    return call_text("get_weather", {"city": city, "unit": unit})


TOOLS = [tool("get_weather", WEATHER)]


def test_text_is_free_and_an_opened_call_follows_the_schema(follows):
    assert follows(TOOLS, "It is sunny. Use <tool call> tags, {\"json\": 1} or `code`.")
    assert follows(TOOLS, f"Let me check.\n{weather()}")
    assert not follows(TOOLS, f"Let me check.\n{weather('kelvin')}")
    assert not follows(TOOLS, call_text("get_weather", {"city": "Oslo"}))
    assert not follows(TOOLS, call_text("get_time", {}))
    assert not follows(TOOLS, "<tool_call>\nnot a call")
    assert not follows(TOOLS, "cut short <tool_call>\n{\"name\": ")  # no end inside a call
    assert not follows(TOOLS, f"{weather()}\nDone.")  # a turn that called ends with its calls
    assert not follows(TOOLS, f"{weather()}\u3000")


def test_a_tool_that_is_not_strict_takes_any_object_beside_a_strict_one(follows):
    tools = [*TOOLS, tool("note", {"type": "object", "required": ["text"]}, strict=False)]
    assert follows(tools, call_text("note", {"anything": [1, 2]}))
    assert not follows(tools, call_text("note", [1]))
    assert not follows(tools, call_text("get_weather", {"anything": 1}))


def test_without_parallel_calls_a_reply_opens_at_most_one(follows):
    assert follows(TOOLS, f"Both.\n{weather()}{weather('fahrenheit', 'Lima')}", parallel=True)
    assert not follows(TOOLS, f"Both.\n{weather()}{weather('kelvin', 'Lima')}", parallel=True)
    assert follows(TOOLS, f"One.\n{weather()}", parallel=False)
    assert not follows(TOOLS, f"{weather()}{weather()}", parallel=False)
    assert not follows(TOOLS, f"{weather()} then <tool_call> as text", parallel=False)


@pytest.mark.parametrize("forced", [False, True], ids=["auto", "required"])
def test_calls_may_stand_on_lines_of_their_own_and_nothing_else_follows(follows, forced):
    """One newline after each call (Qwen and Hermes write their calls so), then another call
    or the end of the turn: never text, and never a run of whitespace."""
    two = f"{weather()}\n{weather('fahrenheit', 'Lima')}"
    assert follows(TOOLS, two, forced=forced) and follows(TOOLS, two + "\n", forced=forced)
    assert follows(TOOLS, f"{weather()}{weather('fahrenheit', 'Lima')}", forced=forced)
    assert follows(TOOLS, f"{weather()}\n", parallel=False, forced=forced)
    assert not follows(TOOLS, two, parallel=False, forced=forced)
    assert not follows(TOOLS, f"{weather()}\n\n", forced=forced)
    assert not follows(TOOLS, f"{weather()}\nDone.", forced=forced)
    assert not follows(TOOLS, f"{weather()}\n{weather('kelvin')}", forced=forced)


@pytest.mark.parametrize("forced", [False, True], ids=["auto", "required"])
def test_arguments_hold_only_the_properties_a_schema_lists(follows, forced):
    """A schema without "additionalProperties" (Pydantic's, LangChain's) still gets no others."""
    loose = {key: value for key, value in WEATHER.items() if key != "additionalProperties"}
    tools = [tool("get_weather", loose)]
    assert follows(tools, weather(), forced=forced)
    assert not follows(tools, call_text("get_weather", {"city": "Oslo", "unit": "celsius", "temperature": 25}),
                       forced=forced)


def test_a_thinking_block_the_prompt_opened_is_free_and_the_answer_after_it_is_held(follows):
    thought = "The format is <tool_call> with JSON; kelvin is wrong here.\n</think>\n\n"
    assert follows(TOOLS, thought + weather(), thinking="open", parallel=False)  # the mention uses up nothing
    assert not follows(TOOLS, thought + weather("kelvin"), thinking="open")
    assert follows(TOOLS, "Still thinking about <tool_call> and", thinking="open")  # cut short while thinking
    assert follows(TOOLS, thought + "No call needed.", thinking="open")


def test_a_thinking_block_the_model_opens_is_free_and_a_reply_without_one_is_held(follows):
    thought = "  <think>\nMaybe <tool_call> kelvin.\n</think>\n\n"
    assert follows(TOOLS, thought + weather(), thinking="may", parallel=False)
    assert not follows(TOOLS, thought + weather("kelvin"), thinking="may")
    assert follows(TOOLS, f"Checking.\n{weather()}", thinking="may")
    assert not follows(TOOLS, f"Checking.\n{weather('kelvin')}", thinking="may")
    assert not follows(TOOLS, f"{weather()}<think>{weather('kelvin')}", thinking="may")  # only at the start
    assert follows(TOOLS, "<think>cut short at <tool_call>", thinking="may")
    assert follows(TOOLS, "", thinking="may") and follows(TOOLS, "", thinking="open")


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
    assert required.tool_parsing == "forced" and required.grammar.spec.source.startswith("start: calls")
    answer = chat_input(request([tool("get_weather", WEATHER)], response_format={"type": "json_object"}), vocab)
    assert answer.tool_parsing == "tagged"  # calls or the JSON answer: bare JSON is the answer


def test_stop_strings_do_not_cut_forced_calls(grammar_compiler, default_tokenizer):
    """A forced reply is calls: an agent's stop string ("\n", a city the call names) would cut
    one and leave an empty answer; under "auto" the text is the model's and stop strings apply."""
    vocab = Vocabulary(default_tokenizer, 2048, default_tokenizer.vocab_size, grammar_compiler.compile)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        forced = chat_input(request(TOOLS, tool_choice=choice, stop=["\n", "Oslo"]), vocab)
        assert forced.tool_parsing == "forced" and forced.sampling.stop == ()
    assert chat_input(request(TOOLS, stop=["\n"]), vocab).sampling.stop == ("\n",)


def test_a_strict_schema_the_engine_cannot_enforce_is_refused_naming_the_tool(grammar_compiler, default_tokenizer):
    vocab = Vocabulary(default_tokenizer, 2048, default_tokenizer.vocab_size, grammar_compiler.compile)
    tags = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(APIError, match=r"tools\[1\]\.function\.parameters: .*uniqueItems") as info:
        chat_input(request([tool("get_weather", WEATHER), tool("label", tags)]), vocab)
    assert info.value.status == 400
    assert chat_input(request([tool("get_weather", WEATHER), tool("label", tags, strict=False)]), vocab).grammar


def vocabulary(tokenizer: Tokenizer, compiler: GrammarCompiler, template: str, *, reasoning: bool = False) -> (
        Vocabulary):
    """The default model's tokenizer with another chat template."""
    templated = copy.copy(tokenizer)
    templated.chat_template = template
    return Vocabulary(templated, 2048, tokenizer.vocab_size, compiler.compile, reasoning=reasoning)


def test_strict_tools_leave_a_template_opened_think_block_to_the_model(grammar_compiler, default_tokenizer):
    opened = "{% for m in messages %}{{ m.content }}{% endfor %}<think>\n"
    for reasoning, shape in ((False, "start: body"), (True, "start: thought body | UNCLOSED\n")):
        vocab = vocabulary(default_tokenizer, grammar_compiler, opened, reasoning=reasoning)
        strict = chat_input(request(TOOLS), vocab)
        assert strict.opens_thinking and shape in strict.grammar.spec.source
        assert not chat_input(request(TOOLS, tool_choice="required"), vocab).opens_thinking
    vocab = vocabulary(default_tokenizer, grammar_compiler, "{% for m in messages %}{{ m.content }}{% endfor %}",
                       reasoning=True)
    assert "first_body" in chat_input(request(TOOLS), vocab).grammar.spec.source


def test_a_model_whose_calls_are_not_tool_call_blocks_keeps_auto_free(grammar_compiler, default_tokenizer):
    """Llama 3's bare JSON calls: no grammar to hold them, and bare JSON is still read as a call."""
    llama_like = ("{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}"
                  "{% for m in messages %}{{ m.content }}{% endfor %}")
    plain = chat_input(request(TOOLS), vocabulary(default_tokenizer, grammar_compiler, llama_like))
    assert plain.grammar is None and plain.tool_parsing == "auto"
    hermes_like = llama_like + "{# calls in <tool_call></tool_call> tags #}"
    held = chat_input(request(TOOLS), vocabulary(default_tokenizer, grammar_compiler, hermes_like))
    assert held.grammar is not None and held.tool_parsing == "tagged"


def test_held_replies_read_calls_from_tool_call_blocks_only():
    """Bare JSON is no call where the grammar held only <tool_call> blocks: nothing checked it."""
    bare = json.dumps({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "kelvin"}})
    for parsing, calls in (("auto", 1), ("tagged", 0)):
        state = ChoiceState(0, Reading(tool_parsing=parsing, tool_names=("get_weather",)))
        state.feed(RequestOutput("r", bare, [], True, "stop", 5, 1))
        message = state.answer(chat=True)["message"]
        assert len(message.get("tool_calls") or ()) == calls
        assert (message["content"] == bare) == (calls == 0)
    state = ChoiceState(0, Reading(tool_parsing="tagged", tool_names=("get_weather",)))
    state.feed(RequestOutput("r", f"Checking.\n{weather()}", [], True, "stop", 5, 1))
    assert state.answer(chat=True)["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_without_parallel_calls_only_the_first_call_is_read():
    """Where no grammar stops a second call ("auto" without strict tools), the parser drops it,
    streamed or not."""
    two = f"Both.\n{weather(city='Oslo')}\n{weather('fahrenheit', 'Lima')}"
    bare = json.dumps([{"name": "get_weather", "arguments": {"city": c, "unit": "celsius"}} for c in ("Oslo", "B")])
    for text, parsing in ((two, "auto"), (two, "tagged"), (bare, "auto")):
        for single, expected in ((False, 2), (True, 1)):
            for size in (len(text), 3):  # whole, then streamed in small pieces
                state = ChoiceState(0, Reading(tool_parsing=parsing, tool_names=("get_weather",), single_call=single))
                pieces = [text[i:i + size] for i in range(0, len(text), size)]
                for i, piece in enumerate(pieces):
                    state.feed(RequestOutput("r", piece, [], i == len(pieces) - 1, "stop", 5, i + 1))
                message = state.answer(chat=True)["message"]
                assert len(message["tool_calls"]) == expected and message["content"] in (None, "Both."), message
                assert json.loads(message["tool_calls"][0]["function"]["arguments"])["city"] == "Oslo"


def test_a_held_call_cut_short_is_dropped_not_content():
    text = f"Checking.\n{weather()}"[:-20]  # max_tokens ended it inside the call
    for parsing, content in (("tagged", "Checking.\n"), ("auto", text)):
        state = ChoiceState(0, Reading(tool_parsing=parsing, tool_names=("get_weather",)))
        state.feed(RequestOutput("r", text, [], True, "length", 5, 1))
        message = state.answer(chat=True)["message"]
        assert message["content"] == content and not message.get("tool_calls"), message


@pytest.mark.parametrize("parsing", ["forced", "tagged"])
def test_a_cut_reply_keeps_its_whole_calls_and_drops_the_tag_it_began(parsing):
    """max_tokens may cut a held reply anywhere: after a call, inside the next call's opening
    tag (Gemma's tokenizer writes ``<tool_call>`` in five tokens), or inside a call's closing
    tag. A call whose JSON is whole is kept wherever its tag was cut; a begun tag is no text."""
    call = weather()
    cuts = {call + "\n<tool": 1, call + "\n<": 1, call[: -len("tool_call>")]: 1, call[: -len("</tool_call>")]: 1,
            call[:-2]: 1, call[:30]: 0}
    for text, calls in cuts.items():
        for size in (len(text), 2):
            state = ChoiceState(0, Reading(tool_parsing=parsing, tool_names=("get_weather",)))
            pieces = [text[i:i + size] for i in range(0, len(text), size)]
            streamed = []
            for i, piece in enumerate(pieces):
                streamed.append(state.feed(RequestOutput("r", piece, [], i == len(pieces) - 1, "length", 5, i + 1)))
            message = state.answer(chat=True)["message"]
            assert len(message.get("tool_calls") or ()) == calls, (text, message)
            assert not any(delta.content for delta in streamed), (text, streamed)
            assert message["content"] is None or (parsing == "tagged" and message["content"] == ""), (text, message)


def test_tagged_text_that_ends_in_a_bracket_stays_text():
    """Under "auto" with strict tools the text is free: a reply may end in "<" or "<t"."""
    for text in ("Use a <", "see <t"):
        for size in (len(text), 1):
            state = ChoiceState(0, Reading(tool_parsing="tagged", tool_names=("get_weather",)))
            pieces = [text[i:i + size] for i in range(0, len(text), size)]
            for i, piece in enumerate(pieces):
                state.feed(RequestOutput("r", piece, [], i == len(pieces) - 1, "stop", 5, i + 1))
            assert state.answer(chat=True)["message"]["content"] == text
