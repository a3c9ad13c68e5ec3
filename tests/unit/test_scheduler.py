"""The scheduler as short stories of ticks, with a fake runner and a fake clock (no torch).

Each tick is what the engine does: ``plan = schedule(now)``, the fake runner "computes"
the plan (every fed token lands in the cache; a sampling row gets a scripted token),
``update(result, now)``. The stories cover admission (``max_num_seqs``), the chunked
prefill budget (``max_num_batched_tokens``) with running streams decoding every tick,
the queue limit, aborts mid-prefill and mid-decode, and every finish reason. A random
test runs 1,000 add/abort/tick events and checks that nothing is left behind.
"""

from __future__ import annotations

import gc
import random
import weakref

import pytest

from speclane.config import LaneConfig, SchedulerConfig
from speclane.request import FINISH_REASONS, Request, RequestStatus, SamplingParams, finish_reason
from speclane.scheduler.plan import RunnerResult, ScheduledSeq, SchedulerPlan, SeqResult
from speclane.scheduler.scheduler import QueueFullError, Scheduler, TokenEvent

EOS = 2


def make_scheduler(
    *,
    max_num_seqs: int = 4,
    max_queue: int = 16,
    max_num_batched_tokens: int = 64,
    chunked: bool = True,
    max_model_len: int = 256,
    lane: LaneConfig | None = None,
    num_kv_blocks: int | None = None,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_queue=max_queue,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=chunked,
    )
    return Scheduler(config, lane or LaneConfig(spec_mode="off"), max_model_len, num_kv_blocks=num_kv_blocks)


def make_request(rid: str, num_prompt_tokens: int, max_tokens: int = 16, **sampling: object) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=[100 + i for i in range(num_prompt_tokens)],
        sampling=SamplingParams(max_tokens=max_tokens, **sampling),  # type: ignore[arg-type]
        eos_token_ids=frozenset({EOS}),
    )


class FakeRunner:
    """Computes a plan without a model: fed tokens land in the cache, sampling rows get
    the request's scripted token for that output index (default ``1000 + index``)."""

    def __init__(self, script: dict[str, list[int]] | None = None):
        self.script = script or {}

    def token(self, seq: ScheduledSeq, output_index: int) -> int:
        tokens = self.script.get(seq.request_id, [])
        return tokens[output_index] if output_index < len(tokens) else 1000 + output_index

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        results = []
        for seq in plan.seqs:
            computed = seq.start + len(seq.token_ids)
            token_ids = (self.token(seq, computed - seq.request.num_prompt_tokens),) if seq.sample else ()
            results.append(SeqResult(seq.request_id, token_ids))
        return RunnerResult(tuple(results))


class Story:
    """A scheduler, a fake runner and a fake clock that advances 10 ms per tick."""

    def __init__(self, scheduler: Scheduler, runner: FakeRunner | None = None):
        self.scheduler = scheduler
        self.runner = runner or FakeRunner()
        self.now = 0.0

    def add(self, request: Request) -> Request:
        self.scheduler.add_request(request, self.now)
        return request

    def tick(self) -> tuple[SchedulerPlan, dict[str, TokenEvent]]:
        plan = self.scheduler.schedule(self.now)
        events = self.scheduler.update(plan, self.runner.execute(plan), self.now)
        self.now += 0.010
        return plan, {e.request.request_id: e for e in events}


def rows(plan: SchedulerPlan) -> dict[str, ScheduledSeq]:
    return {seq.request_id: seq for seq in plan.seqs}


def chunk_sizes(plan: SchedulerPlan) -> dict[str, int]:
    return {seq.request_id: len(seq.token_ids) for seq in plan.seqs}


# -- admission -----------------------------------------------------------------------------
def test_admission_stops_at_max_num_seqs_and_a_freed_slot_admits_the_next():
    story = Story(make_scheduler(max_num_seqs=2))
    a = story.add(make_request("a", 4, max_tokens=2))
    b = story.add(make_request("b", 4))
    c = story.add(make_request("c", 4))

    plan, events = story.tick()  # a and b take both slots; c waits without a slot
    first = plan
    assert set(rows(plan)) == {"a", "b"}
    assert story.scheduler.num_running == 2 and story.scheduler.num_waiting == 1
    assert c.status == RequestStatus.WAITING and "c" not in story.scheduler.kv
    assert events["a"].new_token_ids == [1000] and events["b"].new_token_ids == [1000]

    plan, events = story.tick()  # both decode; a reaches max_tokens=2 and frees slot 0
    assert set(rows(plan)) == {"a", "b"}
    assert events["a"].finished and a.status == RequestStatus.FINISHED_LENGTH
    assert story.scheduler.kv.num_holders == 1

    plan, events = story.tick()  # c takes a's slot, b keeps decoding
    assert set(rows(plan)) == {"b", "c"}
    assert rows(plan)["c"].block_table == rows(first)["a"].block_table and rows(plan)["c"].start == 0
    assert b.num_output_tokens == 3 and c.num_output_tokens == 1


