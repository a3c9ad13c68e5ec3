"""The suffix drafter: longest-suffix matching, resynchronisation, frequency voting, the
estimated-probability stop, tenant isolation, the memory bound and the cost of a round."""

import random
import time

import pytest

from speclane import draft_tree
from speclane.drafters.suffix import SuffixDrafter
from speclane.drafters.suffix_index import SuffixIndex, SuffixParams, alignments, vote
from speclane.request import Request, SamplingParams

SOURCE = list(range(10, 30))
LONG = SuffixParams(max_match=32, spec_factor=4.0, min_prob=0.1)
RESYNC = SuffixParams(max_match=32, spec_factor=4.0, min_prob=0.1, max_resync=3)


def _request(prompt, output=(), tenant="a", rid="r", prediction=()) -> Request:
    request = Request(request_id=rid, prompt_token_ids=list(prompt), sampling=SamplingParams(max_tokens=100),
                      tenant=tenant, prediction_token_ids=list(prediction))
    request.output_token_ids.extend(output)
    return request


def _finished(tokens, tenant, rid) -> Request:
    return _request([1], tokens, tenant=tenant, rid=rid)


def test_a_copy_drafts_what_followed_its_longest_matching_suffix():
    request = _request([1] + SOURCE + [2], output=[12, 13, 14])
    assert SuffixDrafter(LONG).propose(request, 4).token_ids == [15, 16, 17, 18]


def test_a_requests_first_round_reports_its_index_as_a_seed_and_later_rounds_do_not():
    drafter = SuffixDrafter(LONG)
    request = _request([1] + SOURCE + [2], output=[12, 13, 14])
    first = drafter.propose(request, 4)
    assert first.seeded and first.catch_up_ms > 0  # the index's time: the seed's
    request.output_token_ids.append(15)
    later = drafter.propose(request, 4)
    assert later.token_ids == [16, 17, 18, 19] and not later.seeded and later.catch_up_ms == 0.0


def test_the_longest_suffix_wins_over_a_more_recent_shorter_match():
    # "5 6 7" is followed by 8 once; the more recent "6 7" by 99. The context ends in 5 6 7.
    index = SuffixIndex([5, 6, 7, 8, 0, 6, 7, 99, 0])
    tokens, _, _ = vote(alignments(index, [3, 5, 6, 7], LONG), 1, LONG)
    assert tokens == [8]


def test_the_most_frequent_continuation_wins_and_its_share_is_its_probability():
    index = SuffixIndex([4, 5, 6, 0, 4, 5, 6, 0, 4, 5, 7, 0])
    params = SuffixParams(max_match=2, prior=0.0, min_prob=0.1)
    tokens, probs, _ = vote(alignments(index, [9, 4, 5], params), 1, params)
    assert tokens == [6] and abs(probs[0] - 2 / 3) < 1e-9


def test_the_draft_stops_where_its_estimated_probability_falls_below_the_threshold():
    # After 4 5 6: 7 twice, 8 once (2/3); after 4 5 6 7: 1 once, 2 once (1/2 more, the more
    # recent one winning the tie).
    index = SuffixIndex()
    for document in ([4, 5, 6, 7, 1], [4, 5, 6, 7, 2], [4, 5, 6, 8]):
        index.add_document(document)
    context = [9, 4, 5, 6]
    low = SuffixParams(max_match=3, prior=0.0, min_prob=0.3, spec_factor=4.0)
    high = SuffixParams(max_match=3, prior=0.0, min_prob=0.5, spec_factor=4.0)
    tokens, probs, _ = vote(alignments(index, context, low), 4, low)
    assert tokens == [7, 2] and abs(probs[1] - 1 / 3) < 1e-9  # the document ends there
    assert vote(alignments(index, context, high), 4, high)[0] == [7]


