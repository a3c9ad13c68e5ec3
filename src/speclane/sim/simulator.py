"""The simulator's event loop: the real scheduler, a cost-model runner, a simulated clock.

One tick is the engine's tick (docs/design.md, "One tick") with the runner replaced:

    arrivals up to now join (a full queue answers 429: the client retries after retry_s)
    plan   = scheduler.schedule(now)
    result = runner.execute(plan)          # elapsed_ms from the cost model
    now   += result.elapsed_ms / 1000
    events = scheduler.update(plan, result, now)

When nothing is left to run, the clock jumps to the next arrival. Observers (the
bounds monitor) see the scheduler after each ``schedule`` and each ``update``, with the
lane events of that step. Time is in seconds, as the scheduler expects; a cost model
of ``base_ms=1000`` and nothing else makes one tick one second (tests run in ticks).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from speclane.config import LaneConfig, SchedulerConfig
from speclane.request import Request, SamplingParams, SpecStats
from speclane.scheduler.lane import LaneEvent
from speclane.scheduler.plan import RunnerResult, SchedulerPlan
from speclane.scheduler.scheduler import QueueFullError, Scheduler
from speclane.sim.acceptance import AcceptanceSource
from speclane.sim.cost import CostModel
from speclane.sim.runner import TOKEN, CostModelRunner
from speclane.sim.workload import SimJob


class Observer(Protocol):
    def after_schedule(self, tick: int, now: float, scheduler: Scheduler, plan: SchedulerPlan,
                       lane_events: list[LaneEvent]) -> None: ...

    def after_update(self, tick: int, now: float, scheduler: Scheduler, plan: SchedulerPlan, result: RunnerResult,
                     lane_events: list[LaneEvent]) -> None: ...


@dataclass
class RequestRecord:
    """One finished request, as the report needs it."""

    request_id: str
    tenant: str
    priority: int
    speculative: bool
    arrival_s: float  # first attempt (before any 429 retries)
    first_token_s: float | None
    finished_s: float
    num_output_tokens: int
    spec: SpecStats


@dataclass
class SimResult:
    ticks: int = 0
    sim_time_s: float = 0.0
    wall_s: float = 0.0
    busy_s: float = 0.0  # simulated time spent in ticks (the rest is idle)
    rejected: int = 0  # 429 answers (each retried after retry_s)
    slice_rounds: int = 0
    burst_rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    generated_tokens: int = 0
    lane_grants: int = 0
    lane_yields: int = 0
    lane_preemptions: int = 0
    records: list[RequestRecord] = field(default_factory=list)
    lane_events: list[LaneEvent] = field(default_factory=list)  # only with keep_events


class Simulator:
    def __init__(self, scheduler_config: SchedulerConfig, lane_config: LaneConfig, max_model_len: int,
                 cost: CostModel, acceptance: AcceptanceSource, *, observers: Sequence[Observer] = (),
                 keep_events: bool = False, retry_s: float = 1.0):
        self.scheduler = Scheduler(scheduler_config, lane_config, max_model_len, record_lane_events=True)
        self.runner = CostModelRunner(cost, acceptance)
        self.observers = list(observers)
        self.keep_events = keep_events
        self.retry_s = retry_s

    def run(self, jobs: Iterable[SimJob], on_finished: Callable[[int], None] | None = None) -> SimResult:
        """Run every job to completion; ``on_finished(n)`` reports n more finished requests."""
        started = time.perf_counter()
        scheduler, lane = self.scheduler, self.scheduler.lane
        seq = itertools.count()
        arrivals = [(job.arrival_s, next(seq), job) for job in jobs]
        heapq.heapify(arrivals)
        first_arrival = {job.request_id: t for t, _, job in arrivals}
        out = SimResult()
        now, tick = 0.0, 0
        while arrivals or scheduler.has_unfinished():
            while arrivals and arrivals[0][0] <= now:
                _, _, job = heapq.heappop(arrivals)
                try:
                    scheduler.add_request(job_request(job, now), now)
                except QueueFullError:
                    out.rejected += 1
                    heapq.heappush(arrivals, (now + self.retry_s, next(seq), job))
            if not scheduler.has_unfinished():
                now = max(now, arrivals[0][0])
                continue
            plan = scheduler.schedule(now)
            events = lane.drain_events()
            for obs in self.observers:
                obs.after_schedule(tick, now, scheduler, plan, events)
            self._keep(out, events)
            if plan.is_empty:  # cannot happen with running requests; guard the clock anyway
                now = arrivals[0][0] if arrivals else now + 0.001
                continue
            result = self.runner.execute(plan)
            now += result.elapsed_ms / 1000.0
            out.busy_s += result.elapsed_ms / 1000.0
            token_events = scheduler.update(plan, result, now)
            events = lane.drain_events()
            for obs in self.observers:
                obs.after_update(tick, now, scheduler, plan, result, events)
            self._keep(out, events)
            finished = 0
            for ev in token_events:
                out.generated_tokens += len(ev.new_token_ids)
                if ev.finished:
                    finished += 1
                    r = ev.request
                    out.records.append(RequestRecord(r.request_id, r.tenant, r.priority, r.speculative,
                                                     first_arrival[r.request_id], r.first_token_s, now,
                                                     r.num_output_tokens, r.spec))
            if finished and on_finished is not None:
                on_finished(finished)
            tick += 1
        out.ticks, out.sim_time_s = tick, now
        counts = scheduler.counts
        out.slice_rounds, out.burst_rounds = counts.slice_rounds, counts.burst_rounds
        out.draft_tokens, out.accepted_tokens = counts.draft_tokens, counts.accepted_tokens
        out.lane_grants, out.lane_yields, out.lane_preemptions = lane.grants_total, lane.yields_total, lane.preemptions_total
        out.wall_s = time.perf_counter() - started
        return out

    def _keep(self, out: SimResult, events: list[LaneEvent]) -> None:
        if self.keep_events and events:
            out.lane_events.extend(events)


def job_request(job: SimJob, now: float) -> Request:
    """The scheduler's request for ``job``, arriving at ``now``."""
    return Request(
        request_id=job.request_id,
        prompt_token_ids=(TOKEN,) * job.num_prompt_tokens,
        sampling=SamplingParams(max_tokens=job.max_tokens, ignore_eos=True),
        arrival_s=now,
        priority=job.priority,
        tenant=job.tenant.name,
        tenant_weight=job.tenant.weight,
        speculative=job.speculative,
    )
