"""What a request's output must match: ``response_format``, vLLM's ``structured_outputs``
or its older ``guided_*`` fields, and tool calls (``tools.py``), as one grammar.

``request_grammar`` runs in the worker thread that tokenizes the request: compiling a
new grammar costs its own client the time, never the engine's tick. A grammar the engine
cannot compile (a malformed schema, an unsupported keyword, a bad regex) is a 400 that
names the field and the problem.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speclane.grammar.compiler import CompiledGrammar
from speclane.grammar.spec import GrammarSpec
from speclane.server.errors import APIError
from speclane.server.protocol import ChatCompletionRequest, CompletionRequest, NamedToolChoice, Tool
from speclane.server.tool_grammar import (
    Thinking,
    opened_calls_grammar,
    strict_tools,
    tool_call_grammar,
)
from speclane.server.tools import ANY_OBJECT

Compile = Callable[[GrammarSpec], CompiledGrammar]


@dataclass(frozen=True)
class OutputGrammar:
    compiled: CompiledGrammar
    free_text_first: bool = False  # strict tools' calls under "auto": the text is free until a call opens


@dataclass(frozen=True)
class Constraint:
    param: str  # the field it came from
    spec: GrammarSpec
    schema: dict[str, Any] | bool | None = None  # the JSON schema, for the JSON kinds


def output_constraint(request: ChatCompletionRequest | CompletionRequest) -> Constraint | None:
    """The request's one output constraint (protocol.py allows at most one), or None."""
    fields = request.constraint_fields
    if not fields:
        return None
    param = fields[0]
    try:
        return _constraint(request, param)
    except ValueError as exc:
        raise APIError(400, f"{param}: {exc}", param=param) from None


def _json(param: str, value: dict[str, Any] | bool | str) -> Constraint:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"the schema is not valid JSON ({exc})") from None
        if not isinstance(value, dict | bool):
            raise ValueError("the schema must be a JSON object (or true/false)")
    return Constraint(param, GrammarSpec.json_schema(value), value)


def _constraint(request: ChatCompletionRequest | CompletionRequest, param: str) -> Constraint:
    if param == "response_format":
        fmt = request.response_format
        if fmt is not None and fmt.type == "json_schema":
            schema = fmt.json_schema.schema_  # type: ignore[union-attr]
            if schema is not None:
                return Constraint(param, GrammarSpec.json_schema(schema), schema)
        return Constraint(param, GrammarSpec.json_object(), ANY_OBJECT)
    if param == "structured_outputs":
        so = request.structured_outputs
        assert so is not None
        kind = so.kind
        if kind == "json":
            return _json(param, so.json_)  # type: ignore[arg-type]
        if kind == "json_object":
            return Constraint(param, GrammarSpec.json_object(), ANY_OBJECT)
        if kind == "regex":
            return Constraint(param, GrammarSpec.regex(so.regex or ""))
        if kind == "choice":
            return Constraint(param, GrammarSpec.choice(list(so.choice or ())))
        return Constraint(param, GrammarSpec.lark(so.grammar or ""))
    if param == "guided_json":
        return _json(param, request.guided_json)  # type: ignore[arg-type]
    if param == "guided_regex":
        return Constraint(param, GrammarSpec.regex(request.guided_regex or ""))
    if param == "guided_choice":
        return Constraint(param, GrammarSpec.choice(list(request.guided_choice or ())))
    return Constraint(param, GrammarSpec.lark(request.guided_grammar or ""))


def request_grammar(request: ChatCompletionRequest | CompletionRequest, compile_grammar: Compile, *,
                    tagged_calls: Thinking | None = None) -> OutputGrammar | None:
    """The grammar the output must match, or None when it is free.

    ``tagged_calls``: where the model writes calls in ``<tool_call>`` blocks, how its reply
    may think first; "auto" with strict tools then holds the calls it opens. None: the
    model's calls take another form, which "auto" leaves free (and parses as it comes)."""
    constraint = output_constraint(request)
    mode = request.tool_mode if isinstance(request, ChatCompletionRequest) else "none"
    if mode == "none":
        return None if constraint is None else OutputGrammar(_compile(compile_grammar, constraint.spec, constraint.param))
    assert isinstance(request, ChatCompletionRequest) and request.tools
    tools = request.tools
    if mode == "named":
        assert isinstance(request.tool_choice, NamedToolChoice)
        tools = [t for t in tools if t.function.name == request.tool_choice.function.name]
    elif mode == "auto":
        if constraint is None:
            if tagged_calls is None or not strict_tools(tools):
                return None
            _compile_parameters(request.tools, compile_grammar, lambda tool: bool(tool.function.strict))
            lark = opened_calls_grammar(tools, parallel=request.parallel_tool_calls is not False, thinking=tagged_calls)
            return OutputGrammar(_compile(compile_grammar, lambda: GrammarSpec.lark(lark), "tools"), free_text_first=True)
        if constraint.schema is None:
            raise APIError(400, f"{constraint.param}: with tools offered (tool_choice 'auto'), only a JSON "
                                "constraint can apply (the reply is a call or the JSON); send tool_choice 'none' "
                                "to constrain the reply alone", param=constraint.param)
    _compile_parameters(request.tools, compile_grammar, lambda tool: tool in tools)
    answer = constraint.schema if constraint is not None else None
    lark = tool_call_grammar(tools, parallel=request.parallel_tool_calls is not False, answer=answer)
    return OutputGrammar(_compile(compile_grammar, lambda: GrammarSpec.lark(lark), constraint.param if constraint else "tools"))


def _compile_parameters(tools: list[Tool], compile_grammar: Compile, held: Callable[[Tool], bool]) -> None:
    """Compile each ``held`` tool's ``parameters`` alone, so a keyword the engine cannot
    enforce is a 400 naming that tool, never a looser constraint."""
    for index, tool in enumerate(tools):
        if held(tool) and tool.function.parameters is not None:
            params = tool.function.parameters
            _compile(compile_grammar, lambda params=params: GrammarSpec.json_schema(params),  # type: ignore[misc]
                     f"tools[{index}].function.parameters")


def _compile(compile_grammar: Compile, spec: Callable[[], GrammarSpec] | GrammarSpec, param: str) -> CompiledGrammar:
    try:
        return compile_grammar(spec if isinstance(spec, GrammarSpec) else spec())
    except ValueError as exc:  # GrammarError, or a spec too long
        raise APIError(400, f"{param}: {exc}", param=param) from None
