"""Two engine replicas on a real local Ray (1 torch thread each) behind one endpoint:
greedy outputs equal the single-process server's; 3/1/1 closed-loop speculative streams
of three tenants share the cluster's lane fairly; a replica killed with SIGKILL mid-stream
ends only its own streams (with an error event), /health says "degraded", new requests
go to the other replica, and the restarted replica rejoins."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import MODEL, TEST_ENGINE_OPTIONS, LiveServer, wait_until

from speclane.config import ClusterConfig, EngineConfig
from speclane.server.app import create_app

pytestmark = pytest.mark.slow

COUNT = "Count from 1 to 100, separated by commas."
PROMPTS = [COUNT, "Name three colours.", "What is the capital of France? Answer in one sentence.",
           "Write a haiku about the sea."]
# The lane with grant budgets (the server tests' engine holds a grant for a whole generation).
CLUSTER_OPTIONS = {**TEST_ENGINE_OPTIONS, "spec_grant_rounds": 8}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LiveServer, Any]]:
    pytest.importorskip("ray", reason="Ray is the cluster extra: pip install speclane[cluster]")
    from speclane.cluster.launch import start_cluster

    front = start_cluster(EngineConfig().replace(**CLUSTER_OPTIONS), ClusterConfig(replicas=2, counter_sync_ms=50))
    server = LiveServer(create_app(front))
    yield server, front
    server.stop()
    front.shutdown()


def chat(url: str, prompt: str, max_tokens: int, tenant: str = "t") -> str:
    response = httpx.post(url + "/v1/chat/completions", timeout=180, json={
        "model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0, "user": tenant})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def stream(url: str, prompt: str, max_tokens: int, tenant: str, first_token: threading.Event | None = None
           ) -> dict[str, Any]:
    """Text and error events of one streamed chat completion."""
    text, errors = [], []
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=180, json={
            "model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "user": tenant, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                errors.append(event["error"]["message"])
                continue
            piece = event["choices"][0]["delta"].get("content") if event["choices"] else None
            if piece:
                text.append(piece)
                if first_token is not None:
                    first_token.set()
    return {"text": "".join(text), "errors": errors}


def test_greedy_outputs_equal_the_single_process_servers(cluster: tuple[LiveServer, Any], live: LiveServer) -> None:
    server, front = cluster
    expected = [chat(live.url, p, 40) for p in PROMPTS]
    got: dict[int, str] = {}
    for pair in (PROMPTS[:2], PROMPTS[2:]):  # two at a time: one on each replica
        threads = [threading.Thread(target=lambda i=PROMPTS.index(p), p=p: got.__setitem__(i, chat(server.url, p, 40)))
                   for p in pair]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
    assert [got[i] for i in range(len(PROMPTS))] == expected
    assert all(s is not None and s["counters"]["generated_by_tenant"] for s in front.statuses), \
        "both replicas served"


def per_tenant(url: str, name: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    family = next(f for f in text_string_to_metric_families(text) if f.name == name)
    return {s.labels["tenant"]: s.value for s in family.samples if s.name.endswith("_total")}


def lane_rounds(url: str) -> dict[str, float]:
    return per_tenant(url, "speclane_spec_lane_rounds")


def jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def test_three_tenants_3_1_1_streams_share_the_clusters_lane_fairly(cluster: tuple[LiveServer, Any]) -> None:
    server, _ = cluster
    stop = threading.Event()
    streams = {"fair-a": 3, "fair-b": 1, "fair-c": 1}

    def closed_loop(tenant: str) -> None:
        while not stop.is_set():
            stream(server.url, COUNT, 150, tenant)

    threads = [threading.Thread(target=closed_loop, args=(t,), daemon=True)
               for t, n in streams.items() for _ in range(n)]
    for thread in threads:
        thread.start()
        time.sleep(0.1)  # a, a, a, b, c in this order: a's streams spread over both replicas
    time.sleep(3.0)  # warm-up
    before = lane_rounds(server.url)
    time.sleep(12.0)
    after = lane_rounds(server.url)
    state = httpx.get(server.url + "/dashboard/state").json()
    stop.set()
    for thread in threads:
        thread.join(120)
    rounds = {t: after.get(t, 0) - before.get(t, 0) for t in streams}
    assert jain(list(rounds.values())) >= 0.95, rounds
    a_on = {s["replica"] for s in state["timeline"] if s["tenant"] == "fair-a"}
    assert a_on == {"0", "1"}, "the 3-stream tenant held the lane on both replicas"


def test_a_client_that_disconnects_ends_its_request_on_its_replica(cluster: tuple[LiveServer, Any]) -> None:
    server, front = cluster
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=180, json={
            "model": MODEL, "messages": [{"role": "user", "content": COUNT}], "max_tokens": 300,
            "temperature": 0, "user": "gone", "stream": True}) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i >= 6:
                break
    wait_until(lambda: front.num_streams == 0, timeout=10, what="the front to drop the request")
    time.sleep(1.0)  # a second at several tokens per tick, had the replica gone on
    generated = sum(s["counters"]["generated_by_tenant"].get("gone", 0) for s in front.statuses if s is not None)
    assert generated < 40, f"{generated} tokens: the replica went on generating after the client left"
    assert all(s is not None and s["counters"]["running"] == 0 for s in front.statuses)


def streams_under_way(url: str, n: int, tenant_prefix: str) -> tuple[dict[int, dict[str, Any]], list[threading.Thread]]:
    """``n`` streams of 150 tokens of ``COUNT`` (tenants ``{tenant_prefix}-{i}``), each one
    past its first token when this returns; their results fill in as they end."""
    results: dict[int, dict[str, Any]] = {}
    started = [threading.Event() for _ in range(n)]
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(
        i, stream(url, COUNT, 150, f"{tenant_prefix}-{i}", started[i])), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for event in started:
        assert event.wait(120), "every stream sent a token"
    return results, threads


def test_a_replica_killed_mid_stream_ends_only_its_own_streams_and_rejoins(cluster: tuple[LiveServer, Any],
                                                                          live: LiveServer) -> None:
    server, front = cluster
    expected, short = chat(live.url, COUNT, 150), chat(live.url, COUNT, 20)
    results, threads = streams_under_way(server.url, 8, "kill")
    time.sleep(0.5)  # the front's copy of the counters catches up
    generated_before = sum(per_tenant(server.url, "speclane_generated_tokens").values())
    os.kill(front.replica_pid(1), signal.SIGKILL)
    wait_until(lambda: httpx.get(server.url + "/health").json()["status"] == "degraded", timeout=15,
               what="/health to report the degraded state")
    assert chat(server.url, COUNT, 20, "kill-new") == short, "a new request is served by the healthy replica"
    for thread in threads:
        thread.join(180)
    complete = [r for r in results.values() if not r["errors"]]
    failed = [r for r in results.values() if r["errors"]]
    assert len(complete) >= 4 and failed, [(len(r["text"]), r["errors"]) for r in results.values()]
    assert all(r["text"] == expected for r in complete), "the other replica's streams are unaffected"
    assert all("replica 1" in r["errors"][0] for r in failed)
    wait_until(lambda: httpx.get(server.url + "/health").json()["status"] == "ok", timeout=180,
               what="the restarted replica to rejoin")
    health = httpx.get(server.url + "/health").json()
    assert health["replicas"][1]["outages"] == 1
    done = []
    pair = [threading.Thread(target=lambda i=i: done.append(chat(server.url, COUNT, 20, f"after-{i}")))
            for i in range(2)]
    for thread in pair:
        thread.start()
    for thread in pair:
        thread.join(120)
    assert len(done) == 2
    retired = dict(front.snapshots())["retired"]["generated_by_tenant"]
    assert any(retired.get(f"kill-{i}", 0) > 0 for i in range(8)), "the dead replica's totals are kept"
    assert sum(per_tenant(server.url, "speclane_generated_tokens").values()) > generated_before, \
        "the summed counters never go back"
    wait_until(lambda: front.statuses[1] is not None and front.statuses[1]["counters"]["generated_by_tenant"],
               timeout=10, what="the rejoined replica to serve")


def test_a_replica_that_stops_answering_is_drained_then_stops_what_the_front_ended(
        cluster: tuple[LiveServer, Any], live: LiveServer) -> None:
    """SIGSTOP freezes replica 0 (its process lives, its calls hang): after the health
    timeout the front drains it (its streams end with an error event, new requests go to
    replica 1); SIGCONT brings it back with the same incarnation, it serves again, and the
    requests the front ended are aborted there rather than left generating."""
    server, front = cluster
    short = chat(live.url, COUNT, 20)
    results, threads = streams_under_way(server.url, 4, "hang")
    pid = front.replica_pid(0)
    outages = httpx.get(server.url + "/health").json()["replicas"][0]["outages"]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: httpx.get(server.url + "/health").json()["status"] == "degraded",
                   timeout=front.cluster.health_timeout_s + 20, what="the frozen replica to be drained")
        assert chat(server.url, COUNT, 20, "hang-new") == short, "a new request is served by the other replica"
    finally:
        os.kill(pid, signal.SIGCONT)
    for thread in threads:
        thread.join(180)
    failed = [r for r in results.values() if r["errors"]]
    assert failed and all("replica 0" in r["errors"][0] for r in failed), [r["errors"] for r in results.values()]
    wait_until(lambda: httpx.get(server.url + "/health").json()["status"] == "ok", timeout=60,
               what="the resumed replica to serve again")
    assert httpx.get(server.url + "/health").json()["replicas"][0]["outages"] == outages + 1
    wait_until(lambda: front.statuses[0] is not None and front.statuses[0]["counters"]["running"] == 0
               and front.statuses[0]["counters"]["waiting"] == 0, timeout=30,
               what="the resumed replica to finish or stop its requests")
    generated = front.statuses[0]["counters"]["generated_by_tenant"]
    ended = [i for i, r in results.items() if r["errors"]]
    assert all(generated.get(f"hang-{i}", 0) < 150 for i in ended), (
        "the requests the front ended were stopped on the resumed replica, not generated to their 150 tokens",
        {i: generated.get(f"hang-{i}") for i in ended})
