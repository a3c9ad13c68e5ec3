"""Property-based fuzz of the whole API from its own OpenAPI schema (schemathesis), against
the real server and model: valid and invalid requests alike never get a 5xx, never hang,
and every answer has the documented shape (a response model, an event stream ending in
``[DONE]``, or an OpenAI error).

Half the generated requests name the served model so that valid ones reach the engine;
``max_tokens`` (``max_output_tokens`` for ``/v1/responses``) is capped at 3 there to keep
the run short on two shared cores.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from server_helpers import MODEL, LiveServer, engine_idle, wait_until

from speclane.engine.async_engine import AsyncEngine
from speclane.server.protocol import (
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
    ModelList,
)
from speclane.server.responses_protocol import ResponseObject

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 120
REQUEST_TIMEOUT_S = 60.0  # an answer slower than this is a hang
RESPONSE_MODELS: dict[str, Any] = {"/v1/chat/completions": ChatCompletionResponse,
                                   "/v1/completions": CompletionResponse, "/v1/models": ModelList,
                                   "/v1/responses": ResponseObject}
RESPONSES_END = ("event: response.completed", "event: response.incomplete", "event: response.failed")


def _shape_for_the_engine(body: Any, served: bool, path: str) -> Any:
    if not isinstance(body, dict):
        return body
    body = dict(body)
    if served:
        body["model"] = MODEL
    if path == "/v1/responses":
        limit = body.get("max_output_tokens")
        if limit is None or (isinstance(limit, int) and not isinstance(limit, bool) and limit > 3):
            body["max_output_tokens"] = 3
        return body
    for field in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(field), int) and not isinstance(body[field], bool) and body[field] > 3:
            body[field] = 3
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 3  # absent or null: the rest of the context, too slow here
    return body


def _encode(case: Any, body: Any) -> tuple[bytes | None, dict[str, str]]:
    headers = {k: v for k, v in (case.headers or {}).items() if isinstance(v, str)}
    if body is None or case.method.upper() == "GET":
        return None, headers
    headers.setdefault("content-type", case.media_type or "application/json")
    if isinstance(body, bytes):
        return body, headers
    return json.dumps(body, allow_nan=True).encode(), headers


def check_response(path: str, response: httpx.Response, streamed: bool) -> None:
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    if response.status_code >= 400:
        ErrorResponse.model_validate(response.json())
    elif path in RESPONSE_MODELS:
        if streamed and response.headers["content-type"].startswith("text/event-stream"):
            if path == "/v1/responses":
                last = response.text.rstrip().rsplit("\n\n", 1)[-1]
                assert last.startswith(RESPONSES_END), response.text[-300:]
            else:
                assert response.text.rstrip().endswith("data: [DONE]"), response.text[-300:]
        else:
            RESPONSE_MODELS[path].model_validate(response.json())


def test_fuzz_the_openapi_schema(live: LiveServer, async_engine: AsyncEngine) -> None:
    schema = schemathesis.openapi.from_dict(live.app.openapi())
    operations = [result.ok() for result in schema.get_all_operations()]
    strategy = st.one_of([op.as_strategy(mode) for op in operations
                          for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)])
    statuses: dict[int, int] = {}

    with httpx.Client(base_url=live.url, timeout=REQUEST_TIMEOUT_S) as client:

        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy, served=st.booleans())
        def request_never_breaks_the_server(case: Any, served: bool) -> None:
            path = case.formatted_path
            body = _shape_for_the_engine(case.body, served, path)
            content, headers = _encode(case, body)
            try:
                response = client.request(case.method, path, content=content, headers=headers,
                                          params=case.query or None)
            except httpx.TimeoutException:
                raise AssertionError(f"{case.method} {path} hung (no answer in {REQUEST_TIMEOUT_S:.0f} s)") from None
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            check_response(path, response, isinstance(body, dict) and body.get("stream") is True)

        request_never_breaks_the_server()

    print(f"\nfuzz: status counts {dict(sorted(statuses.items()))}")
    assert statuses.get(200, 0) > 0, "no generated request was valid: the fuzz exercised nothing"
    assert async_engine.error is None
    wait_until(lambda: engine_idle(async_engine), timeout=60, what="the engine to be idle after the fuzz")
