"""--drafter auto: each round takes the proposal with the most expected accepted tokens,
runs the MTP head only when it is expected to win, and learns each drafter's acceptance."""

import pytest

from speclane.drafters.auto import HEAD_PROBE_ROUNDS, HEAD_SEED_AFTER, AutoDrafter, geometric
from speclane.drafters.base import Draft
from speclane.request import Request, SamplingParams


class Fixed:
    """Proposes ``tokens`` with ``confidence``; counts its calls."""

    needs_hidden_states = False

    def __init__(self, tokens, confidence=()):
        self.tokens, self.confidence, self.calls = list(tokens), tuple(confidence), 0

    def propose(self, request: Request, k: int) -> Draft:
        self.calls += 1
        return Draft(self.tokens[:k], confidence=self.confidence[:k])

    def needs_seed(self, request_id: str) -> bool:
        return False  # as a head: seeded already

    def finish(self, request: Request) -> None:
        pass

    def release(self, request_id: str) -> None:
        pass


class Unseeded(Fixed):
    """A head that needs its seed (a pass over the request's context) before its first draft."""

    def __init__(self, tokens):
        super().__init__(tokens)
        self.seeded_ids: set[str] = set()

    def needs_seed(self, request_id: str) -> bool:
        return request_id not in self.seeded_ids

    def propose(self, request: Request, k: int) -> Draft:
        self.seeded_ids.add(request.request_id)
        return super().propose(request, k)


def _request(rid="r") -> Request:
    return Request(request_id=rid, prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=100))


def test_the_proposal_with_more_expected_accepted_tokens_wins():
    sure = AutoDrafter(Fixed([7, 8, 9], [0.9, 0.9, 0.9]), Fixed([5, 6]), None)  # 2.7 vs 0.5 + 0.25
    assert sure.propose(_request(), 4).token_ids == [7, 8, 9]
    doubtful = AutoDrafter(Fixed([7, 8, 9], [0.2, 0.1, 0.05]), Fixed([5, 6]), None)  # 0.35 vs 0.75
    assert doubtful.propose(_request(), 4).token_ids == [5, 6]


def test_the_head_runs_only_when_it_is_expected_to_beat_the_cheap_proposals():
    head = Fixed([40, 41, 42, 43])
    auto = AutoDrafter(Fixed([7, 8, 9, 10], [0.95] * 4), Fixed([]), head)  # 3.8 > the head's 0.94
    draft = auto.propose(_request(), 4)
    assert draft.token_ids == [7, 8, 9, 10] and head.calls == 0
    assert draft.catch_up_ms is None  # adaptive K times head rounds only
    auto = AutoDrafter(Fixed([]), Fixed([]), head)
    assert auto.propose(_request(), 4).token_ids == [40, 41, 42, 43] and head.calls == 1


def test_rejected_rounds_lower_a_drafters_rate_until_the_other_wins():
    lookup = Fixed([5, 6, 7])
    auto = AutoDrafter(Fixed([8, 9], [0.5, 0.3]), lookup, None)  # 0.8 vs lookup's 0.875 at the start
    request = _request()
    assert auto.propose(request, 3).token_ids == [5, 6, 7]
    for _ in range(6):  # the target writes what the suffix drafter proposes: lookup's drafts fail
        request.output_token_ids.extend([8, 9, 10])
        auto.propose(request, 3)
    assert auto.rate(auto.states["r"], "lookup") < 0.5  # below where it started
    assert auto.propose(request, 3).token_ids == [8, 9]


def test_accepted_rounds_raise_the_rate():
    auto = AutoDrafter(Fixed([]), Fixed([5, 6]), None)
    request = _request()
    auto.propose(request, 2)
    start = auto.rate(auto.states["r"], "lookup")
    for _ in range(4):
        request.output_token_ids.extend([5, 6, 11])  # both drafts accepted, then the target's own token
        auto.propose(request, 2)
    assert auto.rate(auto.states["r"], "lookup") > start


def test_geometric_expectation():
    assert geometric(0.5, 3) == 0.5 + 0.25 + 0.125
    assert geometric(0.9, 0) == 0


