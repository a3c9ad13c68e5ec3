"""The lane's bounds (docs/design.md, "The lane, exactly"), measured from outside the lane while the simulator runs.

The monitor sees only what a user could: the scheduler's running requests, the lane's
holders and waiter count, its grant/yield/preempt/finish events, and the rounds each
tick ran. It never reads the lane's private state, so a bug in the lane shows up here.

- **Wait to first grant.** A request becomes a waiter when its prefill ends. After the
  first ``schedule`` that leaves it waiting, W = waiters of its priority (itself
  included); the lane promises a grant within ``ceil(W / slots) * budget`` ticks. The
  promise is about equal-priority waiters, so a wait during which any grant went to
  another priority (a more urgent request, or a skip-cap grant) is counted apart
  ("not clean"). A request that finishes before its first grant counts with the time
  it waited. Waits that began behind a request of the same tenant are tagged: with
  ``--fairness tenant`` such a request waits for its tenant's turns, not its own.
- **Lane share.** Within each priority, the rounds that priority ran each tick are
  shared among its backlogged tenants (those with an eligible request) in proportion to
  weight, each capped at one round per eligible request (water-filling): that is the
  tenant's fair share (generalized processor sharing). Jain's index is taken over
  ``actual / fair`` of every (tenant, priority) entitled to at least one grant; the lag
  ``fair - actual`` within a backlogged period shows how far a tenant fell behind.
- **Holder overrun.** Rounds a holder began with its budget already spent while someone
  waited (a spent holder with no waiter renews, as the lane's rules say). Promise: <= 1.
- **Work conservation.** After every ``schedule``: holders >= min(slots, eligible).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from speclane.config import LaneConfig
from speclane.scheduler.lane import LaneEvent
from speclane.scheduler.plan import RunnerResult, SchedulerPlan
from speclane.scheduler.scheduler import Scheduler

Key = tuple[str, int]  # (tenant, priority)


@dataclass
class _Wait:
    tick: int  # the schedule it first waited after
    now: float
    bound: float  # ceil(W / slots) * budget ticks (inf without a round budget)
    other_grants: int  # grants to other priorities so far (clean = unchanged at the grant)
    priority: int
    behind_own_tenant: bool  # a request of its own tenant (and priority) was already waiting


@dataclass
class _Grant:
    rounds: int = 0
    ms: float = 0.0
    overrun: int = 0


@dataclass
class WaitSample:
    bound: float
    wait_ticks: int
    wait_s: float
    clean: bool
    granted: bool
    behind_own_tenant: bool = False


@dataclass
class BoundsReport:
    waits: list[WaitSample] = field(default_factory=list)
    share_ratios: dict[Key, float] = field(default_factory=dict)  # actual / fair lane rounds
    fair_rounds: dict[Key, float] = field(default_factory=dict)
    jain: float = float("nan")
    max_lag_rounds: float = 0.0
    max_overrun: int = 0
    grants_with_overrun: int = 0
    wc_violations: int = 0
    wc_checked: int = 0
    membership_mismatches: int = 0
    budget_rounds: int = 0

    def wait_violations(self, *, clean_only: bool, behind_own_tenant: bool | None = None) -> int:
        return sum(1 for w in self.waits if w.wait_ticks > w.bound and (w.clean or not clean_only)
                   and (behind_own_tenant is None or w.behind_own_tenant == behind_own_tenant))

    def max_wait(self) -> WaitSample | None:
        return max(self.waits, key=lambda w: w.wait_ticks, default=None)


class BoundsMonitor:
    def __init__(self, lane_config: LaneConfig):
        self.cfg = lane_config
        self.slots = lane_config.spec_slots
        self.budget = lane_config.spec_grant_rounds
        self.active = lane_config.speculation_enabled
        self.report = BoundsReport(budget_rounds=self.budget)
        self._eligible: dict[str, tuple[str, int, float]] = {}  # rid -> (tenant, priority, weight)
        self._joiners: list[str] = []  # became eligible at the last update
        self._waits: dict[str, _Wait] = {}
        self._grants: dict[str, _Grant] = {}
        self._grants_by_priority: dict[int, int] = defaultdict(int)
        self._grants_total = 0
        self._waiters_before = 0
        # Lane share: the backlog, per priority: tenant -> [weight, eligible requests].
        self._backlog: dict[int, dict[str, list[float]]] = {}
        self._backlog_stale = False
        self._ledger = ShareLedger()

    # -- after schedule -------------------------------------------------------------
    def after_schedule(self, tick: int, now: float, scheduler: Scheduler, plan: SchedulerPlan,
                       lane_events: list[LaneEvent]) -> None:
        lane = scheduler.lane
        for ev in lane_events:
            if ev.kind == "grant":
                self._on_grant(ev, tick, now)
            elif ev.kind in ("yield", "preempt"):
                self._close_grant(ev.request_id)
        holders = lane.holders
        num_waiters = lane.num_waiters
        self._check_holders(holders, num_waiters)
        eligible = len(self._eligible)
        if eligible != len(holders) + num_waiters:
            self.report.membership_mismatches += 1
        self.report.wc_checked += 1
        if len(holders) < min(self.slots, eligible):
            self.report.wc_violations += 1
        if self._joiners:
            self._start_waits(tick, now, set(holders))

    def _start_waits(self, tick: int, now: float, holders: set[str]) -> None:
        joiners = set(self._joiners)
        waiting_by_priority: dict[int, int] = defaultdict(int)
        waiting_tenants: set[tuple[str, int]] = set()  # (tenant, priority) with a waiter already
        for rid, (tenant, priority, _) in self._eligible.items():
            if rid not in holders:
                waiting_by_priority[priority] += 1
                if rid not in joiners:
                    waiting_tenants.add((tenant, priority))
        for rid in self._joiners:
            if rid in holders or rid in self._waits or rid not in self._eligible:
                continue
            tenant, priority, _ = self._eligible[rid]
            w = waiting_by_priority[priority]
            bound = math.ceil(w / self.slots) * self.budget if self.budget else math.inf
            self._waits[rid] = _Wait(tick, now, bound, self._other_grants(priority), priority,
                                     (tenant, priority) in waiting_tenants)
            waiting_tenants.add((tenant, priority))  # later joiners of its tenant are behind it
        self._joiners = []

    def _on_grant(self, ev: LaneEvent, tick: int, now: float) -> None:
        self._grants_total += 1
        self._grants_by_priority[ev.priority] += 1
        self._grants[ev.request_id] = _Grant()
        wait = self._waits.pop(ev.request_id, None)
        if wait is not None:
            clean = self._other_grants(wait.priority) == wait.other_grants
            self.report.waits.append(WaitSample(wait.bound, tick - wait.tick, now - wait.now, clean, True,
                                                wait.behind_own_tenant))
        elif ev.request_id in self._joiners:  # granted at its first schedule: no wait at all
            self.report.waits.append(WaitSample(0.0, 0, 0.0, True, True))
            self._joiners.remove(ev.request_id)

    def _other_grants(self, priority: int) -> int:
        return self._grants_total - self._grants_by_priority[priority]

    def _close_grant(self, rid: str) -> None:
        grant = self._grants.pop(rid, None)
        if grant is not None and grant.overrun:
            self.report.grants_with_overrun += 1
            self.report.max_overrun = max(self.report.max_overrun, grant.overrun)

    def _spent(self, g: _Grant) -> bool:
        return (self.budget > 0 and g.rounds >= self.budget) or (0 < self.cfg.spec_grant_ms <= g.ms)

    def _check_holders(self, holders: tuple[str, ...], num_waiters: int) -> None:
        for rid in holders:
            g = self._grants.get(rid)
            if g is None or not self._spent(g):
                continue
            if self._waiters_before == 0:  # nobody waited at the boundary: the grant renewed
                g.rounds, g.ms = 0, 0.0
            elif num_waiters > 0:
                g.overrun += 1
                self.report.max_overrun = max(self.report.max_overrun, g.overrun)

    # -- after update ---------------------------------------------------------------
    def after_update(self, tick: int, now: float, scheduler: Scheduler, plan: SchedulerPlan, result: RunnerResult,
                     lane_events: list[LaneEvent]) -> None:
        rounds: dict[Key, float] = {}
        running = scheduler.running
        eligible = self._eligible
        for seq in plan.seqs:
            rid = seq.request_id
            if seq.is_round:
                g = self._grants.get(rid)
                if g is not None:
                    g.rounds += 1
                    g.ms += result.elapsed_ms
                owner = eligible.get(rid)
                if owner is not None:
                    key = (owner[0], owner[1])
                    rounds[key] = rounds.get(key, 0.0) + 1
            r = running.get(rid)
            if r is None:  # finished this tick
                if eligible.pop(rid, None) is not None:
                    self._backlog_stale = True
                wait = self._waits.pop(rid, None)
                if wait is not None:  # it never got the lane
                    clean = self._other_grants(wait.priority) == wait.other_grants
                    self.report.waits.append(WaitSample(wait.bound, tick + 1 - wait.tick, now - wait.now, clean, False,
                                                        wait.behind_own_tenant))
            elif self.active and rid not in eligible and r.speculative and r.caught_up:
                eligible[rid] = (r.tenant, r.priority, r.tenant_weight)
                self._joiners.append(rid)
                self._backlog_stale = True
        self._share(rounds)
        for ev in lane_events:
            if ev.kind == "finish":
                self._close_grant(ev.request_id)
        self._waiters_before = scheduler.lane.num_waiters

    def _share(self, rounds: dict[Key, float]) -> None:
        """Fair shares of this tick's rounds within each priority; lags per backlogged period.

        Uses the backlog as it stood at this tick's schedule (membership changes made by
        this update take effect from the next tick)."""
        self._ledger.add(rounds, self._backlog)
        self.report.max_lag_rounds = self._ledger.max_lag
        if self._backlog_stale:
            self._rebuild_backlog()

    def _rebuild_backlog(self) -> None:
        backlog: dict[int, dict[str, list[float]]] = {}
        for tenant, priority, weight in self._eligible.values():
            entry = backlog.setdefault(priority, {}).setdefault(tenant, [weight, 0])
            entry[1] += 1
        self._ledger.end_periods(backlog)
        self._backlog = backlog
        self._backlog_stale = False

    # -- the end ----------------------------------------------------------------------
    def finish(self) -> BoundsReport:
        for rid in list(self._grants):
            self._close_grant(rid)
        rep = self.report
        threshold = self.budget or 8
        rep.fair_rounds = {k: v for k, v in self._ledger.fair.items() if v >= threshold}
        rep.share_ratios = self._ledger.ratios(threshold)
        rep.jain = jain(list(rep.share_ratios.values()))
        return rep


class ShareLedger:
    """Fair and actual lane rounds per (tenant, priority), and each one's lag within its
    backlogged period: ``add`` one tick's rounds against the backlog it had (priority ->
    tenant -> [weight, eligible requests]); ``end_periods`` drops the lags of those that
    left it."""

    def __init__(self) -> None:
        self.fair: dict[Key, float] = defaultdict(float)
        self.actual: dict[Key, float] = defaultdict(float)
        self.lag: dict[Key, float] = {}
        self.max_lag = 0.0

    def add(self, rounds: dict[Key, float], backlog: dict[int, dict[str, list[float]]]) -> None:
        for priority, tenants in backlog.items():
            capacity = sum(v for (_, p), v in rounds.items() if p == priority)
            if not capacity:
                continue  # no entitlement, no service: nothing moves
            for tenant, share in water_fill(capacity, tenants).items():
                key = (tenant, priority)
                got = rounds.get(key, 0.0)
                self.fair[key] += share
                self.actual[key] += got
                lag = self.lag.get(key, 0.0) + share - got
                self.lag[key] = lag
                self.max_lag = max(self.max_lag, abs(lag))

    def end_periods(self, backlog: dict[int, dict[str, list[float]]]) -> None:
        for key in [k for k in self.lag if k[0] not in backlog.get(k[1], ())]:
            del self.lag[key]  # its backlogged period ended

    def ratios(self, threshold: float) -> dict[Key, float]:
        """``actual / fair`` of every key entitled to at least ``threshold`` rounds."""
        return {k: self.actual[k] / v for k, v in self.fair.items() if v >= threshold}


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one gets everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else float("nan")


def water_fill(capacity: float, tenants: dict[str, list[float]]) -> dict[str, float]:
    """Split ``capacity`` by weight, each tenant capped at its number of eligible requests."""
    total_w = sum(w for w, _ in tenants.values())
    if all(capacity * w / total_w <= cap for w, cap in tenants.values()):
        return {t: capacity * w / total_w for t, (w, _) in tenants.items()}
    share: dict[str, float] = {}
    open_ = dict(tenants)
    left = capacity
    while open_ and left > 1e-12:
        total_w = sum(w for w, _ in open_.values())
        capped = {t: v for t, v in open_.items() if left * v[0] / total_w >= v[1]}
        if not capped:
            for t, (w, _) in open_.items():
                share[t] = left * w / total_w
            return share
        for t, (_, cap) in capped.items():
            share[t] = cap
            left -= cap
            del open_[t]
    for t in open_:
        share[t] = 0.0
    return share
