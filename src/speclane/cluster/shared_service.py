"""The replicas' shared lane-service counters: what each replica is told the others charged.

Each replica reports the lane service it charged per tenant since it started (cumulative
rounds per weight, ``VirtualCounters.charged``) together with its incarnation (a new one
after a restart, whose counts start again from zero). ``remote_for(r)`` is, per tenant, the
sum over the other replicas' current incarnations plus everything that replicas' earlier
incarnations charged (which no live replica counts any more): a value that only grows,
as ``VirtualCounters.set_remote`` requires. Pure bookkeeping; the front calls it every
``counter_sync_ms`` (docs/design.md, "Replicas").

Tenants are the clients' ``user`` fields where there are no API keys, so there may be many
thousands, few of them served within one sync. A report may carry only the tenants whose
charge changed (``complete=False``; the replica's lane answers what changed after the
version of the front's last report, ``VirtualCounters.charged_since``), and ``remote_for``
recomputes only the tenants some report changed since its last call for that replica: a
sync costs what changed, not every tenant ever seen (the whole table, summed at each of 8
replicas' syncs, took ~13 ms of the front's loop per replica with 10,000 tenants, more
than its 50 ms cadence allows). ``resend`` sends a replica every value again, after a
poll that carried some failed.
"""

from __future__ import annotations

from collections import Counter


class SharedService:
    def __init__(self, num_replicas: int) -> None:
        self._current: list[dict[str, float]] = [{} for _ in range(num_replicas)]
        self._incarnation: list[str | None] = [None] * num_replicas
        self._retired: Counter[str] = Counter()  # charged by incarnations that are gone
        self._sent: list[dict[str, float]] = [{} for _ in range(num_replicas)]
        self._stale: list[set[str]] = [set() for _ in range(num_replicas)]  # tenants to recompute for each

    def report(self, replica: int, incarnation: str, charged: dict[str, float], *, complete: bool = True) -> None:
        """``replica``'s cumulative charges: every tenant's (``complete``) or those that
        changed since its last report; a new ``incarnation`` retires the old one's."""
        if self._incarnation[replica] != incarnation:
            if self._incarnation[replica] is not None:
                self._retired.update(self._current[replica])
            self._incarnation[replica] = incarnation
            self._current[replica] = {}
            self.resend(replica)  # a fresh lane knows nothing yet
        current = self._current[replica]
        changed = set(charged).union(current) if complete else set(charged)
        if complete:
            current.clear()
        current.update(charged)
        for other, stale in enumerate(self._stale):
            if other != replica:
                stale |= changed

    def resend(self, replica: int) -> None:
        """Send ``replica`` every tenant's value again at its next ``remote_for`` (what was
        sent may not have arrived)."""
        self._sent[replica] = {}
        self._stale[replica] = set(self._retired).union(*self._current)

    def remote_for(self, replica: int) -> dict[str, float]:
        """Per tenant, the service charged elsewhere; only the values that changed since the
        last call for this replica."""
        sent = self._sent[replica]
        changed: dict[str, float] = {}
        for tenant in self._stale[replica]:
            value = self._retired.get(tenant, 0.0) + sum(
                charged.get(tenant, 0.0) for other, charged in enumerate(self._current) if other != replica)
            if sent.get(tenant, 0.0) != value:
                changed[tenant] = value
        self._stale[replica].clear()
        sent.update(changed)
        return changed