def test_an_ambiguous_match_drafts_a_tree_of_its_continuations_best_first():
    # After 4 5 6: "8 3" three times, "7 1 2" twice, "9" once.
    index = SuffixIndex()
    for document in ([4, 5, 6, 7, 1, 2], [4, 5, 6, 9], [4, 5, 6, 7, 1, 2], [4, 5, 6, 8, 3], [4, 5, 6, 8, 3],
                     [4, 5, 6, 8, 3]):
        index.add_document(document)
    context = [0, 4, 5, 6]
    chain = SuffixParams(max_match=3, prior=0.0, min_prob=0.3, spec_factor=4.0)
    tree = SuffixParams(max_match=3, prior=0.0, min_prob=0.3, spec_factor=4.0, max_branches=2, branch_min_prob=0.3)
    tokens, probs, parents = vote(alignments(index, context, chain), 6, chain)
    assert (tokens, parents) == ([8, 3], [-1, 0])
    tokens, probs, parents = vote(alignments(index, context, tree), 6, tree)
    # Best first: 8 and its 3 (1/2 each), then the sibling 7 and its 1 and 2 (1/3); 9 (1/6) is below the bar.
    assert tokens == [8, 3, 7, 1, 2] and parents == [-1, 0, -1, 2, 3]
    assert [round(p, 6) for p in probs] == [0.5, 0.5, 0.333333, 0.333333, 0.333333]
    assert draft_tree.first_chain(parents) == [0, 1]  # the likeliest branch first
    # A budget of 3 nodes keeps the likeliest ones, still a tree.
    tokens, _, parents = vote(alignments(index, context, tree), 3, tree)
    assert tokens == [8, 3, 7] and parents == [-1, 0, -1]


def test_one_branch_per_node_drafts_the_chain():
    index = SuffixIndex()
    for document in ([4, 5, 6, 7, 1], [4, 5, 6, 7, 2], [4, 5, 6, 8]):
        index.add_document(document)
    params = SuffixParams(max_match=3, prior=0.0, min_prob=0.3, spec_factor=4.0)
    tokens, _, parents = vote(alignments(index, [9, 4, 5, 6], params), 4, params)
    assert draft_tree.is_chain(parents) and tokens == [7, 2]


def test_a_short_match_drafts_a_short_continuation():
    # A match of 2 tokens drafts at most spec_factor * 2 tokens, whatever k allows.
    params = SuffixParams(max_match=32, spec_factor=1.0, min_prob=0.01)
    request = _request([1] + SOURCE + [2], output=[7, 12, 13])
    assert SuffixDrafter(params).propose(request, 8).token_ids == [14, 15]


def test_after_a_replaced_token_the_copy_resynchronises_at_once():
    # The copy wrote 99 where the source has 16 (a capitalised word, a changed number).
    request = _request([1] + SOURCE + [2], output=[12, 13, 14, 15, 99])
    assert SuffixDrafter(RESYNC).propose(request, 3).token_ids == [17, 18, 19]


def test_resync_is_off_by_default():
    # Tuned off (SuffixParams.max_resync 0): after the divergence nothing matches exactly.
    request = _request([1] + SOURCE + [2], output=[12, 13, 14, 15, 99])
    assert SuffixDrafter(LONG).propose(request, 3).token_ids == []


def test_after_an_inserted_token_and_one_more_the_copy_resynchronises():
    request = _request([1] + SOURCE + [2], output=[12, 13, 14, 15, 99, 16])
    assert SuffixDrafter(RESYNC).propose(request, 3).token_ids == [17, 18, 19]


def test_a_divergence_after_too_short_a_match_does_not_resynchronise():
    request = _request([1] + SOURCE + [2], output=[7, 14, 15, 99])  # only 14 15 matched before 99
    assert SuffixDrafter(RESYNC).propose(request, 3).token_ids == []


def test_a_resync_that_scores_nothing_is_dropped():
    # Two divergent context tokens (99 98) for none in the source after a 3-token match: the
    # penalties leave it no score. Kept, it would be the only occurrence, and with no prior
    # its probability 0 / (0 + 0) divides by zero.
    params = SuffixParams(max_match=3, max_resync=2, prior=0.0, min_prob=0.0)
    context = [1, 10, 11, 12, 99, 98]
    assert alignments(SuffixIndex([10, 11, 12, 13]), context, params) == []


