"""Presence, frequency and repetition penalties on a round's logit rows
(``engine/logits.py``): row i pays for the output so far and the round's first i drafts,
as its decode step would; ``min_tokens``' held stop tokens; and min-p sampling
(``engine/sampling.py``)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from speclane.engine.logits import HeldStops, TokenHistory, constrain, hold_stops
from speclane.engine.sampling import probabilities
from speclane.request import SamplingParams


def history(rows: torch.Tensor, output: list[int], prompt: list[int] | None = None) -> TokenHistory:
    return TokenHistory(rows.shape[-1]).update(prompt or [], output)


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
    constrain(rows, params, None, draft, history(rows, output))
    torch.testing.assert_close(rows, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("params", [SamplingParams(frequency_penalty=0.1), SamplingParams(presence_penalty=0.3),
                                    SamplingParams(frequency_penalty=-0.7, presence_penalty=1.1),
                                    SamplingParams(repetition_penalty=1.3)])
def test_a_rounds_rows_equal_the_decode_steps_bit_for_bit(params: SamplingParams) -> None:
    """Row i of a round, against the decode step that has draft[:i] as output: the same
    float32 bits (a near-tie broken differently would change the greedy answer)."""
    generator = torch.Generator().manual_seed(11)
    prompt, output, draft = [4, 8], [3, 7, 3, 0, 0], [0, 0, 7, 12, 3]
    for _ in range(50):
        rows = torch.randn(len(draft) + 1, 16, generator=generator) * 8
        spec = rows.clone()
        constrain(spec, params, None, draft, history(rows, output, prompt))
        for i in range(len(draft) + 1):
            step = rows[i : i + 1].clone()
            constrain(step, params, None, [], history(rows, output + draft[:i], prompt))
            assert torch.equal(spec[i], step[0]), i


def test_a_near_tie_is_broken_as_the_decode_step_breaks_it() -> None:
    rows = torch.tensor([[5.0, 0.0], [5.0, 0.0], [1.0, 0.8]])
    spec = rows.clone()
    constrain(spec, SamplingParams(frequency_penalty=0.1), None, [0, 0], history(rows, []))
    step = rows[2:].clone()
    constrain(step, SamplingParams(frequency_penalty=0.1), None, [], history(rows, [0, 0]))
    assert torch.equal(spec[2], step[0])


def test_a_token_a_row_does_not_pay_for_keeps_its_bits_even_a_negative_zero() -> None:
    """Negative penalties: a later draft's token in an earlier row is left alone, not
    'reduced by -0.0' (which would turn -0.0 into +0.0 where the decode step keeps -0.0)."""
    params = SamplingParams(presence_penalty=-0.5, frequency_penalty=-0.25)
    rows = torch.tensor([[-0.0, 1.0, 2.0], [-0.0, 1.0, 2.0]])
    spec = rows.clone()
    constrain(spec, params, None, [0], history(rows, [2], [1]))
    step = rows[:1].clone()
    constrain(step, params, None, [], history(rows, [2], [1]))
    assert torch.equal(spec[0], step[0]) and str(spec[0, 0].item()) == "-0.0"


def test_nothing_generated_yet_leaves_the_first_row_alone() -> None:
    rows = torch.zeros(3, 10)
    constrain(rows, SamplingParams(presence_penalty=1.0, frequency_penalty=0.5), None, [4, 4], history(rows, []))
    assert rows[0].abs().sum() == 0
    assert rows[1, 4] == -1.5 and rows[2, 4] == -2.0


def test_the_repetition_penalty_divides_positive_logits_and_multiplies_negative_ones_once() -> None:
    generator = torch.Generator().manual_seed(5)
    rows = torch.randn(4, 30, generator=generator)
    prompt, output, draft = [1, 2, 2], [5, 1], [9, 5, 9]
    expected = rows.clone()
    for i in range(4):
        for token in set(prompt + output + draft[:i]):
            value = expected[i, token]
            expected[i, token] = value / 1.5 if value > 0 else value * 1.5
    constrain(rows, SamplingParams(repetition_penalty=1.5), None, draft, history(rows, output, prompt))
    torch.testing.assert_close(rows, expected, rtol=0, atol=1e-6)


def test_a_history_takes_in_only_what_is_new_and_penalties_need_one() -> None:
    tracked = TokenHistory(10).update([1, 2], [3])
    tracked.update([1, 2], [3, 3, 4])
    assert tracked.seen.nonzero().flatten().tolist() == [1, 2, 3, 4]
    assert tracked.counts.tolist() == [0, 0, 0, 2, 1, 0, 0, 0, 0, 0], "the prompt is not counted, the output once"
    with pytest.raises(ValueError, match="history"):
        constrain(torch.zeros(1, 10), SamplingParams(presence_penalty=1.0), None, [])


def test_min_p_drops_tokens_below_its_share_of_the_likeliest() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]]))
    probs = probabilities(logits, SamplingParams(temperature=1.0, min_p=0.2))
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.3, 0.12, 0.0]]) / 0.92)


@pytest.mark.parametrize(("field", "value"), [
    *[(f, v) for f in ("presence_penalty", "frequency_penalty") for v in (2.5, -2.01, float("nan"), "1", True)],
    ("repetition_penalty", 0.0), ("repetition_penalty", 11.0), ("repetition_penalty", float("inf")),
    ("min_p", -0.1), ("min_p", 1.5), ("min_p", float("nan")), ("min_p", "0.1"),
])
def test_out_of_range_or_wrong_type_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_min_tokens_holds_the_stop_tokens_out_of_the_rows_before_it() -> None:
    """Row i chooses token num_output + i: the rows before min_tokens may not choose an
    end-of-sequence or stop token; later rows, and other tokens, keep their values."""
    rows = torch.randn(4, 30, generator=torch.Generator().manual_seed(5))
    expected = rows.clone()
    params = SamplingParams(max_tokens=20, min_tokens=7, stop_token_ids=(9,))
    held = HeldStops.of(params, frozenset({2, 0}), num_output=5)
    assert held == HeldStops((9, 0, 2), 2)
    constrain(rows, params, None, [1, 1, 1], held=held)
    expected[:2, [0, 2, 9]] = float("-inf")
    torch.testing.assert_close(rows, expected, rtol=0, atol=0)
    assert HeldStops.of(params, {2}, num_output=7) is None, "min_tokens reached: nothing is held"
    assert HeldStops.of(SamplingParams(min_tokens=3, ignore_eos=True), {2}, num_output=0) is None, \
        "with ignore_eos and no stop_token_ids there is nothing to hold"


def test_min_tokens_leaves_a_stop_where_the_grammar_allows_nothing_else() -> None:
    rows = torch.full((2, 6), float("-inf"))
    rows[0, 2] = 1.0  # the grammar's end: only end-of-sequence is allowed
    rows[1, [2, 4]] = torch.tensor([1.0, 0.5])
    hold_stops(rows, HeldStops((2,), 2), grammar=True)
    assert rows[0, 2] == 1.0, "a row of nothing but stops keeps them"
    assert rows[1, 2] == float("-inf") and rows[1, 4] == 0.5


def test_min_tokens_is_checked() -> None:
    with pytest.raises(ValueError, match="min_tokens must be from 0 to max_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match="min_tokens must be an integer"):
        SamplingParams(min_tokens=1.5)  # type: ignore[arg-type]