class FixedTree(Fixed):
    """Proposes a draft tree: ``tokens`` under ``parents``."""

    def __init__(self, tokens, confidence, parents):
        super().__init__(tokens, confidence)
        self.parents = tuple(parents)

    def propose(self, request: Request, k: int) -> Draft:
        return Draft(self.tokens, confidence=self.confidence, parents=self.parents)


def test_a_tree_round_counts_the_branch_the_target_took():
    # Two branches: 7 8 (first) and 9 10. The target writes 9 10: both accepted, on the second branch.
    tree = FixedTree([7, 8, 9, 10], [0.5, 0.5, 0.4, 0.4], [-1, 0, -1, 2])
    auto = AutoDrafter(tree, Fixed([]), None)
    request = _request()
    draft = auto.propose(request, 4)
    assert draft.parents == (-1, 0, -1, 2)
    request.output_token_ids.extend([9, 10, 11])
    auto.propose(request, 4)
    rate = auto.states["r"].rates["suffix"]
    assert rate.hits == 2 and abs(rate.tries - 1.8) < 1e-9  # 2 accepted of 1.8 predicted (the sum of the confidences)


def test_a_tree_keeps_its_shape_when_the_head_sits_the_round_out():
    tree = FixedTree([7, 8, 9], [0.9, 0.9, 0.8], [-1, 0, -1])
    head = Fixed([40, 41, 42])
    draft = AutoDrafter(tree, Fixed([]), head).propose(_request(), 3)  # 2.6 expected: the head is not asked
    assert head.calls == 0 and draft.parents == (-1, 0, -1) and draft.catch_up_ms is None


def test_auto_drafts_without_the_shipped_head_where_it_does_not_fit_the_model(caplog):
    """A toy model under the default model's name: the shipped head does not fit it, so the
    default drafter runs without a head (and says so); a head named by the user must fit."""
    import pytest

    from speclane.config import ModelConfig
    from speclane.drafters.mtp import default_head_path
    from speclane.drafters.registry import create_drafter
    from speclane.models.mtp_store import MTPHeadError
    from speclane.models.toy import toy_model

    config = ModelConfig()
    assert default_head_path(config.model).exists()
    auto = create_drafter("auto", model=toy_model(), model_config=config)
    assert isinstance(auto, AutoDrafter) and auto.head is None
    assert "without an MTP head" in caplog.text
    with pytest.raises(MTPHeadError):
        create_drafter("auto", model=toy_model(), model_config=config, mtp_head=str(default_head_path(config.model)))


def test_with_the_step_cost_a_longer_head_draft_loses_to_a_cheaper_one():
    """0.94 expected tokens from the head's 4 drafts beat the suffix drafter's 0.9 from one,
    counted in tokens; per millisecond, where each verified row costs 5 ms more, they do not."""
    head = Fixed([40, 41, 42, 43])
    auto = AutoDrafter(Fixed([7], [0.9]), Fixed([]), head)
    assert auto.propose(_request("a"), 4).token_ids == [40, 41, 42, 43]
    auto = AutoDrafter(Fixed([7], [0.9]), Fixed([]), head)
    auto.use_step_cost(lambda rows: 10.0 + 5.0 * (rows - 1))  # 1.9 / 15 ms vs 1.94 / 30 ms
    assert auto.propose(_request("b"), 4).token_ids == [7]


def test_the_heads_own_time_counts_against_it_once_measured():
    now = [0.0]
    head = Fixed([40, 41, 42, 43])
    original = head.propose

    def slow_propose(request, k):
        now[0] += 0.020  # the head's passes take 20 ms
        return original(request, k)

    head.propose = slow_propose
    auto = AutoDrafter(Fixed([7], [0.9]), Fixed([]), head, clock=lambda: now[0])
    auto.use_step_cost(lambda rows: 10.0)  # rows cost nothing extra: only the head's time differs
    assert auto.propose(_request("a"), 4).token_ids == [40, 41, 42, 43]  # its time unknown yet
    assert auto.head_ms == 20.0
    assert auto.propose(_request("b"), 4).token_ids == [7] and head.calls == 1  # 1.94 / 30 ms < 1.9 / 10 ms