def test_the_context_never_matches_itself():
    request = _request([1, 2, 3, 4, 5, 6, 7])  # no pair repeats
    assert SuffixDrafter(LONG).propose(request, 4).token_ids == []


def test_the_prediction_is_drafted_from():
    request = _request([1, 2, 3], output=[40, 41], prediction=[40, 41, 42, 43, 44])
    assert SuffixDrafter(LONG).propose(request, 3).token_ids == [42, 43, 44]


def test_a_finished_output_of_the_same_tenant_is_drafted_from():
    drafter = SuffixDrafter(LONG)
    drafter.finish(_finished([50, 51, 52, 53, 54, 55], "a", "old"))
    assert drafter.propose(_request([1, 50, 51]), 3).token_ids == [52, 53, 54]


def test_tenant_b_never_drafts_a_continuation_seen_only_in_tenant_a_outputs():
    drafter = SuffixDrafter(LONG)
    secret = [60, 61, 62, 63, 64, 65, 66, 67]
    for i in range(5):
        drafter.finish(_finished(secret, "a", f"a{i}"))
    # Tenant b's context ends with the secret's opening: only tenant a's text continues it.
    for n in range(2, len(secret)):
        draft = drafter.propose(_request([1] + secret[:n], tenant="b", rid=f"b{n}"), 4)
        assert not set(draft.token_ids) & set(secret[n:]), draft.token_ids
        drafter.release(f"b{n}")
    assert drafter.propose(_request([1] + secret[:3], tenant="a", rid="a-next"), 4).token_ids == secret[3:7]


def test_memory_stays_bounded_over_a_long_soak_of_many_tenants():
    cache_tokens, max_tenants = 500, 8
    drafter = SuffixDrafter(LONG, cache_tokens=cache_tokens, max_tenants=max_tenants)
    rng = random.Random(0)
    for i in range(3000):
        tenant = f"t{rng.randrange(40)}"
        output = [rng.randrange(1000) for _ in range(rng.randrange(1, 120))]
        drafter.finish(_finished(output, tenant, f"r{i}"))
        drafter.release(f"r{i}")
        stored = drafter.stored_tokens()
        assert len(stored) <= max_tenants
        # Separators between documents aside, each tenant holds at most its bound.
        assert all(n <= cache_tokens + len(drafter.tenants[t].documents) for t, n in stored.items())
    assert not drafter.states
    assert sum(drafter.stored_tokens().values()) > cache_tokens  # the bound is reached, not avoided


def test_the_oldest_outputs_are_evicted_first():
    drafter = SuffixDrafter(LONG, cache_tokens=40)
    drafter.finish(_finished([70, 71, 72, 73, 74, 75], "a", "old"))
    for i in range(6):
        drafter.finish(_finished([200 + 10 * i + j for j in range(8)], "a", f"r{i}"))
    assert drafter.propose(_request([1, 70, 71, 72]), 3).token_ids == []
    assert drafter.propose(_request([1, 250, 251], rid="x"), 3).token_ids == [252, 253, 254]


@pytest.mark.parametrize("params", [SuffixParams(), RESYNC], ids=["default", "with-resync"])
def test_a_round_on_a_2k_token_context_costs_well_under_a_millisecond(params):
    rng = random.Random(1)
    words = [rng.randrange(5000) for _ in range(300)]
    text = []
    while len(text) < 2048:  # text that repeats phrases, as real prose and code do
        start = rng.randrange(len(words) - 40)
        text += words[start : start + rng.randrange(4, 40)] + [rng.randrange(5000)]
    drafter = SuffixDrafter(params)
    for i in range(8):
        drafter.finish(_finished(text[i * 200 : (i + 1) * 200], "a", f"f{i}"))
    request = _request(text[:2048])
    drafter.propose(request, 4)  # the first round indexes the prompt
    started = time.perf_counter()
    rounds = 200
    for i in range(rounds):
        request.output_token_ids.append(text[(i * 7) % 2048])
        drafter.propose(request, 4)
    per_round_ms = (time.perf_counter() - started) * 1000 / rounds
    assert per_round_ms < 1.0, per_round_ms
