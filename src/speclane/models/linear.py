"""Linear layers over dense, float, int8 or int4 weights.

A quantized layer's row has the same bits at every batch width: a row's result must not
depend on how many neighbours shared its tick (batch-invariant greedy output); so does a
float-weight layer's (``FloatWeight``: one float32 FMA chain per output). Our int4
layers run one arithmetic on two kernels, the int4 matmul and, for calls of 5+ rows where
the CPU has AMX, the tile kernel: the same bits (``kernels/int4_cpu.py``). On the
project's AVX2 machine our int4 kernel was also faster than a dense float32 matmul at every
width measured (1-96 rows); on its AVX-512 machine a 96-row float32 GEMM is ~1.2x faster
(~140 vs ~113 GFLOPS), not worth a second, dense copy of 8x the bytes.
"""

from __future__ import annotations

import ctypes

import torch

from speclane.kernels import float_cpu, int4_cpu, int8_cpu, norm_cpu
from speclane.kernels.select import Kernels

INT4_GROUP = 32
INT4_ROW_BLOCK = 4  # rows torch's CPU int4 kernel computes together
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
    """An int4 weight with its kernel: ours (``kernels/int4_x86.c``) where ``kernels`` holds
    it, else torch's ``_weight_int4pack_mm_for_cpu``.

    Ours computes with the file's Q4_1 values exactly: scale * sum(x q) + minimum * sum(x)
    per group of 32 inputs, in float32, the inputs rounded to their group's grid first
    (``q4.h``: what makes every kernel's sums exact, in any order).
    torch's dequantizes ``(q - 8) * scale + zero``, so ``scale = d`` and ``zero = m + 8 * d``,
    with scales and zeros kept in bfloat16 (a small rounding on top of the file's values).
    ``tensors`` are what the kernel reads.
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, kernels: Kernels,
                 group: int = INT4_GROUP):
        out_features, in_features = q.shape
        if in_features % group:
            raise ValueError(f"int4 needs in_features divisible by {group}; got {in_features}")
        self.group = group
        self.out_features = out_features
        if group == int4_cpu.GROUP and out_features % int4_cpu.LANES == 0 and kernels.int4 is not None:
            self.kernel = kernels.int4.isa  # "avx512bf16", "avx512vnni", "avx512" or "avx2": the same bits (on bfloat16 inputs)
            self.library = kernels.int4.library
            # The kernel on int8 inputs reads its weights' q in quads, the AVX2 build on
            # bfloat16 inputs in planes, the others (and the AMX tile kernel) in bytes (int4_cpu.pack).
            quads = kernels.matmul_inputs == "int8"
            planes = not quads and self.kernel == int4_cpu.PLANES_ISA
            self.tensors: tuple[torch.Tensor, ...] = int4_cpu.pack(q, scale, minimum, quads=quads, planes=planes)
            # Calls of many rows go to the AMX tile kernel where it runs (the same bits: int4_cpu).
            self.bound = int4_cpu.bind(*self.tensors, lib=self.library, tiles=None if planes else kernels.tile_library)
            self.op_row = self.bound.op_row  # a forward plan's step (Linear.op_steps)
            self._values: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        else:
            self.kernel = "torch"
            self.library = None  # torch's kernel, not a build of ours
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
            zero = minimum.float() + 8 * scale.float()
            # [K // group, N, 2]: the kernel's layout of (scale, zero) pairs.
            scales_and_zeros = torch.stack([scale.float(), zero], dim=-1).transpose(0, 1).contiguous()
            self.tensors = (packed, scales_and_zeros.to(torch.bfloat16))
            # torch's packing has no documented layout to read rows back from: keep the values.
            self._values = (q.to(torch.uint8).contiguous(), scale.float().contiguous(), minimum.float().contiguous())

    @property
    def nbytes(self) -> int:
        kept = self._values or ()
        return sum(t.numel() * t.element_size() for t in (*self.tensors, *kept))

    def dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """float32 [len(rows), in]: the rows' values q * scale + minimum."""
        if self._values is None:
            return int4_cpu.dequantize_rows(*self.tensors, rows)
        q, scale, minimum = self._values
        w = q[rows].float().unflatten(1, (-1, self.group)) * scale[rows][..., None] + minimum[rows][..., None]
        return w.flatten(1)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, K] bfloat16
        if self.kernel != "torch":
            return self.bound(x)
        rows = x.shape[0]
        tail = rows % INT4_ROW_BLOCK
        if rows > INT4_ROW_BLOCK and tail:
            # torch's kernel works in blocks of 4 rows and a partial block costs a full one
            # (measured, [3072 x 576]: 1-4 rows 174-314 us, 5-8 rows ~600 us, 9 rows 892 us),
            # while a lone call of 1-3 rows is cheap: run the tail as its own call.
            full = rows - tail
            return torch.cat([self._torch_kernel(x[:full]), self._torch_kernel(x[full:])])
        return self._torch_kernel(x)

    def _torch_kernel(self, x: torch.Tensor) -> torch.Tensor:
        return INT4_MM(x, self.tensors[0], self.group, self.tensors[1])


