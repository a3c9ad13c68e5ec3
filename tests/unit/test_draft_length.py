"""Adaptive draft length (scheduler/draft_length.py): the goodput choice, the acceptance
estimate, and the scheduler using them — a fake runner, a fake clock, no torch.

The step cost used here has the shape measured for the default model with torch's int4
kernel on a 2-core CPU (``speclane bench decode``, engine/calibration.py): rows come in
blocks of 4, so 1 -> 4 rows costs +55% and the 5th row as much again — a harder curve
for the policy than our own kernel's, which the tests need not follow."""

from __future__ import annotations

import pytest

from speclane.config import LaneConfig, SchedulerConfig
from speclane.request import Request, SamplingParams
from speclane.scheduler.draft_length import (
    FADE,
    MAX_SLOWDOWN,
    MIN_GAIN,
    MIN_PLAIN_TICKS,
    PROBE_EVERY,
    AcceptanceEstimate,
    DraftTiming,
    RoundOverhead,
    StepCost,
    choose,
    expected_tokens,
)
from speclane.scheduler.plan import RunnerResult, ScheduledSeq, SchedulerPlan, SeqResult
from speclane.scheduler.scheduler import Scheduler

BLOCKY = StepCost((30.0, 38.0, 42.0, 47.0, 67.0, 73.0, 78.0, 78.0, 101.0, 102.0, 111.0, 111.0, 122.0, 129.0, 140.0, 140.0))
# Our own kernel's shape: every row costs its FMAs, a tenth of a one-row step here.
ROWWISE = StepCost(tuple(30.0 + 3.0 * i for i in range(16)))
# Dense-like: a row costs a sixtieth of a step, so depth is limited only by the caps.
NEARLY_FLAT = StepCost(tuple(30.0 + 0.5 * i for i in range(24)))


def estimate(rate: float, request_id: str = "a") -> AcceptanceEstimate:
    """An estimate that has seen many tried draft positions at ``rate`` for ``request_id``
    (and as the engine-wide rate): the steady state of rounds accepting ``rate`` of them."""
    est = AcceptanceEstimate()
    est.counts[request_id] = est.record[request_id] = (500.0, 500.0 * rate)
    est.engine_tried, est.engine_accepted = 500.0, 500.0 * rate
    return est


# -- the pieces ------------------------------------------------------------------------------
def test_step_cost_is_made_monotone_and_extends_past_its_table():
    cost = StepCost.from_measurements([10.0, 9.0, 14.0, 13.0])
    assert cost.ms_by_rows == (10.0, 10.0, 14.0, 14.0)
    assert cost.ms(6) == pytest.approx(14.0 + 2 * (14.0 - 10.0) / 3)
    for bad in ((), (10.0, float("nan")), (0.0,), (float("inf"),)):
        with pytest.raises(ValueError):
            StepCost(bad)


def test_expected_tokens_of_a_round():
    assert expected_tokens(0.0, 4) == 1.0  # only the bonus token
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_the_rate_is_per_tried_position_not_per_drafted_token():
    """Rounds of 2 drafts accepting 0, 1, 2: 3 accepted of 5 tried positions (the drafts
    after a rejection were never judged), 0.6 a position, the ``a`` of 1 + a + a^2. Per
    drafted token it would read 3 of 6, and adaptive K would undervalue the drafter."""
    est = AcceptanceEstimate()
    for _ in range(60):
        for accepted in (0, 1, 2):
            est.observe("a", 2, accepted)
    assert est.prior() == pytest.approx(0.6, abs=0.01)
    assert 0.55 < est.rate("a") < 0.7  # decayed counts: the last rounds weigh most
    est.observe("b", 4, 1)  # one accepted, the second rejected, two never judged
    assert est.counts["b"] == (2.0, 1.0)


def test_acceptance_estimate_follows_rounds_and_counts_held_ticks_toward_a_probe():
    est = AcceptanceEstimate()
    assert est.rate("a") == pytest.approx(0.7)  # the prior before any round
    assert not est.has_drafted("a")  # choose() probes such a holder first
    for _ in range(10):
        est.observe("a", 4, 0)
        est.observe("b", 4, 4)
    low = est.rate("a")
    # The prior is now the engine-wide rate per tried position: "a" tried 1 of its 4 drafts
    # each round (rejected), "b" all 4 (accepted): 40 of 50.
    assert low < 0.2 and est.prior() == pytest.approx(0.8, abs=0.01)
    assert est.evidence("a") > 4 and est.has_drafted("a") and not est.due_for_probe("a")  # ~5 tried positions (decayed)
    for _ in range(PROBE_EVERY - 1):
        est.idle("a")
    assert not est.due_for_probe("a")
    est.idle("a")
    assert est.due_for_probe("a")
    assert est.rate("a") == low  # held ticks leave the counts alone: no drift back to the prior
    est.observe("a", 1, 0)  # the probe's round restarts the count
    assert not est.due_for_probe("a")
    est.forget("a")
    assert "a" not in est.counts and "a" not in est.idle_ticks


# -- the choice --------------------------------------------------------------------------------
def test_a_lone_stream_drafts_deep_when_drafts_are_good_and_not_at_all_when_they_are_bad():
    assert choose([("a", 4)], 1, 1, BLOCKY, estimate(0.95)) == {"a": 3}  # 4 rows, not the 5th
    assert choose([("a", 4)], 1, 1, StepCost((30.0, 31.0, 32.0, 33.0, 34.0)), estimate(0.95)) == {"a": 4}  # flat cost
    assert choose([("a", 4)], 1, 1, BLOCKY, estimate(0.1)) == {"a": 0}


def test_in_a_full_batch_a_holder_drafts_only_what_its_acceptance_pays_for():
    # 8 decode rows fill two blocks; any draft opens a third (+30-43% for the whole tick):
    # not worth it at 0.7, and even perfect drafts may add only one row (MAX_SLOWDOWN),
    # which does not pay for a block.
    assert choose([("a", 4)], 8, 8, BLOCKY, estimate(0.7)) == {"a": 0}
    assert choose([("a", 4)], 8, 8, BLOCKY, estimate(1.0)) == {"a": 0}
    # 6 rows leave 2 free rows in the second block: cheap drafts are worth it.
    assert choose([("a", 4)], 6, 6, BLOCKY, estimate(0.7)) == {"a": 2}
    # Where every row costs its share (our kernel), perfect drafts go deep beside 8 rows,
    # poor ones not at all, and at 0.8 three (the fourth's 0.41 expected tokens cost 3 ms).
    assert choose([("a", 4)], 8, 8, ROWWISE, estimate(1.0)) == {"a": 4}
    assert choose([("a", 4)], 8, 8, ROWWISE, estimate(0.1)) == {"a": 0}
    assert choose([("a", 4)], 8, 8, ROWWISE, estimate(0.8)) == {"a": 3}


