"""Engine-level counters (the numbers behind ``/metrics`` and the benchmarks' proofs).

The engine thread refreshes them once per tick from the scheduler, which does all the
counting of prefill tokens and speculation (``scheduler/counts.py``); the engine adds
only what it alone sees: ticks, busy time and the tokens it emitted per tenant.
Readers (the metrics endpoint, benchmarks) take a ``snapshot()``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from speclane.request import Request
from speclane.scheduler.counts import TenantTally, acceptance_by_position, series_name
from speclane.scheduler.scheduler import Scheduler


class EngineObserver(Protocol):
    """Hooks for latency histograms; called on the engine thread, so keep them cheap."""

    def on_tick(self, seconds: float) -> None: ...

    def on_idle(self) -> None: ...  # a tick that ran nothing (aborts only, or nothing to do)

    def on_first_token(self, seconds: float) -> None: ...

    def on_token_gap(self, seconds: float, num_tokens: int) -> None: ...

    def on_finish(self, request: Request) -> None: ...


class Observers:
    """Several ``EngineObserver``s behind one (the metrics and the dashboard)."""

    def __init__(self, *observers: EngineObserver) -> None:
        self.observers = observers

    def on_tick(self, seconds: float) -> None:
        for o in self.observers:
            o.on_tick(seconds)

    def on_idle(self) -> None:
        for o in self.observers:
            o.on_idle()

    def on_first_token(self, seconds: float) -> None:
        for o in self.observers:
            o.on_first_token(seconds)

    def on_token_gap(self, seconds: float, num_tokens: int) -> None:
        for o in self.observers:
            o.on_token_gap(seconds, num_tokens)

    def on_finish(self, request: Request) -> None:
        for o in self.observers:
            o.on_finish(request)


@dataclass
class EngineCounters:
    ticks: int = 0
    slice_rounds: int = 0  # rounds run one per tick (--spec-mode slice)
    burst_rounds: int = 0  # rounds run by a burst holder alone (--spec-mode burst)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    prefill_tokens: int = 0
    busy_s: float = 0.0
    spec_rounds_by_tenant: TenantTally = field(default_factory=TenantTally)
    # Rounds each tenant held the lane for, with drafts or not (the lane's fair share).
    lane_rounds_by_tenant: TenantTally = field(default_factory=TenantTally)
    generated_by_tenant: TenantTally = field(default_factory=TenantTally)
    # Drafts tried and accepted by draft position (the scheduler's tallies).
    draft_tried_by_position: Counter[int] = field(default_factory=Counter)
    draft_accepted_by_position: Counter[int] = field(default_factory=Counter)
    # The lane's own totals (grants, yields, preemptions) and live sizes.
    lane_grants: int = 0
    lane_yields: int = 0
    lane_preemptions: int = 0
    lane_holders: int = 0
    lane_waiting: int = 0
    running: int = 0
    waiting: int = 0
    # The KV pool and prefix cache (``scheduler.kv``): totals and live sizes.
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    kv_evicted_blocks: int = 0
    kv_preemptions: int = 0
    kv_refused_admissions: int = 0
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0
    kv_blocks_cached: int = 0
    kv_blocks_by_tenant: dict[str, int] = field(default_factory=dict)

    def record_tick(self, scheduler: Scheduler, seconds: float) -> None:
        self.ticks += 1
        self.busy_s += seconds
        self.refresh(scheduler)

    def refresh(self, scheduler: Scheduler) -> None:
        counts = scheduler.counts
        self.slice_rounds = counts.slice_rounds
        self.burst_rounds = counts.burst_rounds
        self.draft_tokens = counts.draft_tokens
        self.accepted_tokens = counts.accepted_tokens
        self.prefill_tokens = counts.prefill_tokens
        self.spec_rounds_by_tenant = counts.rounds_by_tenant
        self.draft_tried_by_position = counts.tried_by_position
        self.draft_accepted_by_position = counts.accepted_by_position
        lane = scheduler.lane
        self.lane_rounds_by_tenant = lane.held_rounds_by_tenant
        self.lane_grants = lane.grants_total
        self.lane_yields = lane.yields_total
        self.lane_preemptions = lane.preemptions_total
        self.lane_holders = lane.num_holders
        self.lane_waiting = lane.num_waiters
        self.running = scheduler.num_running
        self.waiting = scheduler.num_waiting
        kv = scheduler.kv
        self.prefix_cache_queried_tokens = kv.stats.queried_tokens
        self.prefix_cache_hit_tokens = kv.stats.cached_tokens
        self.kv_evicted_blocks = kv.stats.evicted_blocks
        self.kv_preemptions = kv.stats.preemptions
        self.kv_refused_admissions = kv.stats.refused_admissions
        self.kv_blocks_total = kv.pool.num_blocks
        self.kv_blocks_free = kv.pool.num_free
        self.kv_blocks_cached = kv.cache.num_cached
        # A new dict (readers never see it change), named as the per-tenant counters name tenants.
        self.kv_blocks_by_tenant = {series_name(tenant): n for tenant, n in kv.pool.held_by_tenant().items()}

    def record_tokens(self, tenant: str, num_tokens: int) -> None:
        self.generated_by_tenant.add(tenant, num_tokens)

    def snapshot(self) -> dict[str, object]:
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, Counter | dict)}
        out["kv_blocks_by_tenant"] = dict(self.kv_blocks_by_tenant)
        out["spec_rounds_by_tenant"] = dict(self.spec_rounds_by_tenant)
        out["lane_rounds_by_tenant"] = dict(self.lane_rounds_by_tenant)
        out["generated_by_tenant"] = dict(self.generated_by_tenant)
        out["acceptance_by_position"] = self.acceptance_by_position()
        return out

    def acceptance_by_position(self) -> list[float]:
        # Copies first (one C call each under the GIL): a replica's poll reads these while
        # its engine thread adds positions, and iterating a dict that grows raises.
        return acceptance_by_position(Counter(self.draft_tried_by_position), Counter(self.draft_accepted_by_position))


# The snapshot's live sizes: a replica that is gone holds none, while its totals still count.
GAUGE_KEYS = ("running", "waiting", "lane_holders", "lane_waiting", "kv_blocks_total", "kv_blocks_free",
              "kv_blocks_cached", "kv_blocks_by_tenant")


def sum_snapshots(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """``EngineCounters.snapshot()``s added up: numbers, and per-tenant dicts per tenant
    (lists, per-engine shapes, are dropped); a key no snapshot has reads as an idle engine's."""
    total: dict[str, Any] = {}
    for snap in snapshots:
        for key, value in snap.items():
            if isinstance(value, dict):
                into = total.setdefault(key, {})
                for k, v in value.items():
                    into[k] = into.get(k, 0) + v
            elif isinstance(value, int | float):
                total[key] = total.get(key, 0) + value
    for key, value in EngineCounters().snapshot().items():
        total.setdefault(key, value)
    return total


def totals_only(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` without its live sizes (``GAUGE_KEYS``): what a replica that is gone leaves."""
    return {k: v for k, v in snapshot.items() if k not in GAUGE_KEYS}
