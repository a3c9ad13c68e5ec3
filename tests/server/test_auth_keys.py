"""API keys against a real server: 401 for a missing or unknown key, 403 for a priority
beyond the key's allowance, and the tenant and weight taken from the key, never the body.
Without keys the tenant is ``user``, else ``anonymous``."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import MODEL, LiveServer, keyed_server

from speclane.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.slow

KEYS_TOML = """
[[keys]]
key = "sk-gold"
tenant = "gold"
weight = 3.0
most_urgent_priority = -5

[[keys]]
key = "sk-basic"
tenant = "basic"
"""


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}


@pytest.fixture(scope="module")
def keyed(async_engine: AsyncEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = keyed_server(async_engine, KEYS_TOML, tmp_path_factory.mktemp("keys"))
    yield server
    server.stop()


@pytest.fixture
def added(async_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the server passed to ``engine.add_request`` (tenant, weight, priority, ...)."""
    engine = async_engine.engine
    calls: list[dict[str, Any]] = []
    original = engine.add_request

    def spy(request_id: str, prompt_token_ids: Any, sampling: Any = None, **options: Any) -> Any:
        calls.append(options)
        return original(request_id, prompt_token_ids, sampling, **options)

    monkeypatch.setattr(engine, "add_request", spy)
    return calls


def post(server: LiveServer, key: str | None, **fields: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + "/v1/chat/completions", json=body(**fields), headers=headers, timeout=60)


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize("authorization", [None, "Bearer sk-nope", "Bearer", "Basic c2stZ29sZA==", "sk-gold"])
def test_missing_or_unknown_key_is_401(keyed: LiveServer, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    response = httpx.post(keyed.url + "/v1/chat/completions", json=body(), headers=headers, timeout=60)
    error = error_of(response, 401)
    assert error["code"] == "invalid_api_key"
    assert response.headers["www-authenticate"] == "Bearer"
    assert error_of(httpx.get(keyed.url + "/v1/models", headers=headers), 401)


def test_key_is_checked_before_the_body(keyed: LiveServer) -> None:
    assert error_of(post(keyed, None, max_tokens=0), 401)


def test_health_metrics_and_version_need_no_key(keyed: LiveServer) -> None:
    assert httpx.get(keyed.url + "/health").status_code == 200
    assert httpx.get(keyed.url + "/metrics").status_code == 200
    version = httpx.get(keyed.url + "/version")
    assert version.status_code == 200 and version.json() == {"version": importlib.metadata.version("speclane")}


def test_priority_beyond_the_allowance_is_403(keyed: LiveServer, added: list[dict[str, Any]]) -> None:
    error = error_of(post(keyed, "sk-basic", priority=-1), 403)
    assert error["param"] == "priority" and error["code"] == "priority_not_allowed"
    assert "0" in error["message"]
    error_of(post(keyed, "sk-gold", priority=-6), 403)
    assert added == [], "a refused request must not reach the engine"
    assert post(keyed, "sk-gold", priority=-5).status_code == 200
    assert post(keyed, "sk-basic", priority=0).status_code == 200
    assert post(keyed, "sk-basic", priority=7).status_code == 200
    assert [c["priority"] for c in added] == [-5, 0, 7]


def test_tenant_and_weight_come_from_the_key(keyed: LiveServer, added: list[dict[str, Any]]) -> None:
    assert post(keyed, "sk-gold", user="mallory").status_code == 200
    assert post(keyed, "sk-basic", user="gold").status_code == 200
    assert [(c["tenant"], c["tenant_weight"]) for c in added] == [("gold", 3.0), ("basic", 1.0)]
    models = httpx.get(keyed.url + "/v1/models", headers={"Authorization": "Bearer sk-basic"})
    assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL


def test_without_keys_the_tenant_is_the_user(live: LiveServer, added: list[dict[str, Any]]) -> None:
    assert post(live, None, user="alice").status_code == 200
    assert post(live, None).status_code == 200
    assert post(live, "sk-anything", priority=-100).status_code == 200, "no keys: any priority"
    assert post(live, None, safety_identifier="bob", prompt_cache_key="k", prompt_cache_retention="24h").status_code \
        == 200, "OpenAI's newer end-user id names the tenant too; the cache hints are accepted"
    assert post(live, None, user="alice", safety_identifier="bob").status_code == 200
    assert [c["tenant"] for c in added] == ["alice", "anonymous", "anonymous", "bob", "alice"]
    assert all(c["tenant_weight"] == 1.0 for c in added)
    responses = httpx.post(live.url + "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 1,
                                                             "safety_identifier": "carol", "prompt_cache_key": "k"})
    assert responses.status_code == 200 and added[-1]["tenant"] == "carol"