def test_co_batched_streams_wait_at_most_max_slowdown_for_the_drafts():
    # 4 classic rows + the holder's own (5 rows, 67 ms): K = 7 would be the goodput choice
    # at acceptance 1.0 (12 rows, 111 ms), but it makes the others' tick 1.66x longer.
    ks = choose([("a", 7)], 5, 5, BLOCKY, estimate(1.0))
    assert ks == {"a": 3} and BLOCKY.ms(5 + 3) <= MAX_SLOWDOWN * BLOCKY.ms(5)
    # Alone, the same holder drafts as deep as pays.
    assert choose([("a", 7)], 1, 1, BLOCKY, estimate(1.0)) == {"a": 7}


def test_drafting_time_counts_a_costly_drafter_drafts_less():
    # An MTP-like head at 34% acceptance: one draft pays while drafting is free, not at 3 ms a token.
    assert choose([("a", 3)], 1, 1, BLOCKY, estimate(0.34)) == {"a": 1}
    assert choose([("a", 3)], 1, 1, BLOCKY, estimate(0.34), draft_ms_per_token=3.0) == {"a": 0}
    timing = DraftTiming()
    timing.observe(9.0, 3)
    assert timing.ms_per_token == pytest.approx(3.0) and timing.ms_per_round == 0.0
    timing.observe(0.0, 0)  # a tick without drafts says nothing
    timing.observe(2.0, 2)
    assert timing.ms_per_token == pytest.approx((3.0 + 1.0) / 2)  # the mean of the first rounds, then following


def test_a_rounds_catch_up_is_charged_once_per_round_not_per_token():
    timing = DraftTiming()
    timing.observe(0.6, 2, catch_up_ms=0.5)  # 2 drafts at 0.3 ms, after a 0.5 ms catch-up
    assert (timing.ms_per_token, timing.ms_per_round) == pytest.approx((0.3, 0.5))
    flat = StepCost((10.0, 10.5, 11.0, 11.5))
    # 60% acceptance, 1 ms a draft token and 3 ms a round: K = 3 pays (2.18 tokens in 17.5 ms
    # against 1.05 in 10). Charged as 4 ms a token, the same costs would stop it at K = 1.
    assert choose([("a", 3)], 1, 1, flat, estimate(0.6), draft_ms_per_token=1.0, draft_ms_per_round=3.0) == {"a": 3}
    assert choose([("a", 3)], 1, 1, flat, estimate(0.6), draft_ms_per_token=4.0) == {"a": 1}
    # A round that costs a step's worth does not pay at all.
    assert choose([("a", 3)], 1, 1, flat, estimate(0.6), draft_ms_per_token=1.0, draft_ms_per_round=10.0) == {"a": 0}


def test_the_cap_is_respected_and_later_holders_see_the_rows_of_earlier_ones():
    est = estimate(1.0, "a")
    for _ in range(50):
        est.observe("b", 100, 100)
    assert choose([("b", 4)], 2, 2, BLOCKY, est) == {"b": 2}  # alone: fill the first block
    # After a's row b could only open the second block, over MAX_SLOWDOWN of the 2-row tick.
    assert choose([("a", 1), ("b", 4)], 2, 2, BLOCKY, est) == {"a": 1, "b": 1}


def test_round_overhead_is_a_rounds_time_beyond_the_table_and_the_plain_ticks():
    overhead = RoundOverhead()
    overhead.observe(8, 1, 1, 20.0, ROWWISE)  # no plain tick of 8 rows yet: nothing to compare with
    for _ in range(MIN_PLAIN_TICKS):
        overhead.observe(8, 0, 0, 50.0, ROWWISE)
        overhead.observe(1, 0, 0, 30.0, ROWWISE)
    overhead.observe(1, 4, 1, 90.0, ROWWISE)  # a lone holder's tick delays no one: not counted
    assert overhead.rounds == 0 and overhead.shared_round_ms() == 0.0
    overhead.observe(8, 2, 1, 50.0 + 2 * 3.0 + 4.0, ROWWISE)  # the table's 2 rows (3 ms each), then 4 ms more
    assert overhead.shared_round_ms() == pytest.approx(4.0)
    overhead.observe(8, 1, 1, 50.0 + 3.0 + 14.0, ROWWISE)  # the mean of the first rounds
    assert overhead.shared_round_ms() == pytest.approx(9.0)
    overhead.observe(8, 1, 1, 50.0 + 3.0 + 1e6, ROWWISE)  # a pause: one sample moves it at most a plain tick
    assert overhead.shared_round_ms() == pytest.approx((2 * 9.0 + ROWWISE.ms(8)) / 3)
    cheap = RoundOverhead()
    for _ in range(MIN_PLAIN_TICKS):
        cheap.observe(4, 0, 0, 50.0, ROWWISE)
    cheap.observe(4, 1, 1, 50.0, ROWWISE)  # cheaper than the table says: the table stays the floor
    assert cheap.ms_per_round < 0 and cheap.shared_round_ms() == 0.0


def test_a_first_rounds_seed_is_kept_apart_from_a_rounds_catch_up():
    """A request's first round may seed its drafter (an MTP head's pass over the prompt),
    once: averaged into the catch-up it would make every later round look dear; its own
    mean counts first rounds that seeded nothing (a prompt lookup's) as 0."""
    timing = DraftTiming()
    timing.observe(0.6, 2, catch_up_ms=0.5)
    timing.observe_first_round(3.0)
    timing.observe_first_round(0.0)
    assert timing.ms_first_round == pytest.approx(1.5) and timing.first_rounds == 2
    assert (timing.ms_per_token, timing.ms_per_round) == pytest.approx((0.3, 0.5))


