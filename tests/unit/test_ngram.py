"""The n-gram (prompt lookup) drafter: what it proposes, from where, and the resync."""

import pytest

from speclane.drafters.ngram import NgramDrafter
from speclane.request import Request, SamplingParams


def _request(prompt: list[int], output: list[int] = (), prediction: list[int] = ()) -> Request:
    request = Request(request_id="r", prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=100),
                      prediction_token_ids=prediction)
    request.output_token_ids.extend(output)
    return request


SOURCE = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]


def test_proposes_what_followed_the_longest_recent_match():
    request = _request([1] + SOURCE + [2], output=[12, 13, 14])
    assert NgramDrafter().propose(request, 4).token_ids == [15, 16, 17, 18]


def test_the_prediction_is_preferred_and_k_bounds_the_draft():
    request = _request([12, 13, 50, 51], output=[12, 13], prediction=[12, 13, 60, 61, 62])
    assert NgramDrafter().propose(request, 2).token_ids == [60, 61]


def test_a_single_matching_token_proposes_nothing():
    request = _request([1, 2, 3, 4, 5], output=[9, 3])  # only the 1-gram (3) matches
    assert NgramDrafter().propose(request, 4).token_ids == []


def test_after_one_inserted_token_a_copy_resyncs():
    # The copy wrote 99 (a comma the source does not have) after 13 14 15.
    request = _request([1] + SOURCE + [2], output=[12, 13, 14, 15, 99])
    assert NgramDrafter(resync_ngram=3).propose(request, 3).token_ids == [16, 17, 18]


def test_resync_is_off_by_default():
    request = _request([1] + SOURCE + [2], output=[12, 13, 14, 15, 99])
    assert NgramDrafter().propose(request, 3).token_ids == []


def test_a_short_match_before_the_new_token_does_not_resync():
    # Only two tokens (14 15) match before the new one: chance in free text, no proposal.
    request = _request([1] + SOURCE + [2], output=[7, 14, 15, 99])
    assert NgramDrafter(resync_ngram=3).propose(request, 3).token_ids == []


def test_a_resync_on_one_token_is_refused():
    with pytest.raises(ValueError):
        NgramDrafter(resync_ngram=1)
    with pytest.raises(ValueError):
        NgramDrafter(max_ngram=4, resync_ngram=5)
