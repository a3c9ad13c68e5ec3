"""Random int4 weights and inputs for the int4 kernels' tests (test_int4_kernel, test_tile_kernel)."""

import torch

from speclane.models.linear import quantize_int4_groups

GRID_BITS = 14  # kernels/q4.h


def random_int4_weight(out_features: int, in_features: int, seed: int = 0):
    """(q, scale, minimum, dense): a random weight quantized as GGUF's Q4_1 stores it, and its dequantized values."""
    torch.manual_seed(seed)
    q, scale, minimum = quantize_int4_groups(torch.randn(out_features, in_features) * 0.05)
    # float16 scales and minimums, as GGUF's Q4_1 blocks store them (and the kernel keeps them)
    scale, minimum = scale.half().float(), minimum.half().float()
    dense = (q.float().reshape(out_features, -1, 32) * scale[..., None] + minimum[..., None]).reshape(out_features, -1)
    return q, scale, minimum, dense


def wide_range_inputs(rows: int, in_features: int, seed: int = 1) -> torch.Tensor:
    """bfloat16 inputs spread over many binades, with an outlier column (x100) as LLM
    activations have: most groups hold inputs far below their largest, which the
    kernels' grid rounding changes."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=generator) * torch.exp(2 * torch.randn(rows, in_features, generator=generator))
    x[:, 5] *= 100
    return x.bfloat16()


def grid_round(x: torch.Tensor) -> torch.Tensor:
    """q4.h's round_group in torch: each group of 32 inputs to the nearest multiple (ties
    to even) of 2^(E - GRID_BITS), E the exponent of the group's largest magnitude; a group
    whose largest is below 2^-112 zeroed, one at 2^119 or more (or Inf / NaN) unchanged."""
    groups = x.float().reshape(x.shape[0], -1, 32)
    largest = groups.abs().amax(-1, keepdim=True)  # NaN where the group has one
    _, exponent = torch.frexp(largest)  # largest = m * 2^exponent, m in [0.5, 1)
    step = torch.ldexp(torch.ones_like(largest), (exponent - 1 - GRID_BITS).clamp(min=-126))
    rounded = torch.round(groups / step) * step
    rounded = torch.where(largest < 2.0**-112, torch.zeros_like(groups), rounded)
    rounded = torch.where((largest >= 2.0**119) | largest.isnan(), groups, rounded)
    return rounded.reshape(x.shape).bfloat16()