def test_a_first_round_beside_others_is_charged_its_seed_and_alone_a_rounds_catch_up():
    est = estimate(0.98, "copy")  # has drafted; "new" has not
    costs = {"shared_round_ms": 0.5, "draft_ms_per_round": 0.5, "draft_ms_first_round": 20.0}
    assert choose([("copy", 4)], 8, 8, NEARLY_FLAT, est, **costs) == {"copy": 4}
    assert choose([("new", 4)], 8, 8, NEARLY_FLAT, est, **costs) == {"new": 0}  # a probe that seeds does not pay
    assert choose([("new", 4)], 8, 8, NEARLY_FLAT, est, **{**costs, "draft_ms_first_round": 0.5}) == {"new": 1}
    assert choose([("copy", 4)], 8, 8, NEARLY_FLAT, est, **{**costs, "draft_ms_per_round": 20.0}) == {"copy": 0}
    # Whose next round seeds is the scheduler's to say: a preempted request that has drafted
    # seeds again; one that seeded but proposed nothing has paid its seed.
    assert choose([("copy", 4)], 8, 8, NEARLY_FLAT, est, **costs, first_rounds={"copy"}) == {"copy": 0}
    assert choose([("new", 4)], 8, 8, NEARLY_FLAT, est, **costs, first_rounds=set()) == {"new": 1}
    # Alone the seed delays no one: the lone first round is priced as any round.
    alone = choose([("new", 8)], 1, 1, NEARLY_FLAT, est, draft_ms_per_round=0.5, draft_ms_first_round=1000.0)
    assert alone == choose([("new", 8)], 1, 1, NEARLY_FLAT, est, draft_ms_per_round=0.5) and alone["new"] >= 1


def test_a_run_of_cheap_rounds_prices_a_requests_rounds_until_it_drafts_the_costly_way():
    """``--drafter auto`` times its head's rounds engine-wide; a request whose last rounds
    were the suffix drafter's (``catch_up_ms`` None: the call whole) is priced by them,
    until a round of it is the head's again."""
    timing = DraftTiming()
    timing.observe(0.9, 3, catch_up_ms=0.6, request_id="chat")  # head rounds: 0.3 ms a token, 0.6 a round
    timing.observe(0.05, 8, catch_up_ms=None, request_id="copy")  # a suffix round: 0.05 ms the call
    assert (timing.ms_per_token, timing.ms_per_round) == pytest.approx((0.3, 0.6))  # the cheap way left out
    assert timing.own_costs(["chat", "copy", "new"]) == {"copy": pytest.approx((0.0, 0.05))}
    timing.observe(0.0, 0, catch_up_ms=None, request_id="new")  # nothing proposed says nothing
    timing.observe(0.15, 8, catch_up_ms=None, request_id="copy")
    assert timing.own_costs(["copy", "new"]) == {"copy": pytest.approx((0.0, 0.1))}  # the run's mean call
    timing.observe(0.6, 2, catch_up_ms=0.5, request_id="copy")  # the text stopped matching: the head drafted
    assert timing.own_costs(["copy"]) == {}  # the head's price again, from the next round
    timing.observe(0.05, 8, catch_up_ms=None, request_id="copy")
    timing.forget("copy")
    assert timing.own_costs(["copy"]) == {}
    # Priced by its own rounds, a near-certain copy drafts as deep as the table pays for;
    # at the engine-wide (the head's) costs, less.
    flat = StepCost((10.0, 10.5, 11.0, 11.5, 12.0, 12.5, 13.0, 13.5, 14.0))
    est = estimate(0.8, "copy")
    head_costs = {"draft_ms_per_token": 1.5, "draft_ms_per_round": 2.0}
    priced_as_head = choose([("copy", 8)], 1, 1, flat, est, **head_costs)["copy"]
    own = choose([("copy", 8)], 1, 1, flat, est, **head_costs, own_draft_ms={"copy": (0.0, 0.05)})["copy"]
    assert own == choose([("copy", 8)], 1, 1, flat, est)["copy"] and priced_as_head < own


class CheapAndCostlyRunner:
    """Request "copy" drafts the cheap way (0.05 ms a call, reported without a catch-up),
    every draft accepted; the others' rounds are a head's (1.5 ms a token, 2 ms a round),
    half accepted. Ticks take ``flat`` per row plus the reported drafting."""

    def __init__(self, cost: StepCost):
        self.cost = cost

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        results, timings, rows = [], [], 0
        for seq in plan.seqs:
            k = seq.num_draft_tokens
            cheap = seq.request_id == "copy"
            accepted = k if cheap else k // 2
            results.append(SeqResult(seq.request_id, (500,) * (accepted + 1 if seq.sample else 0), k))
            rows += len(seq.token_ids) + k
            if k:
                timings.append((seq.request_id, 0.05, k, None) if cheap else (seq.request_id, 1.5 * k, k, 2.0))
        drafting = sum(ms + (catch_up or 0.0) for _, ms, _, catch_up in timings)
        return RunnerResult(tuple(results), elapsed_ms=self.cost.ms(rows) + drafting, draft_timings=tuple(timings))


def test_a_lone_copy_stream_after_head_rounds_drafts_as_deep_as_its_own_rounds_pay():
    flat = StepCost(tuple(10.0 + 0.5 * i for i in range(16)))
    lane = LaneConfig(spec_mode="slice", num_draft_tokens=4, lone_draft_tokens=8)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=1), lane, 4096, step_cost=flat)
    runner = CheapAndCostlyRunner(flat)
    ks: dict[str, list[int]] = {"chat": [], "copy": []}
    for t, rid in enumerate(["chat", "copy"]):
        scheduler.add_request(Request(request_id=rid, prompt_token_ids=[1, 2, 3],
                                      sampling=SamplingParams(max_tokens=200, ignore_eos=True)), float(t))
        while scheduler.has_unfinished():
            plan = scheduler.schedule(float(t))
            ks[rid] += [seq.num_draft_tokens for seq in plan.seqs if seq.is_round]
            scheduler.update(plan, runner.execute(plan), float(t))
    assert scheduler.draft_timing.ms_per_token == pytest.approx(1.5)  # the chat stream's head rounds set these
    assert max(ks["chat"]) < 8
    # The copy stream's first round is priced at the head's costs; its own cheap rounds then.
    assert ks["copy"][1:] and all(k == 8 for k in ks["copy"][1:-1])


