"""``speclane simulate``: one seeded workload under three lane policies; tables, report, plots.

Called by ``speclane.cli`` with the parsed arguments (``out``, ``requests``, ``tenants``,
``seed``, ``calibrate`` and the lane / scheduler flags) and the engine config built from
them. Prints the tables, writes ``report.md``, ``report.json`` and two PNGs into ``--out``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from speclane.config import EngineConfig
from speclane.sim import plots
from speclane.sim.calibrate import fit, load_calibration
from speclane.sim.cost import CostModel
from speclane.sim.experiment import PolicyOutcome, Setup, run_policies
from speclane.sim.policies import lane_policies
from speclane.sim.report import bounds_table, heavy_tenants_table, service_table, write_report
from speclane.sim.workload import WorkloadSpec, arrival_rate, make_workload

PROGRESS_MIN_REQUESTS = 500  # smaller runs finish before a bar would help


def run_simulate(args: argparse.Namespace, engine_config: EngineConfig) -> int:
    replicas, sync_ms = getattr(args, "replicas", 1), getattr(args, "counter_sync_ms", 50.0)
    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1; got {replicas}")
    if not sync_ms >= 1:
        raise ValueError(f"--counter-sync-ms must be >= 1 (as serve's); got {sync_ms}")
    if replicas > 1:
        return run_cluster_simulate(args, engine_config)
    started = time.perf_counter()
    spec = WorkloadSpec(num_requests=args.requests, num_tenants=args.tenants)
    cost, notes = CostModel(), []
    if args.calibrate:
        calibration = fit(load_calibration(args.calibrate), cost, engine_config.lane.num_draft_tokens, args.calibrate)
        cost, notes = calibration.cost, calibration.notes
        if calibration.acceptance_beta is not None:
            spec = WorkloadSpec(num_requests=args.requests, num_tenants=args.tenants,
                                acceptance_beta=calibration.acceptance_beta)
    sched = engine_config.scheduler
    rate = arrival_rate(spec, cost, sched.max_num_seqs)
    jobs = make_workload(spec, args.seed, rate)
    policies = lane_policies(engine_config.lane)
    setup = Setup(sched, engine_config.model.max_model_len, cost, args.seed)
    outcomes = _run(policies, jobs, setup, args.requests)

    lane = engine_config.lane
    header = [
        f"workload: {spec.num_requests} requests from {spec.num_tenants} tenants (Zipf s={spec.zipf_s}), seed {args.seed}, "
        f"Poisson arrivals at {rate:.2f}/s ({spec.load:.0%} of estimated capacity); prompts ~{spec.mean_prompt_tokens:.0f} "
        f"and outputs ~{spec.mean_output_tokens:.0f} tokens on average; {spec.speculative_fraction:.0%} speculative; "
        f"priority tiers {dict(spec.priority_tiers)}; per-position draft acceptance ~ "
        f"Beta({spec.acceptance_beta[0]:.2f}, {spec.acceptance_beta[1]:.2f}) per request",
        f"engine: {sched.max_num_seqs} running, queue {sched.max_queue}, {sched.max_num_batched_tokens} tokens/tick; "
        f"lane: {lane.spec_slots} slot(s), K={lane.num_draft_tokens}, skip cap {lane.spec_skip_cap}, "
        f"preemption {'on' if lane.spec_preempt else 'off'}, grant ms {lane.spec_grant_ms:g}",
        f"cost model: {cost.describe()}",
        *[f"calibration: {n}" for n in notes],
        f"simulated in {time.perf_counter() - started:.1f} s wall (policies in parallel processes where cores allow)",
    ]
    budget = next(iter(policies.values())).spec_grant_rounds
    tables = [
        bounds_table(outcomes, f"Lane bounds: {spec.num_requests} requests, {spec.num_tenants} tenants, "
                               f"{lane.spec_slots} slot(s), grant budget B={budget} rounds"),
        service_table(outcomes),
        heavy_tenants_table(outcomes, jobs),
    ]
    for table in tables:
        print(table.markdown())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    images = [
        plots.waits({o.policy: [(w.bound, w.wait_ticks) for w in o.bounds.waits] for o in outcomes},
                    out / "waits.png", f"Wait to first grant, {spec.num_requests} requests"),
        plots.lane_shares({o.policy: list(o.bounds.share_ratios.values()) for o in outcomes},
                          out / "lane-share.png", "Lane share per tenant against its fair share"),
    ]
    report = write_report(out, "speclane simulate", header, tables, images, outcomes,
                          {"cost_model": cost.__dict__, "arrival_rate_per_s": rate, "seed": args.seed})
    for line in header:
        print(f"- {line}")
    print(f"report: {report}")
    return 0


def _run(policies: dict, jobs: list, setup: Setup, num_requests: int) -> list[PolicyOutcome]:
    from tqdm import tqdm

    total = num_requests * len(policies)
    with tqdm(total=total, desc="simulating", unit="req", disable=num_requests < PROGRESS_MIN_REQUESTS,
              mininterval=0.5) as bar:
        return run_policies(policies, jobs, setup, on_finished=bar.update)


def run_cluster_simulate(args: argparse.Namespace, engine_config: EngineConfig) -> int:
    """``--replicas N``: the fair lane over N replicas, counters shared every
    ``--counter-sync-ms``, ten times less often, and never (``sim/cluster.py``)."""
    from speclane.bench.common import Table, write_report
    from speclane.sim.cluster import run_cluster

    spec = WorkloadSpec(num_requests=args.requests, num_tenants=args.tenants)
    cost, sched, lane = CostModel(), engine_config.scheduler, lane_policies(engine_config.lane)
    fair_lane = next(iter(lane.values()))
    rate = arrival_rate(spec, cost, sched.max_num_seqs) * args.replicas
    jobs = make_workload(spec, args.seed, rate)
    setup = Setup(sched, engine_config.model.max_model_len, cost, args.seed)
    table = Table(f"The fair lane over {args.replicas} replicas: {spec.num_requests} requests, {spec.num_tenants} "
                  f"tenants, {fair_lane.spec_slots} slot(s) each, grant budget B={fair_lane.spec_grant_rounds} rounds",
                  ["lane counters", "Jain's index (actual / fair share)", "max lag (rounds)", "lane rounds",
                   "simulated s", "wall s"])
    for sync_ms in (args.counter_sync_ms, args.counter_sync_ms * 10, None):
        outcome = run_cluster(fair_lane, jobs, setup, replicas=args.replicas, sync_ms=sync_ms)
        label = f"shared every {sync_ms:g} ms" if sync_ms is not None else "per replica (not shared)"
        counts = outcome.counts
        table.add(label, round(outcome.jain, 4), round(outcome.max_lag_rounds, 1), int(counts["rounds"]),
                  round(counts["sim_time_s"], 1), round(counts["wall_s"], 1))
    table.notes.append(f"Poisson arrivals at {rate:.2f}/s ({spec.load:.0%} of the estimated capacity of "
                       f"{args.replicas} replicas); each tenant's fair share is taken over the whole cluster")
    print(table.markdown())
    report = write_report(Path(args.out), "speclane simulate --replicas", [table],
                          {"replicas": args.replicas, "seed": args.seed, "arrival_rate_per_s": rate})
    print(f"report: {report}")
    return 0
