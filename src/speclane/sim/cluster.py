"""``speclane simulate --replicas N``: the cluster's lane on the cost model.

N replicas, each the real ``Scheduler`` and lane with a ``CostModelRunner``, behind the
cluster front's real ``Router`` (tenant-fair admission, placement); every
``sync_ms`` of simulated time their lanes exchange tenant service through the real
``SharedService`` and learn who runs elsewhere, as ``cluster/front.py`` does
(``sync_ms=None``: never, independent lanes). The replicas tick in lockstep: a cluster
tick runs every replica that has work and lasts as long as the slowest of them.

Measured as for one replica (``bounds.py``, "Lane share"), over the whole cluster: per
cluster tick, the lane rounds each priority ran on all replicas are shared among the
tenants with an eligible request anywhere, by weight, each capped at one round per
eligible request (water-filling); Jain's index over ``actual / fair`` per (tenant,
priority) entitled to at least one grant, and the largest lag within a backlogged period.
The cap ignores placement (a tenant with two eligible requests on one replica of one slot
can run one round there per tick), so a perfect 1.0 is not always reachable.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from speclane.cluster.router import Pending, Router
from speclane.cluster.shared_service import SharedService
from speclane.config import LaneConfig
from speclane.scheduler.lane import SpecLane
from speclane.scheduler.scheduler import Scheduler
from speclane.sim.acceptance import RateAcceptance
from speclane.sim.bounds import ShareLedger, jain
from speclane.sim.experiment import Setup
from speclane.sim.runner import CostModelRunner
from speclane.sim.simulator import job_request
from speclane.sim.workload import SimJob

Key = tuple[str, int]  # (tenant, priority)


@dataclass
class ClusterOutcome:
    replicas: int
    sync_ms: float | None
    ledger: ShareLedger
    threshold: float
    counts: dict[str, float] = field(default_factory=dict)  # rounds, ticks, finished, sim_time_s, wall_s

    @property
    def share_ratios(self) -> dict[Key, float]:
        return self.ledger.ratios(self.threshold)

    @property
    def jain(self) -> float:
        return jain(list(self.share_ratios.values()))

    @property
    def max_lag_rounds(self) -> float:
        return self.ledger.max_lag


def run_cluster(lane: LaneConfig, jobs: Sequence[SimJob], setup: Setup, *, replicas: int,
                sync_ms: float | None, affinity_slack: int = 2) -> ClusterOutcome:
    started = time.perf_counter()
    acceptance = RateAcceptance({j.request_id: j.acceptance_rate for j in jobs}, setup.seed)
    schedulers = [Scheduler(setup.scheduler, lane, setup.max_model_len, record_lane_events=False)
                  for _ in range(replicas)]
    runner = CostModelRunner(setup.cost, acceptance)
    router = Router(replicas, capacity=setup.scheduler.max_num_seqs, max_queue=len(jobs) + 1,
                    affinity_slack=affinity_slack)
    shared = SharedService(replicas)
    versions = [0] * replicas  # of each replica's last report, as the front keeps them
    ledger = ShareLedger()
    seq = itertools.count()
    arrivals = [(job.arrival_s, next(seq), job) for job in jobs]
    heapq.heapify(arrivals)
    out = ClusterOutcome(replicas, sync_ms, ledger, lane.spec_grant_rounds or 8)
    counts = out.counts = {"rounds": 0, "ticks": 0, "finished": 0}
    now, next_sync = 0.0, 0.0
    while arrivals or router.num_queued or any(s.has_unfinished() for s in schedulers):
        while arrivals and arrivals[0][0] <= now:
            _, _, job = heapq.heappop(arrivals)
            router.enqueue(Pending(job.request_id, job.tenant.name, job.tenant.weight, (), payload=job))
        while (pending := router.place_next()) is not None:
            schedulers[pending.replica].add_request(job_request(pending.payload, now), now)
        if sync_ms is not None and now >= next_sync:
            exchange_service(shared, [s.lane for s in schedulers], versions, router.tenants_elsewhere)
            next_sync = now + sync_ms / 1000.0
        if not any(s.has_unfinished() for s in schedulers):
            now = max(now, arrivals[0][0]) if arrivals else now
            continue
        backlog = _backlog(schedulers)
        rounds: dict[Key, float] = {}
        elapsed_ms = 0.0
        for s in schedulers:
            if not s.has_unfinished():
                continue
            plan = s.schedule(now)
            if plan.is_empty:
                continue
            result = runner.execute(plan)
            elapsed_ms = max(elapsed_ms, result.elapsed_ms)
            for item in plan.seqs:
                request = s.running.get(item.request_id)
                if item.is_round and request is not None:
                    key = (request.tenant, request.priority)
                    rounds[key] = rounds.get(key, 0.0) + 1
            for event in s.update(plan, result, now + result.elapsed_ms / 1000.0):
                router.charge(event.request.tenant, len(event.new_token_ids))
                if event.finished:
                    router.cancel(event.request.request_id)
                    counts["finished"] += 1
        ledger.end_periods(backlog)
        ledger.add(rounds, backlog)
        counts["rounds"] += sum(rounds.values())
        counts["ticks"] += 1
        now += max(elapsed_ms, 0.001) / 1000.0
    counts.update(sim_time_s=now, wall_s=time.perf_counter() - started)
    return out


def exchange_service(shared: SharedService, lanes: Sequence[SpecLane], versions: list[int],
                     elsewhere: Callable[[int], set[str]] | None = None) -> None:
    """One sync of the lanes' service, as the cluster front makes it when no poll fails:
    each lane's changes and drops since ``versions[i]`` (updated), then each lane's remote
    service, who runs elsewhere (``elsewhere(i)``; None: unchanged) and its reset batches,
    confirmed."""
    for i, lane in enumerate(lanes):
        report = lane.charged_service(versions[i])
        versions[i] = report.version
        shared.report(i, "one", report.charged, complete=False, dropped=report.dropped)
    for i, lane in enumerate(lanes):
        resets = shared.pending_resets(i)
        lane.set_remote_service(shared.remote_for(i), elsewhere(i) if elsewhere is not None else None, resets)
        if resets:
            shared.confirm_resets(i, resets[-1][0])


def _backlog(schedulers: Sequence[Scheduler]) -> dict[int, dict[str, list[float]]]:
    """priority -> tenant -> [weight, eligible requests] over every replica's lane."""
    backlog: dict[int, dict[str, list[float]]] = {}
    for s in schedulers:
        for rid, request in s.running.items():
            if rid in s.lane:
                entry = backlog.setdefault(request.priority, {}).setdefault(request.tenant,
                                                                            [request.tenant_weight, 0])
                entry[1] += 1
    return backlog