class GroupInt8Weight:
    """A GGUF weight in int8 groups (Q8_0, Q6_K, Q5_*: ``models/gguf_types.py``) on our
    int8-group kernel (``kernels/int8_x86.c``): scale * sum(x q) + minimum * sum(x) per
    group, the file's values exactly (float32 scales and minimums), in float32, the values
    kept in 5 or 6 bits where they fit (``kernels/int8_packed.h``: Q5_*, Q6_K); a row's
    result does not depend on the other rows of its call. ``kernels.int8`` must hold the
    kernel and ``out_features`` be a multiple of 16 (``supports``)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None, kernels: Kernels):
        if not self.supports(q.shape[0], kernels, q.shape[1]):
            raise ValueError(f"our int8 kernel needs out_features % {int8_cpu.LANES} == 0 and kernels.int8; "
                             f"got {q.shape[0]}, {kernels.int8}")
        self.out_features = q.shape[0]
        self.kernel = kernels.int8.isa
        self.packed = int8_cpu.pack(q, scale, minimum, quads=kernels.matmul_inputs == "int8",  # int8_q8_x86.c reads quads
                                    format=None if kernels.narrow_weights else int8_cpu.INT8)
        self._library = kernels.int8.library
        self.tensors: tuple[torch.Tensor, ...] = tuple(t for t in self.packed[:3] if t is not None)
        # Calls of many rows go to the AMX tile kernel where it runs (the same bits: int8_cpu).
        self.matmul = int8_cpu.bind(self.packed, kernels.int8.library, tiles=kernels.int8_tile_library)
        self.op_row = self.matmul.op_row  # a forward plan's step (Linear.op_steps)

    def dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """float32 [len(rows), in]: the rows' values, the file's exactly."""
        return int8_cpu.dequantize_rows(self.packed, rows, self._library)

    @staticmethod
    def supports(out_features: int, kernels: Kernels, in_features: int) -> bool:
        """The kernel reads whole blocks of 32 inputs (their grid, or their int8 rounding)."""
        return kernels.int8 is not None and out_features % int8_cpu.LANES == 0 and in_features % 32 == 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


class FloatWeight:
    """A weight in its source's own float type (float32, float16 or bfloat16: a GGUF's F32,
    F16 and BF16 matmul weights, a Hugging Face folder's safetensors) on our float-weight
    kernel (``kernels/float_x86.c``): the values as they are, one float32 FMA chain per
    output; a row's result does not depend on the other rows of its call. ``kernels.float_matmul``
    must hold the kernel and ``out_features`` be a multiple of 16 (``supports``)."""

    def __init__(self, weight: torch.Tensor, kernels: Kernels):
        if kernels.float_matmul is None:
            raise ValueError("FloatWeight runs our float kernel: kernels.float_matmul is None")
        self.out_features = weight.shape[0]
        self.kernel = kernels.float_matmul.isa
        self.packed = float_cpu.pack(weight)  # a ValueError unless 16 divides out_features
        self.matmul = float_cpu.bind(self.packed, kernels.float_matmul.library)
        self.op_row = self.matmul.op_row  # a forward plan's step (Linear.op_steps)
        self.nbytes = self.packed.numel() * self.packed.element_size()

    def dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """float32 [len(rows), in]: the rows' values as the source holds them (exact)."""
        return self.packed[rows // float_cpu.LANES, :, rows % float_cpu.LANES].float()

    @staticmethod
    def supports(out_features: int, kernels: Kernels) -> bool:
        return kernels.float_matmul is not None and out_features % float_cpu.LANES == 0


class SplitWeight:
    """Weights of different kinds side by side in one layer (a fused q/k/v whose v is
    Q6_K and q, k Q4_K, as llama.cpp's Q4_K_M files have): each part's kernel on the whole
    input, the outputs side by side. Each output column is its part's, so the parts' batch
    invariance is the whole's. ``copy_library``: our norm kernels' build, whose
    ``copy_columns`` puts the parts side by side in a forward plan (None: no plan steps)."""

    def __init__(self, parts: list[Int4Weight | GroupInt8Weight | FloatWeight], copy_library: ctypes.CDLL | None = None):
        self.parts = parts
        self.copy_library = copy_library

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p.matmul(x) for p in self.parts], dim=1)

    def op_steps(self, x: int, y: int, rows: int, buffers: list[torch.Tensor]) -> list[list[int]] | None:
        """A forward plan's steps (``Linear.op_steps``): each part into a buffer of its own
        (appended to ``buffers``, which the plan keeps while it lives), then copied into its
        columns of y, the bits of ``matmul``'s torch.cat; None where a part has no step."""
        if self.copy_library is None or any(getattr(p, "op_row", None) is None for p in self.parts):
            return None
        widths = [p.out_features for p in self.parts]
        scratch = [torch.empty(rows, w, dtype=torch.bfloat16) for w in widths]
        buffers.extend(scratch)
        steps, offset = [], 0
        for part, out, width in zip(self.parts, scratch, widths, strict=True):
            steps.append(part.op_row(x, out.data_ptr(), rows))
            steps.append(norm_cpu.copy_columns_row(self.copy_library, out.data_ptr(), y, rows, width, sum(widths), offset))
            offset += width
        return steps