def test_round_overhead_fades_while_shared_ticks_go_without_rounds():
    """Once the overhead stops shared drafting nothing measures it: it fades, so probes come
    back and measure it again, instead of one slow stretch stopping drafts for good."""
    overhead = RoundOverhead()
    for _ in range(MIN_PLAIN_TICKS):
        overhead.observe(8, 0, 0, 50.0, ROWWISE)
    overhead.observe(8, 1, 1, 50.0 + 3.0 + 20.0, ROWWISE)
    for _ in range(100):
        overhead.observe(1, 0, 0, 30.0, ROWWISE)  # a lone stream's ticks say nothing of shared rounds
    assert overhead.shared_round_ms() == pytest.approx(20.0)
    for _ in range(140):
        overhead.observe(8, 0, 0, 50.0, ROWWISE)
    assert overhead.shared_round_ms() == pytest.approx(20.0 * FADE**140) and 9.0 < overhead.shared_round_ms() < 10.5


def test_a_measured_round_overhead_stops_drafts_that_the_table_alone_would_buy():
    est = estimate(0.7, "chat")
    assert choose([("chat", 4)], 8, 8, NEARLY_FLAT, est) == {"chat": 4}  # the table: rows are nearly free
    # 8 ms a round keeps every K under the head-of-line ceiling: the goodput says no.
    assert choose([("chat", 4)], 8, 8, NEARLY_FLAT, est, shared_round_ms=8.0) == {"chat": 0}
    # A lone holder's rounds delay no one: its K is the table's (shared_round_ms is a shared
    # tick's; charged here it would stop this holder too).
    half = estimate(0.5, "prose")
    assert choose([("prose", 4)], 1, 1, ROWWISE, half) == {"prose": 2}
    assert choose([("prose", 4)], 1, 1, ROWWISE, half, shared_round_ms=30.0) == {"prose": 2}
    assert choose([("prose", 4)], 1, 1, ROWWISE, half, draft_ms_per_round=30.0) == {"prose": 0}


def test_a_probe_in_a_shared_tick_must_pay_for_itself():
    """A probe is PROBE_K drafts: beside other streams it happens only where those drafts,
    accepted, repay the tick's extra time, even if a deeper round of certain drafts would
    (its cost is every co-batched stream's)."""
    est = AcceptanceEstimate()
    # 8 rows of ~33 ms: one certain draft adds 1/8 of the tokens (~4 ms' worth), four add 1/2.
    assert choose([("new", 4)], 8, 8, NEARLY_FLAT, est, shared_round_ms=1.0) == {"new": 1}
    assert choose([("new", 4)], 8, 8, NEARLY_FLAT, est, shared_round_ms=6.0) == {"new": 0}
    assert choose([("new", 4)], 1, 1, NEARLY_FLAT, est, shared_round_ms=60.0)["new"] >= 1  # alone it probes


# -- the scheduler ---------------------------------------------------------------------------
class VerifyingRunner:
    """Every draft is accepted (or rejected) as scripted; a round emits accepted + 1 tokens."""

    def __init__(self, accept: bool):
        self.accept = accept

    def accepts(self, request_id: str) -> bool:
        return self.accept

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        results = []
        for seq in plan.seqs:
            accepted = seq.num_draft_tokens if self.accepts(seq.request_id) else 0
            n = accepted + 1 if seq.sample else 0
            results.append(SeqResult(seq.request_id, (500,) * n, seq.num_draft_tokens))
        return RunnerResult(tuple(results), elapsed_ms=10.0)


def run_batch(accept: bool, ticks: int, grant_rounds: int = 0) -> tuple[Scheduler, list[SchedulerPlan]]:
    lane = LaneConfig(spec_mode="slice", num_draft_tokens=4, spec_grant_rounds=grant_rounds)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8), lane, 4096, step_cost=ROWWISE)
    for i in range(8):
        scheduler.add_request(Request(request_id=f"r{i}", prompt_token_ids=[1, 2, 3],
                                      sampling=SamplingParams(max_tokens=1000, ignore_eos=True)), 0.0)
    runner, plans = VerifyingRunner(accept), []
    for t in range(ticks):
        plan = scheduler.schedule(t * 0.01)
        plans.append(plan)
        scheduler.update(plan, runner.execute(plan), t * 0.01)
    return scheduler, plans


def drafts(plan: SchedulerPlan) -> int:
    return sum(seq.num_draft_tokens for seq in plan.seqs)


def test_in_a_full_batch_rejected_drafts_stop_and_accepted_ones_continue():
    _, rejected = run_batch(accept=False, ticks=40)
    _, accepted = run_batch(accept=True, ticks=40)
    # Tick 0 prefills. Tick 1: the holder has no evidence, so it probes with one draft.
    assert drafts(rejected[1]) == 1 and drafts(accepted[1]) == 1
    # Rejected: drafting stops, save a one-token probe now and then; accepted: it goes deep.
    assert all(drafts(p) <= 1 for p in rejected[2:])
    assert sum(1 for p in rejected[2:] if drafts(p) == 0) >= 30
    assert all(drafts(p) == 4 for p in accepted[3:])


def test_a_new_holder_probes_even_where_the_prior_says_no():
    est = AcceptanceEstimate()
    for _ in range(20):
        est.observe("old", 4, 1)  # engine-wide rate 0.25
    # ROWWISE at 8 rows: one more row costs 6%, so drafts that are all accepted would pay.
    assert choose([("new", 3)], 8, 8, ROWWISE, est) == {"new": 1}
    assert choose([("old", 3)], 8, 8, ROWWISE, est) == {"old": 0}


def test_no_probe_where_even_drafts_that_are_all_accepted_would_not_pay():
    """BLOCKY at 8 rows: a ninth row costs 29% of the tick, more than a draft that is
    surely accepted adds (1 token of 8): a probe would learn a rate no K could use."""
    est = AcceptanceEstimate()
    assert choose([("new", 3)], 8, 8, BLOCKY, est) == {"new": 0}
    est.observe("idle", 2, 0)
    for _ in range(PROBE_EVERY):
        est.idle("idle")
    assert est.due_for_probe("idle")
    assert choose([("idle", 3)], 8, 8, BLOCKY, est) == {"idle": 0}
    assert choose([("idle", 3)], 8, 8, ROWWISE, est) == {"idle": 1}  # where it could pay, the probe is due
    assert choose([("new", 3)], 1, 1, BLOCKY, AcceptanceEstimate())["new"] >= 1  # a lone stream still probes