def test_admission_order_is_priority_then_arrival():
    story = Story(make_scheduler(max_num_seqs=1))
    story.add(make_request("first", 3, max_tokens=1))
    story.now = 1.0
    urgent = make_request("urgent", 3, max_tokens=1)
    urgent.priority = -1
    story.add(urgent)
    story.add(make_request("later", 3, max_tokens=1))
    admitted = []
    while story.scheduler.has_unfinished():
        plan, _ = story.tick()
        admitted += [seq.request_id for seq in plan.seqs]
    assert admitted == ["urgent", "first", "later"]


# -- chunked prefill -----------------------------------------------------------------------
def test_long_prompt_is_prefilled_in_chunks_while_running_streams_decode_every_tick():
    budget = 16
    story = Story(make_scheduler(max_num_batched_tokens=budget))
    d1 = story.add(make_request("d1", 4, max_tokens=100))
    d2 = story.add(make_request("d2", 4, max_tokens=100))
    plan, _ = story.tick()
    assert chunk_sizes(plan) == {"d1": 4, "d2": 4}

    long = story.add(make_request("long", 40))
    chunks = []
    for tick in range(3):
        plan, events = story.tick()
        sizes = chunk_sizes(plan)
        # The decoders are never starved: one token each, every tick.
        assert sizes["d1"] == 1 and sizes["d2"] == 1
        assert events["d1"].new_token_ids and events["d2"].new_token_ids
        assert plan.num_tokens <= budget
        chunks.append(sizes["long"])
        last = tick == 2
        assert rows(plan)["long"].sample == last  # no token until the prompt is complete
        assert ("long" in events) == last
    assert chunks == [14, 14, 12]
    assert long.num_computed_tokens == 40 and long.num_output_tokens == 1
    assert d1.num_output_tokens == d2.num_output_tokens == 4

    plan, _ = story.tick()  # now all three decode
    assert chunk_sizes(plan) == {"d1": 1, "d2": 1, "long": 1}
    assert rows(plan)["long"].start == 40 and rows(plan)["long"].token_ids == (1000,)


def test_two_new_prompts_share_one_tick_budget():
    story = Story(make_scheduler(max_num_batched_tokens=16))
    story.add(make_request("a", 10))
    story.add(make_request("b", 10))
    plan, events = story.tick()
    assert chunk_sizes(plan) == {"a": 10, "b": 6}
    assert set(events) == {"a"}
    plan, events = story.tick()
    assert chunk_sizes(plan) == {"a": 1, "b": 4}
    assert rows(plan)["b"].start == 6 and set(events) == {"a", "b"}


def test_without_chunking_a_prompt_over_the_budget_runs_whole_once_alone():
    story = Story(make_scheduler(max_num_batched_tokens=16, chunked=False))
    story.add(make_request("d", 4, max_tokens=2))
    story.tick()
    story.add(make_request("long", 40, max_tokens=1))
    plan, _ = story.tick()  # does not fit beside the decoder: it waits
    assert set(rows(plan)) == {"d"} and story.scheduler.num_waiting == 1
    plan, events = story.tick()  # d has finished; the whole prompt runs in one tick
    assert chunk_sizes(plan) == {"long": 40} and events["long"].finished


# -- the queue -----------------------------------------------------------------------------
def test_queue_full_is_a_clear_rejection_and_admission_makes_room():
    story = Story(make_scheduler(max_num_seqs=1, max_queue=2))
    story.add(make_request("a", 3))
    story.add(make_request("b", 3))
    with pytest.raises(QueueFullError, match="queue is full.*2 requests waiting.*retry"):
        story.add(make_request("c", 3))
    assert story.scheduler.get("c") is None
    story.tick()  # a is admitted: one place frees up in the queue
    story.add(make_request("c", 3))
    with pytest.raises(QueueFullError):
        story.add(make_request("d", 3))


def test_prompt_limits_and_request_ids():
    story = Story(make_scheduler(max_model_len=32))
    with pytest.raises(ValueError, match="32 tokens but --max-model-len is 32"):
        story.add(make_request("too-long", 32))
    story.add(make_request("fits", 31))  # one token left for the completion
    with pytest.raises(ValueError, match="already in use"):
        story.add(make_request("fits", 3))
    with pytest.raises(ValueError, match="prompt is empty"):
        make_request("empty", 0)


