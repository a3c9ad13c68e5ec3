"""Tool calling on chat: the prompt that offers the tools, and the parser that turns a
reply back into OpenAI's ``tool_calls``.

The call format is Hermes's, which Qwen 2.5 and 3 use natively::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Prompt. A chat template that uses a ``tools`` variable (Qwen 2.5, Hermes, Llama 3.1
style) renders the tools and the history itself: it gets ``tools=[...]`` and the
messages in the shape transformers passes them (assistant ``tool_calls`` with the
arguments as an object, ``tool`` messages with their ``tool_call_id`` and ``name``).
Mistral's templates refuse a call id that is not 9 characters long (OpenAI's and ours
are longer): for a template that checks that length, every id is rendered as a 9-character
alphanumeric id derived from it, the same for a call and its result.
Any other template gets the generic format: a system preamble that lists the tools as
JSON and asks for calls in the format above (joined to the first system message, or a
system message of its own); an earlier assistant call is rendered as that same text, and
tool results as one user message per run of results, each result in
``<tool_response>...</tool_response>`` (user, because many templates accept no other
role). With ``tool_choice: "none"`` no tools are offered and replies are never parsed.

The grammars that hold calls to the tools' schemas are ``tool_grammar.py``'s.

Parsing (``auto``, ``required``, named). Text before and between calls stays
``content``; each complete ``<tool_call>`` block whose JSON names a known tool and gives
its ``arguments`` (or ``parameters``) as an object becomes a call; a block that does not
parse stays content. With ``auto``, a reply that is one bare JSON object (or a list of
them) naming a known tool with its arguments is a call too, unless a grammar held the
reply (strict tools, a JSON answer): its calls are the ``<tool_call>`` blocks it held,
and one it held but ``max_tokens`` cut short is dropped, as under ``required``. With
``parallel_tool_calls: false`` a call after the first is dropped. ``ToolCallParser`` works on
the text as it streams: it holds back text that may be the start of a ``<tool_call>``
tag, whitespace that may come before a call, and a reply that starts like bare JSON,
until it knows; a call is emitted once its block is complete. The non-streaming answer
runs the same parser over the whole text, so both give the same calls and content.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import jinja2
import jinja2.meta

from speclane.models.tokenizer import template_environment
from speclane.server.protocol import ChatMessage, Tool

if TYPE_CHECKING:
    from speclane.models.tokenizer import Tokenizer

OPEN, CLOSE = "<tool_call>", "</tool_call>"
ANY_OBJECT: dict[str, Any] = {"type": "object"}

PREAMBLE = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_dict(tool: Tool) -> dict[str, Any]:
    """A tool as OpenAI's JSON (unset fields left out), as templates and the preamble show it."""
    function: dict[str, Any] = {"name": tool.function.name}
    if tool.function.description is not None:
        function["description"] = tool.function.description
    function["parameters"] = tool.function.parameters if tool.function.parameters is not None else ANY_OBJECT
    return {"type": "function", "function": function}


# -- the prompt ------------------------------------------------------------------------------


@lru_cache(maxsize=16)
def template_uses_tools(template: str) -> bool:
    """Whether a chat template reads a ``tools`` variable (then it renders tools itself)."""
    try:
        return "tools" in jinja2.meta.find_undeclared_variables(template_environment().parse(template))
    except jinja2.TemplateError:
        return False


def chat_messages(messages: Sequence[ChatMessage], tools: Sequence[Tool], tokenizer: Tokenizer) -> tuple[
        list[dict[str, Any]], dict[str, Any]]:
    """The messages to render and the extra template variables (``tools``), for either format."""
    template = tokenizer.chat_template
    if template is not None and template_uses_tools(template):
        extra: dict[str, Any] = {"tools": [tool_dict(t) for t in tools]} if tools else {}
        rename = nine_character_id if _NINE_CHARACTER_IDS.search(template) else str
        return _template_messages(messages, rename), extra
    return _generic_messages(messages, tools, system_role=not tools or template_takes_system(tokenizer)), {}


