"""The cluster front over fake replicas (no Ray, no model): what it refuses before queueing,
and that a replica whose poll fails in any way is taken out and brought back, never left
with a dead loop (its streams would hang)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from speclane.cluster.client import ReplicaUnavailable
from speclane.cluster.front import ClusterEngine
from speclane.cluster.replica import PollReply
from speclane.config import ClusterConfig, EngineConfig
from speclane.request import SamplingParams


class FakeReplica:
    """Answers the front's calls: a KV pool of 8 blocks of 16 positions, no outputs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.up = True
        self.raise_next: BaseException | None = None
        self.added: list[str] = []
        self.charged_asks: list[tuple[str, int] | None] = []  # charged_since of each poll that asked
        self.lose_next_reply = False  # the next poll that asks runs, and its reply is lost
        self.lost_at = -1  # the index in charged_asks of the ask whose reply was lost
        self.resets_sent: list[list[Any]] = []  # the reset batches of each poll that asked
        self.drop_next: dict[str, float] = {}  # charges the lane reports dropped in its next reply
        self.lose_reply_with_resets = False  # the reply of the next poll that carries reset batches is lost

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.005)
        if not self.up and method != "describe":
            raise ReplicaUnavailable(f"replica {self.name}: down")
        if method == "describe":
            return {"tokenizer": None, "max_model_len": 256, "vocab_size": 1000,
                    "kv_pool": {"blocks": 8, "block_size": 16}, "incarnation": "one", "pid": 0}
        if method == "poll":
            if self.raise_next is not None:
                exc, self.raise_next = self.raise_next, None
                raise exc
            if kwargs.get("want_charged"):
                since = kwargs.get("charged_since")
                self.charged_asks.append(since)  # the lane's version is the number of asks so far
                self.resets_sent.append(list(kwargs.get("resets", ())))
                if self.lose_reply_with_resets and kwargs.get("resets"):
                    self.lose_next_reply, self.lose_reply_with_resets = True, False
                if self.lose_next_reply:
                    self.lose_next_reply, self.lost_at = False, len(self.charged_asks) - 1
                    raise ReplicaUnavailable("the reply was lost")
                dropped, self.drop_next = self.drop_next, {}
                return PollReply("one", [], {}, charged_complete=since is None, charged_version=len(self.charged_asks),
                                 charged_dropped=dropped)
            return PollReply("one", [])
        if method == "add":
            self.added.append(args[0])
        return "one" if method == "ping" else None

    def kill(self) -> None:
        pass


@pytest.fixture
def front() -> Iterator[tuple[ClusterEngine, FakeReplica]]:
    replica = FakeReplica("0")
    engine = ClusterEngine([replica], EngineConfig(), ClusterConfig(health_timeout_s=1.0), ready_timeout_s=5)
    engine.wait_ready(10)
    yield engine, replica
    engine.shutdown()


def until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def generate(engine: ClusterEngine, prompt: list[int], max_tokens: int) -> Any:
    async def run() -> Any:
        return await engine.generate(prompt, SamplingParams(max_tokens=max_tokens), request_id=f"r{len(prompt)}")
    return asyncio.run(run())


def test_a_request_no_replica_could_hold_is_refused_before_it_is_queued(front: tuple[ClusterEngine, FakeReplica]) -> None:
    engine, replica = front
    with pytest.raises(ValueError, match="KV pool holds 8"):
        generate(engine, [1] * 10, 200)  # up to 209 positions: 14 blocks of 16
    assert engine.router.num_queued == 0 and not replica.added
    generate(engine, [1] * 11, 100)  # 110 positions, 7 blocks: queued and placed
    until(lambda: replica.added == ["r11"])


def test_with_no_replica_serving_a_request_is_refused_not_left_waiting(front: tuple[ClusterEngine, FakeReplica]) -> None:
    engine, replica = front
    replica.up = False
    until(lambda: engine.health == ["down"])
    with pytest.raises(ReplicaUnavailable, match="no replica is serving"):
        generate(engine, [1, 2, 3], 8)
    replica.up = True
    until(lambda: engine.health == ["healthy"])
    generate(engine, [1, 2, 3], 8)
    until(lambda: replica.added == ["r3"])


def test_a_poll_that_fails_unexpectedly_takes_the_replica_out_and_back(front: tuple[ClusterEngine, FakeReplica]) -> None:
    engine, replica = front
    replica.raise_next = KeyError("a counter changed size")  # not a ReplicaUnavailable
    until(lambda: engine.outages == [1])
    until(lambda: engine.health == ["healthy"])
    generate(engine, [1, 2], 8)
    until(lambda: replica.added == ["r2"])  # its loop still polls and places


def test_the_lane_service_is_asked_for_from_the_version_of_the_last_reply_that_arrived(
        front: tuple[ClusterEngine, FakeReplica]) -> None:
    """Every tenant's first; then what changed after the last version received, so a reply
    that is lost is asked for again."""
    engine, replica = front
    until(lambda: len(replica.charged_asks) >= 3)
    assert replica.charged_asks[:3] == [None, ("one", 1), ("one", 2)]
    replica.lose_next_reply = True
    until(lambda: engine.outages == [1] and len(replica.charged_asks) > replica.lost_at + 1 > 0)
    lost = replica.lost_at
    assert replica.charged_asks[lost + 1] == replica.charged_asks[lost] == ("one", lost), \
        "asked again from the version before the lost reply"


def test_a_tenant_no_lane_counts_is_reset_on_the_lanes_until_a_reply_says_so(
        front: tuple[ClusterEngine, FakeReplica]) -> None:
    """The lane dropped tenant x's charge: the front forgets x and sends the replica a reset
    batch with each sync until a poll carrying it is answered (scheduler/fairness.py)."""
    engine, replica = front
    until(lambda: len(replica.charged_asks) >= 2)
    replica.lose_reply_with_resets = True  # a reply lost while the batch is pending: sent again
    replica.drop_next = {"x": 3.0}
    until(lambda: engine.outages == [1] and len(replica.charged_asks) > replica.lost_at + 2 > 1)
    batches = [sent for sent in replica.resets_sent if sent]
    assert batches[0] == [(1, {"x": 0.0})] and len(batches) >= 2 and batches[1] == batches[0], \
        "the batch, and again after the lost reply"
    assert replica.resets_sent[-1] == [], "no longer once a poll carrying it was answered"
    assert engine.shared.num_tenants == 0 and engine.shared.pending_resets(0) == []
