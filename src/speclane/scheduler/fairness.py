"""Virtual lane-service counters per tenant, as in VTC ("Fairness in Serving Large
Language Models", OSDI'24), counted in speculative rounds.

A tenant's counter grows by ``1 / weight`` for every lane round one of its requests runs.
The lane grants within a priority to the tenant with the smallest ``key``: its counter
plus the rounds it has been granted but not yet run (``reserve``), also per weight. A
grant thus counts in full the moment it is given, so grants made at one round boundary
or on several slots spread over tenants, and backlogged tenants' service stays within
one grant of each other whatever the number of slots (see tests/unit/test_lane_properties.py).

A tenant that becomes active (gets an eligible request after having none) is lifted
to the smallest counter among active tenants, or, when none is active, to the counter
of the last tenant that went idle: idling never banks credit. Because that lift target
never decreases, an idle tenant whose counter is at or below it can be forgotten; the
record of an idle tenant still in debt (counter above the target) is kept until the
target passes it.

Replicas (``speclane serve --replicas``) share these counters: each replica reports the
service it charged per tenant (``charged``, cumulative rounds per weight) and is told, every
sync interval, what the other replicas charged (``set_remote``); a tenant's counter is its
local counter plus that remote service, so its requests spread over several replicas buy
one share of the cluster's lane, not one per replica (docs/design.md, "Replicas"). A lane
counts ``charged`` from the first time it is read or told remote service (a replica does
both before it serves); a lone engine never is, so it keeps no record of every tenant it
ever served (tenants are the clients' ``user`` fields when there are no API keys). Remote
service only grows, so counters and keys still only grow between lifts. A tenant with
requests on another replica is active in the cluster: it is neither lifted when it joins
this lane nor forgotten when it leaves it.

Replicas forget too, so their numbers follow the tenants being served, not every tenant
ever served. When a replica's lane forgets a tenant it had charged, it reports the charge
as dropped (``ChargeReport.dropped``, kept until the front's next ask shows it arrived) and
counts that tenant's charges from zero again; the front keeps the dropped charge apart
(``cluster/shared_service.py``). Once no charge the front has heard of is counted by a live
lane, the front forgets the tenant as well and sends each lane a reset (``set_remote``'s
``resets``) carrying the tenant's remote service as the front last summed it for that lane:
the lane first takes that value as it takes any (a value it was not sent yet, a poll that
was lost, counts), then folds its remote service into the tenant's base, so the counter is
unchanged (to the float's rounding; exactly where 1 / weight is exact in binary) and the
remote service it is told next counts from zero. Resets come in numbered batches, each
applied once, so one sent again after a lost reply is ignored.

Pure bookkeeping: no time, no I/O. Every operation is O(log t) amortized in the number
of tenants t, using min-heaps with lazy deletion.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class _Tenant:
    base: float  # the counter at its last lift
    weight: float = 1.0
    rounds: int = 0  # rounds run since the last lift
    reserved: int = 0  # rounds granted, not yet run
    num_eligible: int = 0  # requests in the lane (holding or waiting)

    remote: float = 0.0  # service charged on other replicas (shared counters)

    # Kept as base + integers / weight so that running a reserved round leaves ``key``
    # bit-identical and equal-weight tenants compare exactly.
    @property
    def counter(self) -> float:
        return self.base + self.rounds / self.weight + self.remote

    @property
    def key(self) -> float:
        return self.key_handing_back(0)

    def key_handing_back(self, rounds: int) -> float:
        """The key with ``rounds`` of its reserved rounds handed back."""
        return self.base + (self.rounds + self.reserved - rounds) / self.weight + self.remote


@dataclass(frozen=True)
class ChargeReport:
    """What a replica's lane charged after a version (``VirtualCounters.charged_since``)."""

    charged: dict[str, float]  # tenant -> cumulative service charged here (since its last drop)
    version: int  # the lane's version now: ask from it next time
    # tenant -> service charged here that the lane forgot after that version (its count
    # restarted from zero; a tenant dropped twice sums both)
    dropped: dict[str, float] = field(default_factory=dict)


# (its number, tenant -> its remote service before the reset): tenants whose remote service
# restarts from zero
ResetBatch = tuple[int, Mapping[str, float]]