@lru_cache(maxsize=4)
def template_takes_system(tokenizer: Tokenizer) -> bool:
    """Whether the model's chat template renders a system message (Gemma 2's raises)."""
    try:
        tokenizer.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    except Exception:  # noqa: BLE001 - a template that cannot render a system message, whatever it raises
        return False
    return True


def _role(message: ChatMessage) -> str:
    return "system" if message.role == "developer" else message.role


def _arguments_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


# How Mistral's templates check a call id: ``tool_call.id|length != 9`` raises.
_NINE_CHARACTER_IDS = re.compile(r"id\s*\|\s*length\s*!=\s*9\b")
_ALPHANUMERIC = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def nine_character_id(call_id: str) -> str:
    """``call_id`` itself where it is 9 letters and digits, else 9 of them derived from it
    (a hash: a call and its result, renamed apart, still match)."""
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    return "".join(_ALPHANUMERIC[(number // 62**i) % 62] for i in range(9))


def _template_messages(messages: Sequence[ChatMessage], rename: Callable[[str], str] = str) -> list[dict[str, Any]]:
    """``rename``: the call ids as the template will see them."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for m in messages:
        entry: dict[str, Any] = {"role": _role(m), "content": m.text}
        if m.reasoning_content is not None:
            entry["reasoning_content"] = m.reasoning_content
        if m.tool_calls:
            entry["tool_calls"] = [{"id": rename(c.id), "type": "function", "function": {
                "name": c.function.name, "arguments": _arguments_object(c.function.arguments)}}
                for c in m.tool_calls]
            names.update((c.id, c.function.name) for c in m.tool_calls)
        if m.role == "tool":
            entry["tool_call_id"] = rename(m.tool_call_id) if m.tool_call_id is not None else None
            entry["name"] = names.get(m.tool_call_id or "", "")
        out.append(entry)
    return out


def call_text(name: str, arguments: Any) -> str:
    """One call in the Hermes format (the arguments as compact JSON, as the grammar writes it)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CLOSE}"


def _generic_messages(messages: Sequence[ChatMessage], tools: Sequence[Tool], *,
                      system_role: bool = True) -> list[dict[str, Any]]:
    """The Hermes format in plain messages; the tools' preamble is a system message, or,
    for a template without a system role and a chat without a system message, the start
    of the first user message."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            result = f"<tool_response>\n{m.text}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
            continue
        text = m.text
        if m.role == "user" and out and out[-1].get("tool_results"):
            # The results are a user turn here, so the user's next words join it (and results
            # after them too): two user turns in a row are what templates that check roles
            # alternate (Gemma's) reject.
            if text:
                out[-1]["content"] += "\n\n" + text
            continue
        if m.tool_calls:
            calls = "\n".join(call_text(c.function.name, _arguments_object(c.function.arguments))
                              for c in m.tool_calls)
            text = f"{text}\n{calls}" if text else calls
        entry = {"role": _role(m), "content": text}
        if m.reasoning_content is not None:
            entry["reasoning_content"] = m.reasoning_content
        out.append(entry)
    for entry in out:
        entry.pop("tool_results", None)
    if tools:
        preamble = PREAMBLE.format(tools="\n".join(json.dumps(tool_dict(t), ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{preamble}" if out[0]["content"] else preamble
        elif system_role or not out or out[0]["role"] != "user":
            out.insert(0, {"role": "system", "content": preamble})
        else:
            out[0]["content"] = f"{preamble}\n\n{out[0]['content']}"
    return out


# -- parsing the reply -----------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


Event = str | ParsedCall  # a piece of content, or a complete call

# How replies are read: "none" (plain text), "auto" (calls or text), "tagged" (calls only
# from <tool_call> blocks, which a grammar held, or text), "forced" (calls).
ToolParsing = Literal["none", "auto", "tagged", "forced"]


class ToolCallParser:
    """Splits a reply, fed as it streams, into content pieces and complete calls."""

    def __init__(self, names: Sequence[str], *, bare_json: bool, held: bool = False, single: bool = False,
                 calls_only: bool = False) -> None:
        self._names = frozenset(names)
        self._bare_json = bare_json
        self._held = held  # a grammar held the calls: an unfinished one was cut short
        self._calls_only = calls_only  # the grammar allowed no text at all (forced calls)
        self._single = single  # parallel_tool_calls false: calls after the first are dropped
        self._buffer = ""
        self._in_call = False
        self._bare = False  # the reply starts like bare JSON: held until the end
        self._started = False  # a non-whitespace character was seen
        self._after_call = False  # whitespace right after a call is dropped
        self._held_space = ""
        self.num_calls = 0

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while not self._bare:
            if not self._in_call:
                if not self._started:
                    stripped = self._buffer.lstrip()
                    if not stripped:
                        break
                    self._started = True
                    if self._bare_json and stripped[0] in "{[":
                        self._bare = True
                        break
                at = self._buffer.find(OPEN)
                if at < 0:
                    keep = partial_tag(self._buffer)
                    self._content(self._buffer[: len(self._buffer) - keep], events)
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                self._content(self._buffer[:at], events)
                self._buffer = self._buffer[at + len(OPEN):]
                self._in_call = True
            at = self._buffer.find(CLOSE)
            if at < 0:
                break
            body, self._buffer = self._buffer[:at], self._buffer[at + len(CLOSE):]
            self._in_call = False
            self._block(body, events, closed=True)
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        rest, self._buffer = self._buffer, ""
        if self._bare:
            calls = self._bare_calls(rest)[:1 if self._single else None]
            if calls:
                events.extend(calls)
                self.num_calls += len(calls)
            else:
                self._content(rest, events)
        elif self._in_call:
            # A call cut short: its JSON may be whole, its closing tag begun ("}\n</").
            stripped = rest.rstrip()
            whole = stripped[: len(stripped) - partial_tag(stripped, CLOSE)]
            if self._call(whole) is not None:
                self._block(whole, events, closed=False)
            elif not self._held:  # unheld, what the model wrote stays (as content)
                self._block(rest, events, closed=False)
        elif not (self._held and (self._calls_only or self.num_calls) and rest.strip() and OPEN.startswith(rest.strip())):
            # Where the grammar let no text be written (forced calls, or after a held call),
            # the start of a call's tag is a call cut short and goes with it; text that ends
            # in "<" under "tagged" stays text.
            self._content(rest, events)
        if self.num_calls == 0 and self._held_space:
            events.append(self._held_space)
        self._held_space = ""
        return events

    def _content(self, text: str, events: list[Event]) -> None:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        text = self._held_space + text
        body = text.rstrip()
        self._held_space = text[len(body):]
        if body:
            events.append(body)

    def _block(self, body: str, events: list[Event], *, closed: bool) -> None:
        call = self._call(body)
        if call is None:
            self._content(OPEN + body + (CLOSE if closed else ""), events)
            return
        if self._single and self.num_calls:
            self._after_call = True  # a call the client did not allow: neither call nor content
            return
        self._held_space = ""
        self.num_calls += 1
        self._after_call = True
        events.append(call)

    def _call(self, text: str) -> ParsedCall | None:
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return self._call_of(value)

    def _call_of(self, value: Any) -> ParsedCall | None:
        if not isinstance(value, dict) or value.get("name") not in self._names:
            return None
        arguments = value.get("arguments", value.get("parameters"))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict) or set(value) - {"name", "arguments", "parameters"}:
            return None
        return ParsedCall(new_call_id(), value["name"], json.dumps(arguments, ensure_ascii=False))

    def _bare_calls(self, text: str) -> list[ParsedCall]:
        try:
            value = json.loads(text)
        except ValueError:
            return []
        items = value if isinstance(value, list) and value else [value]
        calls = [self._call_of(item) for item in items]
        return [c for c in calls if c is not None] if all(calls) else []


def partial_tag(text: str, tag: str = OPEN) -> int:
    """The length of the longest end of ``text`` that may begin ``tag`` (a streamed parser
    holds that much back until it knows)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
