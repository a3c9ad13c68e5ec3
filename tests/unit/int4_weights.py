"""Random int4 weights for the int4 kernels' tests (test_int4_kernel, test_prompt_kernel)."""

import torch

from speclane.models.linear import quantize_int4_groups


def random_int4_weight(out_features: int, in_features: int, seed: int = 0):
    """(q, scale, minimum, dense): a random weight quantized as GGUF's Q4_1 stores it, and its dequantized values."""
    torch.manual_seed(seed)
    q, scale, minimum = quantize_int4_groups(torch.randn(out_features, in_features) * 0.05)
    # float16 scales and minimums, as GGUF's Q4_1 blocks store them (and the kernel keeps them)
    scale, minimum = scale.half().float(), minimum.half().float()
    dense = (q.float().reshape(out_features, -1, 32) * scale[..., None] + minimum[..., None]).reshape(out_features, -1)
    return q, scale, minimum, dense
