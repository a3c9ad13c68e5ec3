"""What the scheduler has advanced requests by, over the engine's life.

The one tally of prefill tokens and speculative rounds: ``Scheduler.update`` records
each round once, here and in the request's own ``SpecStats``; ``/metrics``, the
benchmarks and the simulator read these totals and never count rounds themselves.

Per-tenant totals are ``TenantTally``s: without API keys a tenant is the request's
``user`` field, which applications set to their own end users, so the tenants a server
sees over its life are unbounded. An engine's tallies share one ``TenantNames``: the first
``MAX_TENANT_SERIES`` tenants any of them counts are named in all of them, and every later
one is counted under ``OTHER_TENANTS`` in all of them. Memory and each ``/metrics`` scrape
stay bounded, and every series only grows (a Prometheus counter never goes back).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

MAX_TENANT_SERIES = 1000
OTHER_TENANTS = "_other"  # the tenants past MAX_TENANT_SERIES, counted together


def series_name(tenant: str) -> str:
    """A tenant's name in per-tenant series: a name that starts with an underscore gets one
    more, so that no tenant's series is ``OTHER_TENANTS`` (a ``user`` may be any string)."""
    return "_" + tenant if tenant.startswith("_") else tenant


class TenantNames:
    """The tenants an engine's tallies name: the first ``cap`` any of them counts."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = MAX_TENANT_SERIES if cap is None else cap
        self._named: set[str] = set()

    def label(self, tenant: str) -> str:
        """``tenant``'s ``series_name`` where it is named (or there is room to name it), else
        ``OTHER_TENANTS``."""
        if tenant in self._named:
            return series_name(tenant)
        if len(self._named) < self.cap:
            self._named.add(tenant)
            return series_name(tenant)
        return OTHER_TENANTS


class TenantTally(Counter[str]):
    """A per-tenant count that names the tenants of its ``TenantNames`` and counts the rest
    under ``OTHER_TENANTS`` (module docstring). Read it as the ``Counter`` it is."""

    def __init__(self, counts: dict[str, int] | None = None, /, *, names: TenantNames | None = None) -> None:
        super().__init__(counts or {})
        self.names = names if names is not None else TenantNames()

    def add(self, tenant: str, n: int = 1) -> None:
        self[self.names.label(tenant)] += n

    def copy(self) -> TenantTally:
        return TenantTally(self, names=self.names)


@dataclass
class ScheduleCounts:
    prefill_tokens: int = 0  # prompt tokens fed to the model
    slice_rounds: int = 0  # rounds of --spec-mode slice (one per holder per tick)
    burst_rounds: int = 0  # rounds of --spec-mode burst (a holder alone until it finishes)
    draft_tokens: int = 0  # drafts verified (up to EOS, a stop token or max_tokens inside a round)
    accepted_tokens: int = 0
    rounds_by_tenant: TenantTally = field(default_factory=TenantTally)
    # Rounds by draft position j (0-based): drafts verified at j (all before it accepted),
    # and accepted at j. Their ratio is the acceptance per draft position.
    tried_by_position: Counter[int] = field(default_factory=Counter)
    accepted_by_position: Counter[int] = field(default_factory=Counter)

    def record_round(self, tenant: str, *, burst: bool, drafted: int, accepted: int) -> None:
        if burst:
            self.burst_rounds += 1
        else:
            self.slice_rounds += 1
        self.rounds_by_tenant.add(tenant)
        self._tally(drafted, accepted, 1)

    def recount_round(self, *, drafted: int, accepted: int, kept: int) -> None:
        """A recorded round whose answer ended after ``kept`` of its accepted drafts (a stop
        string the engine found): it counts as drafting and accepting those alone, as a
        round that ends at EOS does."""
        self._tally(drafted, accepted, -1)
        self._tally(kept, kept, 1)
        for tally in (self.tried_by_position, self.accepted_by_position):
            for position in [j for j, n in tally.items() if n == 0]:
                del tally[position]  # no round reached it: as if none had been counted

    def _tally(self, drafted: int, accepted: int, sign: int) -> None:
        self.draft_tokens += sign * drafted
        self.accepted_tokens += sign * accepted
        for j in range(min(drafted, accepted + 1)):
            self.tried_by_position[j] += sign
        for j in range(accepted):
            self.accepted_by_position[j] += sign

    def acceptance_by_position(self) -> list[float]:
        return acceptance_by_position(self.tried_by_position, self.accepted_by_position)


def acceptance_by_position(tried: Counter[int], accepted: Counter[int]) -> list[float]:
    """Acceptance rate at each draft position, given every earlier draft was accepted."""
    n = max(tried, default=-1) + 1
    return [accepted[j] / tried[j] if tried[j] else 0.0 for j in range(n)]
