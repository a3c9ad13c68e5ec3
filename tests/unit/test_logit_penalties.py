"""Presence and frequency penalties on a round's logit rows (``engine/logits.py``): row i
pays for the output so far and the round's first i drafts, as its decode step would."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from speclane.engine.logits import constrain
from speclane.request import SamplingParams


def brute_force(rows: torch.Tensor, presence: float, frequency: float, output: list[int], draft: list[int]) -> torch.Tensor:
    out = rows.clone()
    for i in range(rows.shape[0]):
        for token, count in Counter(output + draft[:i]).items():
            out[i, token] -= presence + frequency * count
    return out


@pytest.mark.parametrize(("presence", "frequency"), [(0.5, 0.0), (0.0, 1.25), (-0.7, 2.0), (2.0, -2.0)])
def test_each_row_pays_for_the_output_and_the_drafts_before_it(presence: float, frequency: float) -> None:
    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(5, 40, generator=generator)
    output, draft = [3, 7, 3, 3, 11], [7, 20, 20, 3]  # repeats within the output, the draft, and across both
    expected = brute_force(rows, presence, frequency, output, draft)
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency)
    constrain(rows, params, None, draft, output)
    torch.testing.assert_close(rows, expected, rtol=0, atol=1e-6)


def test_nothing_generated_yet_leaves_the_first_row_alone() -> None:
    rows = torch.zeros(3, 10)
    constrain(rows, SamplingParams(presence_penalty=1.0, frequency_penalty=0.5), None, [4, 4], [])
    assert rows[0].abs().sum() == 0
    assert rows[1, 4] == -1.5 and rows[2, 4] == -2.0


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.5, -2.01, float("nan"), "1", True])
def test_out_of_range_or_wrong_type_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
