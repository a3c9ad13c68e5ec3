"""Property-based tests of the lane: the bounds of docs/design.md ("The lane, exactly") over random traffic.

1. ``SpecLane`` makes exactly the decisions of ``ReferenceLane``, the same rules written
   the slow, obvious way (lists, O(n) scans, per-priority pass-over counts kept by hand,
   no forgetting of idle tenants): this checks the heaps, the lazy deletion and the compaction.
2. Invariants under any traffic (random arrivals, priorities, tenants, weights, removals,
   skipped rounds, wall times): never more holders than slots; work-conserving; a holder
   never starts a round past its budget while someone waits; with preemption on (and no
   skip-cap grant in play) no holder is less urgent than a waiter after ``schedule``;
   between two grants to a priority that has waiters, at most ``spec_skip_cap + P - 1``
   grants go to more urgent requests (P = number of priorities, 3 here): it becomes
   overdue after ``spec_skip_cap`` of them, then waits only for priorities that were
   overdue before it, each served once.
3. Wait bound (``fairness="request"``, one priority, round budget B, S slots, every
   holder runs its round each tick; an ms budget too only shortens grants; arrivals and
   removals allowed): a request waiting among W waiters after some ``schedule`` holds the
   lane within ``ceil(W / S) * B`` further ticks. Proof: later waiters queue behind it (FIFO, no
   preemption, no pass-overs at one priority); each slot frees within B ticks and then
   at least every B ticks, so ``ceil(W / S) * B`` ticks bring >= W frees, and it needs at
   most W of them (W - 1 requests ahead of it, then itself).
4. Service bound (``fairness="tenant"``, one priority, round budget B, any S, every
   tenant always has a waiter, every holder runs its round each tick, all tenants start
   together): for any tenants t, u at every tick,
   ``rounds_t / w_t - rounds_u / w_u <= B / w_t`` -- no tenant gets ahead of another by
   more than one grant of its own. Proof sketch: every grant runs exactly B rounds and is
   charged up front, so t's j-th grant covers virtual service [(j-1)B/w_t, jB/w_t]; when
   t's (j+1)-th grant is given, u has already been given the grant covering virtual
   point jB/w_t (t's key was the smallest), which started no later, so has progressed at
   least as far; integrating over the virtual axis, u's service is at least t's minus
   t's first grant.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclane.config import LaneConfig
from speclane.request import SpecStats
from speclane.scheduler.lane import SpecLane

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TENANTS = ("A", "B", "C", "D")


# -- the reference model -----------------------------------------------------------------
@dataclass(eq=False)
class _Req:
    rid: str
    tenant: str
    priority: int
    stats: SpecStats
    order_key: tuple[float, int] = (0.0, 0)
    since: float = 0.0
    waiting: bool = False
    protected: bool = False
    rounds: int = 0
    ms: float = 0.0
    reserved: int = 0
    ended: bool = False


class ReferenceLane:
    """lane.py's rules with lists and scans (see the module docstring of lane.py)."""

    def __init__(self, config: LaneConfig) -> None:
        self.c = config
        self.reqs: dict[str, _Req] = {}
        self.holders: list[_Req] = []
        self.tenants: dict[str, dict] = {}  # name -> base, rounds, reserved, weight, eligible
        self.floor = 0.0
        self.seq = 0
        self.passed: dict[int, int] = {}  # priority -> more urgent grants since it got one
        self.overdue_since: dict[int, int | None] = {}
        self.events: list[tuple] = []
        self.totals = [0, 0, 0]  # grants, yields, preemptions

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def counter(self, name: str) -> float:
        t = self.tenants[name]
        return t["base"] + t["rounds"] / t["weight"]

    def key(self, name: str) -> float:
        t = self.tenants[name]
        return t["base"] + (t["rounds"] + t["reserved"]) / t["weight"]

    def waiters(self) -> list[_Req]:
        return [r for r in self.reqs.values() if r.waiting]

    def add(self, rid, tenant, priority, weight, now, stats) -> None:
        t = self.tenants.setdefault(tenant, {"base": None, "rounds": 0, "reserved": 0,
                                             "weight": weight, "eligible": 0})
        if t["eligible"] == 0:
            active = [self.counter(n) for n, x in self.tenants.items() if x["eligible"]]
            target = min(active) if active else self.floor
            old = target if t["base"] is None else self.counter(tenant)
            t.update(base=max(old, target), rounds=0, weight=weight)
        t["eligible"] += 1
        self.reqs[rid] = r = _Req(rid, tenant, priority, stats)
        self._enqueue(r, now)

    def remove(self, rid, now) -> None:
        r = self.reqs.pop(rid, None)
        if r is None:
            return
        if r.waiting:
            self._dequeue(r, now)
        else:
            self._release(r)
            self.events.append((now, "finish", r.rid, r.tenant, r.priority))
        t = self.tenants[r.tenant]
        t["eligible"] -= 1
        if not any(x["eligible"] for x in self.tenants.values()):
            self.floor = max(self.floor, self.counter(r.tenant))

    def end_grant(self, rid) -> None:
        r = self.reqs.get(rid)
        if r is not None and r in self.holders:
            r.ended = True

    def _first_again(self, h: _Req) -> bool:
        """An ended holder that would be the next waiter granted keeps its grant."""
        nxt, overdue = self._next()
        if nxt.priority != h.priority:
            return nxt.priority > h.priority and not overdue
        if self.c.fairness != "tenant" or any(w.priority == h.priority and w.tenant == h.tenant for w in self.waiters()):
            return False
        t = self.tenants[h.tenant]
        return t["base"] + (t["rounds"] + t["reserved"] - h.reserved) / t["weight"] < self.key(nxt.tenant)

    def schedule(self, now) -> list[str]:
        for h in [h for h in self.holders if self._spent(h)]:
            if not self.waiters():
                h.rounds, h.ms, h.protected, h.ended = 0, 0.0, False, False
                self._reserve(h)
                continue
            if not self._budget_spent(h) and self._first_again(h):
                h.ended = False
                continue
            self._release(h)
            h.stats.yields += 1
            self.totals[1] += 1
            self.events.append((now, "yield", h.rid, h.tenant, h.priority))
            self._enqueue(h, now)
        while self.waiters():
            nxt, overdue = self._next()
            if len(self.holders) >= self.c.spec_slots:
                candidates = [h for h in self.holders if not h.protected]
                if not self.c.spec_preempt or not candidates:
                    break
                victim = max(candidates, key=lambda h: (h.priority, h.rounds))
                if nxt.priority >= victim.priority:
                    break
                self._release(victim)
                victim.stats.preemptions += 1
                self.totals[2] += 1
                self.events.append((now, "preempt", victim.rid, victim.tenant, victim.priority))
                self._enqueue(victim, now, keep_order=True)
            self._dequeue(nxt, now)
            nxt.protected, nxt.rounds, nxt.ms, nxt.ended = overdue, 0, 0.0, False
            self.holders.append(nxt)
            self._reserve(nxt)
            nxt.stats.grants += 1
            self.totals[0] += 1
            self.events.append((now, "grant", nxt.rid, nxt.tenant, nxt.priority))
            for p in {w.priority for w in self.waiters()}:
                if p == nxt.priority:
                    self.passed[p], self.overdue_since[p] = 0, None
                elif p > nxt.priority:
                    self.passed[p] += 1
                    if self.passed[p] == self.c.spec_skip_cap:
                        self.overdue_since[p] = self.totals[0]
        return [h.rid for h in self.holders]

    def round_done(self, rid, elapsed_ms) -> None:
        r = self.reqs.get(rid)
        if r is None:
            return
        r.rounds += 1
        r.ms += elapsed_ms
        t = self.tenants[r.tenant]
        t["rounds"] += 1
        if self.c.spec_grant_rounds > 0 and r.reserved > 0:
            r.reserved -= 1
            t["reserved"] -= 1

    def _next(self) -> tuple[_Req, bool]:
        waiters = self.waiters()
        overdue = [(self.overdue_since[p], p) for p in {w.priority for w in waiters}
                   if self.overdue_since[p] is not None]
        top = min(overdue)[1] if overdue else min(w.priority for w in waiters)
        fair = self.c.fairness == "tenant"
        return min((w for w in waiters if w.priority == top),
                   key=lambda w: (self.key(w.tenant) if fair else 0.0, w.order_key)), bool(overdue)

    def _budget_spent(self, h: _Req) -> bool:
        rounds, ms = self.c.spec_grant_rounds, self.c.spec_grant_ms
        return (rounds > 0 and h.rounds >= rounds) or (ms > 0 and h.ms >= ms)

    def _spent(self, h: _Req) -> bool:
        return self._budget_spent(h) or (h.ended and (self.c.spec_grant_rounds > 0 or self.c.spec_grant_ms > 0))

    def _reserve(self, h: _Req) -> None:
        full = self.c.spec_grant_rounds or 1
        self.tenants[h.tenant]["reserved"] += full - h.reserved
        h.reserved = full

    def _release(self, h: _Req) -> None:
        self.holders.remove(h)
        h.protected = False
        self.tenants[h.tenant]["reserved"] -= h.reserved
        h.reserved = 0

    def _enqueue(self, r: _Req, now, keep_order=False) -> None:
        if not keep_order:
            r.order_key = (now, self._next_seq())
        if not any(w.priority == r.priority for w in self.waiters()):  # a fresh count
            self.passed[r.priority], self.overdue_since[r.priority] = 0, None
        r.waiting, r.since = True, now

    def _dequeue(self, r: _Req, now) -> None:
        r.waiting = False
        r.stats.wait_ms += max(0.0, now - r.since) * 1000.0


