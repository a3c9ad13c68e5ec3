"""The replicas' shared lane-service counters: what each replica is told the others charged.

Each replica reports the lane service it charged per tenant since it started (cumulative
rounds per weight, ``VirtualCounters.charged``) together with its incarnation (a new one
after a restart, whose counts start again from zero). ``remote_for(r)`` is, per tenant, the
sum over the other replicas' current incarnations plus everything that replicas' earlier
incarnations charged (which no live replica counts any more): a value that only grows,
as ``VirtualCounters.set_remote`` requires. Pure bookkeeping; the front calls it every
``counter_sync_ms`` (docs/design.md, "Replicas").
"""

from __future__ import annotations

from collections import Counter


class SharedService:
    def __init__(self, num_replicas: int) -> None:
        self._current: list[dict[str, float]] = [{} for _ in range(num_replicas)]
        self._incarnation: list[str | None] = [None] * num_replicas
        self._retired: Counter[str] = Counter()  # charged by incarnations that are gone
        self._sent: list[dict[str, float]] = [{} for _ in range(num_replicas)]

    def report(self, replica: int, incarnation: str, charged: dict[str, float]) -> None:
        """``replica``'s cumulative charges; a new ``incarnation`` retires the old one's."""
        if self._incarnation[replica] != incarnation:
            if self._incarnation[replica] is not None:
                self._retired.update(self._current[replica])
            self._incarnation[replica] = incarnation
            self._current[replica] = {}
            self._sent[replica] = {}  # a fresh lane knows nothing yet
        self._current[replica] = dict(charged)

    def remote_for(self, replica: int) -> dict[str, float]:
        """Per tenant, the service charged elsewhere; only the values that changed since the
        last call for this replica."""
        total: Counter[str] = Counter(self._retired)
        for other, charged in enumerate(self._current):
            if other != replica:
                total.update(charged)
        sent = self._sent[replica]
        changed = {tenant: value for tenant, value in total.items() if sent.get(tenant) != value}
        sent.update(changed)
        return changed
