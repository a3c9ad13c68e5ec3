"""``cache_scope`` against a real server: a tenant's prefix cache is its own; the global
scope is shared by every request that asks for it, and with API keys only keys granted
``may_share_prefix_cache`` may ask (403 otherwise)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import MODEL, LiveServer, keyed_server

from speclane.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.slow

KEYS_TOML = """
[[keys]]
key = "sk-shop-a"
tenant = "shop-a"
may_share_prefix_cache = true

[[keys]]
key = "sk-shop-b"
tenant = "shop-b"
may_share_prefix_cache = true

[[keys]]
key = "sk-guest"
tenant = "guest"
"""


@pytest.fixture(scope="module")
def keyed(async_engine: AsyncEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = keyed_server(async_engine, KEYS_TOML, tmp_path_factory.mktemp("keys"))
    yield server
    server.stop()


def system_prompt() -> str:
    """A prompt of several full KV blocks no other test has sent."""
    return f"[{uuid.uuid4().hex}] You are the help desk of a hardware shop. " + " ".join(
        f"Rule {i}: answer in one short sentence." for i in range(12))


def chat(server: LiveServer, system: str, *, key: str | None = None, **fields: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + "/v1/chat/completions", headers=headers, timeout=120, json={
        "model": MODEL, "max_tokens": 6, "temperature": 0, **fields,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Do you sell drills?"}]})


def cached(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def reads_none_of_this_prompt(response: httpx.Response) -> bool:
    """At most the chat template's opening tokens (before the system prompt's unique id) came
    from the cache: any earlier request of the same scope shares them, as part of a block."""
    return cached(response) < 16


def text(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"]


def test_global_scope_is_shared_between_keys_allowed_it(keyed: LiveServer) -> None:
    system = system_prompt()
    first = chat(keyed, system, key="sk-shop-a", cache_scope="global")
    assert reads_none_of_this_prompt(first)
    shared = chat(keyed, system, key="sk-shop-b", cache_scope="global")
    assert cached(shared) >= 64, "another tenant's global-scope request reads the shared blocks"
    assert text(shared) == text(first)
    own = chat(keyed, system, key="sk-shop-b")
    assert reads_none_of_this_prompt(own), "the tenant scope does not read the global scope's blocks"
    assert text(own) == text(first)
    assert cached(chat(keyed, system, key="sk-shop-b")) == cached(shared), "now shop-b's own scope has them"


def test_tenant_scope_is_not_read_by_another_tenant(keyed: LiveServer) -> None:
    system = system_prompt()
    assert reads_none_of_this_prompt(chat(keyed, system, key="sk-shop-a"))
    assert cached(chat(keyed, system, key="sk-shop-a")) >= 64
    assert reads_none_of_this_prompt(chat(keyed, system, key="sk-shop-b")), "tenant B with tenant A's exact prefix hits nothing"
    assert reads_none_of_this_prompt(chat(keyed, system, key="sk-shop-b", cache_scope="global")), (
        "a tenant's own blocks are not in the global scope")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_key_without_permission_gets_403(keyed: LiveServer, path: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "cache_scope": "global", "max_tokens": 1,
                            "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/responses":
        body = {"model": MODEL, "cache_scope": "global", "max_output_tokens": 16, "input": "hi"}
    response = httpx.post(keyed.url + path, json=body, headers={"Authorization": "Bearer sk-guest"}, timeout=60)
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "cache_scope_not_allowed" and error["param"] == "cache_scope"
    assert error["type"] == "permission_error"


def test_unknown_scope_is_400(live: LiveServer) -> None:
    response = chat(live, "hi", cache_scope="everyone")
    assert response.status_code == 400, response.text
    assert "cache_scope" in response.text


def test_without_keys_any_user_may_share(live: LiveServer) -> None:
    system = system_prompt()
    first = chat(live, system, user="desk-1", cache_scope="global")
    assert reads_none_of_this_prompt(first)
    second = chat(live, system, user="desk-2", cache_scope="global")
    assert cached(second) >= 64 and text(second) == text(first)
    assert reads_none_of_this_prompt(chat(live, system, user="desk-2"))