def test_a_new_holder_probes_before_it_drafts_deep_in_a_shared_tick_even_where_the_prior_says_yes():
    # A copy stream has held the engine-wide rate near 1; a new chat holder beside other
    # streams must not buy a deep round on that alone (every co-batched stream would wait).
    est = estimate(0.98, "copy")
    assert choose([("copy", 4)], 4, 4, ROWWISE, est) == {"copy": 3}  # its evidence buys what the guard allows
    assert choose([("chat", 4)], 4, 4, ROWWISE, est) == {"chat": 1}
    assert choose([("chat", 4)], 5, 5, ROWWISE, est) == {"chat": 1}


def test_a_new_lone_holder_drafts_as_deep_as_the_prior_pays_and_backs_off_when_it_fails():
    # Alone, a wrong first guess costs only the stream's own tick, once: a copy request's
    # first round yields 5 tokens instead of a probe's 2 (bench speedup).
    est = estimate(0.98, "copy")
    assert choose([("copy", 4)], 1, 1, BLOCKY, est) == {"copy": 3}
    assert choose([("chat", 4)], 1, 1, BLOCKY, est) == {"chat": 3}
    est.observe("chat", 3, 0)  # its deep first round failed: the prior (one token's weight) does not undo that
    assert est.rate("chat") < 0.5
    failed = 1
    while choose([("chat", 4)], 1, 1, BLOCKY, est) != {"chat": 0}:
        k = choose([("chat", 4)], 1, 1, BLOCKY, est)["chat"]
        assert k <= 2  # shallow rounds while the evidence builds
        est.observe("chat", k, 0)
        failed += 1
    # It stops once its own rounds rule out a paying rate (see Stopping), the copy stream's
    # engine-wide 0.98 notwithstanding: here after 8 failed rounds, most of them one draft.
    assert failed <= 8
    low = estimate(0.1, "chat-heavy")  # an engine-wide prior that does not pay: still one probe
    assert choose([("new", 4)], 1, 1, BLOCKY, low) == {"new": 1}


def test_a_lone_holder_near_break_even_keeps_drafting_until_its_rounds_rule_it_out():
    """Two failed rounds put a 0.47 drafter's estimate below what a round costs here, but two
    rounds cannot rule a paying rate out: it drafts on at the estimate's best K > 0 rather than
    stopping (which would end the evidence until a probe PROBE_EVERY ticks later). Its own
    rounds, not the prior, decide: a run of failures does stop it."""
    est = estimate(0.47, "other")
    for _ in range(2):
        est.observe("chat", 2, 0)
    assert _best_k_by_estimate(est, "chat") == 0  # the estimate alone would stop
    assert est.optimistic_rate("chat") > est.rate("chat")
    assert choose([("chat", 4)], 1, 1, ROWWISE_DRAFTING, est, 0.6, 0.9) == {"chat": 1}
    for _ in range(10):
        est.observe("chat", 1, 0)
    assert choose([("chat", 4)], 1, 1, ROWWISE_DRAFTING, est, 0.6, 0.9) == {"chat": 0}
    assert est.optimistic_rate("chat") < 0.3
    # A steady 0.47 (many rounds) is not stopped by a bad round or two either.
    for _ in range(40):
        est.observe("steady", 2, 1)
        est.observe("steady", 2, 0)
    est.observe("steady", 2, 0)
    assert choose([("steady", 4)], 1, 1, ROWWISE_DRAFTING, est, 0.6, 0.9)["steady"] >= 1


def test_in_a_shared_tick_the_estimate_alone_decides_to_stop():
    """Beside other streams a wasted round makes them wait too: no optimism there."""
    est = estimate(0.47, "other")
    for _ in range(2):
        est.observe("chat", 2, 0)
    assert choose([("chat", 4)], 4, 4, ROWWISE_DRAFTING, est, 0.6, 0.9) == {"chat": 0}


# A measured shape of the default model's step (ms by rows), drafts costing
# 0.6 ms per token and 0.9 ms per round: a K = 2 round pays from ~34% acceptance.
ROWWISE_DRAFTING = StepCost((6.79, 7.39, 7.39, 8.35, 8.48, 8.76, 9.8, 10.08))


def _best_k_by_estimate(est: AcceptanceEstimate, request_id: str) -> int:
    """What the pre-stopping-rule choice gave: K by the estimate alone (a shared tick's rule)."""
    rate = est.rate(request_id)
    base = MIN_GAIN / ROWWISE_DRAFTING.ms(1)
    best, best_k = base, 0
    for k in range(1, 5):
        goodput = expected_tokens(rate, k) / (ROWWISE_DRAFTING.ms(1 + k) + 0.9 + 0.6 * k)
        if goodput > best:
            best, best_k = goodput, k
    return best_k


def test_a_holder_at_k0_probes_once_every_probe_every_held_ticks():
    _, plans = run_batch(accept=False, ticks=1 + 3 * (PROBE_EVERY + 1) + 1)
    probe_ticks = [t for t, p in enumerate(plans) if drafts(p) > 0]
    # Tick 0 prefills; the first holder probes at tick 1, then again after PROBE_EVERY held ticks at K = 0.
    assert probe_ticks[:3] == [1, 1 + PROBE_EVERY + 1, 1 + 2 * (PROBE_EVERY + 1)]
    assert all(drafts(plans[t]) == 1 for t in probe_ticks)


