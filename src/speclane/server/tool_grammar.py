"""The grammars that hold a reply's tool calls (Hermes's ``<tool_call>`` blocks, as
``tools.py`` prompts for and parses them) to the tools' schemas: Lark grammars for
llguidance that embed each tool's ``parameters`` with ``%json``.

Forced. ``tool_choice: "required"`` or a named function constrains the reply to one
call (``parallel_tool_calls: false``) or one or more, each to a function of the choice
with arguments that match its ``parameters``; nothing else may be generated, so even a
small model answers with calls that parse and validate. A newline may follow each call
(``BETWEEN``); after it comes another call or the end of the turn, never text, so a model
that writes calls on lines of their own (Qwen, Hermes) makes all of them, and one that
wants to stop after its newline can. A call cut short by ``max_tokens`` is dropped. With a
JSON answer (``response_format`` under "auto") the reply is the calls or that JSON.

Opened. Under "auto", tools marked ``strict`` hold the calls the model opens: the text
is free until it writes ``<tool_call>``, then the call must follow. Only for models asked
for calls in that format (``writes_tagged_calls``): a Llama 3 or Mistral template asks for
others, which stay free. A thinking block (Qwen3's ``<think>``) stays free, its
``<tool_call>`` mentions included, as the reasoning splitter reads it (``Thinking``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

from speclane.grammar.compiler import JSON_OPTIONS
from speclane.grammar.spec import closed_objects
from speclane.server.protocol import Tool
from speclane.server.reasoning import CLOSE as THINK_CLOSE
from speclane.server.reasoning import OPEN as THINK_OPEN
from speclane.server.tools import ANY_OBJECT, CLOSE, OPEN, template_uses_tools

# How a reply may begin with a thinking block, as the reasoning splitter reads it: never
# ("none"), inside one the prompt opened ("open"), or with one the model opens ("may").
Thinking = Literal["none", "open", "may"]


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _in_regex(text: str) -> str:
    """``text`` as a literal inside a Lark ``/.../`` regex."""
    return re.escape(text).replace("/", "\\/")


def _json_rule(schema: dict[str, Any] | bool) -> str:
    """``%json`` with the compiler's fixed spacing, so a call reads as ``call_text`` writes it."""
    body = {**closed_objects(schema), "x-guidance": JSON_OPTIONS} if isinstance(schema, dict) else {
        "x-guidance": JSON_OPTIONS} if schema else {"not": {}}
    return "%json " + json.dumps(body, ensure_ascii=False, separators=(",", ":"))


# What may stand between two calls and after the last: one newline, as Qwen and Hermes write
# them. One, not any whitespace: a rule that repeats lets a model that has called write
# spaces until max_tokens; after the newline comes another call or the end of the turn.
_BETWEEN = f"BETWEEN: {_lark_string(chr(10))}"


