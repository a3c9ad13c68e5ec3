"""Engine-level counters (the numbers behind ``/metrics`` and the benchmarks' proofs).

Counters are plain integers updated once per tick by the engine thread; readers
(the metrics endpoint, benchmarks) take a ``snapshot()``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from speclane.scheduler.plan import RunnerResult, SchedulerPlan

if TYPE_CHECKING:
    from speclane.engine.engine import LLMEngine
    from speclane.request import Request
    from speclane.scheduler.scheduler import Scheduler


class EngineObserver(Protocol):
    """Hooks for latency histograms; called on the engine thread, so keep them cheap."""

    def on_tick(self, seconds: float, engine: LLMEngine) -> None: ...

    def on_first_token(self, seconds: float) -> None: ...

    def on_token_gap(self, seconds: float, num_tokens: int) -> None: ...

    def on_finish(self, request: Request) -> None: ...


@dataclass
class EngineCounters:
    ticks: int = 0
    slice_rounds: int = 0  # rounds run one per tick (--spec-mode slice)
    burst_rounds: int = 0  # rounds run inside a burst (--spec-mode burst)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    prefill_tokens: int = 0
    busy_s: float = 0.0
    spec_rounds_by_tenant: Counter[str] = field(default_factory=Counter)
    generated_by_tenant: Counter[str] = field(default_factory=Counter)
    # Slice rounds by draft position j (0-based): drafts verified at j (all before it
    # accepted), and accepted at j. Their ratio is the acceptance per draft position.
    draft_tried_by_position: Counter[int] = field(default_factory=Counter)
    draft_accepted_by_position: Counter[int] = field(default_factory=Counter)
    # The lane's own totals (grants, yields, preemptions) and live sizes, refreshed each tick.
    lane_grants: int = 0
    lane_yields: int = 0
    lane_preemptions: int = 0
    lane_holders: int = 0
    lane_waiting: int = 0
    running: int = 0
    waiting: int = 0

    def record_tick(self, plan: SchedulerPlan, result: RunnerResult, scheduler: Scheduler, seconds: float) -> None:
        self.ticks += 1
        self.busy_s += seconds
        tenants = {s.request_id: s.request.tenant for s in plan.seqs}
        if plan.burst is not None:
            tenants[plan.burst.request_id] = plan.burst.request.tenant
        for seq in plan.seqs:
            if seq.start < seq.request.num_prompt_tokens:
                self.prefill_tokens += len(seq.token_ids)
        for res in result.seqs:
            if not res.spec_round:
                continue
            if plan.burst is not None:
                self.burst_rounds += res.num_rounds
            else:
                self.slice_rounds += res.num_rounds
            self.spec_rounds_by_tenant[tenants.get(res.request_id, "?")] += res.num_rounds
            self.draft_tokens += res.num_draft_tokens
            self.accepted_tokens += res.num_accepted_tokens
            if res.num_rounds == 1:
                for j in range(min(res.num_draft_tokens, res.num_accepted_tokens + 1)):
                    self.draft_tried_by_position[j] += 1
                for j in range(res.num_accepted_tokens):
                    self.draft_accepted_by_position[j] += 1
        self.refresh(scheduler)

    def refresh(self, scheduler: Scheduler) -> None:
        lane = scheduler.lane
        self.lane_grants = lane.grants_total
        self.lane_yields = lane.yields_total
        self.lane_preemptions = lane.preemptions_total
        self.lane_holders = lane.num_holders
        self.lane_waiting = lane.num_waiters
        self.running = scheduler.num_running
        self.waiting = scheduler.num_waiting

    def record_tokens(self, tenant: str, num_tokens: int) -> None:
        self.generated_by_tenant[tenant] += num_tokens

    def snapshot(self) -> dict[str, object]:
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, Counter)}
        out["spec_rounds_by_tenant"] = dict(self.spec_rounds_by_tenant)
        out["generated_by_tenant"] = dict(self.generated_by_tenant)
        out["acceptance_by_position"] = self.acceptance_by_position()
        return out

    def acceptance_by_position(self) -> list[float]:
        """Acceptance rate at each draft position, given every earlier draft was accepted."""
        n = max(self.draft_tried_by_position, default=-1) + 1
        return [self.draft_accepted_by_position[j] / self.draft_tried_by_position[j] if self.draft_tried_by_position[j] else 0.0
                for j in range(n)]