@pytest.mark.parametrize("spec_mode", ["off", "slice"])
def test_a_request_the_whole_kv_pool_cannot_hold_is_refused_and_one_that_just_fits_finishes(spec_mode: str):
    """A pool of 4 blocks of 16 positions: positions [0, 64) at most. The last token is never
    fed and drafts stop short of max_tokens and the context, so prompt + max_tokens = 65
    fits and runs to the end; 66 would wait forever and is refused at once."""
    lane = LaneConfig(spec_mode=spec_mode, num_draft_tokens=4)
    story = Story(make_scheduler(max_model_len=256, num_kv_blocks=4, lane=lane))
    with pytest.raises(ValueError, match="40 tokens and max_tokens is 26.*5 KV blocks of 16 positions.*pool holds 4"):
        story.add(make_request("too-big", 40, max_tokens=26))
    assert story.scheduler.get("too-big") is None
    fits = story.add(make_request("fits", 40, max_tokens=25))
    capped = Story(make_scheduler(max_model_len=65, num_kv_blocks=4, lane=lane))
    by_context = capped.add(make_request("by-context", 40, max_tokens=1000))  # max_model_len caps it at 65 tokens
    for s in (story, capped):
        for _ in range(200):
            if not s.scheduler.has_unfinished():
                break
            s.tick()
    assert fits.num_output_tokens == 25 and fits.status == RequestStatus.FINISHED_LENGTH
    assert by_context.num_output_tokens == 25 and by_context.status == RequestStatus.FINISHED_LENGTH


# -- aborts --------------------------------------------------------------------------------
def test_abort_mid_prefill_frees_the_slot_for_the_next_tick():
    story = Story(make_scheduler(max_num_seqs=1, max_num_batched_tokens=16))
    victim = story.add(make_request("victim", 40))
    nxt = story.add(make_request("next", 5))
    story.tick()
    assert 0 < victim.num_computed_tokens < victim.num_prompt_tokens  # mid-prefill

    assert story.scheduler.abort_request("victim", story.now) is victim
    assert victim.status == RequestStatus.FINISHED_ABORTED
    assert finish_reason(victim.status) == "abort"
    assert story.scheduler.kv.num_holders == 0 and story.scheduler.num_running == 0

    plan, events = story.tick()
    assert plan.released_request_ids == ("victim",)  # the runner drops its drafter state
    assert set(rows(plan)) == {"next"} and "next" in story.scheduler.kv
    # "next" shares its first 4 prompt tokens with the victim's first block, which the
    # aborted prefill had computed and cached: they are copied, the 5th is computed.
    assert rows(plan)["next"].start == 4 and len(plan.kv_copies) == 1 and plan.kv_copies[0][2] == 4
    assert "victim" not in events and victim.num_output_tokens == 0
    assert nxt.num_output_tokens == 1


def test_abort_mid_decode_keeps_what_was_streamed_and_frees_the_slot():
    story = Story(make_scheduler())
    a = story.add(make_request("a", 3, max_tokens=10))
    b = story.add(make_request("b", 3, max_tokens=10))
    for _ in range(3):
        story.tick()
    assert story.scheduler.abort_request("a", story.now) is a
    assert a.output_token_ids == [1000, 1001, 1002]
    assert story.scheduler.kv.num_holders == 1 and "a" not in story.scheduler.kv
    plan, _ = story.tick()
    assert set(rows(plan)) == {"b"}
    assert story.scheduler.abort_request("a", story.now) is None  # a second abort is a no-op
    assert b.num_output_tokens == 4


def test_abort_while_the_tick_runs_drops_its_result():
    story = Story(make_scheduler())
    a = story.add(make_request("a", 3))
    story.tick()
    plan = story.scheduler.schedule(story.now)
    story.scheduler.abort_request("a", story.now)  # e.g. the client went away mid-forward
    events = story.scheduler.update(plan, story.runner.execute(plan), story.now)
    assert events == [] and a.output_token_ids == [1000]
    assert story.scheduler.kv.num_holders == 0


def test_abort_while_waiting_never_takes_a_slot():
    story = Story(make_scheduler(max_num_seqs=1))
    story.add(make_request("a", 3))
    b = story.add(make_request("b", 3))
    assert story.scheduler.abort_request("b", story.now) is b
    assert b.status == RequestStatus.FINISHED_ABORTED and story.scheduler.get("b") is None
    assert story.scheduler.abort_request("nobody", story.now) is None
    plan, _ = story.tick()
    assert set(rows(plan)) == {"a"}


def test_a_preempted_request_aborted_while_waiting_is_released_like_a_finished_one():
    """Preempted, it waits with its output kept, and the runner keeps its sampling stream and
    grammar state to resume it; aborted there, those must go too (the next plan says so)."""
    story = Story(make_scheduler())
    a = story.add(make_request("a", 3))
    story.tick(), story.tick()
    story.scheduler.kv.free("a")  # what a shortage in KVManager.reserve does, then the scheduler
    story.scheduler._preempt("a", story.now)
    assert a.status == RequestStatus.WAITING and a.output_token_ids
    assert story.scheduler.abort_request("a", story.now) is a
    plan, _ = story.tick()
    assert "a" in plan.released_request_ids and a.status == RequestStatus.FINISHED_ABORTED
    assert not plan.seqs