class VirtualCounters:
    def __init__(self) -> None:
        self._tenants: dict[str, _Tenant] = {}
        self._num_active = 0
        self._floor = 0.0  # lift target when no tenant is active
        self._active: list[tuple[float, str]] = []  # lazy min-heap of active counters
        self._idle: list[tuple[float, str]] = []  # lazy min-heap of idle tenants kept for debt
        self._charged: dict[str, float] = {}  # rounds / weight run here per tenant, once shared
        self._version = 0  # charges so far, once shared: a reader asks for what came after one it has
        self._changed: OrderedDict[str, int] = OrderedDict()  # tenant -> version of its last charge, oldest first
        self._shared = False  # charged or set_remote called: this lane is one of several
        self._remote: dict[str, float] = {}  # the same, charged on the other replicas
        self._elsewhere: set[str] = set()  # tenants with requests on other replicas
        self._dropped: list[tuple[int, str, float]] = []  # (version, tenant, charge) forgotten, until asked past
        self._reset_batch = 0  # the number of the last batch of resets applied

    # -- reading --------------------------------------------------------------------
    def key(self, tenant: str, handing_back: int = 0) -> float:
        """Grant order within a priority: lower first (with ``handing_back`` of its reserved
        rounds handed back: the key it would have)."""
        return self._tenants[tenant].key_handing_back(handing_back)

    def service(self, tenant: str) -> float:
        """The tenant's virtual counter (0.0 for a tenant never seen or forgotten)."""
        t = self._tenants.get(tenant)
        return t.counter if t is not None else 0.0

    def lift_target(self) -> float:
        """The smallest counter among active tenants (the floor when none is active)."""
        if self._num_active == 0:
            return self._floor
        heap = self._active
        while True:
            counter, name = heap[0]
            t = self._tenants.get(name)
            if t is None or t.num_eligible == 0:
                heapq.heappop(heap)
            elif t.counter != counter:  # counters only grow: re-file at its current value
                heapq.heapreplace(heap, (t.counter, name))
            else:
                return counter

    def charged(self) -> dict[str, float]:
        """Lane service run here per tenant (rounds / weight) since the lane was first shared
        (this call, ``charged_since`` or ``set_remote``) and not since dropped: what a
        replica reports to the others. A copy."""
        return self.charged_since(0).charged

    def charged_since(self, version: int) -> ChargeReport:
        """The tenants charged after ``version`` (0: every tenant) with their cumulative
        service, the charges dropped after it, and the version now: a reader that passes
        back the last version it received gets what changed since, at the cost of what
        changed, and loses nothing where a reply of its never arrived (it asks again from
        the same version). Asking from a version says that everything up to it arrived:
        the drops up to it are let go."""
        self._shared = True
        changed: dict[str, float] = {}
        for tenant in reversed(self._changed):  # newest first, down to the reader's version
            if self._changed[tenant] <= version:
                break
            changed[tenant] = self._charged[tenant]
        if version:
            self._dropped = [entry for entry in self._dropped if entry[0] > version]
        dropped: dict[str, float] = {}
        for at, tenant, charge in self._dropped:
            if at > version:
                dropped[tenant] = dropped.get(tenant, 0.0) + charge
        return ChargeReport(changed, self._version, dropped)

    @property
    def num_remembered(self) -> int:
        """Per-tenant entries held for sharing (charged, remote, drops not yet read): what
        the replicas' forgetting bounds (tests)."""
        return len(self._charged) + len(self._remote) + len(self._dropped)

    # -- changes --------------------------------------------------------------------
    def set_remote(self, service: dict[str, float], active_elsewhere: set[str] | None = None,
                   resets: Sequence[ResetBatch] = ()) -> None:
        """The service each tenant was charged on the other replicas (cumulative; a value
        below the one already known is ignored: remote service only grows), and (when not
        None) the tenants with requests on other replicas: those are active in the cluster,
        so joining or leaving this lane neither lifts nor forgets them (their counter goes
        on as one cluster-wide counter would).

        ``resets``, applied first: batches of tenants the cluster forgot, each with its
        remote service before the reset, which restarts from zero (module docstring); a
        batch numbered at or below the last one applied was applied already."""
        self._shared = True
        for number, values in resets:
            if number <= self._reset_batch:
                continue
            self._reset_batch = number
            for name, value in values.items():
                self._raise_remote(name, value)
                self._remote.pop(name, None)
                t = self._tenants.get(name)
                if t is not None and t.remote:  # the same counter, its remote part folded into its base
                    counter = t.counter
                    t.base, t.remote = t.base + t.remote, 0.0
                    if t.num_eligible == 0 and t.counter != counter:  # re-filed where the fold rounded it
                        heapq.heappush(self._idle, (t.counter, name))
        if active_elsewhere is not None:
            for name in self._elsewhere.difference(active_elsewhere):
                t = self._tenants.get(name)
                if t is not None and t.num_eligible == 0:  # idle in the whole cluster now: forgettable again
                    heapq.heappush(self._idle, (t.counter, name))
            self._elsewhere = set(active_elsewhere)
        for name, value in service.items():
            self._raise_remote(name, value)

    def _raise_remote(self, name: str, value: float) -> None:
        if value <= self._remote.get(name, 0.0):
            return
        self._remote[name] = value
        t = self._tenants.get(name)
        if t is not None:
            t.remote = value
            if t.num_eligible == 0:  # re-file its debt at the new counter
                heapq.heappush(self._idle, (t.counter, name))

    def join(self, tenant: str, weight: float) -> None:
        """One more eligible request of ``tenant`` (``weight`` applies when it activates)."""
        t = self._tenants.get(tenant)
        if t is None or t.num_eligible == 0:
            target = self.lift_target()
            self._forget_idle_below(target)  # may forget this very tenant: it starts afresh
            t = self._tenants.get(tenant)
            remote = self._remote.get(tenant, 0.0)
            if t is None:
                t = self._tenants[tenant] = _Tenant(base=target - remote, remote=remote)
            lifted = t.counter if tenant in self._elsewhere else max(t.counter, target)
            t.base, t.rounds, t.weight = lifted - remote, 0, weight
            self._num_active += 1
            # Active from here on, before the stale-entry clean-up below looks at who is.
            t.num_eligible += 1
            heapq.heappush(self._active, (t.counter, tenant))
            if len(self._active) > 2 * self._num_active + 32:
                live = {name for _, name in self._active if self._is_active(name)}
                self._active = [(self._tenants[name].counter, name) for name in live]
                heapq.heapify(self._active)
            return
        t.num_eligible += 1

    def leave(self, tenant: str) -> None:
        """One eligible request of ``tenant`` left the lane (finished or aborted)."""
        t = self._tenants[tenant]
        t.num_eligible -= 1
        if t.num_eligible:
            return
        self._num_active -= 1
        if self._num_active == 0:
            self._floor = max(self._floor, t.counter)
        if t.counter <= self.lift_target() and tenant not in self._elsewhere:
            self._forget(tenant)  # a return would be lifted to at least this anyway
        else:
            heapq.heappush(self._idle, (t.counter, tenant))

    def reserve(self, tenant: str, rounds: int) -> None:
        """Rounds granted (> 0) or handed back unused (< 0)."""
        self._tenants[tenant].reserved += rounds

    def charge(self, tenant: str, *, reserved: bool) -> None:
        """One round run; ``reserved`` if it was one of the tenant's reserved rounds."""
        t = self._tenants[tenant]
        t.rounds += 1
        if self._shared:
            self._charged[tenant] = self._charged.get(tenant, 0.0) + 1.0 / t.weight
            self._version += 1
            self._changed[tenant] = self._version
            self._changed.move_to_end(tenant)
        if reserved:
            t.reserved -= 1

    # -- helpers --------------------------------------------------------------------
    def _is_active(self, name: str) -> bool:
        t = self._tenants.get(name)
        return t is not None and t.num_eligible > 0

    def _forget_idle_below(self, target: float) -> None:
        while self._idle and self._idle[0][0] <= target:
            counter, name = heapq.heappop(self._idle)
            t = self._tenants.get(name)
            if t is not None and t.num_eligible == 0 and t.counter == counter and name not in self._elsewhere:
                self._forget(name)

    def _forget(self, name: str) -> None:
        """Drop an idle tenant's record; once shared, its charge here is reported dropped."""
        del self._tenants[name]
        charge = self._charged.pop(name, None)
        if charge is not None:
            self._version += 1
            self._changed.pop(name)
            self._dropped.append((self._version, name, charge))
