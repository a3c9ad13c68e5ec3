"""``/metrics`` after real traffic: every name docs/api.md lists, in Prometheus text format,
with values that moved (tokens per tenant, lane grants, latency histograms)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import MODEL, LiveServer

from speclane.engine.async_engine import AsyncEngine
from speclane.scheduler.counts import OTHER_TENANTS

pytestmark = pytest.mark.slow

GAUGES = ["speclane_requests_running", "speclane_requests_waiting", "speclane_spec_lane_holders",
          "speclane_spec_lane_waiting"]
COUNTERS = ["speclane_spec_rounds", "speclane_spec_draft_tokens", "speclane_spec_accepted_tokens",
            "speclane_spec_grants", "speclane_spec_yields", "speclane_spec_preemptions",
            "speclane_generated_tokens"]
HISTOGRAMS = ["speclane_time_to_first_token_seconds", "speclane_inter_token_latency_seconds",
              "speclane_spec_wait_seconds", "speclane_tick_seconds"]


def scrape(url: str) -> dict[str, Any]:
    """family name -> {(sample name, labels): value}, and "<name>:type" -> its type."""
    response = httpx.get(url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families: dict[str, Any] = {}
    for family in text_string_to_metric_families(response.text):
        families[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
        families[family.name + ":type"] = family.type
    return families


def test_contract_metrics_after_traffic(live: LiveServer, idle_after: AsyncEngine) -> None:
    before = scrape(live.url)
    for tenant in ("metrics-a", "metrics-b"):
        response = httpx.post(live.url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Repeat: one two one two one two"}],
            "max_tokens": 8, "temperature": 0, "user": tenant})
        assert response.status_code == 200
    after = scrape(live.url)

    for name in GAUGES:
        assert after[name + ":type"] == "gauge", name
        assert after[name][(name, ())] == 0.0, f"{name} is 0 when idle"
    for name in COUNTERS:
        assert after[name + ":type"] == "counter", name
    for name in HISTOGRAMS:
        assert after[name + ":type"] == "histogram", name

    generated = after["speclane_generated_tokens"]
    for tenant in ("metrics-a", "metrics-b"):
        key = ("speclane_generated_tokens_total", (("tenant", tenant),))
        assert generated[key] > 0, f"tokens of {tenant} are counted under its tenant label"
    assert after["speclane_spec_grants"][("speclane_spec_grants_total", ())] \
        >= before["speclane_spec_grants"][("speclane_spec_grants_total", ())] + 2
    rounds = after["speclane_spec_rounds"]
    assert rounds.get(("speclane_spec_rounds_total", (("tenant", "metrics-a"),)), 0) > 0

    def count(name: str) -> float:
        return after[name][(name + "_count", ())] - before[name].get((name + "_count", ()), 0)

    assert count("speclane_time_to_first_token_seconds") == 2
    assert count("speclane_inter_token_latency_seconds") >= 2
    assert count("speclane_tick_seconds") >= 8
    assert count("speclane_spec_wait_seconds") == 2


def test_tenants_past_the_series_cap_are_counted_together(live: LiveServer, idle_after: AsyncEngine) -> None:
    """Without API keys a tenant is the client's ``user``: once the per-tenant counters name
    as many tenants as they may, a new tenant's tokens and rounds go under ``_other``, and
    no series of its own appears (the scrape and the counters' memory stay bounded)."""
    engine = idle_after.engine
    names = engine.scheduler.tenant_names
    assert engine.counters.generated_by_tenant.names is names, "the engine's tallies share the scheduler's names"
    cap = names.cap
    before = scrape(live.url)
    try:
        names.cap = len(names._named)  # full as it is: the next new tenant is one too many
        for tenant in ("past-cap-a", "past-cap-b"):
            response = httpx.post(live.url + "/v1/chat/completions", timeout=120, json={
                "model": MODEL, "messages": [{"role": "user", "content": "Repeat: one two one two one two"}],
                "max_tokens": 8, "temperature": 0, "user": tenant})
            assert response.status_code == 200
            assert response.json()["usage"]["completion_tokens"] > 0
        after = scrape(live.url)
    finally:
        names.cap = cap
    for family in ("speclane_generated_tokens", "speclane_spec_rounds", "speclane_spec_lane_rounds"):
        labels = {dict(key[1]).get("tenant") for key in after[family] if isinstance(key, tuple)}
        assert not labels & {"past-cap-a", "past-cap-b"}, f"{family} names no tenant past the cap"
    other = ("speclane_generated_tokens_total", (("tenant", OTHER_TENANTS),))
    grew = after["speclane_generated_tokens"][other] - before["speclane_generated_tokens"].get(other, 0)
    assert grew >= 2, "both tenants' tokens are counted under the shared label"
    assert after["speclane_spec_lane_rounds"][("speclane_spec_lane_rounds_total", (("tenant", OTHER_TENANTS),))] > 0


def test_health_shows_the_kv_pool(live: LiveServer, async_engine: AsyncEngine) -> None:
    body = httpx.get(live.url + "/health", timeout=30).json()
    cache = async_engine.engine.cache
    assert body["kv_cache"] == {"mib": round(cache.bytes / 2**20, 1), **async_engine.engine.kv_pool, "dtype": "bfloat16"}
    assert body["kv_cache"]["mib"] > 0


def test_prefix_cache_and_kv_metrics(live: LiveServer, idle_after: AsyncEngine) -> None:
    """A repeated prompt's cached tokens show in the hit counter, a tenant's cached blocks
    under its label, and another tenant's identical prompt hits nothing."""
    prompt = "Summarise this list in one line: " + ", ".join(f"item {i}" for i in range(40))

    def send(tenant: str) -> int:
        response = httpx.post(live.url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2,
            "temperature": 0, "user": tenant})
        assert response.status_code == 200
        return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    def hits(families: dict[str, Any]) -> float:
        return families["speclane_prefix_cache_hit_tokens"][("speclane_prefix_cache_hit_tokens_total", ())]

    before = scrape(live.url)
    assert send("kv-metrics-a") == 0
    cached = send("kv-metrics-a")
    assert cached >= 64, "the second identical prompt reads its full blocks from the cache"
    middle = scrape(live.url)
    assert hits(middle) - hits(before) == cached
    assert send("kv-metrics-b") == 0, "another tenant's identical prompt takes the uncached path"
    after = scrape(live.url)
    assert hits(after) == hits(middle)
    queried = after["speclane_prefix_cache_queried_tokens"][("speclane_prefix_cache_queried_tokens_total", ())]
    assert queried - before["speclane_prefix_cache_queried_tokens"][
        ("speclane_prefix_cache_queried_tokens_total", ())] >= 3 * cached

    in_use = after["speclane_kv_blocks_in_use"]
    assert after["speclane_kv_blocks_in_use:type"] == "gauge"
    for tenant in ("kv-metrics-a", "kv-metrics-b"):
        assert in_use[("speclane_kv_blocks_in_use", (("tenant", tenant),))] >= cached // 16, (
            f"{tenant}'s prompt blocks stay cached and charged to it")
    total = after["speclane_kv_blocks_total"][("speclane_kv_blocks_total", ())]
    free = after["speclane_kv_blocks_free"][("speclane_kv_blocks_free", ())]
    assert free + sum(in_use.values()) == total, "every block is free or charged to one tenant"
    assert after["speclane_kv_blocks_cached"][("speclane_kv_blocks_cached", ())] >= 2 * cached // 16
    for name in ("speclane_kv_evictions", "speclane_kv_preemptions"):
        assert after[name + ":type"] == "counter", name