def test_a_preempted_request_catches_up_on_its_output_in_chunks_within_the_budget_then_decodes():
    """Recomputed after preemption, a request feeds its prompt and its output (299 tokens)
    in chunks of the tick's budget (64), samples only after the last, and decodes from then
    on; its output continues as if it had never left."""
    story = Story(make_scheduler(max_num_batched_tokens=64, max_model_len=1024, num_kv_blocks=64))
    a = story.add(make_request("a", 100, max_tokens=400))
    while a.num_output_tokens < 299:
        story.tick()
    story.scheduler.kv.free("a")
    story.scheduler.kv.clear_cache()  # its blocks' cached copies went too: it computes everything again
    story.scheduler._preempt("a", story.now)
    fed, sampled = [], []
    while a.num_output_tokens < 302:
        plan, _ = story.tick()
        fed.append(sum(len(seq.token_ids) for seq in plan.seqs))
        sampled.append(any(seq.sample for seq in plan.seqs))
    assert max(fed) <= 64 and sum(fed) == 399 + 2  # 100 + 299 tokens again, then two decode rows
    assert sampled == [False] * (len(fed) - 3) + [True] * 3
    assert a.output_token_ids == [1000 + i for i in range(302)]


# -- finishing -----------------------------------------------------------------------------
def run_to_end(story: Story, request: Request, max_ticks: int = 500) -> Request:
    story.add(request)
    for _ in range(max_ticks):
        if request.is_finished:
            return request
        story.tick()
    raise AssertionError(f"{request.request_id} did not finish")


def test_finish_reasons():
    story = Story(make_scheduler(max_model_len=20), FakeRunner({"eos": [5, EOS, 6], "ignore": [EOS] * 4, "stop-id": [5, 6, 7]}))
    eos = run_to_end(story, make_request("eos", 3))
    assert eos.output_token_ids == [5, EOS] and eos.status == RequestStatus.FINISHED_STOPPED

    ignored = run_to_end(story, make_request("ignore", 3, max_tokens=4, ignore_eos=True))
    assert ignored.output_token_ids == [EOS] * 4 and ignored.status == RequestStatus.FINISHED_LENGTH

    stop_id = run_to_end(story, make_request("stop-id", 3, stop_token_ids=(6,)))
    assert stop_id.output_token_ids == [5, 6] and stop_id.status == RequestStatus.FINISHED_STOPPED

    length = run_to_end(story, make_request("length", 3, max_tokens=3))
    assert length.num_output_tokens == 3 and length.status == RequestStatus.FINISHED_LENGTH

    context = run_to_end(story, make_request("context", 17, max_tokens=100))
    assert context.num_tokens == 20 and context.num_output_tokens == 3
    assert context.status == RequestStatus.FINISHED_LENGTH

    assert [finish_reason(r.status) for r in (eos, ignored, stop_id, length, context)] == [
        "stop", "length", "stop", "length", "length"]
    assert story.scheduler.kv.num_holders == 0 and not story.scheduler.has_unfinished()


def test_several_tokens_in_one_tick_stop_exactly_at_the_stop_point():
    """A verified speculative round returns several tokens: nothing past EOS or
    max_tokens is appended."""
    story = Story(make_scheduler())
    a = story.add(make_request("a", 3))
    b = story.add(make_request("b", 3, max_tokens=3))
    story.tick()
    plan = story.scheduler.schedule(story.now)
    result = RunnerResult((
        SeqResult("a", token_ids=(5, EOS, 6, 7)),
        SeqResult("b", token_ids=(5, 6, 7, 8)),
    ))
    events = {e.request.request_id: e for e in story.scheduler.update(plan, result, story.now)}
    assert events["a"].new_token_ids == [5, EOS] and a.status == RequestStatus.FINISHED_STOPPED
    assert events["b"].new_token_ids == [5, 6] and b.num_output_tokens == 3
    assert b.status == RequestStatus.FINISHED_LENGTH and story.scheduler.kv.num_holders == 0


def test_stop_string_finish_from_the_engine_trims_the_output():
    story = Story(make_scheduler())
    a = story.add(make_request("a", 3))
    for _ in range(4):
        story.tick()
    story.scheduler.stop_at(a, 2, story.now)
    assert a.output_token_ids == [1000, 1001] and a.status == RequestStatus.FINISHED_STOPPED
    assert story.scheduler.kv.num_holders == 0 and story.scheduler.take_released() == ("a",)