class CostlyRoundRunner:
    """Ticks that take what the table says (ROWWISE), a round's timed drafting (0.02 ms a draft
    and 0.05 ms catching up, reported as the runner does), ``round_ms`` more (the
    verification the table and the drafter's timing leave out), and on a request's first
    round a seed of ``seed_ms`` instead of the catch-up, reported as a seed (``cheap_seed_ms``
    where the round may not seed the costly state; default the same: a drafter with one way).
    A round of k drafts has (k + 1) // 2 accepted."""

    def __init__(self, round_ms: float, seed_ms: float = 0.0, cheap_seed_ms: float | None = None):
        self.round_ms, self.seed_ms = round_ms, seed_ms
        self.cheap_seed_ms = seed_ms if cheap_seed_ms is None else cheap_seed_ms
        self.seeded: set[str] = set()

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        results, rows, timings, seeds = [], 0, [], []
        for seq in plan.seqs:
            k = seq.num_draft_tokens
            accepted = (k + 1) // 2
            results.append(SeqResult(seq.request_id, (500,) * (accepted + 1 if seq.sample else 0), k))
            rows += len(seq.token_ids) + k
            seed_ms = self.seed_ms if seq.may_seed else self.cheap_seed_ms
            if k and seed_ms and seq.request_id not in self.seeded:
                self.seeded.add(seq.request_id)
                seeds.append((seq.request_id, seed_ms, seed_ms + 0.02 * k))  # the seed, then its drafts
            elif k:
                timings.append((seq.request_id, 0.02 * k, k, 0.05))
        drafting = sum(ms + catch_up for _, ms, _, catch_up in timings) + sum(call for _, _, call in seeds)
        return RunnerResult(tuple(results), elapsed_ms=ROWWISE.ms(rows) + drafting + self.round_ms * (len(timings) + len(seeds)),
                            draft_timings=tuple(timings), seed_timings=tuple(seeds))


def eight_streams(runner: CostlyRoundRunner, ticks: int, cheap_starts: bool = False) -> tuple[Scheduler, list[SchedulerPlan]]:
    lane = LaneConfig(spec_mode="slice", num_draft_tokens=4)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8), lane, 4096, step_cost=ROWWISE, cheap_starts=cheap_starts)
    for i in range(8):
        scheduler.add_request(Request(request_id=f"r{i}", prompt_token_ids=[1, 2, 3],
                                      sampling=SamplingParams(max_tokens=1000, ignore_eos=True)), 0.0)
    plans = []
    for t in range(ticks):
        plan = scheduler.schedule(t * 0.01)
        plans.append(plan)
        scheduler.update(plan, runner.execute(plan), t * 0.01)
    return scheduler, plans


def test_the_scheduler_learns_a_rounds_overhead_from_its_ticks_and_stops_drafts_it_does_not_repay():
    def shared_drafts(round_ms: float) -> tuple[int, list[float], Scheduler]:
        """Drafts in ticks 100-199 of 8 streams, and the overhead after each tick with a round."""
        runner, total, learnt = CostlyRoundRunner(round_ms), 0, []
        scheduler, plans = eight_streams(runner, 0)
        for t in range(200):
            plan = scheduler.schedule(t * 0.01)
            scheduler.update(plan, runner.execute(plan), t * 0.01)
            total += drafts(plan) if t >= 100 else 0
            if drafts(plan) and scheduler.round_overhead.rounds:
                learnt.append(scheduler.round_overhead.ms_per_round)
        return total, learnt, scheduler

    as_timed, learnt, _ = shared_drafts(0.0)
    assert learnt and all(ms == pytest.approx(0.0, abs=1e-9) for ms in learnt)
    assert as_timed >= 20  # on the table's cost, half-accepted rounds (and probes) go on
    costly, learnt, scheduler = shared_drafts(25.0)
    assert learnt and learnt[-1] == pytest.approx(25.0)  # less the timed drafting, exactly
    assert costly == 0  # a round costs ~4 tokens' time more than the table says: not even a probe pays
    assert scheduler.round_overhead.shared_round_ms() < 25.0 * FADE**100  # fading since, toward the next probe


def rounds_by_may_seed(plans: list[SchedulerPlan]) -> tuple[set[str], set[str]]:
    """The requests that had a round that could seed, and those that had one that could not."""
    rounds = [seq for plan in plans for seq in plan.seqs if seq.is_round]
    return {seq.request_id for seq in rounds if seq.may_seed}, {seq.request_id for seq in rounds if not seq.may_seed}


def test_a_seed_measured_on_one_first_round_stops_the_first_probes_it_does_not_repay():
    """8 streams of ROWWISE ticks (51 ms): one certain draft repays 3.6 ms, its row costs 3.
    A first round that seeds for 20 ms is found dear on the first request that pays it; the
    other seven, which have never drafted, then never probe (a drafter with one way: no
    cheap starts). The seed is the drafter's, not the round's: the overhead of later rounds
    stays 0."""
    scheduler, plans = eight_streams(CostlyRoundRunner(0.0, seed_ms=20.0), 120)
    seeding, cheap = rounds_by_may_seed(plans)
    assert len(seeding) == 1 and not cheap and scheduler.lane.events  # the lane rotated; one request probed
    assert scheduler.draft_timing.ms_first_round == pytest.approx(20.0)
    assert scheduler.round_overhead.ms_per_round == pytest.approx(0.0, abs=1e-9)
    granted = {e.request_id for e in scheduler.lane.events if e.kind == "grant"}
    assert len(granted) == 8


def test_beside_others_a_request_whose_seed_does_not_pay_drafts_the_cheap_way():
    """The costly seed (20 ms: an MTP head's pass) measured on the first request, the seven
    others start the cheap way (an index of the prompt, 0.5 ms), and stay there: beside
    the others the costly seed never pays."""
    runner = CostlyRoundRunner(0.0, seed_ms=20.0, cheap_seed_ms=0.5)
    scheduler, plans = eight_streams(runner, 120, cheap_starts=True)
    seeding, cheap = rounds_by_may_seed(plans)
    assert len(seeding) == 1 and len(cheap) == 7 and not seeding & cheap
    assert scheduler.draft_timing.ms_first_round == pytest.approx(20.0)
    assert scheduler.draft_timing.ms_cheap_first_round == pytest.approx(0.5)
    assert scheduler.draft_timing.cheap_first_rounds == 7
    # Where the cheap way seeds dearly too, the first cheap start measures it: one more
    # request probes, and the six left never do.
    scheduler, plans = eight_streams(CostlyRoundRunner(0.0, seed_ms=20.0), 120, cheap_starts=True)
    seeding, cheap = rounds_by_may_seed(plans)
    assert len(seeding) == 1 and len(cheap) == 1
    assert scheduler.draft_timing.ms_cheap_first_round == pytest.approx(20.0)
    # A cheap seed: each probes, and the rounds after the plain ticks measure no overhead,
    # since their seeds are the drafter's time, not the round's.
    cheap, plans = eight_streams(CostlyRoundRunner(0.0, seed_ms=0.5), 120)
    assert len({seq.request_id for plan in plans for seq in plan.seqs if seq.is_round}) == 8
    assert cheap.round_overhead.rounds > 0 and cheap.round_overhead.ms_per_round == pytest.approx(0.0, abs=1e-9)
    assert cheap.draft_timing.ms_first_round == pytest.approx(0.5)


