"""Run one workload under several lane policies, in parallel processes where cores allow.

Each policy gets the same jobs and the same per-request acceptance streams (common
random numbers, see ``acceptance.py``), its own real ``Scheduler`` and a
``BoundsMonitor``. Progress (finished requests, all policies together) is reported
through ``on_finished``; worker processes send it back through a queue.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from speclane.config import LaneConfig, SchedulerConfig
from speclane.sim.acceptance import RateAcceptance
from speclane.sim.bounds import BoundsMonitor, BoundsReport
from speclane.sim.cost import CostModel
from speclane.sim.simulator import SimResult, Simulator
from speclane.sim.workload import SimJob


@dataclass
class PolicyOutcome:
    policy: str
    lane: LaneConfig
    result: SimResult
    bounds: BoundsReport


@dataclass(frozen=True)
class Setup:
    scheduler: SchedulerConfig
    max_model_len: int
    cost: CostModel
    seed: int


def run_policy(policy: str, lane: LaneConfig, jobs: Sequence[SimJob], setup: Setup,
               on_finished: Callable[[int], None] | None = None) -> PolicyOutcome:
    acceptance = RateAcceptance({j.request_id: j.acceptance_rate for j in jobs}, setup.seed)
    monitor = BoundsMonitor(lane)
    sim = Simulator(setup.scheduler, lane, setup.max_model_len, setup.cost, acceptance, observers=[monitor])
    result = sim.run(jobs, on_finished=on_finished)
    return PolicyOutcome(policy, lane, result, monitor.finish())


def run_policies(policies: dict[str, LaneConfig], jobs: Sequence[SimJob], setup: Setup, *,
                 workers: int | None = None, on_finished: Callable[[int], None] | None = None) -> list[PolicyOutcome]:
    """Outcomes in the order of ``policies``; ``workers=1`` runs them in this process."""
    workers = min(len(policies), workers or os.cpu_count() or 1)
    if workers <= 1:
        return [run_policy(name, lane, jobs, setup, on_finished) for name, lane in policies.items()]
    ctx = mp.get_context("fork")
    progress: mp.Queue = ctx.Queue()
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(progress,)) as pool:
        futures = [pool.submit(_run_in_worker, name, lane, jobs, setup) for name, lane in policies.items()]
        while not all(f.done() for f in futures):
            try:
                n = progress.get(timeout=0.2)
            except queue.Empty:
                continue
            if on_finished is not None:
                on_finished(n)
        outcomes = [f.result() for f in futures]
    while on_finished is not None:
        try:
            on_finished(progress.get_nowait())
        except queue.Empty:
            break
    return outcomes


_progress: mp.Queue | None = None


def _init_worker(progress: mp.Queue) -> None:
    global _progress
    _progress = progress


def _run_in_worker(policy: str, lane: LaneConfig, jobs: Sequence[SimJob], setup: Setup) -> PolicyOutcome:
    pending = [0]

    def report(n: int) -> None:
        pending[0] += n
        if pending[0] >= 50 and _progress is not None:
            _progress.put(pending[0])
            pending[0] = 0

    outcome = run_policy(policy, lane, jobs, setup, report)
    if pending[0] and _progress is not None:
        _progress.put(pending[0])
    return outcome
