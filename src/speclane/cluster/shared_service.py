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

Forgetting (``scheduler/fairness.py``): a lane that forgets a tenant reports its charge
there as dropped; the charge is kept apart per replica (in the others' remote service, not
its own) and the lane's count of it starts again from zero. A tenant none of whose charges
is counted by a live incarnation any more is forgotten here too, and each replica is sent
a numbered batch of such tenants, each with the remote service ``remote_for`` would have
sent it then (``pending_resets``, until ``confirm_resets`` says a poll carrying it was
answered): the lane takes that value, which it may not have been sent yet, then folds the
tenant's remote service into its counter and counts the next values from zero, as
``remote_for`` now sends them. So the table holds the tenants some lane still counts, not
every tenant the cluster served. A restarted replica's fresh lane needs only the batches
made after the first poll it answered was computed (``report``'s ``batch_at_send``): that
poll may have carried a forgotten tenant's old value; the earlier batches are let go.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from speclane.scheduler.fairness import ResetBatch


class SharedService:
    def __init__(self, num_replicas: int) -> None:
        self._current: list[dict[str, float]] = [{} for _ in range(num_replicas)]
        self._incarnation: list[str | None] = [None] * num_replicas
        self._retired: Counter[str] = Counter()  # charged by incarnations that are gone
        # Per replica: charges its lane dropped (its count restarted from zero); not part of
        # its own remote service, as its current charges are not.
        self._dropped: list[Counter[str]] = [Counter() for _ in range(num_replicas)]
        self._sent: list[dict[str, float]] = [{} for _ in range(num_replicas)]
        self._stale: list[set[str]] = [set() for _ in range(num_replicas)]  # tenants to recompute for each
        self._resets: list[list[ResetBatch]] = [[] for _ in range(num_replicas)]  # batches not yet confirmed
        self._last_batch = 0

    def report(self, replica: int, incarnation: str, charged: dict[str, float], *, complete: bool = True,
               dropped: dict[str, float] | None = None, batch_at_send: int | None = None) -> None:
        """``replica``'s cumulative charges: every tenant's (``complete``) or those that
        changed since its last report, and the charges its lane dropped since then; a new
        ``incarnation`` retires the old one's. ``batch_at_send``: ``last_batch`` when the
        poll this answers was computed (None: unknown, every pending batch is kept)."""
        gone: set[str] = set()
        if self._incarnation[replica] != incarnation:
            if self._incarnation[replica] is not None:
                self._retired.update(self._current[replica])
                self._retired.update(self._dropped[replica])
                gone.update(self._current[replica])
            self._dropped[replica] = Counter()
            self._incarnation[replica] = incarnation
            self._current[replica] = {}
            if batch_at_send is not None:  # what a fresh lane cannot hold: nothing sent to it before
                self._resets[replica] = [batch for batch in self._resets[replica] if batch[0] > batch_at_send]
            self.resend(replica)  # a fresh lane knows nothing yet
        current = self._current[replica]
        changed = set(charged).union(current) if complete else set(charged)
        for tenant, charge in (dropped or {}).items():
            self._dropped[replica][tenant] += charge
            current.pop(tenant, None)  # the lane counts it from zero again
            changed.add(tenant)
            gone.add(tenant)
        if complete:
            current.clear()
        current.update(charged)
        for other, stale in enumerate(self._stale):
            if other != replica:
                stale |= changed
        self._forget(tenant for tenant in gone if not any(tenant in c for c in self._current))

    def _forget(self, tenants: Iterable[str]) -> None:
        """Tenants no live incarnation counts: dropped from every table, and reset on every
        lane at the remote service it would be sent now."""
        forgotten = sorted(tenants)
        if not forgotten:
            return
        self._last_batch += 1
        for replica, resets in enumerate(self._resets):
            resets.append((self._last_batch, {tenant: self._remote_value(replica, tenant) for tenant in forgotten}))
        for tenant in forgotten:
            self._retired.pop(tenant, None)
        for sent, stale, dropped in zip(self._sent, self._stale, self._dropped, strict=True):
            for tenant in forgotten:
                sent.pop(tenant, None)
                stale.discard(tenant)
                dropped.pop(tenant, None)

    @property
    def last_batch(self) -> int:
        """The number of the newest reset batch (0: none yet)."""
        return self._last_batch

    def _remote_value(self, replica: int, tenant: str) -> float:
        """The tenant's service charged elsewhere than ``replica``."""
        return self._retired.get(tenant, 0.0) + sum(
            self._current[other].get(tenant, 0.0) + self._dropped[other].get(tenant, 0.0)
            for other in range(len(self._current)) if other != replica)

    def pending_resets(self, replica: int) -> list[ResetBatch]:
        """The reset batches ``replica`` has not confirmed, oldest first (send them all: a
        lane applies each once)."""
        return list(self._resets[replica])

    def confirm_resets(self, replica: int, upto: int) -> None:
        """A poll carrying ``replica``'s batches up to number ``upto`` was answered."""
        self._resets[replica] = [batch for batch in self._resets[replica] if batch[0] > upto]

    @property
    def num_tenants(self) -> int:
        """Tenants some table holds (tests: forgetting bounds it)."""
        return len(set(self._retired).union(*self._current, *self._dropped, *self._sent))

    def resend(self, replica: int) -> None:
        """Send ``replica`` every tenant's value again at its next ``remote_for`` (what was
        sent may not have arrived)."""
        self._sent[replica] = {}
        self._stale[replica] = set(self._retired).union(*self._current, *self._dropped)

    def remote_for(self, replica: int) -> dict[str, float]:
        """Per tenant, the service charged elsewhere; only the values that changed since the
        last call for this replica."""
        sent = self._sent[replica]
        changed: dict[str, float] = {}
        for tenant in self._stale[replica]:
            value = self._remote_value(replica, tenant)
            if sent.get(tenant, 0.0) != value:
                changed[tenant] = value
        self._stale[replica].clear()
        sent.update(changed)
        return changed
