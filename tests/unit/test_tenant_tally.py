"""Per-tenant counters name a bounded number of tenants (``scheduler/counts.py``)."""

from __future__ import annotations

from speclane.scheduler.counts import OTHER_TENANTS, ScheduleCounts, TenantTally


def test_tenants_past_the_cap_are_counted_under_one_name() -> None:
    tally = TenantTally(max_named=2)
    for tenant in ("a", "b", "c", "d", "a"):
        tally.add(tenant, 3)
    assert tally == {"a": 6, "b": 3, OTHER_TENANTS: 6}
    tally.add("b")
    assert tally["b"] == 4, "a named tenant keeps its own series"
    assert sum(tally.values()) == 16, "nothing counted is lost"


def test_a_copy_keeps_the_cap() -> None:
    tally = TenantTally({"a": 1}, max_named=1)
    copy = tally.copy()
    copy.add("b")
    assert copy == {"a": 1, OTHER_TENANTS: 1} and tally == {"a": 1}


def test_the_schedulers_round_tally_is_bounded_over_many_tenants() -> None:
    counts = ScheduleCounts()
    counts.rounds_by_tenant.max_named = 50
    for i in range(10_000):
        counts.record_round(f"user-{i}", burst=False, drafted=2, accepted=1)
    assert len(counts.rounds_by_tenant) == 51
    assert counts.rounds_by_tenant[OTHER_TENANTS] == 10_000 - 50
    assert counts.slice_rounds == 10_000
