"""Whether a tool's ``parameters`` is a JSON schema at all: its shape, not what it allows.

A tool that the reply may call freely (``tool_choice`` "auto", the default) is never
compiled into a grammar, and compiling it would refuse schemas that are fine for the
model to read but that the grammar engine does not implement (``"format": "uri"``,
``"uniqueItems"``: common in pydantic and MCP tools). A schema that is not a schema
(``"type": "nonsense"``, a ``$ref`` to nothing) is still refused on every request, as
OpenAI refuses it, rather than found when a later request forces the call. Only the
keywords that hold schemas are walked; the rest are the grammar engine's to judge when a
call is constrained (``constraints.py``).
"""

from __future__ import annotations

from typing import Any

JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
MAX_DEPTH = 100  # levels of nested schemas walked (a deeper one is refused, not recursed into)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "unevaluatedProperties", "unevaluatedItems", "additionalItems")


def shape_error(schema: Any) -> str | None:
    """The first way ``schema`` is not a JSON schema, as "where: what", else None."""
    return _walk(schema, schema, "", 0)


def _walk(schema: Any, root: Any, path: str, depth: int) -> str | None:
    where = path.rstrip(".") or "the schema"
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"{where}: a schema is an object or a boolean"
    if depth > MAX_DEPTH:
        return f"{where}: the schema nests more than {MAX_DEPTH} levels deep"
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        wrong = next((k for k in kinds if not isinstance(k, str) or k not in JSON_TYPES), None)
        if wrong is not None or not kinds:
            return f"{path}type: {repr(wrong)[:32]} is not a JSON type (one of {', '.join(JSON_TYPES)})"
    required = schema.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        return f"{path}required: a list of property names"
    ref = schema.get("$ref")
    if ref is not None:
        if not isinstance(ref, str):
            return f"{path}$ref: a string"
        if ref.startswith("#") and not _resolves(root, ref):
            return f"{path}$ref: '{ref[:64]}' points at nothing in the schema"
    for key in _SCHEMA_MAPS:
        if key in schema:
            subs = schema[key]
            if not isinstance(subs, dict):
                return f"{path}{key}: an object of schemas"
            for name, sub in subs.items():
                if error := _walk(sub, root, f"{path}{key}.{name}.", depth + 1):
                    return error
    for key in _SCHEMA_LISTS:
        if key in schema:
            subs = schema[key]
            if not isinstance(subs, list):
                return f"{path}{key}: a list of schemas"
            for index, sub in enumerate(subs):
                if error := _walk(sub, root, f"{path}{key}[{index}].", depth + 1):
                    return error
    for key in _SCHEMA_ONE:
        if key in schema:
            subs = schema[key]
            for index, sub in enumerate(subs) if key == "items" and isinstance(subs, list) else [(None, subs)]:
                at = f"{path}{key}." if index is None else f"{path}{key}[{index}]."
                if error := _walk(sub, root, at, depth + 1):
                    return error
    return None


def _resolves(root: Any, ref: str) -> bool:
    """Whether a local JSON pointer (``#/$defs/n``) names a part of ``root``."""
    node = root
    for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True