def test_stop_string_in_the_tick_that_ended_a_request_for_length():
    """A stop string in a request's last tick turns its finish reason into "stop" and trims
    the output: the same call whether or not the scheduler already finished it."""
    story = Story(make_scheduler())
    a = story.add(make_request("a", 3, max_tokens=3))
    while not a.is_finished:
        story.tick()
    assert a.status == RequestStatus.FINISHED_LENGTH
    story.scheduler.stop_at(a, 1, story.now)
    assert a.output_token_ids == [1000] and a.status == RequestStatus.FINISHED_STOPPED
    assert story.scheduler.kv.num_holders == 0 and not story.scheduler.has_unfinished()


def test_update_rejects_a_result_that_does_not_answer_the_plan():
    story = Story(make_scheduler())
    story.add(make_request("a", 3))
    plan = story.scheduler.schedule(story.now)
    with pytest.raises(ValueError, match="answered 0 sequences of a plan of 1"):
        story.scheduler.update(plan, RunnerResult(()), story.now)
    with pytest.raises(ValueError, match="answered 'b' for 'a'"):
        story.scheduler.update(plan, RunnerResult((SeqResult("b"),)), story.now)


class AcceptingRunner(FakeRunner):
    """Every draft is accepted: a round of k drafts emits k + 1 tokens."""

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        results = []
        for seq in plan.seqs:
            n = seq.num_draft_tokens + 1 if seq.sample else 0
            results.append(SeqResult(seq.request_id, (7,) * n, seq.num_draft_tokens))
        return RunnerResult(tuple(results), elapsed_ms=5.0)


def test_a_stop_string_inside_a_round_counts_only_the_drafts_it_kept():
    """A round appends 4 accepted drafts and its own token; the engine finds a stop string
    after the second of them: the round counts 2 drafts, 2 accepted (as a round that ends
    at EOS there would), and the usage never reports drafts past the answer's end."""
    lane = LaneConfig(spec_mode="slice", num_draft_tokens=4, spec_adaptive_k=False)
    story = Story(make_scheduler(lane=lane), AcceptingRunner())
    a = story.add(make_request("a", 3, max_tokens=40))
    story.tick()  # the prompt, and the first token
    _, events = story.tick()  # a round: 4 drafts, all accepted, and a fifth token
    assert len(events["a"].new_token_ids) == 5 and (a.spec.draft_tokens, a.spec.accepted_tokens) == (4, 4)
    story.scheduler.stop_at(a, 1 + 2, story.now)
    assert a.num_output_tokens == 3 and (a.spec.rounds, a.spec.draft_tokens, a.spec.accepted_tokens) == (1, 2, 2)
    assert a.status == RequestStatus.FINISHED_STOPPED
    counts = story.scheduler.counts  # /metrics' totals agree with the usage
    assert (counts.slice_rounds, counts.draft_tokens, counts.accepted_tokens) == (1, 2, 2)
    assert counts.acceptance_by_position() == [1.0, 1.0]

    b = story.add(make_request("b", 3, max_tokens=40))
    story.tick()
    story.tick()
    story.tick()  # a second round of 5 tokens
    story.scheduler.stop_at(b, 1 + 5 + 4, story.now)  # at the last round's fourth draft: its own token goes
    assert (b.spec.rounds, b.spec.draft_tokens, b.spec.accepted_tokens) == (2, 8, 8)


def test_speculation_is_counted_once_by_the_scheduler_and_clipped_at_the_stop_point():
    lane = LaneConfig(spec_mode="slice", num_draft_tokens=4, spec_adaptive_k=False)
    story = Story(make_scheduler(lane=lane), AcceptingRunner())
    a = run_to_end(story, make_request("a", 3, max_tokens=12))
    counts = story.scheduler.counts
    # Prefill emits 1 token; then rounds of 4 drafts emit 5: 1 + 5 + 5 = 11, and the last
    # round's budget is max_tokens - 11 - 1 = 0 drafts, a plain decode step.
    assert a.num_output_tokens == 12
    assert (a.spec.rounds, a.spec.draft_tokens, a.spec.accepted_tokens) == (2, 8, 8)
    assert (counts.slice_rounds, counts.draft_tokens, counts.accepted_tokens) == (2, 8, 8)
    assert counts.rounds_by_tenant == {"anonymous": 2} and counts.prefill_tokens == 3
    assert counts.acceptance_by_position() == [1.0] * 4

    eos = run_to_end(Story(make_scheduler(lane=lane), FakeRunner()), make_request("b", 3, max_tokens=2))
    assert eos.spec.rounds == 0  # too short to leave room for a draft


