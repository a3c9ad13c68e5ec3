"""``speclane simulate --replicas``: the real router, lanes and shared counters on the cost
model. Three streams of one tenant and one each of two others on two replicas: with the
counters shared each tenant gets its cluster-wide share; per replica, the three-stream
tenant gets half of the cluster."""

from __future__ import annotations

import pytest

from speclane.config import LaneConfig, SchedulerConfig
from speclane.sim.cluster import run_cluster
from speclane.sim.cost import CostModel
from speclane.sim.experiment import Setup
from speclane.sim.workload import SimJob, Tenant


def jobs_3_1_1() -> list[SimJob]:
    tenants = ["a", "a", "a", "b", "c"]
    return [SimJob(f"{t}{i}", 0.001 * i, Tenant(t, 1.0, 0), 32, 600, True, 0.6) for i, t in enumerate(tenants)]


@pytest.mark.parametrize("sync_ms", [50.0, 500.0])
def test_shared_counters_give_each_tenant_its_share_of_the_clusters_lane(sync_ms: float) -> None:
    setup = Setup(SchedulerConfig(), 2048, CostModel(), seed=0)
    lane = LaneConfig(spec_grant_rounds=8)
    shared = run_cluster(lane, jobs_3_1_1(), setup, replicas=2, sync_ms=sync_ms)
    alone = run_cluster(lane, jobs_3_1_1(), setup, replicas=2, sync_ms=None)
    assert shared.counts["finished"] == alone.counts["finished"] == 5
    assert shared.jain > 0.98, shared.share_ratios
    assert alone.jain < 0.93, alone.share_ratios
    assert alone.share_ratios[("a", 0)] > 1.3, "per replica, a runs on both lanes: half of the cluster's rounds"
    assert shared.max_lag_rounds < alone.max_lag_rounds / 3


def test_bench_replicas_carries_the_simulated_cluster_table(monkeypatch):
    from speclane.bench import replicas_scenario

    monkeypatch.setattr(replicas_scenario, "SIMULATE", ["--replicas", "2", "--requests", "120", "--tenants", "6"])
    [table] = replicas_scenario.simulated_cluster()
    assert table.title.startswith("The fair lane over 2 replicas: 120 requests, 6 tenants")
    assert [row[0] for row in table.rows] == ["shared every 50 ms", "shared every 500 ms", "per replica (not shared)"]
    assert all(0 < row[1] <= 1 for row in table.rows)
    assert "`speclane simulate --replicas 2 --requests 120 --tenants 6`" in table.notes[-1]