class Int8Weight:
    """Per-output-channel symmetric int8 for ``torch._weight_int8pack_mm``."""

    def __init__(self, weight: torch.Tensor):
        w = weight.float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-8)  # [N]
        self.q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.scale = scale.to(torch.bfloat16)

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scale.numel() * self.scale.element_size()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, K] bfloat16
        return _INT8_MM(x, self.q, self.scale)


class Linear:
    """y = x @ W^T through the quantized kernel when there is one, else the dense weight.

    A plain callable, not an ``nn.Module``: a decode step makes 121 of these calls, and
    at one row ``Module.__call__`` plus the per-call dtype checks cost more than some of
    the kernels (measured in ``speclane bench decode``). The kernel is chosen once here.
    ``quantized`` is any weight with a kernel of ours or torch's (``FloatWeight`` too: its
    values are not quantized, but it runs a bfloat16 kernel as the quantized ones do).
    A quantized layer may still carry its dense weight (an output head quantized from dense
    weights keeps a float32 copy to refine its top logits, see ``LlamaModel.logits``).
    ``rows`` reads weight rows back in float32: the token embedding's lookup and the
    head's refinement, from the dense weight or from the quantized one's own values.
    """

    def __init__(
        self,
        dense: torch.Tensor | None,
        quantized: Int4Weight | GroupInt8Weight | FloatWeight | SplitWeight | Int8Weight | None = None,
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

    @property
    def nbytes(self) -> int:
        dense = 0 if self.dense is None else self.dense.numel() * self.dense.element_size()
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return dense + bias + (0 if self.quantized is None else self.quantized.nbytes)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [len(ids), in]: the weight's rows ``ids`` (an embedding lookup)."""
        if self.dense is not None:
            return self.dense[ids].float()
        rows = getattr(self.quantized, "dequantize_rows", None)
        if rows is None:
            raise TypeError(f"{type(self.quantized).__name__} keeps no rows to read back")
        return rows(ids)

    def op_steps(self, x: int, y: int, rows: int, buffers: list[torch.Tensor]) -> list[list[int]] | None:
        """This layer as a forward plan's steps (``models/forward_plan.py``) on ``rows`` rows
        at addresses x (bfloat16 [rows, in]) and y ([rows, out]), or None where it has no
        kernel of ours to call so (torch's kernels, a bias). Scratch the steps write goes
        into ``buffers``, for the plan to keep."""
        if self.bias is not None:
            return None
        op_steps = getattr(self.quantized, "op_steps", None)
        if op_steps is not None:  # a weight split between kinds
            return op_steps(x, y, rows, buffers)
        op_row = getattr(self.quantized, "op_row", None)
        return None if op_row is None else [op_row(x, y, rows)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [M, in] in ``input_dtype`` (the model keeps its activations there) -> [M, out]."""
        if x.dtype != self.input_dtype:
            x = x.to(self.input_dtype)
        y = self._matmul(x)
        return y if self.bias is None else y + self.bias
