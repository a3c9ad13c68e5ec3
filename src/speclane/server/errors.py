"""Every error the server returns, in OpenAI's shape, and the handlers that guarantee it.

A body is always ``{"error": {"message", "type", "param", "code"}}``. Handlers are
installed for our own ``APIError``, for FastAPI's validation errors (which would
otherwise be 422 with FastAPI's shape), for Starlette's HTTP errors (404 route, 405,
unparsable body) and, last, for anything unexpected (500, without internals).
Messages say what to fix; they never echo the offending input (it may be megabytes).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("speclane.server")

# status -> (OpenAI error type, default code)
_TYPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "queue_full"),
    500: ("server_error", "internal_error"),
    503: ("server_error", "shutting_down"),
}


class APIError(Exception):
    """An error to answer with ``status``; raise it anywhere in a handler."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code if code is not None else _TYPES.get(status, ("", None))[1]
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    err_type, default_code = _TYPES.get(status, ("invalid_request_error" if status < 500 else "server_error", None))
    return {"error": {"message": message, "type": err_type, "param": param,
                      "code": code if code is not None else default_code}}


# -- validation errors -> one clear message ----------------------------------------------------

# A check across fields (a model validator) names its field as the message's first word.
_NAMED_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?(?:\.[A-Za-z_][A-Za-z0-9_]*)*): ")

# Pydantic puts union members and validator names into ``loc``; they are not field names.
_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "null"}


def _param(loc: Sequence[Any], body: Any = None, *, missing: bool = False) -> str | None:
    """The field ``loc`` names, as the client wrote it. Where the request ``body`` is known,
    a name the body does not hold at that point is a union member's tag (Responses' flat
    ``text.format``, or an input item without its ``type``) and is left out, except the
    last name of a ``missing`` field's."""
    parts: list[str] = []
    previous = None
    items = list(loc[1:] if loc and loc[0] == "body" else loc)
    node = body
    for at, item in enumerate(items):
        if isinstance(item, int):
            parts.append(f"[{item}]")
            node = node[item] if isinstance(node, list) and 0 <= item < len(node) else None
            continue
        if _is_type_tag(item) or item == previous:
            # A discriminated union puts its tag before the member's fields, and OpenAI's
            # members hold their body under a field named as the tag ({"type": "json_schema",
            # "json_schema": {...}}): one name, not two.
            continue
        if isinstance(node, dict) and item not in node and not (missing and at == len(items) - 1):
            continue  # a tag: the member's fields sit in this same object
        parts.append(("." if parts else "") + str(item))
        node = node.get(item) if isinstance(node, dict) else None
        previous = item
    return "".join(parts) or None


def _is_type_tag(item: Any) -> bool:
    return isinstance(item, str) and ("[" in item or "(" in item or item.lower() in _TYPE_TAGS
                                      or item.startswith("constrained-"))


def _expected_types(errors: Sequence[Mapping[str, Any]], param: str | None, body: Any = None) -> str | None:
    """For a value that matched no member of a union: "a string or a list"."""
    names: list[str] = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        if _param(loc, body) != param or not err.get("type", "").endswith("_type"):
            continue
        tag = next((item for item in reversed(loc) if _is_type_tag(item)), None)
        if tag is None:
            return None
        tag = tag.removeprefix("constrained-")
        name = "a list" if tag.startswith("list") else "an object" if tag.startswith("dict") else {
            "str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean"}.get(tag, tag)
        if name not in names:
            names.append(name)
    return " or ".join(names) if len(names) > 1 else None


def _first_meaningful(errors: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """Within a union, a value error (too long, below minimum) tells more than "not a string"."""
    for err in errors:
        if not err.get("type", "").endswith("_type"):
            return err
    return errors[0]


def validation_message(errors: Sequence[Mapping[str, Any]], body: Any = None) -> tuple[str, str | None]:
    """(message, param) for the most telling of pydantic's errors; the rest are counted.
    ``body``, the request as sent, lets a param leave out the union tags it does not hold."""
    if not errors:
        return "the request is invalid", None
    err = _first_meaningful(errors)
    kind = err.get("type", "")
    loc = tuple(err.get("loc", ()))
    param = _param(loc, body, missing=kind == "missing")
    ctx = err.get("ctx") or {}
    if kind == "json_invalid":
        pos = loc[1] if len(loc) > 1 else "?"
        reason = str(ctx.get("error", "decode error")).removesuffix(" at")  # the parser's own ends in "at"
        return f"the body is not valid JSON ({reason} at character {pos})", None
    if kind == "missing" and param is None:
        return "the request body is missing: send a JSON object", None
    if kind in ("model_attributes_type", "dict_type", "model_type") and param is None:
        return "the request body must be a JSON object", None
    if kind == "extra_forbidden":
        message = (f"unsupported field '{param}': this server does not read it, so it is refused rather than "
                   "ignored; remove it (docs/api.md lists the fields it reads)")
    elif kind == "literal_error" and param is not None and param.endswith(".type"):
        # A content part or item of a kind this server does not take (an image, audio, a
        # refusal part): say so, not only which kinds it does take.
        message = f"{param}: '{str(err.get('input'))[:64]}' is not supported here (expected {ctx.get('expected')})"
    elif kind == "missing":
        message = f"'{param}' is required"
    elif kind == "value_error":
        message = f"{param}: {ctx.get('error', err.get('msg', 'invalid value'))}" if param else str(
            ctx.get("error", err.get("msg")))
        if param is None and (named := _NAMED_FIELD.match(message)):
            param = named.group(1)
    elif (expected := _expected_types(errors, param, body)) is not None:
        return f"{param}: the value should be {expected}", param
    else:
        message = f"{param}: {err.get('msg', 'invalid value')}" if param else str(err.get("msg", "invalid value"))
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return message, param


# -- handlers --------------------------------------------------------------------------------


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    if request.method == "POST" and not _is_json(request.headers.get("content-type")):
        return APIError(400, "the body must be JSON sent with the header 'Content-Type: application/json'").response()
    message, param = validation_message(exc.errors(), getattr(exc, "body", None))
    return APIError(400, message, param=param).response()


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status == 404:
        message = f"no route {request.method} {request.url.path}: see GET /v1/models and POST /v1/chat/completions"
    elif status == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    elif status == 400:
        message = ("the body could not be parsed: send one JSON object, in UTF-8 and uncompressed (no "
                   "Content-Encoding)")
    else:
        message = str(exc.detail)
    headers = dict(exc.headers or {})
    return APIError(status, message, headers=headers).response()


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return APIError(500, "internal server error; the request was not completed").response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