class SeedsThenProposes:
    """A drafter whose first call on a request seeds (``seed_ms``) and proposes nothing (no
    match yet), and whose later calls propose every draft, all accepted."""

    def __init__(self, seed_ms: float):
        self.seed_ms, self.seeded = seed_ms, set()

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        results, seeds, timings = [], [], []
        for seq in plan.seqs:
            k = seq.num_draft_tokens
            if k and seq.request_id not in self.seeded:
                self.seeded.add(seq.request_id)
                seeds.append((seq.request_id, self.seed_ms, self.seed_ms))
                k = 0
            elif k:
                timings.append((seq.request_id, 0.0, k, 0.0))
            results.append(SeqResult(seq.request_id, (500,) * (k + 1 if seq.sample else 0), k))
        return RunnerResult(tuple(results), elapsed_ms=10.0, draft_timings=tuple(timings), seed_timings=tuple(seeds))


def test_a_first_round_that_seeded_but_proposed_nothing_is_its_one_first_round():
    """Its seed is paid: the round that first proposes is an ordinary one, neither a second
    sample of the first round's cost (at 0, halving the seed) nor charged the seed again."""
    lane = LaneConfig(spec_mode="slice", num_draft_tokens=4)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8), lane, 4096, step_cost=StepCost((10.0,)))
    scheduler.add_request(Request(request_id="a", prompt_token_ids=[1, 2, 3],
                                  sampling=SamplingParams(max_tokens=1000, ignore_eos=True)), 0.0)
    runner, rounds = SeedsThenProposes(6.0), []
    for t in range(6):
        plan = scheduler.schedule(t * 0.01)
        rounds.append(drafts(plan))
        scheduler.update(plan, runner.execute(plan), t * 0.01)
    assert rounds[1] > 0 and rounds[2] > 0  # it seeded (nothing proposed), then drafted
    assert scheduler.draft_timing.first_rounds == 1 and scheduler.draft_timing.ms_first_round == pytest.approx(6.0)


class ForcedThenSeeds:
    """A constrained request's rounds: at first its drafter proposes nothing and the
    grammar forces every draft (verified, accepted, in no drafter's timings); from
    ``seed_at`` the drafter seeds (``seed_ms``) once, then proposes every draft."""

    def __init__(self, seed_at: int, seed_ms: float):
        self.seed_at, self.seed_ms, self.calls, self.seeded = seed_at, seed_ms, 0, False

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        results, seeds, timings = [], [], []
        for seq in plan.seqs:
            k = seq.num_draft_tokens
            if k:
                self.calls += 1
                if self.calls >= self.seed_at and not self.seeded:
                    self.seeded = True
                    seeds.append((seq.request_id, self.seed_ms, self.seed_ms))
                elif self.seeded:
                    timings.append((seq.request_id, 0.0, k, 0.0))
                else:
                    timings.append((seq.request_id, 0.0, 0, 0.0))  # proposed nothing: forced tokens only
            results.append(SeqResult(seq.request_id, (500,) * (k + 1 if seq.sample else 0), k))
        return RunnerResult(tuple(results), elapsed_ms=10.0, draft_timings=tuple(timings), seed_timings=tuple(seeds))


def test_a_round_of_grammar_forced_tokens_alone_is_not_the_drafters_first_round():
    """Forced tokens cost no drafting: counted as a first round they would price the
    drafter's seed at 0 ms, and leave the round that seeds unpriced."""
    lane = LaneConfig(spec_mode="slice", num_draft_tokens=4)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8), lane, 4096, step_cost=StepCost((10.0,)))
    scheduler.add_request(Request(request_id="a", prompt_token_ids=[1, 2, 3],
                                  sampling=SamplingParams(max_tokens=1000, ignore_eos=True)), 0.0)
    runner = ForcedThenSeeds(seed_at=3, seed_ms=6.0)
    for t in range(8):
        plan = scheduler.schedule(t * 0.01)
        scheduler.update(plan, runner.execute(plan), t * 0.01)
    assert runner.seeded
    assert scheduler.draft_timing.first_rounds == 1 and scheduler.draft_timing.ms_first_round == pytest.approx(6.0)


def test_a_holder_kept_at_k0_still_spends_its_grant_so_the_lane_rotates():
    scheduler, _ = run_batch(accept=False, ticks=60, grant_rounds=4)
    granted = {e.request_id for e in scheduler.lane.events if e.kind == "grant"}
    assert len(granted) == 8  # every request got the lane although drafts stopped paying


class AcceptsFor(VerifyingRunner):
    """Accepts every draft of the requests in ``accepting``, none of the others'."""

    def __init__(self, accepting: set[str]):
        super().__init__(accept=True)
        self.accepting = accepting

    def accepts(self, request_id: str) -> bool:
        return request_id in self.accepting


def test_a_holder_that_drafts_nothing_ends_its_grant_so_a_waiter_whose_drafts_pay_gets_the_lane():
    """Seven requests whose drafts fail and, admitted last, one whose drafts are accepted
    (a copy stream beside chat streams), grants of 8 rounds: each of the seven hands the
    lane on at the first tick it drafts nothing, so the eighth holds it within a few ticks
    each lap, not after 7 x 8 ticks, and keeps it for its whole budget."""
    lane = LaneConfig(spec_mode="slice", num_draft_tokens=4, spec_grant_rounds=8)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8), lane, 4096, step_cost=NEARLY_FLAT)
    for i in range(8):
        scheduler.add_request(Request(request_id=f"r{i}", prompt_token_ids=[1, 2, 3],
                                      sampling=SamplingParams(max_tokens=1000, ignore_eos=True)), 0.0)
    runner, copy_rounds = AcceptsFor({"r7"}), []
    for t in range(80):
        plan = scheduler.schedule(t * 0.01)
        copy_rounds += [(t, seq.num_draft_tokens) for seq in plan.seqs if seq.request_id == "r7" and seq.is_round]
        scheduler.update(plan, runner.execute(plan), t * 0.01)
    assert copy_rounds[0][0] <= 1 + 7 * 2  # each of the seven: a probe, then a tick at K = 0 (not 1 + 7 x 8)
    assert len(copy_rounds) >= 30 and sum(k for _, k in copy_rounds) >= 100  # ~8 ticks of every 15, at K = 4
    grants = [e for e in scheduler.lane.events if e.kind == "grant" and e.request_id == "r7"]
    assert len(grants) >= 4