def test_burst_holder_runs_alone_one_round_per_tick_until_it_finishes():
    lane = LaneConfig(spec_mode="burst", num_draft_tokens=2, spec_grant_rounds=1)
    story = Story(make_scheduler(lane=lane), AcceptingRunner())
    a = story.add(make_request("a", 3, max_tokens=10))
    b = story.add(make_request("b", 3, max_tokens=10))
    plan, _ = story.tick()  # both prefill (nobody is in the lane yet)
    assert set(rows(plan)) == {"a", "b"}
    alone = []
    while not a.is_finished:
        plan, _ = story.tick()
        alone.append(tuple(rows(plan)))
    # a holds the burst from its grant to its end, whatever its grant budget, and b waits.
    assert set(alone) == {("a",)} and len(alone) == 3 and b.num_output_tokens == 1
    plan, _ = story.tick()
    assert tuple(rows(plan)) == ("b",) and rows(plan)["b"].num_draft_tokens == 2
    counts = story.scheduler.counts
    assert counts.burst_rounds == 4 and counts.slice_rounds == 0


def test_status_order_and_the_one_finish_reason_map():
    live = [RequestStatus.WAITING, RequestStatus.RUNNING]
    finished = [s for s in RequestStatus if s not in live]
    assert all(not s.is_finished for s in live) and all(s.is_finished for s in finished)
    assert max(live) < min(finished)
    assert set(FINISH_REASONS) == set(finished)
    assert FINISH_REASONS == {
        RequestStatus.FINISHED_STOPPED: "stop",
        RequestStatus.FINISHED_LENGTH: "length",
        RequestStatus.FINISHED_ABORTED: "abort",
        RequestStatus.FINISHED_ERROR: "error",
    }
    assert finish_reason(RequestStatus.RUNNING) is None


# -- 1,000 random events -------------------------------------------------------------------
class RandomRunner(FakeRunner):
    """Random tokens (sometimes EOS); a lane round accepts a random number of drafts."""

    def __init__(self, rng: random.Random):
        super().__init__()
        self.rng = rng

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        results = []
        for seq in plan.seqs:
            if seq.sample:
                accepted = self.rng.randint(0, seq.num_draft_tokens)
                token_ids = tuple(self.rng.choice([EOS, 7, 8, 9, 10]) for _ in range(accepted + 1))
                results.append(SeqResult(seq.request_id, token_ids, seq.num_draft_tokens))
            else:
                results.append(SeqResult(seq.request_id))
        return RunnerResult(tuple(results), elapsed_ms=5.0)


def check_invariants(scheduler: Scheduler, plan: SchedulerPlan) -> None:
    cfg = scheduler.config
    running = scheduler.running
    assert len(running) <= cfg.max_num_seqs and len(scheduler.waiting) <= cfg.max_queue
    scheduler.kv.check()
    assert scheduler.kv.num_holders == len(running) and all(rid in scheduler.kv for rid in running)
    seqs = rows(plan)
    assert len(seqs) == len(plan.seqs), "a request appears twice in one plan"
    blocks = [b for s in plan.seqs for b in s.block_table]
    assert len(set(blocks)) == len(blocks), "two sequences share a KV block"
    for seq in plan.seqs:
        assert running[seq.request_id] is seq.request
        assert seq.start == seq.request.num_computed_tokens
    for rid, request in running.items():
        assert request.status == RequestStatus.RUNNING
        if request.caught_up:
            assert rid in seqs, "a running stream skipped a tick"
    assert plan.num_tokens <= cfg.max_num_batched_tokens