# -- random traffic ------------------------------------------------------------------------
configs = st.builds(
    LaneConfig,
    spec_slots=st.integers(1, 3),
    spec_grant_rounds=st.integers(0, 4),
    spec_grant_ms=st.sampled_from([0.0, 15.0, 40.0]),
    spec_skip_cap=st.integers(1, 3),
    spec_preempt=st.booleans(),
    fairness=st.sampled_from(["tenant", "request"]),
)
WEIGHTS = (1.0, 1.0, 2.0, 0.5, 3.0)
ROUND_MS = (1.0, 5.0, 10.0, 20.0)


def _op(code: int) -> tuple:
    """One random operation from one integer (cheap for hypothesis to draw and shrink):
    add 2/6, remove 1/6, tick 3/6 (a round wall time, a bit mask of holders that skip
    their round, as when the scheduler has no draft budget left for one, and a bit mask of
    holders whose round drafted nothing, which ends their grant)."""
    kind, code = code % 6, code // 6
    if kind < 2:
        return ("add", TENANTS[code % 4], code // 4 % 3, WEIGHTS[code // 12 % 5])
    if kind == 2:
        return ("remove", code)
    return ("tick", ROUND_MS[code % 4], code // 4 % 8, code // 32 % 8)


ops = st.lists(st.integers(0, 2**20).map(_op), min_size=40, max_size=200)


class Driver:
    """Replays ops on a lane (and optionally the reference), checking invariants each tick."""

    def __init__(self, config: LaneConfig, reference: bool = False) -> None:
        self.config = config
        self.lane = SpecLane(config)
        self.ref = ReferenceLane(config) if reference else None
        self.now = 0.0
        self.count = 0
        self.stats: dict[str, SpecStats] = {}
        self.ref_stats: dict[str, SpecStats] = {}
        self.priority: dict[str, int] = {}
        self.budget_rounds: dict[str, int] = {}  # rounds since grant or renewal
        self.budget_ms: dict[str, float] = {}
        self.ended: set[str] = set()  # holders whose grant the last tick ended (end_grant)
        self.class_passes: dict[int, int] = {}  # priority with waiters -> passes since served
        self.new_events: list = []  # the lane's events during the last op

    def apply(self, op: tuple) -> None:
        self.new_events = []
        if op[0] == "add":
            _, tenant, priority, weight = op
            rid = f"r{self.count}"
            self.count += 1
            self.stats[rid], self.priority[rid] = SpecStats(), priority
            self.lane.add(rid, tenant=tenant, priority=priority, now=self.now,
                          stats=self.stats[rid], weight=weight)
            if self.ref:
                self.ref_stats[rid] = SpecStats()
                self.ref.add(rid, tenant, priority, weight, self.now, self.ref_stats[rid])
            self._sync_classes(set(self.lane.waiters))
        elif op[0] == "remove":
            present = sorted(rid for rid in self.stats if rid in self.lane)
            if present:
                self.remove(present[op[1] % len(present)])
        else:
            self.tick(*op[1:])
        if self.ref:
            self.compare()

    def remove(self, rid: str) -> None:
        self.lane.remove(rid, self.now)
        self.new_events += self.lane.drain_events()
        self._sync_classes(set(self.lane.waiters))
        if self.ref:
            self.ref.remove(rid, self.now)

    def tick(self, round_ms: float = 10.0, skip_mask: int = 0, end_mask: int = 0) -> list[str]:
        waiting_before = set(self.lane.waiters)
        eligible = self.lane.num_waiters + self.lane.num_holders
        holders = self.lane.schedule(self.now)
        self.new_events = self.lane.drain_events()
        expected = self.ref.schedule(self.now) if self.ref else None
        assert expected is None or holders == expected
        self._check_after_schedule(holders, eligible, waiting_before)
        self.now = round(self.now + round_ms / 1000.0, 9)
        for i, rid in enumerate(holders):
            if skip_mask >> i & 1:
                continue  # e.g. no draft budget left: the scheduler runs no round for it
            self.lane.round_done(rid, elapsed_ms=round_ms, now=self.now)
            if self.ref:
                self.ref.round_done(rid, round_ms)
            self.budget_rounds[rid] += 1
            self.budget_ms[rid] += round_ms
            if end_mask >> i & 1:  # it drafted nothing: the scheduler ends its grant
                self.lane.end_grant(rid)
                self.ended.add(rid)
                if self.ref:
                    self.ref.end_grant(rid)
        return holders

    def _sync_classes(self, waiting: set[str]) -> None:
        """Priorities that just got waiters start counting from 0; emptied ones stop."""
        priorities = {self.priority[rid] for rid in waiting}
        self.class_passes = {p: self.class_passes.get(p, 0) for p in priorities}

    def _check_after_schedule(self, holders: list[str], eligible: int, waiting: set[str]) -> None:
        c, lane = self.config, self.lane
        had_waiters = bool(waiting)
        assert len(holders) == min(c.spec_slots, eligible)  # never more than slots; conserving
        assert len(set(holders)) == len(holders) and not set(holders) & set(lane.waiters)
        for event in self.new_events:  # replay the boundary in order
            rid = event.request_id
            if event.kind == "grant":
                waiting.discard(rid)
                self.budget_rounds[rid], self.budget_ms[rid] = 0, 0.0
                self._sync_classes(waiting)
                for p in self.class_passes:
                    if p == event.priority:
                        self.class_passes[p] = 0
                    elif p > event.priority:
                        self.class_passes[p] += 1
                        assert self.class_passes[p] <= c.spec_skip_cap + 3 - 1
            else:  # yield or preempt: back among the waiters
                waiting.add(rid)
            self._sync_classes(waiting)
        assert waiting == set(lane.waiters)
        if not had_waiters:  # holders alone at the boundary: spent (or ended) grants renewed
            budget = c.spec_grant_rounds > 0 or c.spec_grant_ms > 0
            for rid in holders:
                if self._spent(rid) or (rid in self.ended and budget):
                    self.budget_rounds[rid], self.budget_ms[rid] = 0, 0.0
        self.ended.clear()  # yielded, renewed, or kept where the lane would grant it again
        if lane.num_waiters:  # nobody starts a round with its budget spent while others wait
            assert not any(self._spent(rid) for rid in holders)
        if c.spec_preempt and c.spec_skip_cap > 10**6 and lane.num_waiters:
            assert max(self.priority[h] for h in holders) <= min(
                self.priority[w] for w in lane.waiters)

    def _spent(self, rid: str) -> bool:
        rounds, ms = self.config.spec_grant_rounds, self.config.spec_grant_ms
        return (rounds > 0 and self.budget_rounds[rid] >= rounds) or (
            ms > 0 and self.budget_ms[rid] >= ms)

    def compare(self) -> None:
        lane, ref = self.lane, self.ref
        assert lane.holders == tuple(h.rid for h in ref.holders)
        assert set(lane.waiters) == {w.rid for w in ref.waiters()}
        assert [(e.time_s, e.kind, e.request_id, e.tenant, e.priority)
                for e in self.new_events] == ref.events
        ref.events.clear()
        assert [lane.grants_total, lane.yields_total, lane.preemptions_total] == ref.totals
        assert self.stats == self.ref_stats
        for name, t in ref.tenants.items():
            if t["eligible"]:
                assert lane.lane_service(name) == ref.counter(name)


@SETTINGS
@given(config=configs, ops=ops)
def test_lane_decides_exactly_like_the_reference(config, ops):
    driver = Driver(config, reference=True)
    for op in ops:
        driver.apply(op)


def test_long_random_run_matches_the_reference():
    """Thousands of operations: enough stale heap entries to trigger every compaction."""
    rng = random.Random(7)
    for fairness in ("tenant", "request"):
        config = LaneConfig(spec_slots=2, spec_grant_rounds=2, spec_skip_cap=2,
                            fairness=fairness)
        driver = Driver(config, reference=True)
        for _ in range(3000):
            roll = rng.random()
            if roll < 0.25 or driver.lane.num_waiters < 3:
                op = ("add", rng.choice(TENANTS), rng.choice([0, 0, 1, 2]), rng.choice([1.0, 2.0]))
            elif roll < 0.38:
                op = ("remove", rng.randrange(10**6))
            else:
                op = ("tick", 10.0, 0)
            driver.apply(op)


def test_churn_exercises_every_compaction_and_forgetting():
    """Stale entries pile up behind long waiters; idle tenants in debt are kept, then
    forgotten once the lift target passes them: decisions stay the reference's."""
    driver = Driver(LaneConfig(spec_grant_rounds=1, spec_skip_cap=10**9), reference=True)

    def add(tenant: str, priority: int) -> str:
        driver.apply(("add", tenant, priority, 1.0))
        return f"r{driver.count - 1}"

    def remove(rid: str) -> None:
        driver.new_events = []
        driver.remove(rid)
        driver.compare()

    def tick() -> None:
        driver.apply(("tick", 10.0, 0))

    x0 = add("A", 5)  # waits throughout: A's counter stays the minimum (and sorts first)
    add("Y", 0)
    for i in range(120):
        visitor, extra_a = add(f"T{i}", 0), add("A", 5)
        tick()
        tick()  # the visitor gets a round: it leaves in debt
        remove(visitor)
        remove(extra_a)
    remove(x0)
    for i in range(60):
        add(f"U{i}", 0)
        tick()


def test_a_tenant_returning_exactly_level_with_the_lift_target():
    """Regression: forgetting an idle tenant must not forget the one being re-activated."""
    driver = Driver(LaneConfig(spec_grant_rounds=1), reference=True)
    driver.apply(("add", "A", 0, 1.0))  # r0
    driver.apply(("add", "B", 0, 1.0))  # r1
    driver.apply(("tick", 10.0, 0))  # r0 runs: A's counter 1
    driver.new_events = []
    driver.remove("r0")  # A idles in debt (B is at 0)
    driver.compare()
    driver.apply(("tick", 10.0, 0))  # r1 runs: B's counter 1, level with A's
    driver.apply(("add", "A", 0, 1.0))
    for _ in range(4):
        driver.apply(("tick", 10.0, 0))


@SETTINGS
@given(config=configs, ops=ops, no_skip_cap=st.booleans())
def test_invariants_hold_under_any_traffic(config, ops, no_skip_cap):
    if no_skip_cap:
        config = dataclasses.replace(config, spec_skip_cap=10**9)
    driver = Driver(config)
    for op in ops:
        driver.apply(op)


@SETTINGS
@given(
    slots=st.integers(1, 3),
    budget=st.integers(1, 5),
    grant_ms=st.sampled_from([0.0, 25.0]),
    ops=st.lists(st.one_of(st.just(("tick",)), st.tuples(st.just("add"), st.sampled_from(TENANTS)),
                           st.tuples(st.just("remove"), st.integers(0, 10**6))),
                 min_size=1, max_size=150),
)
def test_request_mode_every_waiter_is_granted_within_ceil_w_over_s_budgets(
        slots, budget, grant_ms, ops):
    config = LaneConfig(spec_slots=slots, spec_grant_rounds=budget, spec_grant_ms=grant_ms,
                        fairness="request")
    driver = Driver(config)
    deadline: dict[str, int] = {}  # the tick by which each waiter must hold the lane
    tick = 0
    for op in ops:
        if op[0] == "tick":
            holders = driver.tick(round_ms=10.0)
            for rid in holders:
                deadline.pop(rid, None)
            waiters = driver.lane.waiters
            bound = math.ceil(len(waiters) / slots) * budget
            for rid in waiters:
                assert tick < deadline.get(rid, math.inf), (rid, tick)
                deadline[rid] = min(deadline.get(rid, math.inf), tick + bound)
            tick += 1
        else:
            driver.apply(op if op[0] == "remove" else ("add", op[1], 0, 1.0))
            deadline = {rid: d for rid, d in deadline.items() if rid in driver.lane}


@SETTINGS
@given(
    slots=st.integers(1, 4),
    budget=st.integers(1, 5),
    weights=st.lists(st.sampled_from([1.0, 2.0, 3.0, 0.5, 1.5]), min_size=2, max_size=4),
    extra=st.lists(st.integers(0, 2), min_size=4, max_size=4),
    ticks=st.integers(1, 120),
    seed=st.integers(0, 2**16),
)
def test_backlogged_tenants_stay_within_one_grant_of_each_other(
        slots, budget, weights, extra, ticks, seed):
    lane = SpecLane(LaneConfig(spec_slots=slots, spec_grant_rounds=budget), record_events=False)
    tenant_weight = {f"t{i}": w for i, w in enumerate(weights)}
    requests = [(f"{t}-{j}", t) for i, t in enumerate(tenant_weight)
                for j in range(slots + 1 + extra[i])]  # more than `slots`: always one waiting
    random.Random(seed).shuffle(requests)
    for rid, tenant in requests:
        lane.add(rid, tenant=tenant, priority=0, now=0.0, weight=tenant_weight[tenant])
    tenant_of = dict(requests)
    rounds = dict.fromkeys(tenant_weight, 0)
    for tick in range(ticks):
        for rid in lane.schedule(float(tick)):
            lane.round_done(rid, elapsed_ms=10.0, now=tick + 1.0)
            rounds[tenant_of[rid]] += 1
        service = {t: rounds[t] / w for t, w in tenant_weight.items()}
        for t, w in tenant_weight.items():
            assert service[t] - min(service.values()) <= budget / w + 1e-9, (tick, service)
