"""Linear layers over dense, int8 or int4 weights, picking the kernel by batch width.

Weight-only int4/int8 kernels are fastest for a single token but slow down sharply
as more tokens pass through them, while a dense bfloat16 matmul stays nearly flat
(DESIGN.md, "Speed facts"). A quantized layer therefore also keeps a dense copy
when ``keep_dense`` is set and switches to it for wide batches (a speculative
verify, a prefill chunk, many decode rows).

On CPUs without native bfloat16 matmul (AVX2 only, like this project's machines) a
dense bfloat16 matmul grows almost linearly with the batch while float32 stays nearly
flat up to ~16 rows, so the dense copy of a quantized layer is kept in float32.
"""

from __future__ import annotations

import torch
from torch import nn

INT4_GROUP = 32


def quantize_int4_groups(weight: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric min/max int4 per group of ``group`` input columns.

    Returns ``q`` [N, K] int32 in 0..15, ``scale`` and ``minimum`` [N, K // group] with
    w ~= q * scale + minimum (the same shape of formula as GGUF's Q4_1 blocks).
    """
    out_features, in_features = weight.shape
    grouped = weight.float().reshape(out_features, in_features // group, group)
    lo = grouped.amin(-1)
    hi = grouped.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    q = torch.round((grouped - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
    return q.reshape(out_features, in_features), scale, lo


class Int4Weight:
    """Packed int4 weight for ``torch._weight_int4pack_mm_for_cpu``.

    The kernel dequantizes ``(q - 8) * scale + zero``; GGUF's Q4_1 stores
    ``q * d + m``, so ``scale = d`` and ``zero = m + 8 * d``. It keeps scales and zeros
    in bfloat16, a small rounding on top of the file's own values.
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, group: int = INT4_GROUP):
        out_features, in_features = q.shape
        if in_features % group:
            raise ValueError(f"int4 needs in_features divisible by {group}; got {in_features}")
        self.group = group
        self.out_features = out_features
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        zero = minimum.float() + 8 * scale.float()
        # [K // group, N, 2]: the kernel's layout of (scale, zero) pairs.
        self.scales_and_zeros = torch.stack([scale.float(), zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)

        self._q = q.to(torch.uint8)  # kept to rebuild the exact dense equivalent

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, K] bfloat16
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scales_and_zeros)

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32 holding exactly the values the kernel multiplies by.

        The dense copy for wide batches is built from this, so a row's result does not
        depend on whether its tick was narrow (int4 kernel) or wide (dense matmul).
        """
        out_features, in_features = self._q.shape
        pairs = self.scales_and_zeros.float().transpose(0, 1)  # [N, K // group, 2]
        q = self._q.float().view(out_features, in_features // self.group, self.group)
        w = (q - 8) * pairs[..., :1] + pairs[..., 1:]
        return w.reshape(out_features, in_features)


class Int8Weight:
    """Per-output-channel symmetric int8 for ``torch._weight_int8pack_mm``."""

    def __init__(self, weight: torch.Tensor):
        w = weight.float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-8)  # [N]
        self.q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.scale = scale.to(torch.bfloat16)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, K] bfloat16
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.scale)

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale.float()[:, None]


class Linear(nn.Module):
    """y = x @ W^T with an optional quantized fast path for narrow batches."""

    def __init__(
        self,
        dense: torch.Tensor | None,
        quantized: Int4Weight | Int8Weight | None = None,
        bias: torch.Tensor | None = None,
        dense_from_tokens: int = 1 << 30,
    ):
        super().__init__()
        if dense is None and quantized is None:
            raise ValueError("a Linear needs dense or quantized weights")
        self.dense = dense  # [out, in] or None
        self.quantized = quantized
        self.bias = bias
        # Use the dense copy once a batch has this many tokens (only if it exists).
        self.dense_from_tokens = dense_from_tokens if dense is not None else 1 << 30

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, in]
        if self.quantized is not None and x.shape[0] < self.dense_from_tokens:
            y = self.quantized.matmul(x.to(torch.bfloat16)).to(x.dtype)  # the kernels take bfloat16
        else:
            y = torch.nn.functional.linear(x.to(self.dense.dtype), self.dense).to(x.dtype)
        return y if self.bias is None else y + self.bias