@pytest.mark.parametrize("spec_mode", ["off", "slice"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_1000_random_events_leave_nothing_behind(seed: int, spec_mode: str):
    rng = random.Random(seed)
    lane = LaneConfig(spec_mode=spec_mode, num_draft_tokens=3, spec_grant_rounds=2)
    scheduler = make_scheduler(max_num_seqs=4, max_queue=6, max_num_batched_tokens=32, max_model_len=64, lane=lane)
    runner = RandomRunner(rng)
    refs: list[weakref.ref[Request]] = []
    known_ids: list[str] = []
    now = 0.0
    counts = {"add": 0, "rejected": 0, "abort": 0, "tick": 0, "finished": 0}
    for event in range(1000):
        kind = rng.choices(["add", "abort", "tick"], weights=[3, 1, 4])[0]
        if kind == "add":
            rid = f"r{event}"
            request = Request(rid, [rng.randrange(50, 60) for _ in range(rng.randint(1, 70))],
                              SamplingParams(max_tokens=rng.randint(1, 12), ignore_eos=rng.random() < 0.2),
                              arrival_s=now, priority=rng.choice([0, 0, 1]), eos_token_ids=frozenset({EOS}))
            refs.append(weakref.ref(request))
            try:
                scheduler.add_request(request, now)
                known_ids.append(rid)
                counts["add"] += 1
            except (QueueFullError, ValueError):
                counts["rejected"] += 1
            del request
        elif kind == "abort" and known_ids:
            scheduler.abort_request(rng.choice(known_ids + ["unknown"]), now)
            counts["abort"] += 1
        else:
            plan = scheduler.schedule(now)
            check_invariants(scheduler, plan)
            events = scheduler.update(plan, runner.execute(plan), now)
            counts["finished"] += sum(e.finished for e in events)
            counts["tick"] += 1
            del plan, events
        now += rng.choice([0.0, 0.001, 0.02])
    assert min(counts.values()) > 0, counts

    for rid in known_ids:  # the server shuts down: abort whatever is left
        scheduler.abort_request(rid, now)
    plan = scheduler.schedule(now)
    assert plan.is_empty
    del plan
    assert scheduler.kv.num_holders == 0
    assert not scheduler.has_unfinished()
    assert not scheduler._in_lane and not scheduler.lane.holders and not scheduler.lane.waiters
    gc.collect()
    alive = [ref() for ref in refs if ref() is not None]
    assert not alive, f"{len(alive)} request objects are still referenced, e.g. {alive[0].request_id}"


def test_a_burst_is_one_round_of_its_grant_charged_to_its_tenant_even_when_it_ends_at_k0():
    lane = LaneConfig(spec_mode="burst", num_draft_tokens=2, spec_grant_rounds=1)
    story = Story(make_scheduler(lane=lane), AcceptingRunner())
    calls = []
    lane_round_done, lane_remove = story.scheduler.lane.round_done, story.scheduler.lane.remove
    story.scheduler.lane.round_done = lambda rid, **kw: (calls.append(("round_done", rid)), lane_round_done(rid, **kw))
    story.scheduler.lane.remove = lambda rid, now: (calls.append(("remove", rid)), lane_remove(rid, now))
    a = run_to_end(story, make_request("a", 3, max_tokens=8))
    # Prefill gives 1 token, two rounds of 2 drafts give 3 each, the last tick drafts 0.
    assert a.num_output_tokens == 8 and a.spec.rounds == 3
    assert story.scheduler.counts.burst_rounds == 3 and a.spec.grants == 1
    assert calls == [("round_done", "a"), ("remove", "a")]  # one round of its grant, then it leaves


def shared(rid: str, source: str, num_prompt_tokens: int) -> Request:
    request = make_request(rid, num_prompt_tokens)
    request.prefill_source = source
    return request


def test_sequences_sharing_a_prompt_wait_for_its_prefill_then_read_its_blocks_from_the_cache():
    story = Story(make_scheduler(max_num_batched_tokens=40))
    story.add(make_request("a", 100))
    story.add(shared("a#1", "a", 100))
    story.add(shared("a#2", "a", 100))
    prefilled = 0
    while "a" not in story.scheduler.running or not story.scheduler.running["a"].prefill_done:
        plan, _ = story.tick()
        assert set(rows(plan)) == {"a"}, "the siblings must not prefill while their source does"
        prefilled += len(rows(plan)["a"].token_ids)
    assert prefilled == 100
    plan, events = story.tick()
    shared_blocks = rows(plan)["a"].block_table[:6]  # the prompt's full blocks: 96 positions
    for rid in ("a#1", "a#2"):  # only the positions past the full blocks are computed
        seq = rows(plan)[rid]
        assert seq.block_table[:6] == shared_blocks and seq.request.num_cached_tokens == 96
        assert (seq.start, len(seq.token_ids), seq.sample) == (96, 4, True)
        assert events[rid].new_token_ids == [1000]
    assert story.scheduler.counts.prefill_tokens == 100 + 2 * 4


def test_a_sibling_whose_source_left_prefills_on_its_own():
    story = Story(make_scheduler(max_num_seqs=1))
    story.add(make_request("a", 8, max_tokens=1))
    story.add(shared("a#1", "a", 8))
    plan, events = story.tick()  # a prefills and finishes at once (max_tokens=1)
    assert set(rows(plan)) == {"a"} and events["a"].finished
    plan, _ = story.tick()
    assert rows(plan)["a#1"].start == 0 and len(rows(plan)["a#1"].token_ids) == 8


def test_a_waiting_sibling_does_not_block_requests_behind_it():
    story = Story(make_scheduler(max_num_batched_tokens=16))
    story.add(make_request("a", 40))
    story.add(shared("a#1", "a", 40))
    story.add(make_request("b", 4))
    plan, _ = story.tick()
    assert "a#1" not in rows(plan)
    seen_b = "b" in rows(plan)
    while not seen_b:
        plan, _ = story.tick()
        assert "a#1" not in rows(plan) or story.scheduler.running["a"].prefill_done
        seen_b = "b" in rows(plan)
    assert seen_b


def chat(rid: str, shared: int, own: list[int], tenant: str = "anonymous", **sampling: object) -> Request:
    """A request whose prompt opens with the ``shared`` tokens every such chat starts with
    (a system prompt), then its ``own``."""
    return Request(request_id=rid, prompt_token_ids=[100 + i for i in range(shared)] + own,
                   sampling=SamplingParams(**{"max_tokens": 16, **sampling}),  # type: ignore[arg-type]
                   eos_token_ids=frozenset({EOS}), tenant=tenant)


def test_chats_with_one_prefix_arriving_together_compute_it_once():
    story = Story(make_scheduler(max_num_batched_tokens=256))
    for rid, own in (("a", 1), ("b", 2), ("c", 3)):
        story.add(chat(rid, 40, [own] * 4))
    plan, _ = story.tick()
    assert set(rows(plan)) == {"a"}, "b and c must wait while a computes the blocks they share with it"
    plan, _ = story.tick()
    for rid in ("b", "c"):  # the two full blocks a computed are read (its third is not full yet)
        seq = rows(plan)[rid]
        assert seq.request.num_cached_tokens == 32 and (seq.start, len(seq.token_ids)) == (32, 12)
    assert story.scheduler.counts.prefill_tokens == 44 + 2 * 12


def test_another_tenants_prefix_is_never_waited_for():
    story = Story(make_scheduler(max_num_batched_tokens=256))
    story.add(chat("a", 40, [1] * 4))
    story.add(chat("b", 40, [2] * 4, tenant="other"))
    plan, _ = story.tick()
    assert chunk_sizes(plan) == {"a": 44, "b": 44}


def test_a_request_that_needs_its_prompts_logprobs_computes_the_prefix_itself():
    story = Story(make_scheduler(max_num_batched_tokens=256))
    story.add(chat("a", 40, [1] * 4))
    story.add(chat("b", 40, [2] * 4, prompt_logprobs=0))  # every position's logits: none read from the cache
    plan, _ = story.tick()
    assert chunk_sizes(plan) == {"a": 44, "b": 44}


def test_a_request_waiting_for_a_shared_prefix_keeps_its_place():
    story = Story(make_scheduler(max_num_batched_tokens=64))
    story.add(chat("a", 60, []))
    story.add(chat("b", 60, []))
    story.add(Request(request_id="c", prompt_token_ids=[7] * 20, sampling=SamplingParams(max_tokens=16)))
    plan, _ = story.tick()
    assert chunk_sizes(plan) == {"a": 60}, "c, behind b, must not take the budget, a slot or blocks before it"
    plan, _ = story.tick()
    assert chunk_sizes(plan) == {"a": 1, "b": 12, "c": 20}
    assert rows(plan)["b"].request.num_cached_tokens == 48  # the prompt's full blocks, but the last token's


def test_a_request_waits_for_the_last_chunk_of_the_prefix_it_shares():
    story = Story(make_scheduler(max_num_batched_tokens=24))
    story.add(chat("a", 70, []))
    story.add(chat("b", 70, []))
    a_before_tick = []  # a's computed tokens when each tick's plan was made, until b is in one
    while True:
        a_before_tick.append(story.scheduler.running["a"].num_computed_tokens if "a" in story.scheduler.running else 0)
        plan, _ = story.tick()
        if "b" in rows(plan):
            break
    # a computes 24 tokens a tick. Its last chunk leaves room for b, but b waits one tick
    # more, until a's fourth full block is in the cache too.
    assert a_before_tick == [0, 24, 48, 70] and rows(plan)["b"].request.num_cached_tokens == 64


def test_a_request_that_ends_at_its_first_token_leaves_its_prompt_in_the_cache():
    story = Story(make_scheduler(max_num_batched_tokens=256))
    story.add(chat("a", 48, [], max_tokens=1))  # three full blocks
    plan, events = story.tick()
    assert events["a"].finished
    story.add(chat("b", 48, []))
    plan, _ = story.tick()
    assert rows(plan)["b"].request.num_cached_tokens == 47  # all but its last token, which is computed


def test_a_token_budget_below_the_slots_and_the_lanes_drafts_is_warned_about_at_start_up():
    from speclane.config import EngineConfig

    assert EngineConfig().start_up_warnings() == [], "the defaults: 64 tokens for 16 slots and 4 drafts"
    assert EngineConfig().replace(max_num_seqs=60, spec_mode="off").start_up_warnings() == []
    crowded = EngineConfig().replace(max_num_seqs=62)  # 62 decode rows and a round of 4 drafts: 66 > 64
    [warning] = crowded.start_up_warnings()
    assert "--max-num-batched-tokens 64 is below --max-num-seqs 62 plus the lane's drafts (1 x 4)" in warning
    [warning] = EngineConfig().replace(max_num_seqs=80, spec_mode="off").start_up_warnings()
    assert "below --max-num-seqs 80:" in warning and "drafts" not in warning.split(":")[0]
    assert EngineConfig().replace(max_num_seqs=62, max_num_batched_tokens=66).start_up_warnings() == []
