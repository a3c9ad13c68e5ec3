"""benchmarks/accuracy.py's measures on logits small enough to work out by hand: top-1
agreement, KL(reference || arm), their running totals, the batching and the table."""

from __future__ import annotations

import math

import benchmark_scripts
import pytest
import torch

accuracy = benchmark_scripts.load("accuracy")

LN3 = math.log(3.0)


def test_kl_of_two_swapped_distributions_is_half_ln_3():
    # p = (1/4, 3/4), q = (3/4, 1/4): KL = 1/4 ln(1/3) + 3/4 ln 3 = ln(3) / 2
    reference, logits = torch.tensor([[0.0, LN3]]), torch.tensor([[LN3, 0.0]])
    assert accuracy.kl_divergences(reference, logits).item() == pytest.approx(LN3 / 2, rel=1e-6)
    assert accuracy.top1_matches(reference, logits) == 0


def test_kl_of_uniform_against_one_doubled_token():
    # p uniform over 4; q = (2/5, 1/5, 1/5, 1/5): KL = 1/4 (ln(5/8) + 3 ln(5/4))
    reference, logits = torch.zeros(1, 4), torch.tensor([[math.log(2.0), 0.0, 0.0, 0.0]])
    expected = (math.log(5 / 8) + 3 * math.log(5 / 4)) / 4
    assert accuracy.kl_divergences(reference, logits).item() == pytest.approx(expected, rel=1e-5)


def test_shifted_logits_are_the_same_distribution():
    reference = torch.tensor([[1.0, 4.0, 2.0], [30.0, 29.5, -3.0]])
    kl = accuracy.kl_divergences(reference, reference + 7.0)
    assert kl.abs().max().item() < 1e-6
    assert accuracy.top1_matches(reference, reference + 7.0) == 2


def test_a_tiny_difference_keeps_its_digits():
    # KL of p against p with one logit moved by e: ~ p (1 - p) e^2 / 2 for small e
    reference = torch.tensor([[0.0, 0.0]])
    kl = accuracy.kl_divergences(reference, torch.tensor([[1e-3, 0.0]])).item()
    assert kl == pytest.approx(0.25 * 1e-6 / 2, rel=1e-2)


def test_the_totals_are_over_positions():
    agreement = accuracy.Agreement()
    agreement.add(torch.tensor([[0.0, LN3]]), torch.tensor([[LN3, 0.0]]))  # differs, KL ln(3)/2
    agreement.add(torch.tensor([[0.0, 1.0], [2.0, 0.0]]), torch.tensor([[0.0, 1.0], [2.0, 0.0]]))  # same, KL 0
    assert agreement.positions == 3
    assert agreement.top1_pct == pytest.approx(200 / 3)
    assert agreement.mean_kl == pytest.approx(LN3 / 6, rel=1e-5)


def test_batches_hold_at_most_max_rows_tokens_and_a_long_prompt_alone():
    prompts = [[1] * 3, [2] * 4, [3] * 9, [4] * 2, [5] * 2]
    assert [[len(p) for p in b] for b in accuracy.batches(prompts, 8)] == [[3, 4], [9], [2, 2]]


def test_the_table_has_a_line_per_file_and_the_default_arms_distance_from_transformers():
    row = accuracy.Row
    rows = [row("a.gguf", "F16 x7", "speclane bfloat16 auto", "none", 10, 98.5, 0.002),
            row("a.gguf", "F16 x7", "transformers bfloat16", "", 10, 97.0, 0.003),
            row("b.gguf", "Q4_0 x7", "speclane bfloat16 auto", "int4", 10, 90.0, 0.01)]
    lines = accuracy.markdown(rows).splitlines()
    assert lines[0] == ("| file | layer weights | positions | speclane bfloat16 auto: top-1 % / KL "
                        "| transformers bfloat16: top-1 % / KL | top-1 vs transformers bfloat16 (points) |")
    assert lines[2] == "| a.gguf | F16 x7 | 10 | 98.50 / 0.00200 (none) | 97.00 / 0.00300 | +1.50 |"
    assert lines[3] == "| b.gguf | Q4_0 x7 | 10 | 90.00 / 0.01000 (int4) | - | - |"  # no transformers arm for b.gguf


def test_positions_an_earlier_prompt_scored_are_scored_once():
    # The second and third share the first's first two tokens (a chat template's prefix);
    # the third is a copy of the second: nothing of it is new.
    prompts = [[1, 2, 3, 4], [1, 2, 5], [1, 2, 5], [7, 8]]
    assert accuracy.first_new_positions(prompts) == [0, 2, 3, 0]