def test_a_proposal_that_drafts_wins_over_an_empty_one_whatever_the_step_cost():
    """Per millisecond, no draft (1 token for a 1-row step) can out-score a doubtful one;
    whether to draft at all is adaptive K's choice, so auto still returns the draft."""
    auto = AutoDrafter(Fixed([7, 8], [0.1, 0.05]), Fixed([]), None)
    auto.use_step_cost(lambda rows: 10.0 * rows)  # 1.15 / 30 ms vs 1 / 10 ms
    assert auto.propose(_request(), 4).token_ids == [7, 8]


def test_a_seeding_head_round_is_left_out_of_the_heads_time():
    """The head's first round on a request (seeded) catches up on its whole context, once:
    counted, it would keep the head out of every later round."""
    now = [0.0]

    class Seeding(Fixed):
        def propose(self, request, k):
            self.calls += 1
            now[0] += 0.050 if self.calls == 1 else 0.002  # a 50 ms seed, then 2 ms rounds
            return Draft(self.tokens[:k], catch_up_ms=48.0 if self.calls == 1 else 0.5, seeded=self.calls == 1)

    head = Seeding([40, 41, 42, 43])
    auto = AutoDrafter(Fixed([7], [0.9]), Fixed([]), head, clock=lambda: now[0])
    auto.use_step_cost(lambda rows: 10.0)
    assert auto.propose(_request("a"), 4).token_ids == [40, 41, 42, 43] and auto.head_ms is None
    assert auto.propose(_request("b"), 4).token_ids == [40, 41, 42, 43]  # still expected to beat [7]
    assert auto.head_ms == pytest.approx(2.0)


def test_a_call_in_which_the_suffix_drafter_or_the_head_seeded_reports_itself_seeded():
    """Adaptive K keeps a seed apart (a request's first round's cost): whichever drafter's
    draft the round takes, a call that seeded says so (its time unsplit, catch_up_ms None,
    unless the draft is the seeding head's own, which split it), and a later one does not."""

    class SeedsOnce(Fixed):
        def propose(self, request, k):
            self.calls += 1
            seeding = self.calls == 1
            return Draft(self.tokens[:k], confidence=self.confidence[:k], catch_up_ms=3.0 if seeding else 0.5,
                         seeded=seeding)

    # The suffix seeds, the head's draft wins: the call is still a seed.
    auto = AutoDrafter(SeedsOnce([7], [0.2]), Fixed([]), Fixed([40, 41]))
    first, later = auto.propose(_request("a"), 2), auto.propose(_request("a"), 2)
    assert first.token_ids == [40, 41] and first.seeded and first.catch_up_ms is None
    assert later.token_ids == [40, 41] and not later.seeded
    # The head seeds and gives nothing, the suffix's draft is taken: a seed too.
    auto = AutoDrafter(Fixed([7, 8], [0.2, 0.2]), Fixed([]), SeedsOnce([]))
    first = auto.propose(_request("a"), 2)
    assert first.token_ids == [7, 8] and first.seeded and first.catch_up_ms is None
    # The head seeds and its draft is taken: its own split (the seed's catch-up) stands.
    auto = AutoDrafter(Fixed([]), Fixed([]), SeedsOnce([40, 41]))
    first, later = auto.propose(_request("a"), 2), auto.propose(_request("a"), 2)
    assert first.token_ids == [40, 41] and first.seeded and first.catch_up_ms == 3.0
    assert not later.seeded and later.catch_up_ms == 0.5


def test_a_round_that_may_not_seed_leaves_a_head_without_its_seed_alone():
    """The scheduler priced the round without the head's seed (``may_seed`` False): the
    cheap proposal is the round's, timed as one (no catch-up); once the head has seeded
    (a round that may), it competes in such rounds again."""
    head = Unseeded([40, 41, 42, 43])
    auto = AutoDrafter(Fixed([7], [0.2]), Fixed([]), head)  # the head is expected to beat 0.2
    auto.seed_after = 1  # seeded at its first chance (the wait for uncopyable text is tested below)
    cheap = auto.propose(_request("a"), 4, may_seed=False)
    assert cheap.token_ids == [7] and cheap.catch_up_ms is None and head.calls == 0
    assert auto.propose(_request("a"), 4).token_ids == [40, 41, 42, 43] and head.calls == 1
    assert auto.propose(_request("a"), 4, may_seed=False).token_ids == [40, 41, 42, 43] and head.calls == 2



