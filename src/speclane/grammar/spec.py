"""What a request's output must match, as plain data (no grammar engine here).

A ``GrammarSpec`` is the request-side description: a JSON schema, "any JSON object", a
regular expression, one of a list of strings, or a Lark grammar (llguidance's dialect,
which can embed JSON schemas with ``%json``). Its ``key`` is the compact text of the
grammar, so the compiler's cache holds one entry per distinct grammar. A schema keeps
its clients' key order: properties are generated in the order the schema lists them.

An object that lists its ``properties`` and says nothing of others is closed to them
(``closed_objects``), as vLLM (xgrammar's strict mode), llama.cpp and OpenAI's strict mode
generate it: JSON Schema allows any other key there, and a model given that room writes
keys no one asked for (Pydantic and LangChain leave ``additionalProperties`` out, so their
schemas are open as written). Where an object's properties join others' (``allOf``,
``anyOf`` or ``oneOf`` beside them, a ``$ref`` beside them or into an ``allOf``, a
``required`` key it does not list), it stays as written: closed, it would refuse the
keys the other part brings.
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
_SPEAKS_OF_OTHERS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_JOINING = ("allOf", "anyOf", "oneOf", "$ref")  # beside properties: another schema's properties join them


def closed_objects(schema: Any) -> Any:
    """``schema`` with ``"additionalProperties": false`` on each object schema that lists
    ``properties``, says nothing of others (``_SPEAKS_OF_OTHERS``) and whose properties
    join no other schema's (module docstring)."""
    if not isinstance(schema, dict):
        return schema
    joined: set[str] = set()
    _joined_refs(schema, joined)
    return _close(schema, "#", joining=False, joined=joined)


def _joined_refs(node: Any, out: set[str]) -> None:
    """The ``$ref`` targets whose properties join another schema's: a ``$ref`` beside
    ``properties``, in an ``allOf``, or in an ``anyOf``/``oneOf`` beside ``properties``."""
    if isinstance(node, list):
        for item in node:
            _joined_refs(item, out)
        return
    if not isinstance(node, dict):
        return
    listed = isinstance(node.get("properties"), dict)
    if listed and isinstance(node.get("$ref"), str):
        out.add(node["$ref"])
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(node.get(key), list) and (key == "allOf" or listed):
            out.update(item["$ref"] for item in node[key] if isinstance(item, dict) and isinstance(item.get("$ref"), str))
    for value in node.values():
        _joined_refs(value, out)


def _close(node: Any, path: str, *, joining: bool, joined: set[str]) -> Any:
    """``joining``: this schema's properties join another's (an ``allOf`` branch, a branch
    beside its parent's properties, a joined ``$ref``'s target)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    properties = out.get("properties")
    listed = isinstance(properties, dict)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = _close(out[key], f"{path}/{key}", joining=False, joined=joined)
    for key in _LIST:
        if isinstance(out.get(key), list):
            branch_joins = key == "allOf" or (key in ("anyOf", "oneOf") and listed)
            out[key] = [_close(item, f"{path}/{key}/{i}", joining=branch_joins, joined=joined)
                        for i, item in enumerate(out[key])]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: _close(sub, f"{path}/{key}/{name}", joining=f"{path}/{key}/{name}" in joined, joined=joined)
                        for name, sub in out[key].items()}
    required = out.get("required", [])
    closable = (listed and not joining and not any(key in out for key in (*_SPEAKS_OF_OTHERS, *_JOINING))
                and isinstance(required, list) and all(name in properties for name in required))
    if closable:
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
