"""Lane benchmarks: fairness between tenants, priority preemption, lane overhead."""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict

from speclane.bench.common import Table, median, percentile
from speclane.bench.driver import Job, Timeline, drive, progress
from speclane.bench.factory import EngineFactory
from speclane.bench.prompts import CODE, PARAGRAPH
from speclane.config import LaneConfig
from speclane.request import SamplingParams, SpecStats
from speclane.scheduler.lane import SpecLane

POLICIES = {
    "hold (--spec-grant-rounds 0)": dict(spec_grant_rounds=0, fairness="request"),
    "round-robin (--fairness request)": dict(spec_grant_rounds=8, fairness="request"),
    "fair lane (--fairness tenant)": dict(spec_grant_rounds=8, fairness="tenant"),
}


def jain(values: list[float]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def fairness_workload(factory: EngineFactory, quick: bool) -> list[Job]:
    copy = factory.chat_ids(f"Repeat the following paragraph exactly, three times:\n\n{PARAGRAPH}")
    code = factory.chat_ids(f"Print this function again, unchanged:\n\n{CODE}")
    scale = 0.5 if quick else 1.0
    jobs = [Job("A0", copy, SamplingParams(max_tokens=int(512 * scale), ignore_eos=True), 0.0, {"tenant": "A"})]
    for i in range(3):  # A keeps sending more
        jobs.append(Job(f"A{i + 1}", copy, SamplingParams(max_tokens=int(256 * scale), ignore_eos=True), 1.0 + 2.0 * i * scale, {"tenant": "A"}))
    for i in range(3):
        jobs.append(Job(f"B{i}", code, SamplingParams(max_tokens=int(96 * scale), ignore_eos=True), 1.5 + 2.0 * i * scale, {"tenant": "B"}))
        jobs.append(Job(f"C{i}", code, SamplingParams(max_tokens=int(96 * scale), ignore_eos=True), 2.0 + 2.0 * i * scale, {"tenant": "C"}))
    return jobs


REPEATS = 3  # runs of the workload per policy, the policies alternating; their lane rounds pooled


def fairness(factory: EngineFactory, quick: bool = False) -> tuple[list[Table], dict]:
    table = Table("Fairness: tenant A streams long and keeps sending; B and C send shorter requests later",
                  ["policy", "lane share A / B / C (contention)", "Jain (lane share)", "Jain per run",
                   "first grant p50 s", "first grant max s", "tok/s A / B / C", "grants", "yields"])
    repeats = 1 if quick else REPEATS
    held: dict[str, Counter] = defaultdict(Counter)
    per_run: dict[str, list[float]] = defaultdict(list)
    waits: dict[str, list[float]] = defaultdict(list)
    rates: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    lane_counts: dict[str, Counter] = defaultdict(Counter)
    raw: dict[str, dict] = {}
    for run in range(repeats):
        for policy, options in POLICIES.items():
            progress(f"fairness {policy}, run {run + 1} of {repeats}")
            engine = factory.engine(spec_mode="slice", **options)
            samples: list[tuple[float, Counter]] = []

            def on_tick(now: float, engine=engine, samples=samples) -> None:
                samples.append((now, Counter(engine.scheduler.lane.held_rounds_by_tenant)))

            timelines, _ = drive(engine, fairness_workload(factory, quick), on_tick=on_tick)
            events = engine.scheduler.lane.events
            contended = _contended_rounds(samples, timelines)
            held[policy].update(contended)
            per_run[policy].append(jain([_shares(contended).get(t, 0) for t in "ABC"]))
            waits[policy] += list(_first_grant_waits(timelines, events).values())
            for tl in timelines.values():
                rates[policy][tl.job.options["tenant"]].append(tl.tok_per_s())
            lane_counts[policy].update({"grants": engine.counters.lane_grants, "yields": engine.counters.lane_yields})
            if run == 0:  # the plots draw one run
                raw[policy] = {"timelines": timelines, "events": events, "window": _contention_window(timelines),
                               "samples": samples, "clock0": _clock0(timelines)}
    for policy in POLICIES:
        shares = _shares(held[policy])
        table.add(policy, " / ".join(f"{shares.get(t, 0):.2f}" for t in "ABC"), jain([shares.get(t, 0) for t in "ABC"]),
                  ", ".join(f"{j:.3f}" for j in per_run[policy]), percentile(waits[policy], 50),
                  max(waits[policy], default=float("nan")),
                  " / ".join(f"{median(rates[policy][t]):.1f}" for t in "ABC"),
                  lane_counts[policy]["grants"], lane_counts[policy]["yields"])
    table.notes.append("Lane share: each tenant's fraction of the lane's held rounds (a holder's tick, drafting or kept at "
                       "K = 0 by adaptive K: what the lane charges) over the ticks at which every tenant had an unfinished "
                       "request (where a fair lane owes each a third; B and C send short requests, so between them only A "
                       "and one other, or A alone, contend). "
                       f"{repeats} run(s) of the workload per policy, the policies alternating, each on a fresh engine; the "
                       "share and Jain's index pool the runs' contended rounds (one run's few grants in its short contention "
                       "window make its index noisy: 'Jain per run'); first grants, tok/s (median), grants and yields are "
                       "over all runs. "
                       "First grant: from a request's arrival to its first lane grant (requests that never got the lane count their whole life). "
                       f"One slot, K up to {factory.base.lane.num_draft_tokens} beside other streams, {factory.base.lane.drafter} drafter, grant budget 8 rounds.")
    return [table], raw


def _clock0(timelines: dict[str, Timeline]) -> float:
    tl = next(iter(timelines.values()))
    return tl.added_clock - tl.added_s


def _contention_window(timelines: dict[str, Timeline]) -> tuple[float, float]:
    spans = defaultdict(list)
    for tl in timelines.values():
        spans[tl.job.options["tenant"]].append((tl.added_s, tl.finished_s or tl.added_s))
    starts = sorted(min(s for s, _ in v) for v in spans.values())
    ends = sorted(max(e for _, e in v) for v in spans.values())
    return starts[1], ends[-2]  # from the second tenant's arrival until only one tenant is left


def _contended_rounds(samples: list[tuple[float, Counter]], timelines: dict[str, Timeline]) -> Counter:
    """The lane rounds each tenant held between consecutive tick samples (time, held rounds
    by tenant) that end while every tenant has an unfinished request."""
    spans = [(tl.job.options["tenant"], tl.added_s, tl.finished_s if tl.finished_s is not None else math.inf)
             for tl in timelines.values()]
    tenants = {tenant for tenant, _, _ in spans}
    held: Counter = Counter()
    for (_, before), (now, after) in zip(samples, samples[1:], strict=False):
        if {tenant for tenant, start, end in spans if start <= now < end} == tenants:
            held.update(after - before)
    return held


def _shares(held: Counter) -> dict[str, float]:
    total = sum(held.values())
    return {k: v / total for k, v in held.items()} if total else {}


def _first_grant_waits(timelines: dict[str, Timeline], events) -> dict[str, float]:
    first: dict[str, float] = {}
    for ev in events:
        if ev.kind == "grant" and ev.request_id not in first:
            first[ev.request_id] = ev.time_s
    waits = {}
    for rid, tl in timelines.items():
        end = first.get(rid, tl.added_clock + ((tl.finished_s or tl.added_s) - tl.added_s))
        waits[rid] = end - tl.added_clock
    return waits


GRANT_ROUNDS = 64  # the holder's grant: only preemption moves the lane before it is spent
HELD_ROUNDS = 4  # rounds the holder has run when the urgent request arrives


def priority(factory: EngineFactory, quick: bool = False) -> list[Table]:
    """A priority -1 request arriving while a priority 0 stream holds the lane.

    The urgent request arrives once the holder has run ``HELD_ROUNDS`` rounds of its grant
    (not at a wall-clock time, which a fast machine outruns): preemption hands it the lane
    at the next round boundary; without it, it waits until the holder's grant ends: the
    rest of its rounds, or the first tick in which the holder drafts nothing (its suffix
    drafter finds no match; the grant ends there, ``SpecLane.end_grant``)."""
    copy = factory.chat_ids(f"Repeat the following paragraph exactly:\n\n{PARAGRAPH}")
    grant_rounds = GRANT_ROUNDS // 4 if quick else GRANT_ROUNDS
    table = Table("Priority: an urgent request (priority -1) arrives while a priority-0 stream holds the lane",
                  ["preemption", "holder's rounds at arrival", "ticks from eligible to holding",
                   "ms from eligible to holding", "preemptions"])
    for preempt in (True, False):
        progress(f"priority preempt={preempt}")
        engine = factory.engine(spec_mode="slice", spec_preempt=preempt, spec_grant_rounds=grant_rounds)
        label = "on" if preempt else "off (--no-spec-preempt)"
        holder = engine.add_request("holder", copy, SamplingParams(max_tokens=4096, ignore_eos=True), priority=0)
        while engine.has_unfinished() and holder.spec.rounds < HELD_ROUNDS:
            engine.step()
        held_rounds = holder.spec.rounds
        # Long enough to outlast the rest of the grant, which it decodes through while waiting.
        engine.add_request("urgent", copy, SamplingParams(max_tokens=4 * grant_rounds, ignore_eos=True), priority=-1)
        eligible = granted = None  # (tick, clock)
        tick = 0
        while engine.has_unfinished() and granted is None:
            engine.step()
            tick += 1
            urgent = engine.scheduler.get("urgent")
            if granted is None and "urgent" in engine.scheduler.lane.holders:
                granted = (tick, engine.clock())
            if eligible is None and urgent is not None and urgent.prefill_done:
                eligible = (tick, engine.clock())
        for rid in ("holder", "urgent"):
            engine.abort_request(rid)
        engine.run_until_done()
        if eligible is None or granted is None:
            table.add(label, held_rounds, "never", "never", engine.counters.lane_preemptions)
            continue
        table.add(label, held_rounds, granted[0] - eligible[0], (granted[1] - eligible[1]) * 1000,
                  engine.counters.lane_preemptions)
    table.notes.append(f"The urgent request arrives after the holder's first {HELD_ROUNDS} lane rounds of a "
                       f"{grant_rounds}-round grant. Eligible: the tick its prompt finished (its first token). "
                       "Holding: the first tick it runs a round. A grant at the very next tick boundary reads as 1 tick. "
                       "Without preemption the urgent request waits for the holder's grant to end: its rounds spent, "
                       "or a tick in which the holder drafts nothing (that ends a grant).")
    return [table]


def overhead(factory: EngineFactory | None = None, quick: bool = False) -> list[Table]:
    """Cost of one lane decision as waiters grow (pure lane, no model)."""
    table = Table("Lane decision cost by number of waiters (tenant fairness, 1 slot, budget 1 round: a grant every decision)",
                  ["waiters", "tenants", "µs per decision (median of rounds)", "µs per decision / log2(n)"])
    sizes = (100, 1_000, 10_000) if quick else (100, 1_000, 10_000, 100_000)
    for n in sizes:
        lane = SpecLane(LaneConfig(spec_grant_rounds=1), record_events=False)
        now = 0.0
        for i in range(n):
            lane.add(f"r{i}", tenant=f"t{i % 1000}", priority=i % 3, now=now, stats=SpecStats())
        times = []
        for _ in range(200):
            now += 0.01
            start = time.perf_counter()
            holders = lane.schedule(now)
            for h in holders:
                lane.round_done(h, elapsed_ms=10.0, now=now)
            times.append(time.perf_counter() - start)
        import math

        us = median(times) * 1e6
        table.add(n, min(n, 1000), us, us / math.log2(n))
    table.notes.append("Each decision yields the holder (budget spent, waiters exist) and grants the next by the full order "
                       "(overdue, priority, tenant service, FIFO).")
    return [table]


def tick_share(factory: EngineFactory, quick: bool = False) -> list[Table]:
    """The lane's share of tick time with 16 running requests and 64 queued behind them."""
    engine = factory.engine(spec_mode="slice", max_num_seqs=16)
    lane = engine.scheduler.lane
    spent = [0.0]
    for name in ("schedule", "round_done", "add", "remove"):
        original = getattr(lane, name)

        def timed(*a, _original=original, **k):
            start = time.perf_counter()
            try:
                return _original(*a, **k)
            finally:
                spent[0] += time.perf_counter() - start

        setattr(lane, name, timed)
    prompts = [factory.chat_ids(f"Question {i}: what is {i} plus {i}?") for i in range(80)]
    jobs = [Job(f"r{i}", prompts[i], SamplingParams(max_tokens=16 if quick else 32, ignore_eos=True)) for i in range(80)]
    _, wall = drive(engine, jobs)
    table = Table("Lane overhead inside real ticks (16 running, 64 queued)", ["ticks", "tick time total s", "lane time total ms", "lane share"])
    table.add(engine.counters.ticks, engine.counters.busy_s, spent[0] * 1000, f"{spent[0] / engine.counters.busy_s:.3%}")
    return [table]
