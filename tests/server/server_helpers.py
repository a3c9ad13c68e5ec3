"""Helpers of the HTTP server tests: a live in-process server, waiting, idleness."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from speclane.engine.async_engine import AsyncEngine
from speclane.server.app import create_app
from speclane.server.lifecycle import DrainingServer

MODEL = "smollm2-135m-instruct"
MAX_MODEL_LEN = 1024
# One torch thread: two shared cores (see tests/conftest.py); a grant lasts a whole generation.
TEST_ENGINE_OPTIONS: dict[str, Any] = {"max_model_len": MAX_MODEL_LEN, "spec_grant_rounds": 0, "num_threads": 1}


class LiveServer:
    """An app served by uvicorn in a thread, on a free port of 127.0.0.1."""

    def __init__(self, app: Any, *, grace_s: float = 30.0) -> None:
        self.app = app
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5)
        self.server = DrainingServer(config, app.state.tracker, grace_s)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True,
                                       name=f"uvicorn-{self.port}")
        self.thread.start()
        wait_until(lambda: self.server.started, timeout=30, what="uvicorn to start")

    @property
    def tracker(self) -> Any:
        return self.app.state.tracker

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


def keyed_server(async_engine: AsyncEngine, keys_toml: str, folder: Path) -> LiveServer:
    """A live server of ``async_engine`` with the API keys of ``keys_toml`` (written into ``folder``)."""
    path = folder / "keys.toml"
    path.write_text(keys_toml)
    return LiveServer(create_app(async_engine, api_keys=path))


def wait_until(predicate: Callable[[], bool], *, timeout: float = 60.0, interval: float = 0.05,
               what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def engine_idle(async_engine: AsyncEngine) -> bool:
    """Nothing left anywhere: KV pool full, no requests, empty lane, no open streams."""
    engine = async_engine.engine
    s = engine.scheduler
    return (s.kv.num_holders == 0 and s.num_running == 0 and s.num_waiting == 0 and s.lane.num_holders == 0
            and s.lane.num_waiters == 0 and async_engine.num_streams == 0 and not engine.has_unfinished())
