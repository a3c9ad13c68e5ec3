"""Shared fixtures of the HTTP server tests: one real engine, servers on free ports.

The model loads once per pytest run (``async_engine``). Each module that needs HTTP
starts its own in-process uvicorn server on that engine (``live``), so tests can look
inside the engine (KV slots, lane holders) while talking HTTP to it. The engine holds a
lane grant for a whole generation (``spec_grant_rounds=0``) so that the lane holder only
changes when the holder finishes or is aborted — what the disconnect test needs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_helpers import TEST_ENGINE_OPTIONS, LiveServer, engine_idle, wait_until

from speclane.config import EngineConfig
from speclane.engine.async_engine import AsyncEngine
from speclane.engine.engine import LLMEngine
from speclane.server.app import create_app


@pytest.fixture(scope="session")
def async_engine() -> Iterator[AsyncEngine]:
    engine = LLMEngine(EngineConfig().replace(**TEST_ENGINE_OPTIONS))
    front = AsyncEngine(engine)
    yield front
    front.shutdown()


@pytest.fixture(scope="module")
def live(async_engine: AsyncEngine) -> Iterator[LiveServer]:
    server = LiveServer(create_app(async_engine))
    yield server
    server.stop()


@pytest.fixture
def idle_after(async_engine: AsyncEngine) -> Iterator[AsyncEngine]:
    """Asserts, after the test, that the engine went back to idle (nothing leaked)."""
    yield async_engine
    wait_until(lambda: engine_idle(async_engine), timeout=120, what="the engine to be idle")
