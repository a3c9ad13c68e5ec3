"""A schema is compiled once, and never on the engine's thread: the server compiles it in
the worker thread that tokenizes the request, and later requests with the same schema
take it from the cache."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest
from server_helpers import MODEL, LiveServer

from speclane.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.slow


def test_a_schema_compiles_once_off_the_engine_thread(live: LiveServer, async_engine: AsyncEngine, idle_after,
                                                       monkeypatch: pytest.MonkeyPatch):
    engine = async_engine.engine
    compiler = engine.grammars
    threads: list[str] = []
    original = type(compiler)._build

    def spy(self, spec):
        threads.append(threading.current_thread().name)
        return original(self, spec)

    monkeypatch.setattr(type(compiler), "_build", spy)
    # A property name no other test uses, so the first request compiles it here.
    key = f"k{uuid.uuid4().hex[:8]}"
    schema = {"type": "object", "properties": {key: {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": [key], "additionalProperties": False}
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": "A digit?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "digit", "schema": schema}}}
    misses, hits = compiler.misses, compiler.hits
    for _ in range(3):
        reply = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert key in reply.json()["choices"][0]["message"]["content"]
    assert compiler.misses == misses + 1 and compiler.hits >= hits + 2
    # Neither the engine's tick nor the event loop (uvicorn's thread) waits on a compile.
    assert threads and all(name not in ("speclane-engine", live.thread.name) for name in threads), threads
