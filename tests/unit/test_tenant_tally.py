"""Per-tenant counters name a bounded number of tenants, the same ones in every counter of
an engine (``scheduler/counts.py``)."""

from __future__ import annotations

from speclane.config import LaneConfig, SchedulerConfig
from speclane.scheduler.counts import (
    OTHER_TENANTS,
    ScheduleCounts,
    TenantNames,
    TenantTally,
    series_name,
)
from speclane.scheduler.scheduler import Scheduler


def test_tenants_past_the_cap_are_counted_under_one_name() -> None:
    tally = TenantTally(names=TenantNames(cap=2))
    for tenant in ("a", "b", "c", "d", "a"):
        tally.add(tenant, 3)
    assert tally == {"a": 6, "b": 3, OTHER_TENANTS: 6}
    tally.add("b")
    assert tally["b"] == 4, "a named tenant keeps its own series"
    assert sum(tally.values()) == 16, "nothing counted is lost"


def test_tallies_sharing_names_name_the_same_tenants() -> None:
    """A tenant first counted by one tally is named in the others too, whatever order they
    see tenants in (tokens are counted for requests that never speculate)."""
    names = TenantNames(cap=2)
    tokens, rounds = TenantTally(names=names), TenantTally(names=names)
    tokens.add("a")
    tokens.add("b")
    rounds.add("c")
    rounds.add("b")
    tokens.add("c")
    assert tokens == {"a": 1, "b": 1, OTHER_TENANTS: 1} and rounds == {OTHER_TENANTS: 1, "b": 1}
    copy = tokens.copy()
    copy.add("d")
    assert copy[OTHER_TENANTS] == 2 and tokens[OTHER_TENANTS] == 1


def test_a_schedulers_tallies_share_its_names() -> None:
    scheduler = Scheduler(SchedulerConfig(), LaneConfig(), 256)
    assert scheduler.counts.rounds_by_tenant.names is scheduler.tenant_names
    assert scheduler.lane.held_rounds_by_tenant.names is scheduler.tenant_names


def test_the_schedulers_round_tally_is_bounded_over_many_tenants() -> None:
    counts = ScheduleCounts(rounds_by_tenant=TenantTally(names=TenantNames(cap=50)))
    for i in range(10_000):
        counts.record_round(f"user-{i}", burst=False, drafted=2, accepted=1)
    assert len(counts.rounds_by_tenant) == 51
    assert counts.rounds_by_tenant[OTHER_TENANTS] == 10_000 - 50
    assert counts.slice_rounds == 10_000


def test_a_tenant_named_like_the_overflow_series_keeps_its_own() -> None:
    """A ``user`` may be any string: "_other" sent by a client is not the tenants past the cap."""
    tally = TenantTally(names=TenantNames(cap=2))
    for tenant in (OTHER_TENANTS, "__other", "c", "d"):
        tally.add(tenant)
    assert tally == {"_" + OTHER_TENANTS: 1, "__" + OTHER_TENANTS: 1, OTHER_TENANTS: 2}
    assert series_name("a_b") == "a_b" and series_name("_a") == "__a"
