"""Where a request runs: a global admission queue in tenant-fair order, and placement.

Pure policy (no Ray, no I/O, no clock), driven by the cluster front (``front.py``):

- **Admission order.** Requests wait here until a replica has a free slot (fewer than
  ``capacity`` requests running on it: the replicas' own queues stay empty, so this order is
  the cluster's). The next request is the oldest of the tenant with the least service per
  unit of weight, counted in generated tokens by the same virtual counters as the lane
  (``scheduler/fairness.py``, VTC): a tenant that becomes active is lifted to the least
  active counter, so idling banks no credit. A request put back after its replica died
  (no token sent yet) goes to the front of its tenant's queue.
- **Placement.** Among the healthy replicas with a free slot, the one running the fewest
  requests of the same tenant, then the fewest requests (ties: the lowest index): a busy
  tenant's streams spread over the replicas and every replica's lane sees a mix of tenants,
  which the shared lane counters can then balance (a tenant alone on a replica would get
  that replica's whole lane). Affinity overrides this for the replica that served the
  longest prefix of the prompt (its conversation's earlier turns: that replica's prefix
  cache holds them) when it runs none of the tenant's requests (a conversation runs one
  request at a time; a tenant's parallel streams spread instead) and at most
  ``affinity_slack`` more requests than the chosen one. Prefixes are hashed per 16-token block, chained, scoped by tenant (the prefix cache
  is per tenant) and remembered for the last ``max_prefixes`` blocks placed.

Cost per placement: O(tenants waiting + replicas + prompt blocks hashed, at most
``max_prefix_blocks``).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from speclane.scheduler.block_pool import KV_BLOCK_SIZE
from speclane.scheduler.fairness import VirtualCounters
from speclane.scheduler.scheduler import QueueFullError


@dataclass(eq=False)
class Pending:
    """A request the router holds until it is placed (``payload``: the front's)."""

    request_id: str
    tenant: str
    weight: float
    prefix_hashes: tuple[int, ...]
    payload: Any = None
    replica: int | None = None  # where it runs once placed
    seq: int = 0  # arrival order (set by ``enqueue``, kept by ``requeue``)


def prefix_hashes(tenant: str, token_ids: Sequence[int], *, max_blocks: int = 64,
                  block_size: int = KV_BLOCK_SIZE) -> tuple[int, ...]:
    """A chained hash per full block of the prompt (first ``max_blocks``), scoped by tenant."""
    out = []
    h = hash(("speclane-prefix", tenant))
    for start in range(0, min(len(token_ids) // block_size, max_blocks) * block_size, block_size):
        h = hash((h, tuple(token_ids[start:start + block_size])))
        out.append(h)
    return tuple(out)


@dataclass
class _Replica:
    load: int = 0  # requests placed and not finished
    healthy: bool = True
    by_tenant: dict[str, int] = field(default_factory=dict)  # of them, per tenant


@dataclass
class Router:
    num_replicas: int
    capacity: int  # requests running per replica (its max_num_seqs)
    max_queue: int  # requests waiting here before QueueFullError
    affinity_slack: int = 2
    max_prefixes: int = 100_000
    _replicas: list[_Replica] = field(default_factory=list)
    _queues: dict[str, deque[Pending]] = field(default_factory=dict)
    _num_queued: int = 0
    _counters: VirtualCounters = field(default_factory=VirtualCounters)
    _active: dict[str, int] = field(default_factory=dict)  # requests per tenant (queued or running)
    _prefixes: OrderedDict[int, int] = field(default_factory=OrderedDict)  # block hash -> replica
    _placed: dict[str, Pending] = field(default_factory=dict)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self._replicas = [_Replica() for _ in range(self.num_replicas)]

    # -- views ----------------------------------------------------------------------------
    @property
    def num_queued(self) -> int:
        return self._num_queued

    def load(self, replica: int) -> int:
        return self._replicas[replica].load

    def healthy(self, replica: int) -> bool:
        return self._replicas[replica].healthy

    def placed_on(self, replica: int) -> list[Pending]:
        return [p for p in self._placed.values() if p.replica == replica]

    def tenants_elsewhere(self, replica: int) -> set[str]:
        """Tenants with requests placed on replicas other than ``replica``."""
        return {t for i, r in enumerate(self._replicas) if i != replica for t in r.by_tenant}

    def service(self, tenant: str) -> float:
        return self._counters.service(tenant)

    # -- requests ---------------------------------------------------------------------------
    def enqueue(self, pending: Pending) -> None:
        """Queue a new request; ``QueueFullError`` past ``max_queue`` waiting."""
        if self._num_queued >= self.max_queue:
            raise QueueFullError(f"the cluster's queue is full ({self.max_queue} requests waiting)")
        if self._active.get(pending.tenant, 0) == 0:
            self._counters.join(pending.tenant, pending.weight)
        self._active[pending.tenant] = self._active.get(pending.tenant, 0) + 1
        pending.seq = next(self._seq)
        self._queues.setdefault(pending.tenant, deque()).append(pending)
        self._num_queued += 1

    def requeue(self, pending: Pending) -> None:
        """Put a placed request back at the head of its tenant's queue (its replica died
        before it sent a token)."""
        self._unplace(pending)
        self._queues.setdefault(pending.tenant, deque()).appendleft(pending)
        self._num_queued += 1

    def cancel(self, request_id: str) -> Pending | None:
        """Drop a request, queued or placed (finished, aborted, failed)."""
        placed = self._placed.get(request_id)
        if placed is not None:
            self._unplace(placed)
            self._leave(placed.tenant)
            return placed
        for tenant, queue in self._queues.items():
            for pending in queue:
                if pending.request_id == request_id:
                    queue.remove(pending)
                    self._num_queued -= 1
                    if not queue:
                        del self._queues[tenant]
                    self._leave(tenant)
                    return pending
        return None

    def charge(self, tenant: str, num_tokens: int) -> None:
        """``num_tokens`` generated for ``tenant`` (its admission order moves back)."""
        if self._active.get(tenant, 0) == 0:
            return
        for _ in range(num_tokens):
            self._counters.charge(tenant, reserved=False)

    def set_healthy(self, replica: int, healthy: bool) -> None:
        self._replicas[replica].healthy = healthy

    # -- placement ------------------------------------------------------------------------
    def place_next(self) -> Pending | None:
        """The next request in admission order, placed (``pending.replica`` set), or None
        when nothing waits or no healthy replica has a free slot."""
        if not self._queues or not any(r.healthy and r.load < self.capacity for r in self._replicas):
            return None
        tenant = min(self._queues, key=lambda t: (self._counters.key(t), self._queues[t][0].seq))
        queue = self._queues[tenant]
        pending = queue.popleft()
        if not queue:
            del self._queues[tenant]
        self._num_queued -= 1
        pending.replica = self.choose_replica(pending.tenant, pending.prefix_hashes)
        chosen = self._replicas[pending.replica]
        chosen.load += 1
        chosen.by_tenant[pending.tenant] = chosen.by_tenant.get(pending.tenant, 0) + 1
        self._placed[pending.request_id] = pending
        for h in pending.prefix_hashes:
            self._prefixes[h] = pending.replica
            self._prefixes.move_to_end(h)
        while len(self._prefixes) > self.max_prefixes:
            self._prefixes.popitem(last=False)
        return pending

    def choose_replica(self, tenant: str, hashes: Sequence[int]) -> int:
        """Spread the tenant, then least loaded; affinity when it costs neither (see the
        module docstring). Only healthy replicas with a free slot; call when there is one."""
        replicas = self._replicas
        open_ = [i for i, r in enumerate(replicas) if r.healthy and r.load < self.capacity]
        best = min(open_, key=lambda i: (replicas[i].by_tenant.get(tenant, 0), replicas[i].load, i))
        for h in reversed(hashes):
            replica = self._prefixes.get(h)
            if replica is None:
                continue
            if (replica in open_ and tenant not in replicas[replica].by_tenant
                    and replicas[replica].load <= replicas[best].load + self.affinity_slack):
                return replica
            break
        return best

    # -- helpers ----------------------------------------------------------------------------
    def _unplace(self, pending: Pending) -> None:
        if self._placed.pop(pending.request_id, None) is not None and pending.replica is not None:
            replica = self._replicas[pending.replica]
            replica.load -= 1
            left = replica.by_tenant[pending.tenant] - 1
            if left:
                replica.by_tenant[pending.tenant] = left
            else:
                del replica.by_tenant[pending.tenant]
        pending.replica = None

    def _leave(self, tenant: str) -> None:
        left = self._active[tenant] - 1
        if left:
            self._active[tenant] = left
        else:
            del self._active[tenant]
            self._counters.leave(tenant)