def test_a_short_run_of_misses_leaves_new_requests_a_head_prior_of_its_long_run():
    """The engine-wide rate is the prior a new request starts from: after many rounds where
    about half the head's first drafts held, a few misses in a row must not bring it so low
    that the head's proposals never beat an empty one again (and never run to say so)."""
    auto = AutoDrafter(Fixed([]), None, Fixed([40]))
    for i in range(60):
        request = _request(f"r{i}")
        auto.propose(request, 1)  # the head drafts 40
        request.output_token_ids.append(40 if i % 2 == 0 and i < 54 else 99)  # held every other round, then six misses
        auto.propose(request, 1)  # reads the round
        auto.release(request.request_id)
    newcomer = _request("new")
    auto.propose(newcomer, 1)
    assert 0.35 < auto.rate(auto.states["new"], "mtp") < 0.5


def test_a_head_priced_out_runs_as_a_probe_after_a_run_of_rounds_with_no_cheap_draft():
    """The head's rate is learnt only from rounds it runs: priced out, it would never run to
    show its rate is better than the estimate. A run of rounds in which the cheap drafters
    find nothing ends in one head round."""
    head = Fixed([40])
    auto = AutoDrafter(Fixed([]), None, head)
    auto.use_step_cost(lambda rows: 5.0 * rows)  # a one-token head draft at rate 0.5: 1.5 / 10 ms < 1 / 5 ms
    request = _request()
    for _ in range(HEAD_PROBE_ROUNDS - 1):
        assert auto.propose(request, 1).token_ids == []
        request.output_token_ids.append(99)
    assert head.calls == 0
    assert auto.propose(request, 1).token_ids == [40] and head.calls == 1 and auto.probes == 1
    request.output_token_ids.extend([40, 41])  # the probe's draft held: the head's rate rises
    before = auto.rate(auto.states["r"], "mtp")
    auto.propose(request, 1)
    assert auto.rate(auto.states["r"], "mtp") > before


def test_no_probe_while_a_cheap_drafter_has_a_proposal():
    head = Fixed([40])
    auto = AutoDrafter(Fixed([7], [0.9]), None, head)
    auto.use_step_cost(lambda rows: 5.0 * rows)
    request = _request()
    for _ in range(3 * HEAD_PROBE_ROUNDS):
        assert auto.propose(request, 1).token_ids == [7]
        request.output_token_ids.extend([7, 8])
    assert head.calls == 0


def test_a_heads_seed_waits_for_rounds_the_cheap_drafters_cannot_draft():
    """The head, expected to win from its first round, is first run (and seeded) only after
    HEAD_SEED_AFTER rounds in which the cheap drafters found nothing; while they draft every
    round (a copy), it is never seeded."""
    head = Unseeded([40])
    auto = AutoDrafter(Fixed([]), None, head)
    request = _request()
    for _ in range(HEAD_SEED_AFTER - 1):
        assert auto.propose(request, 1).token_ids == []
        request.output_token_ids.append(99)
    assert head.calls == 0
    assert auto.propose(request, 1).token_ids == [40] and head.calls == 1
    assert auto.propose(request, 1).token_ids == [40] and head.calls == 2  # seeded: it competes every round
    copying_head = Unseeded([40, 41, 42, 43])
    copy = AutoDrafter(Fixed([7], [0.3]), None, copying_head)  # worth less than the head's drafts
    for _ in range(4 * HEAD_SEED_AFTER):
        assert copy.propose(_request("copy"), 4).token_ids == [7]
    assert copying_head.calls == 0


def test_rounds_that_may_not_seed_neither_probe_nor_seed_an_unseeded_head():
    head = Unseeded([40])
    auto = AutoDrafter(Fixed([]), None, head)
    request = _request()
    for _ in range(2 * HEAD_PROBE_ROUNDS):
        assert auto.propose(request, 1, may_seed=False).token_ids == []
    assert head.calls == 0 and auto.probes == 0