def _call_rules(tools: Sequence[Tool], opening: str, *, schemas: Callable[[Tool], bool]) -> list[str]:
    """``call: call_0 | call_1 ...``, each ``opening`` then the Hermes JSON naming the tool,
    its arguments held to the tool's ``parameters`` where ``schemas(tool)``, else any object."""
    lines = ["call: " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        head = f'{opening}\n{{"name": {json.dumps(tool.function.name)}, "arguments": '
        lines.append(f"call_{i}: {_lark_string(head)} args_{i} {_lark_string('}' + chr(10) + CLOSE)}")
        params = tool.function.parameters if tool.function.parameters is not None and schemas(tool) else ANY_OBJECT
        lines.append(f"args_{i}: {_json_rule(params)}")
    return lines


def tool_call_grammar(tools: Sequence[Tool], *, parallel: bool, answer: dict[str, Any] | bool | None = None) -> str:
    """A Lark grammar for one call (or, with ``parallel``, one or more) to one of ``tools``;
    with ``answer``, a JSON value matching that schema is allowed instead of the calls."""
    lines = [f"calls: call{' (BETWEEN? call)*' if parallel else ''} BETWEEN?", _BETWEEN,
             *_call_rules(tools, OPEN, schemas=lambda tool: True)]
    if answer is not None:
        lines.insert(0, "start: calls | answer")
        lines.append(f"answer: {_json_rule(answer)}")
    else:
        lines.insert(0, "start: calls")
    return "\n".join(lines) + "\n"


def strict_tools(tools: Sequence[Tool]) -> bool:
    """Whether any tool asks for ``strict`` arguments (then "auto" is held to a grammar)."""
    return any(tool.function.strict for tool in tools)


def writes_tagged_calls(template: str | None) -> bool:
    """Whether the model is asked for calls in ``<tool_call>`` blocks: the generic preamble
    asks for them, and a template that renders the tools itself shows them (Qwen's, Hermes's).
    Llama 3's bare JSON and Mistral's ``[TOOL_CALLS]`` are other formats."""
    return template is None or not template_uses_tools(template) or OPEN in template


_TEXT = r"/(.|\n)*/"
_NO_CALL = rf"{_TEXT} & ~/(.|\n)*{_in_regex(OPEN)}(.|\n)*/"  # text that opens no call
_NOT_OPENING_THINKING = rf"~/\s*{_in_regex(THINK_OPEN)}(.|\n)*/"  # text that does not open a thinking block
_NOT_CLOSING_THINKING = rf"~/(.|\n)*{_in_regex(THINK_CLOSE)}(.|\n)*/"  # text that does not close one


def opened_calls_grammar(tools: Sequence[Tool], *, parallel: bool, thinking: Thinking = "none") -> str:
    """"auto" with strict tools: free text, or text then calls where the model writes
    ``<tool_call>``, each to one of ``tools``, a strict tool's arguments held to its
    ``parameters``, any other's to a JSON object; one call without ``parallel``.

    The opening is a lazy lexeme (llguidance's trigger for calls inside running text): the
    text ends at the first ``<tool_call>``, which then must go on as a call. Further calls
    follow, each after at most a newline, as under "required", and the last (and its
    newline) ends the turn: a reply that called cannot ramble on in would-be calls (nor in
    whitespace). A thinking block (``thinking``)
    is free text, ``<tool_call>`` included, up to its first ``</think>``: its calls would be
    reasoning, never parsed; a reply may end inside it (cut short)."""
    more = f"(BETWEEN? {_lark_string(OPEN)} call)* " if parallel else ""
    lines = ["%llguidance {}",
             f"body: opened call {more}BETWEEN? | TAIL",
             _BETWEEN,
             f"TAIL: {_NO_CALL}",
             f"TEXT: {_TEXT}",
             f"opened[lazy]: TEXT {_lark_string(OPEN)}"]
    if thinking == "none":
        lines.insert(1, "start: body")
    elif thinking == "open":
        lines[1:1] = ["start: thought body | UNCLOSED",
                      f"thought[lazy]: TEXT {_lark_string(THINK_CLOSE)}",
                      f"UNCLOSED: {_TEXT} & {_NOT_CLOSING_THINKING}"]
    else:  # the block, where there is one, opens the reply (after whitespace)
        lines[1:1] = ["start: thought body | UNCLOSED | first_body",
                      rf"thought[lazy]: /\s*{_in_regex(THINK_OPEN)}/ TEXT {_lark_string(THINK_CLOSE)}",
                      rf"UNCLOSED: /\s*{_in_regex(THINK_OPEN)}(.|\n)*/ & {_NOT_CLOSING_THINKING}",
                      f"first_body: first_opened call {more}BETWEEN? | FIRST_TAIL",
                      f"first_opened[lazy]: NOT_THINKING {_lark_string(OPEN)}",
                      f"NOT_THINKING: {_TEXT} & {_NOT_OPENING_THINKING}",
                      f"FIRST_TAIL: {_NO_CALL} & {_NOT_OPENING_THINKING}"]
    return "\n".join([*lines, *_call_rules(tools, "", schemas=lambda tool: bool(tool.function.strict))]) + "\n"
