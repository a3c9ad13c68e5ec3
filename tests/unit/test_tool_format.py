"""Tool calling without a model: the prompt in both formats (a template that renders
``tools`` itself, and the generic Hermes preamble), and the reply parser, whose streamed
pieces equal its answer over the whole text."""

from __future__ import annotations

import json
from typing import Any

import pytest
import tokenizers
from tokenizers import models

from speclane.models.tokenizer import Tokenizer
from speclane.server.protocol import ChatCompletionRequest
from speclane.server.tool_grammar import tool_call_grammar
from speclane.server.tools import (
    PREAMBLE,
    ParsedCall,
    ToolCallParser,
    call_text,
    chat_messages,
    nine_character_id,
)

ADD = {"type": "function", "function": {"name": "add", "description": "Add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
HISTORY: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "1 + 1?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "2"},
]
# A Qwen-like template that renders tools and tool messages itself.
TOOLS_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}[{{ m.role }}]"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}"
    "{% endfor %}{% elif m.role == 'tool' %}RESULT {{ m.name }} {{ m.tool_call_id }} {{ m.content }}"
    "{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
)


def tokenizer(template: str | None) -> Tokenizer:
    backend = tokenizers.Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    return Tokenizer(backend, bos_token_id=1, eos_token_id=2, chat_template=template)


def request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": HISTORY, "tools": [ADD], **fields})


def test_a_template_with_tools_renders_them_itself() -> None:
    tok = tokenizer(TOOLS_TEMPLATE)
    req = request()
    messages, variables = chat_messages(req.messages, req.tools or (), tok)
    text = tok.apply_chat_template(messages, add_generation_prompt=False, **variables)
    assert text.startswith("TOOLS:add;") and "[system]Be brief." in text
    assert 'CALL add {"a": 1}' in text  # arguments passed as an object, as transformers does
    assert "[tool]RESULT add c1 2" in text


def test_the_generic_format_writes_hermes_calls_and_results() -> None:
    tok = tokenizer(None)  # plain ChatML, no tools variable
    req = request()
    messages, variables = chat_messages(req.messages, req.tools or (), tok)
    assert variables == {}
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("Be brief.\n\n# Tools") and json.dumps(ADD) in messages[0]["content"]
    assert messages[2]["content"] == call_text("add", {"a": 1})
    assert messages[3]["content"] == "<tool_response>\n2\n</tool_response>"
    without = chat_messages(req.messages, (), tok)[0]  # tool_choice "none": nothing offered
    assert without[0]["content"] == "Be brief." and PREAMBLE[:7] not in without[0]["content"]


# Gemma's check that roles alternate.
ALTERNATING_TEMPLATE = (
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<{{ m.role }}>{{ m.content }}\n{% endfor %}"
)


def test_the_users_words_after_tool_results_join_the_results_turn() -> None:
    """The generic format sends tool results as a user turn; the user's next message joins it,
    so a template that checks roles alternate renders the conversation OpenAI accepts."""
    tok = tokenizer(ALTERNATING_TEMPLATE)
    follow_up: list[Any] = [*HISTORY[1:], {"role": "user", "content": "And 2 + 2?"}]
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": follow_up, "tools": [ADD]})
    messages, _ = chat_messages(req.messages, req.tools or (), tok)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]  # (the preamble opens the first)
    assert messages[2]["content"] == "<tool_response>\n2\n</tool_response>\n\nAnd 2 + 2?"
    tok.apply_chat_template(messages)  # alternates
    more: list[Any] = [*follow_up, {"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks."}]
    roles = [m["role"] for m in chat_messages(ChatCompletionRequest.model_validate(
        {"model": "m", "messages": more, "tools": [ADD]}).messages, [], tok)[0]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    late = ChatCompletionRequest.model_validate({"model": "m", "tools": [ADD], "messages": [
        *follow_up, {"role": "tool", "tool_call_id": "c1", "content": "still 2"}]})  # results after the user's words
    merged = chat_messages(late.messages, late.tools or (), tok)[0]
    assert [m["role"] for m in merged] == ["user", "assistant", "user"]
    assert merged[2]["content"].endswith("And 2 + 2?\n<tool_response>\nstill 2\n</tool_response>")
    tok.apply_chat_template(merged)


# Gemma 2's way: no system role at all; and a template whose tools branch uses {% break %}.
NO_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
)
BREAK_TEMPLATE = (
    "{% for t in tools %}{{ t.function.name }}{% break %}{% endfor %}"
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
)


def test_without_a_system_role_the_preamble_opens_the_first_user_message() -> None:
    tok = tokenizer(NO_SYSTEM_TEMPLATE)
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": HISTORY[1:], "tools": [ADD]})
    messages, _ = chat_messages(req.messages, req.tools or (), tok)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"].startswith("# Tools") and messages[0]["content"].endswith("\n\n1 + 1?")
    tok.apply_chat_template(messages)  # renders: the template would reject a system message
    with_system = chat_messages(request().messages, request().tools or (), tok)[0]
    assert with_system[0]["role"] == "system"  # the client's own system message stays its (the template's 400)


