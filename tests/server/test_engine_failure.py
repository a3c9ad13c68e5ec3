"""An engine whose tick raises, behind a live server: every client hears it (a 500 naming
the engine's error, or an error event on a stream), none hangs, and new requests get 503;
a replica's engine that raises ends its process for Ray to restart it."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import MODEL, TEST_ENGINE_OPTIONS, LiveServer, wait_until

from speclane.cluster.replica import ReplicaHost
from speclane.config import EngineConfig
from speclane.engine.async_engine import AsyncEngine
from speclane.engine.engine import LLMEngine
from speclane.request import SamplingParams
from speclane.server.app import create_app

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 400, "temperature": 0}


class FailingEngine(LLMEngine):
    """Ticks normally until ``fail`` is set, then raises from its next tick."""

    fail = threading.Event()

    def step(self) -> list[Any]:
        if self.fail.is_set():
            raise RuntimeError("simulated kernel fault")
        return super().step()


@pytest.fixture
def failing(async_engine: AsyncEngine) -> Iterator[tuple[LiveServer, FailingEngine]]:
    shared = async_engine.engine
    engine = FailingEngine.from_parts(shared.config, shared.model, shared.tokenizer)
    front = AsyncEngine(engine)
    server = LiveServer(create_app(front))
    yield server, engine
    server.stop()
    front.shutdown()


def test_a_failing_engine_answers_every_client_then_refuses_new_requests(
        failing: tuple[LiveServer, FailingEngine]) -> None:
    server, engine = failing
    plain: dict[str, Any] = {}
    events: list[str] = []
    streaming = threading.Event()

    def post() -> None:
        response = httpx.post(server.url + "/v1/chat/completions", json=BODY, timeout=60)
        plain["status"], plain["body"] = response.status_code, response.json()

    def stream() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json={**BODY, "stream": True},
                          timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) >= 2:
                        streaming.set()

    threads = [threading.Thread(target=post), threading.Thread(target=stream)]
    for thread in threads:
        thread.start()
    assert streaming.wait(60), "the stream started"
    wait_until(lambda: engine.scheduler.num_running == 2, timeout=30, what="both requests to run")
    engine.fail.set()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a client was left hanging"
    assert plain["status"] == 500, plain
    assert plain["body"]["error"]["code"] == "engine_stopped" and "simulated kernel fault" in plain["body"]["error"]["message"]
    assert events[-1] == "[DONE]" and "simulated kernel fault" in json.loads(events[-2])["error"]["message"]
    after = httpx.post(server.url + "/v1/chat/completions", json=BODY, timeout=30)
    assert after.status_code == 503 and after.json()["error"]["code"] == "engine_stopped", after.text


def test_a_replica_whose_engine_fails_ends_its_process_for_ray_to_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a Ray actor (``exit_on_engine_failure``) the replica exits (Ray restarts it; the
    front finds it dead and runs its requests that sent nothing elsewhere); in-process it
    fails its live requests and refuses new ones."""
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    for exiting in (True, False):
        host = ReplicaHost(EngineConfig().replace(**TEST_ENGINE_OPTIONS), exit_on_engine_failure=exiting)
        try:
            monkeypatch.setattr(host.engine, "step", lambda: (_ for _ in ()).throw(RuntimeError("simulated fault")))
            host.add("r", [1, 2, 3], SamplingParams(max_tokens=4), {})
            if exiting:
                wait_until(lambda: exits == [70], timeout=10, what="the replica to exit")
                continue
            reply = host.poll(wait_s=5)
            assert [(o.request_id, o.finish_reason) for o in reply.outputs] == [("r", "error")]
            assert "simulated fault" in reply.outputs[0].error
            with pytest.raises(RuntimeError, match="engine stopped"):
                host.add("s", [1, 2, 3], SamplingParams(max_tokens=4), {})
        finally:
            host.shutdown()
    assert exits == [70]
