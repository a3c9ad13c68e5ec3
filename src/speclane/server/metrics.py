"""``/metrics``: the engine's numbers in Prometheus text format (names as in docs/api.md).

``ServerMetrics`` is the engine's ``EngineObserver``: the latency histograms are fed
from the engine thread as ticks and tokens happen (prometheus-client's histograms are
thread-safe, and each hook is a few observations). Gauges and counters are read at
scrape time by a custom collector, from the scheduler, the lane and ``engine.counters``
(which the scheduler's own tallies refresh every tick). Behind a cluster front the
collector sums the replicas' counter snapshots (each at most a quarter second old) and adds
``speclane_replica_up`` per replica and ``speclane_cluster_queued``; the front feeds the
latency histograms as its clients see the tokens, and the replicas' tick and lane-wait
samples. Every app has its own ``CollectorRegistry``, never the global one, so
several apps (tests) can live in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from speclane.engine.stats import sum_snapshots

if TYPE_CHECKING:
    from speclane.engine.engine import LLMEngine
    from speclane.request import Request

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    """The histograms (fed by the engine) plus a collector of the engine's live numbers."""

    def __init__(self, engine: LLMEngine | None, *, replicas: Callable[[], ReplicaView] | None = None) -> None:
        """One engine's numbers, or (``engine=None``) a cluster's: ``replicas()`` reads them."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.time_to_first_token = Histogram(
            "speclane_time_to_first_token_seconds", "Arrival to first generated token.",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(
            "speclane_inter_token_latency_seconds", "Time between consecutive tokens of a request "
            "(a tick that emits n tokens counts n gaps of a n-th of its time).",
            buckets=_TOKEN_GAP_BUCKETS, registry=r)
        self.spec_wait = Histogram(
            "speclane_spec_wait_seconds", "Per finished request: total time eligible for the lane "
            "without holding it.", buckets=_LATENCY_BUCKETS, registry=r)
        self.tick = Histogram(
            "speclane_tick_seconds", "Wall time of one engine tick (execute + update).",
            buckets=_TOKEN_GAP_BUCKETS + (10.0,), registry=r)
        if replicas is not None:
            self.cluster_dispatch = Histogram(
                "speclane_cluster_dispatch_seconds", "Arrival at the cluster front to a replica accepting the "
                "request (the admission queue, placement and the Ray call).", buckets=_TOKEN_GAP_BUCKETS + (10.0,),
                registry=r)
            self.cluster_delivery = Histogram(
                "speclane_cluster_delivery_seconds", "A replica's batch of outputs, from sent to received by the "
                "front.", buckets=_TOKEN_GAP_BUCKETS, registry=r)
        r.register(_EngineCollector(engine, replicas))

    # -- EngineObserver (engine thread) ----------------------------------------------------
    def on_tick(self, seconds: float) -> None:
        self.tick.observe(seconds)

    def on_idle(self) -> None:
        pass

    def on_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(seconds)

    def on_token_gap(self, seconds: float, num_tokens: int) -> None:
        for _ in range(num_tokens):
            self.inter_token_latency.observe(seconds)

    def on_finish(self, request: Request) -> None:
        if request.spec.grants or request.spec.wait_ms:  # it was in the lane
            self.observe_spec_wait(request.spec.wait_ms / 1000.0)

    def observe_spec_wait(self, seconds: float) -> None:
        """A finished lane request's wait (a replica's, brought by the cluster front)."""
        self.spec_wait.observe(seconds)

    def observe_dispatch(self, seconds: float) -> None:
        self.cluster_dispatch.observe(seconds)

    def observe_delivery(self, seconds: float) -> None:
        self.cluster_delivery.observe(seconds)

    # -- scrape --------------------------------------------------------------------------
    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """The numbers of ``engine_snapshot`` (one engine) or of a cluster's replicas, summed."""

    def __init__(self, engine: LLMEngine | None, replicas: Callable[[], ReplicaView] | None = None) -> None:
        self.engine = engine
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        if self.engine is not None:
            yield from _snapshot_metrics(engine_snapshot(self.engine))
            return
        assert self.replicas is not None
        view = self.replicas()
        yield from _snapshot_metrics(sum_snapshots([snap for _, snap in view.snapshots]))
        up = GaugeMetricFamily("speclane_replica_up", "1 while the replica serves, 0 while it is down or "
                               "restarting.", labels=["replica"])
        for name, healthy in view.health:
            up.add_metric([name], 1.0 if healthy else 0.0)
        yield up
        yield _gauge("speclane_cluster_queued", "Requests in the cluster's admission queue (not yet placed).",
                     view.queued)