def test_a_template_whose_tools_branch_breaks_out_of_a_loop_renders_tools_itself() -> None:
    tok = tokenizer(BREAK_TEMPLATE)
    req = request()
    messages, variables = chat_messages(req.messages, req.tools or (), tok)
    assert "tools" in variables and tok.apply_chat_template(messages, **variables).startswith("add[system]")


# Mistral's rule: a call id of any other length than 9 is an error of the template's.
NINE_CHARACTER_TEMPLATE = (
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools | length }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m.tool_calls is defined and m.tool_calls %}{% for c in m.tool_calls %}"
    "{% if not c.id is defined or c.id|length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}"
    "[TOOL_CALLS]{{ c.id }}{% endfor %}"
    "{% elif m.role == 'tool' %}{% if m.tool_call_id|length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}"
    "[TOOL_RESULTS]{{ m.tool_call_id }} {{ m.content }}{% else %}[{{ m.role }}]{{ m.content }}{% endif %}"
    "{% endfor %}"
)


def test_a_template_that_wants_nine_character_call_ids_gets_them_paired() -> None:
    tok = tokenizer(NINE_CHARACTER_TEMPLATE)
    history = [*HISTORY[1:3], {**HISTORY[3]}]
    history[1] = {**history[1], "tool_calls": [{**history[1]["tool_calls"][0], "id": "call_5f2c9a0b1d3e4f5a6b7c8d9e"}]}
    history[2]["tool_call_id"] = "call_5f2c9a0b1d3e4f5a6b7c8d9e"
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": history, "tools": [ADD]})
    messages, variables = chat_messages(req.messages, req.tools or (), tok)
    text = tok.apply_chat_template(messages, **variables)  # OpenAI-style ids: the raw template raises
    renamed = messages[1]["tool_calls"][0]["id"]
    assert len(renamed) == 9 and renamed.isalnum() and messages[2]["tool_call_id"] == renamed
    assert f"[TOOL_CALLS]{renamed}[TOOL_RESULTS]{renamed} 2" in text
    assert nine_character_id("a1B2c3D4e") == "a1B2c3D4e", "an id that already fits is kept"
    assert nine_character_id("c1") != nine_character_id("c2")
    plain = chat_messages(req.messages, req.tools or (), tokenizer(TOOLS_TEMPLATE))[0]
    assert plain[1]["tool_calls"][0]["id"] == "call_5f2c9a0b1d3e4f5a6b7c8d9e", "other templates see the ids as sent"


def test_the_grammar_names_each_function_and_embeds_its_schema() -> None:
    req = request()
    one = tool_call_grammar(req.tools or (), parallel=False)
    assert one.startswith("start: calls\ncalls: call BETWEEN?\n") and '\\"name\\": \\"add\\"' in one
    assert "%json" in one and '"required":["a"]' in one
    assert "calls: call (BETWEEN? call)* BETWEEN?" in tool_call_grammar(req.tools or (), parallel=True, answer={"type": "object"})


def parse(text: str, pieces: int | None = None, **options: Any) -> list[str | ParsedCall]:
    parser = ToolCallParser(["add"], **{"bare_json": True, **options})
    size = pieces or len(text) or 1
    events = [e for i in range(0, len(text), size) for e in parser.feed(text[i:i + size])]
    return events + parser.finish()


def summary(events: list[str | ParsedCall]) -> tuple[str, list[tuple[str, str]]]:
    return ("".join(e for e in events if isinstance(e, str)),
            [(e.name, e.arguments) for e in events if isinstance(e, ParsedCall)])


@pytest.mark.parametrize(("text", "content", "calls"), [
    ("Hello <b>world</b>", "Hello <b>world</b>", []),
    ("Sure.\n" + call_text("add", {"a": 1}) + "\n", "Sure.", [("add", '{"a": 1}')]),
    (call_text("add", {"a": 1}) + call_text("add", {"a": 2}), "", [("add", '{"a": 1}'), ("add", '{"a": 2}')]),
    ('{"name": "add", "arguments": {"a": 3}}', "", [("add", '{"a": 3}')]),
    ('{"name": "sub", "arguments": {}}', '{"name": "sub", "arguments": {}}', []),
    ("<tool_call>\nnot json\n</tool_call> ok", "<tool_call>\nnot json\n</tool_call> ok", []),
    ("<tool_call>\n" + '{"name": "add", "parameters": {"a": 4}}', "", [("add", '{"a": 4}')]),
])
def test_streamed_pieces_equal_the_whole_answer(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    assert summary(parse(text)) == (content, calls)
    for size in (1, 2, 3, 7):
        assert summary(parse(text, size)) == (content, calls)


def test_a_forced_call_cut_short_is_dropped() -> None:
    text = call_text("add", {"a": 1}) + '<tool_call>\n{"name": "add", "argu'
    assert summary(parse(text, 1, bare_json=False, held=True)) == ("", [("add", '{"a": 1}')])
    assert summary(parse(text, 1, bare_json=False))[0] == '<tool_call>\n{"name": "add", "argu'