def test_without_a_step_cost_every_holder_drafts_its_full_budget():
    lane = LaneConfig(spec_mode="slice", num_draft_tokens=4)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8), lane, 4096)
    scheduler.add_request(Request(request_id="a", prompt_token_ids=[1, 2], sampling=SamplingParams(max_tokens=50)), 0.0)
    runner = VerifyingRunner(accept=False)
    plans = []
    for t in range(6):
        plan = scheduler.schedule(t * 0.01)
        plans.append(plan)
        scheduler.update(plan, runner.execute(plan), t * 0.01)
    assert all(drafts(p) == 4 for p in plans[1:])


def lone_depth_run(ticks_alone: int, ticks_after: int, **lane_options) -> list[SchedulerPlan]:
    """Request "a" alone for ``ticks_alone`` ticks, then "b" (a 40-token prompt, prefilled in
    one tick) beside it; every draft accepted, on a step cost so flat that depth is limited
    only by the caps."""
    lane = LaneConfig(spec_mode="slice", spec_grant_rounds=0, **lane_options)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8), lane, 4096, step_cost=NEARLY_FLAT)
    runner, plans = VerifyingRunner(accept=True), []
    sampling = SamplingParams(max_tokens=1000, ignore_eos=True)
    scheduler.add_request(Request(request_id="a", prompt_token_ids=[1, 2, 3], sampling=sampling), 0.0)
    for t in range(ticks_alone + ticks_after):
        if t == ticks_alone:
            scheduler.add_request(Request(request_id="b", prompt_token_ids=list(range(4, 44)), sampling=sampling), t * 0.01)
        plan = scheduler.schedule(t * 0.01)
        plans.append(plan)
        scheduler.update(plan, runner.execute(plan), t * 0.01)
    return plans


def a_drafts(plan: SchedulerPlan) -> int:
    return sum(seq.num_draft_tokens for seq in plan.seqs if seq.request_id == "a")


def test_the_engines_one_request_drafts_up_to_lone_draft_tokens_and_beside_another_up_to_num_draft_tokens():
    plans = lone_depth_run(6, 6, num_draft_tokens=4, lone_draft_tokens=8)
    # Alone, as deep as a lone round may go (a new holder alone drafts what the prior pays for).
    assert [a_drafts(p) for p in plans[1:6]] == [8] * 5
    # Tick 6 prefills b beside a's round (b's first token waits for the tick): K, not 8.
    assert {seq.request_id for seq in plans[6].seqs} == {"a", "b"}
    assert a_drafts(plans[6]) == 4
    assert [a_drafts(p) for p in plans[7:12]] == [4] * 5  # b decodes beside a
    # Two lane slots: both holders share the tick, both at K.
    two = lone_depth_run(0, 8, num_draft_tokens=4, lone_draft_tokens=8, spec_slots=2)
    assert max(drafts(p) for p in two) == 8 and all(seq.num_draft_tokens <= 4 for p in two for seq in p.seqs)


def test_the_lone_depth_is_for_adaptive_k_in_slice_mode_only():
    assert LaneConfig(num_draft_tokens=4, lone_draft_tokens=8).max_draft_tokens == 8
    assert LaneConfig(num_draft_tokens=4, lone_draft_tokens=8, spec_adaptive_k=False).max_draft_tokens == 4
    assert LaneConfig(num_draft_tokens=4, lone_draft_tokens=8, spec_mode="burst").max_draft_tokens == 4
    assert LaneConfig(num_draft_tokens=10, lone_draft_tokens=8).max_draft_tokens == 10  # never fewer than K
    assert [a_drafts(p) for p in lone_depth_run(4, 0, num_draft_tokens=4, lone_draft_tokens=8, spec_adaptive_k=False)[1:]] \
        == [4] * 3  # fixed K: K every round, alone too
    with pytest.raises(ValueError, match="lone_draft_tokens"):
        LaneConfig(lone_draft_tokens=17)


def test_a_cheap_started_request_is_priced_at_the_seed_until_a_round_that_may_seed_has_run():
    """Its first round could not seed (timed as a cheap first round); its first round that
    could is timed only if it seeded, and either way ends the seed's price: a round in which
    auto left the head out (no seed) says nothing of a seed's cost."""
    scheduler = Scheduler(SchedulerConfig(), LaneConfig(spec_mode="slice"), 4096, step_cost=ROWWISE, cheap_starts=True)
    request = Request(request_id="a", prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=100))

    def round_of(may_seed: bool, seeded_ms: float | None) -> None:
        plan = SchedulerPlan((ScheduledSeq(request, (0,), 3, (4,), True, num_draft_tokens=2, may_seed=may_seed),))
        seeds = (("a", seeded_ms, seeded_ms),) if seeded_ms is not None else ()
        proposed = (("a", 0.05, 2, None),) if seeded_ms is None else ()  # drafted the cheap way
        scheduler._time_first_rounds(plan, RunnerResult((SeqResult("a", (4, 5), 2),), draft_timings=proposed,
                                                        seed_timings=seeds))

    round_of(may_seed=False, seeded_ms=0.1)
    timing = scheduler.draft_timing
    assert (timing.cheap_first_rounds, timing.first_rounds) == (1, 0) and "a" not in scheduler._seed_offered
    round_of(may_seed=True, seeded_ms=None)  # auto took the suffix drafter's draft: no head seed
    assert timing.first_rounds == 0 and "a" in scheduler._seed_offered


def test_alone_a_cheap_started_request_is_priced_at_its_own_rounds_not_a_seed():
    est = AcceptanceEstimate()
    for _ in range(5):
        est.observe("copy", 8, 8)
    flat = StepCost((10.0,) * 9)
    costs = dict(draft_ms_per_token=0.3, draft_ms_per_round=0.7, draft_ms_first_round=2.0,
                 own_draft_ms={"copy": (0.0, 0.05)}, first_rounds=set())
    assert choose([("copy", 8)], 1, 1, flat, est, **costs, unseeded={"copy"}) == choose([("copy", 8)], 1, 1, flat, est, **costs)
