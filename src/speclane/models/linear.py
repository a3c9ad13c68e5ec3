"""Linear layers over dense, int8 or int4 weights.

A quantized layer runs its kernel at every batch width: a row's result must not depend
on how many neighbours shared its tick (batch-invariant greedy output), and on this
project's AVX2 machines a dense float32 matmul is no faster than int4 from ~16 rows up
(and dense bfloat16 is slower still), so a second, dense copy would buy nothing.
"""

from __future__ import annotations

import torch

INT4_GROUP = 32
INT4_ROW_BLOCK = 4  # rows the CPU int4 kernel computes together
# The kernels' overloads, looked up once (an ``torch.ops.aten.X(...)`` call resolves the
# overload packet on every call).
INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu.default  # (x, packed, group, scales_and_zeros)
_INT8_MM = torch.ops.aten._weight_int8pack_mm.default


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


    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, K] bfloat16
        rows = x.shape[0]
        tail = rows % INT4_ROW_BLOCK
        if rows > INT4_ROW_BLOCK and tail:
            # The kernel works in blocks of 4 rows and a partial block costs a full one
            # (measured, [3072 x 576]: 1-4 rows 174-314 us, 5-8 rows ~600 us, 9 rows 892 us),
            # while a lone call of 1-3 rows is cheap: run the tail as its own call.
            full = rows - tail
            return torch.cat([self._kernel(x[:full]), self._kernel(x[full:])])
        return self._kernel(x)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        return INT4_MM(x, self.packed, self.group, self.scales_and_zeros)


class Int8Weight:
    """Per-output-channel symmetric int8 for ``torch._weight_int8pack_mm``."""

    def __init__(self, weight: torch.Tensor):
        w = weight.float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-8)  # [N]
        self.q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.scale = scale.to(torch.bfloat16)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, K] bfloat16
        return _INT8_MM(x, self.q, self.scale)


class Linear:
    """y = x @ W^T through the quantized kernel when there is one, else the dense weight.

    A plain callable, not an ``nn.Module``: a decode step makes 121 of these calls, and
    at one row ``Module.__call__`` plus the per-call dtype checks cost more than some of
    the kernels (measured in ``speclane bench decode``). The kernel is chosen once here.
    A quantized layer may still carry its dense weight (the output head keeps a float32
    copy to refine its top logits, see ``LlamaModel.logits``).
    """

    def __init__(
        self,
        dense: torch.Tensor | None,
        quantized: Int4Weight | Int8Weight | None = None,
        bias: torch.Tensor | None = None,
    ):
        if dense is None and quantized is None:
            raise ValueError("a Linear needs dense or quantized weights")
        self.dense = dense  # [out, in] or None
        self.quantized = quantized
        self.bias = bias
        # The kernels' input dtype: the quantized ones take bfloat16.
        self.input_dtype = torch.bfloat16 if quantized is not None else dense.dtype
        self._matmul = quantized.matmul if quantized is not None else self._dense

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.dense)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [M, in] in ``input_dtype`` (the model keeps its activations there) -> [M, out]."""
        if x.dtype != self.input_dtype:
            x = x.to(self.input_dtype)
        y = self._matmul(x)
        return y if self.bias is None else y + self.bias