@dataclass(frozen=True)
class ReplicaView:
    """What ``/metrics`` reads of a cluster: each replica's counters, health and the queue."""

    snapshots: list[tuple[str, dict[str, Any]]]
    health: list[tuple[str, bool]]
    queued: int


def engine_snapshot(engine: LLMEngine) -> dict[str, Any]:
    """``engine.counters.snapshot()`` with the live gauges read from the scheduler and lane
    (``len()`` of the scheduler's dicts is atomic; the engine thread may tick meanwhile)."""
    scheduler = engine.scheduler
    lane = scheduler.lane
    snap: dict[str, Any] = engine.counters.snapshot()
    snap.update(running=scheduler.num_running, waiting=scheduler.num_waiting, lane_holders=lane.num_holders,
                lane_waiting=lane.num_waiters, lane_grants=lane.grants_total, lane_yields=lane.yields_total,
                lane_preemptions=lane.preemptions_total)
    return snap


def _snapshot_metrics(snap: dict[str, Any]) -> Iterator[Metric]:
    yield _gauge("speclane_requests_running", "Requests admitted (prefilling or decoding).", snap["running"])
    yield _gauge("speclane_requests_waiting", "Requests queued for admission.", snap["waiting"])
    yield _gauge("speclane_spec_lane_holders", "Requests holding the speculative lane.", snap["lane_holders"])
    yield _gauge("speclane_spec_lane_waiting", "Requests eligible for the lane but not holding it.",
                 snap["lane_waiting"])
    rounds = CounterMetricFamily("speclane_spec_rounds", "Speculative rounds (draft + verify) run.",
                                 labels=["tenant"])
    for tenant, value in sorted(snap["spec_rounds_by_tenant"].items()):
        rounds.add_metric([tenant], value)
    yield rounds
    held = CounterMetricFamily("speclane_spec_lane_rounds", "Rounds a tenant's requests held the lane, with "
                               "drafts or not (what the lane shares fairly).", labels=["tenant"])
    for tenant, value in sorted(snap["lane_rounds_by_tenant"].items()):
        held.add_metric([tenant], value)
    yield held
    yield _counter("speclane_spec_draft_tokens", "Draft tokens proposed.", snap["draft_tokens"])
    yield _counter("speclane_spec_accepted_tokens", "Draft tokens accepted.", snap["accepted_tokens"])
    yield _counter("speclane_spec_grants", "Times a request was given the lane.", snap["lane_grants"])
    yield _counter("speclane_spec_yields", "Times a holder handed the lane on at the end of its budget.",
                   snap["lane_yields"])
    yield _counter("speclane_spec_preemptions", "Times a more urgent request took the lane.",
                   snap["lane_preemptions"])
    generated = CounterMetricFamily("speclane_generated_tokens", "Tokens generated.", labels=["tenant"])
    for tenant, value in sorted(snap["generated_by_tenant"].items()):
        generated.add_metric([tenant], value)
    yield generated
    yield from _kv_metrics(snap)


def _kv_metrics(snap: dict[str, object]) -> Iterator[Metric]:
    """The KV pool and the prefix cache (``EngineCounters``' copy, refreshed every tick)."""
    yield _counter("speclane_prefix_cache_queried_tokens", "Prompt tokens of admitted requests looked up in "
                   "the prefix cache.", snap["prefix_cache_queried_tokens"])
    yield _counter("speclane_prefix_cache_hit_tokens", "Of them, tokens read from the cache (not prefilled).",
                   snap["prefix_cache_hit_tokens"])
    yield _counter("speclane_kv_evictions", "Cached KV blocks evicted to make room.", snap["kv_evicted_blocks"])
    yield _counter("speclane_kv_preemptions", "Running requests preempted (to be recomputed) for KV blocks.",
                   snap["kv_preemptions"])
    yield _gauge("speclane_kv_blocks_total", "Blocks in the KV pool.", snap["kv_blocks_total"])  # type: ignore[arg-type]
    yield _gauge("speclane_kv_blocks_free", "Blocks no request holds and no cache entry keeps.",
                 snap["kv_blocks_free"])  # type: ignore[arg-type]
    yield _gauge("speclane_kv_blocks_cached", "Blocks in the prefix cache (held by requests or not).",
                 snap["kv_blocks_cached"])  # type: ignore[arg-type]
    in_use = GaugeMetricFamily("speclane_kv_blocks_in_use", "Blocks charged to a tenant: held by its requests or "
                               "cached from them.", labels=["tenant"])
    for tenant, value in sorted(snap["kv_blocks_by_tenant"].items()):  # type: ignore[attr-defined]
        in_use.add_metric([tenant], value)
    yield in_use


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: object) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))  # type: ignore[arg-type]
