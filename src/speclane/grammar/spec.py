"""What a request's output must match, as plain data (no grammar engine here).

A ``GrammarSpec`` is the request-side description: a JSON schema, "any JSON object", a
regular expression, one of a list of strings, or a Lark grammar (llguidance's dialect,
which can embed JSON schemas with ``%json``). Its ``key`` is the compact text of the
grammar, so the compiler's cache holds one entry per distinct grammar. A schema keeps
its clients' key order: properties are generated in the order the schema lists them.

An object that lists its ``properties`` and says nothing of others is closed to them
(``closed_objects``), as vLLM (xgrammar's strict mode), llama.cpp and OpenAI's strict mode
generate it: JSON Schema would allow any other key, and a small model fills that room
(a weather tool's arguments gained a ``"temperature"``; a three-field answer ran on in
fields of its own to ``max_tokens``). Pydantic and LangChain leave ``additionalProperties``
out, so their schemas would otherwise be open.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

GrammarKind = Literal["json_schema", "json_object", "regex", "choice", "lark"]
MAX_GRAMMAR_CHARS = 200_000

# Where a schema holds schemas: one, a list of them, or a map from names to them.
_ONE = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPENING = ("additionalProperties", "patternProperties", "unevaluatedProperties")  # what says others may come


def closed_objects(schema: Any) -> Any:
    """``schema`` with ``"additionalProperties": false`` on each object schema that lists
    ``properties`` and none of ``_OPENING`` (module docstring). A schema with ``allOf`` anywhere
    is left as it is: its branches' properties add up, and one closed to its own would
    refuse the others'."""
    if not isinstance(schema, dict) or '"allOf"' in json.dumps(schema):
        return schema
    return _close(schema)


def _close(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = _close(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [_close(item) for item in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: _close(sub) for name, sub in out[key].items()}
    if isinstance(out.get("properties"), dict) and not any(key in out for key in _OPENING):
        out["additionalProperties"] = False
    return out


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    source: str  # the grammar's text: compact JSON, the regex, the choices as a JSON list, the Lark text

    def __post_init__(self) -> None:
        if len(self.source) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"the {self.kind} grammar has {len(self.source)} characters; at most "
                             f"{MAX_GRAMMAR_CHARS} are accepted")

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.source)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool) -> GrammarSpec:
        if not isinstance(schema, dict | bool):
            raise ValueError(f"a JSON schema is an object (or true/false); got {type(schema).__name__}")
        return cls("json_schema", json.dumps(closed_objects(schema), separators=(",", ":"), ensure_ascii=False))

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object", '{"type":"object"}')

    @classmethod
    def regex(cls, pattern: str) -> GrammarSpec:
        if not pattern:
            raise ValueError("the regex is empty")
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: list[str]) -> GrammarSpec:
        if not options or not all(isinstance(o, str) and o for o in options):
            raise ValueError("choice needs a non-empty list of non-empty strings")
        return cls("choice", json.dumps(list(options), ensure_ascii=False))

    @classmethod
    def lark(cls, grammar: str) -> GrammarSpec:
        if not grammar.strip():
            raise ValueError("the grammar is empty")
        return cls("lark", grammar)
