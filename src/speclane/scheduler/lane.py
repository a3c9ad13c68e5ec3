"""The speculative lane: which requests run a speculative round this tick. Pure policy.

This is the one place the lane's rules live (docs/design.md, "The lane, exactly"). A request
is *eligible* from ``add`` to ``remove``; it is then either a *holder* (runs one round
per tick) or a *waiter*. ``schedule(now)`` is called at every round boundary and applies,
in this order:

1. **Budget.** A grant lasts ``spec_grant_rounds`` rounds and/or ``spec_grant_ms`` ms of
   its rounds' wall time (0 = no limit of that kind; both 0 = hold for the whole
   generation, the legacy behaviour). A spent holder yields (event "yield") and rejoins
   the waiters at the back (FIFO time = now) only if someone waits; alone, its grant
   silently renews. A yielded holder may be granted again at once if the order says so.
   A holder whose grant the scheduler ended (``end_grant``: it drafted nothing this
   tick) counts as spent, under a budget of either kind, unless the order of granting
   would give the lane straight back to it: no waiter is as urgent (one less urgent would
   lose the lane to it again at the next boundary), or within its priority its tenant,
   its unused rounds handed back, still comes first. It then keeps its grant.
2. **Fill.** Free slots go to waiters in the *order of granting* below, so after
   ``schedule`` the lane holds ``min(spec_slots, eligible)`` requests (work-conserving).
3. **Preemption** (``spec_preempt``). While the next waiter in that order is strictly more
   urgent (lower priority number) than the least urgent holder, that holder is preempted
   (event "preempt") whatever budget it has left, and rejoins the waiters keeping its old
   FIFO key, so it loses no place within its priority. A grant made by the skip cap
   (rule a) is not preempted: otherwise the cap would buy a starving request nothing.

Order of granting:
  a. a priority whose waiters were *passed over* ``spec_skip_cap`` times is granted first
     (the one overdue longest, then the more urgent); rules c-d pick its waiter. Passed
     over = a grant (preemptions included) went to a more urgent request since this
     priority last got one, while it had waiters. Counted per priority, not per waiter:
     per waiter, a backlog of n less urgent requests would all become overdue together
     and take n grants in a row, handing them most of the lane; per priority, at most
     ``spec_skip_cap + P - 1`` grants go to more urgent requests between two grants to
     it (P = priorities waiting) and the urgent ones keep the rest. Equal-priority
     grants never count, so tenant fairness (c) survives the default cap of 2;
  b. the most urgent priority;
  c. ``fairness="tenant"``: the tenant with the least lane service per unit of weight
     (VTC counters, see ``fairness.py``); ``fairness="request"``: no tenant step;
  d. FIFO by the time the request became a waiter.

Tenant service (rule c) is charged per round in ``round_done``, but a grant's whole
round budget counts toward its tenant's key from the moment it is given (unused rounds
go back when it ends early): several slots granted at once then spread over tenants,
and backlogged tenants stay within one grant of each other whatever ``spec_slots``.

Accounting: a grant adds ``stats.grants``, a yield ``stats.yields``, a preemption the
holder's ``stats.preemptions``; ``stats.wait_ms`` gains the time spent waiting when the
wait ends (grant or removal). ``round_done`` charges the holder's budget (rounds and ms)
and its tenant's lane service; call it before ``remove`` for a request that finished in
its round. ``stats.rounds`` and the token counts belong to the scheduler. The lane's
bounds (docs/design.md) are stated and checked in tests/unit/test_lane_properties.py.

Cost: with n waiters, s slots and P distinct priorities among the waiters (a handful in
practice), ``schedule`` is O(s * P * log n) amortized, ``add`` O(log n), ``remove``
O(P * log n), ``round_done`` O(1): heaps with lazy deletion, rebuilt when half stale.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from speclane.config import LaneConfig
from speclane.request import SpecStats
from speclane.scheduler.counts import TenantNames, TenantTally
from speclane.scheduler.fairness import ChargeReport, ResetBatch, VirtualCounters

OrderKey = tuple[float, int]  # (time it became a waiter, sequence number)


@dataclass(frozen=True)
class LaneEvent:
    time_s: float
    kind: str  # "grant" | "yield" | "preempt" | "finish"
    request_id: str
    tenant: str
    priority: int


@dataclass(eq=False)
class _Member:
    """One eligible request."""

    request_id: str
    tenant: str
    group: str  # its fairness group: the tenant, or "" in request mode
    priority: int
    stats: SpecStats
    order_key: OrderKey = (0.0, 0)  # rule d; kept when preempted
    waiting_since: float = 0.0
    epoch: int = 0  # bumped whenever it stops waiting: older heap entries are stale
    waiting: bool = False
    holding: bool = False
    protected: bool = False  # granted by the skip cap: not preempted during this grant
    rounds: int = 0  # rounds run in the current grant
    ms: float = 0.0  # wall time of those rounds
    ended: bool = False  # the scheduler ended the grant early (end_grant)
    reserved: int = 0  # rounds of this grant charged to its tenant ahead of running them


def _live(entry: tuple) -> bool:
    *_, epoch, member = entry
    return member.epoch == epoch and member.waiting


class _PriorityClass:
    """The waiters of one priority: a FIFO heap per fairness group and a heap of groups
    by (fairness key, head's FIFO key)."""

    def __init__(self) -> None:
        self.num_waiters = 0
        self.passed = 0  # grants to more urgent requests since this priority got one
        self.overdue_since: int | None = None  # grants_total when passed reached the cap
        self.queues: dict[str, list[tuple[OrderKey, int, _Member]]] = {}
        self.counts: dict[str, int] = {}
        self.groups: list[tuple[float, OrderKey, str]] = []

    def push(self, m: _Member, key_of: Callable[[str], float]) -> None:
        self.num_waiters += 1
        heapq.heappush(self.queues.setdefault(m.group, []), (m.order_key, m.epoch, m))
        self.counts[m.group] = self.counts.get(m.group, 0) + 1
        self.touch(m.group, key_of)

    def discard(self, m: _Member) -> None:
        """``m`` stopped waiting (its epoch is already bumped); its entries go stale."""
        self.num_waiters -= 1
        left = self.counts[m.group] - 1
        if left == 0:
            del self.counts[m.group], self.queues[m.group]
            return
        self.counts[m.group] = left
        queue = self.queues[m.group]
        if len(queue) > 2 * left + 32:
            self.queues[m.group] = [e for e in queue if _live(e)]
            heapq.heapify(self.queues[m.group])

    def touch(self, group: str, key_of: Callable[[str], float]) -> None:
        """File ``group`` at its current position (needed when that position moved earlier)."""
        heapq.heappush(self.groups, (key_of(group), self._head(group).order_key, group))
        if len(self.groups) > 2 * len(self.counts) + 32:
            self.groups = [(key_of(g), self._head(g).order_key, g) for g in self.counts]
            heapq.heapify(self.groups)

    def best(self, key_of: Callable[[str], float]) -> _Member:
        """Rules c and d: the head of the group with the smallest (key, head FIFO key)."""
        groups = self.groups
        while True:
            key, head_key, group = groups[0]
            if group not in self.counts:
                heapq.heappop(groups)
                continue
            head = self._head(group)
            current = (key_of(group), head.order_key)
            if (key, head_key) == current:
                return head
            heapq.heapreplace(groups, (*current, group))  # positions only moved later

    def _head(self, group: str) -> _Member:
        queue = self.queues[group]
        while not _live(queue[0]):
            heapq.heappop(queue)
        return queue[0][2]


class SpecLane:
    """Who holds the speculative lane, tick by tick. See the module docstring."""

    def __init__(self, config: LaneConfig, *, record_events: bool = True,
                 max_events: int = 10_000, tenant_names: TenantNames | None = None) -> None:
        self.config = config
        self.grants_total = 0
        self.yields_total = 0
        self.preemptions_total = 0
        self._record_events = record_events
        self._events: deque[LaneEvent] = deque(maxlen=max_events)
        self._members: dict[str, _Member] = {}
        self._holders: list[_Member] = []  # in grant order
        self._classes: dict[int, _PriorityClass] = {}  # priority -> its waiters
        self._num_waiters = 0
        self._counters = VirtualCounters()
        # Rounds run per tenant, drafts or not (``round_done``): what the lane shares out.
        self.held_rounds_by_tenant = TenantTally(names=tenant_names)
        self._seq = itertools.count()
        self._tenant_fair = config.fairness == "tenant"

    # -- views ----------------------------------------------------------------------
    @property
    def holders(self) -> tuple[str, ...]:
        return tuple(m.request_id for m in self._holders)

    @property
    def waiters(self) -> tuple[str, ...]:
        """O(n), in the order they were added; prefer ``num_waiters`` for metrics."""
        return tuple(rid for rid, m in self._members.items() if m.waiting)

    @property
    def num_holders(self) -> int:
        return len(self._holders)

    @property
    def num_waiters(self) -> int:
        return self._num_waiters

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._members

    def holder_view(self) -> list[tuple[str, str, int]]:
        """``(request_id, tenant, priority)`` of each holder, in grant order (the dashboard)."""
        return [(m.request_id, m.tenant, m.priority) for m in self._holders]

    def waiters_by_tenant(self) -> dict[str, int]:
        """How many requests of each tenant wait for the lane; O(eligible requests)."""
        counts: dict[str, int] = {}
        for m in self._members.values():
            if m.waiting:
                counts[m.tenant] = counts.get(m.tenant, 0) + 1
        return counts

    @property
    def events(self) -> list[LaneEvent]:
        """The most recent events (at most ``max_events``), oldest first."""
        return list(self._events)

    def drain_events(self) -> list[LaneEvent]:
        events = list(self._events)
        self._events.clear()
        return events

    def lane_service(self, tenant: str) -> float:
        """The tenant's virtual lane service (rounds / weight, plus idle lifts)."""
        return self._counters.service(tenant)

    def charged_service(self, since: int = 0) -> ChargeReport:
        """Lane service run here per tenant, cumulative (replicas share it, ``fairness.py``):
        the tenants charged after version ``since`` (0: all), the charges dropped after it,
        and the version now."""
        return self._counters.charged_since(since)

    def set_remote_service(self, service: dict[str, float], active_elsewhere: set[str] | None = None,
                           resets: Sequence[ResetBatch] = ()) -> None:
        """What the other replicas charged each tenant (cumulative; keys only grow, so the
        waiters' heaps re-file lazily), who has requests there, and which tenants' remote
        service restarts from zero (``fairness.py``)."""
        self._counters.set_remote(service, active_elsewhere, resets)

    # -- the scheduler's calls ------------------------------------------------------
    def add(self, request_id: str, *, tenant: str, priority: int, now: float,
            stats: SpecStats | None = None, weight: float = 1.0) -> None:
        """``request_id`` became eligible: it joins the waiters."""
        if request_id in self._members:
            raise ValueError(f"request {request_id!r} is already in the lane")
        if not weight > 0:
            raise ValueError(f"tenant weight must be > 0; got {weight}")
        m = _Member(request_id, tenant, tenant if self._tenant_fair else "", priority,
                    stats if stats is not None else SpecStats())
        self._members[request_id] = m
        self._counters.join(tenant, weight)
        self._enqueue(m, now)

    def remove(self, request_id: str, now: float) -> None:
        """``request_id`` finished or was aborted; an unknown id is ignored."""
        m = self._members.pop(request_id, None)
        if m is None:
            return
        if m.waiting:
            self._dequeue(m, now)
        else:
            self._release(m)
            self._log(now, "finish", m)
        self._counters.leave(m.tenant)

    def schedule(self, now: float) -> list[str]:
        """Apply budget yields, grants and preemptions; return this tick's holders."""
        self._yield_spent(now)
        while self._num_waiters:
            nxt, overdue = self._next_waiter()
            if len(self._holders) >= self.config.spec_slots:
                victim = self._victim() if self.config.spec_preempt else None
                if victim is None or nxt.priority >= victim.priority:
                    break
                self._release(victim)
                victim.stats.preemptions += 1
                self.preemptions_total += 1
                self._log(now, "preempt", victim)
                self._enqueue(victim, now, keep_order=True)
            self._grant(nxt, now, protected=overdue)
        return [m.request_id for m in self._holders]

    def round_done(self, request_id: str, *, elapsed_ms: float, now: float) -> None:
        """A holder finished its round this tick, taking ``elapsed_ms`` of wall time."""
        m = self._members.get(request_id)
        if m is None:
            return
        if not m.holding:
            raise ValueError(f"request {request_id!r} ran a round without holding the lane")
        m.rounds += 1
        m.ms += elapsed_ms
        self.held_rounds_by_tenant.add(m.tenant)
        # With a round budget the grant was charged up front; without one, the round each
        # holder is about to run stays reserved (one round ahead) for as long as it holds.
        reserved = self.config.spec_grant_rounds > 0 and m.reserved > 0
        self._counters.charge(m.tenant, reserved=reserved)
        if reserved:
            m.reserved -= 1

    def end_grant(self, request_id: str) -> None:
        """End a holder's grant at this round boundary, whatever budget it has left: the
        next ``schedule`` yields it to a waiter that the order of granting puts ahead of it
        (rule 1; else it keeps the grant, and alone the grant renews). The scheduler ends
        the grant of a holder that drafted nothing in a tick (adaptive K gave it no drafts,
        or its drafter found none): held on, the lane would pass it by for the rest of its
        budget while a waiter whose drafts pay waits (a copy stream behind seven chat
        streams, with a budget of 8 rounds: 56 ticks). Unused rounds go back to its tenant,
        as for any grant that ends early. Without a budget (``spec_grant_rounds`` and
        ``spec_grant_ms`` 0, the legacy whole-generation hold) it does nothing."""
        m = self._members.get(request_id)
        if m is not None and m.holding and (self.config.spec_grant_rounds > 0 or self.config.spec_grant_ms > 0):
            m.ended = True

    # -- rules ----------------------------------------------------------------------
    def _budget_spent(self, m: _Member) -> bool:
        rounds, ms = self.config.spec_grant_rounds, self.config.spec_grant_ms
        return (rounds > 0 and m.rounds >= rounds) or (ms > 0 and m.ms >= ms)

    def _spent(self, m: _Member) -> bool:
        return self._budget_spent(m) or m.ended

    def _first_again(self, m: _Member) -> bool:
        """Whether holder ``m``, yielding now, would be the next waiter granted (rule 1's
        exception for an ended grant): no waiter as urgent, unless the skip cap's turn has
        come; within its priority, its tenant's key with its unused rounds handed back below
        the best waiter's (a tie, or another waiter of its own group, puts it behind: it
        would rejoin at the back)."""
        nxt, overdue = self._next_waiter()
        if nxt.priority != m.priority:
            return nxt.priority > m.priority and not overdue
        if not self._tenant_fair or m.group in self._classes[m.priority].counts:
            return False
        return self._counters.key(m.tenant, handing_back=m.reserved) < self._key_of(nxt.group)

    def _yield_spent(self, now: float) -> None:
        for m in [h for h in self._holders if self._spent(h)]:
            if self._num_waiters == 0:  # alone: the grant renews
                m.rounds, m.ms, m.protected, m.ended = 0, 0.0, False, False
                self._reserve(m)
                continue
            if not self._budget_spent(m) and self._first_again(m):  # an ended grant goes on
                m.ended = False
                continue
            self._release(m)
            m.stats.yields += 1
            self.yields_total += 1
            self._log(now, "yield", m)
            self._enqueue(m, now)

    def _next_waiter(self) -> tuple[_Member, bool]:
        """The waiter granted next, and whether the skip cap (rule a) chose it."""
        overdue = [(cls.overdue_since, p) for p, cls in self._classes.items()
                   if cls.overdue_since is not None]
        priority = min(overdue)[1] if overdue else min(self._classes)
        return self._classes[priority].best(self._key_of), bool(overdue)

    def _victim(self) -> _Member | None:
        """The holder a preemption takes: least urgent, then most used; not protected."""
        candidates = [m for m in self._holders if not m.protected]
        return max(candidates, key=lambda m: (m.priority, m.rounds), default=None)

    def _key_of(self, group: str) -> float:
        return self._counters.key(group) if self._tenant_fair else 0.0

    # -- state changes --------------------------------------------------------------
    def _grant(self, m: _Member, now: float, *, protected: bool) -> None:
        self._dequeue(m, now)
        m.holding, m.protected, m.rounds, m.ms, m.ended = True, protected, 0, 0.0, False
        self._holders.append(m)
        self._reserve(m)
        m.stats.grants += 1
        self.grants_total += 1
        self._log(now, "grant", m)
        for priority, cls in self._classes.items():
            if priority == m.priority:
                cls.passed, cls.overdue_since = 0, None
            elif priority > m.priority:
                cls.passed += 1
                if cls.passed == self.config.spec_skip_cap:
                    cls.overdue_since = self.grants_total

    def _reserve(self, m: _Member) -> None:
        """Charge a new grant's rounds to its tenant up front (see ``fairness.py``)."""
        full = self.config.spec_grant_rounds or 1
        self._counters.reserve(m.tenant, full - m.reserved)
        m.reserved = full

    def _release(self, m: _Member) -> None:
        """``m`` stops holding; unused reserved rounds go back to its tenant."""
        self._holders.remove(m)
        m.holding = m.protected = False
        refund, m.reserved = m.reserved, 0
        self._counters.reserve(m.tenant, -refund)
        if refund and self._tenant_fair:  # its key dropped: re-file the tenant's groups
            for cls in self._classes.values():
                if m.group in cls.counts:
                    cls.touch(m.group, self._key_of)

    def _enqueue(self, m: _Member, now: float, *, keep_order: bool = False) -> None:
        if not keep_order:
            m.order_key = (now, next(self._seq))
        m.waiting, m.waiting_since = True, now
        cls = self._classes.get(m.priority)
        if cls is None:
            cls = self._classes[m.priority] = _PriorityClass()
        cls.push(m, self._key_of)
        self._num_waiters += 1

    def _dequeue(self, m: _Member, now: float) -> None:
        m.waiting = False
        m.epoch += 1
        m.stats.wait_ms += max(0.0, now - m.waiting_since) * 1000.0
        cls = self._classes[m.priority]
        cls.discard(m)
        if cls.num_waiters == 0:
            del self._classes[m.priority]
        self._num_waiters -= 1

    def _log(self, now: float, kind: str, m: _Member) -> None:
        if self._record_events:
            self._events.append(LaneEvent(now, kind, m.request_id, m.tenant, m.priority))
