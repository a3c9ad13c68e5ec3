"""The GGML tensor types a GGUF may hold: how each is loaded and which kernel runs it.

One table (``TYPES``). A matmul weight of a ``native`` type keeps the file's own values,
with no dense float32 copy and no requantization:

- ``int4`` (our int4 kernel, ``kernels/int4_x86.c``: w = q * scale + minimum, q in 0..15,
  groups of 32, scale and minimum kept by the kernel in float16), as a ``QuantizedTensor``:
  Q4_0 (scale d, minimum -8 d: both exact in float16), Q4_1 (d, m: the file's float16s),
  Q4_K (scale d * sc, minimum -dmin * m: float32 products of the file's float16s and 6-bit
  indices, rounded to float16 when packed for the kernel, a relative error of at most 2^-11).
- ``int8`` (our int8-group kernel, ``kernels/int8_x86.c``: q an int8, float32 scale and
  minimum, every value exact), as a ``QuantizedTensor``: Q8_0 (q, d), Q6_K (q - 32, d * sc,
  groups of 16), Q5_0 (q - 16, d), Q5_1 (q, d, m), Q5_K (q, d * sc, -dmin * m).
- ``float`` (our float-weight kernel, ``kernels/float_x86.c``: the weight read in its own
  element type, every value exact), as a ``FloatTensor``: F32, F16 and BF16, 4, 2 and 2
  bytes a value in memory, as in the file.

``dequantize`` of either gives the same float32 bits as ``gguf.quants.dequantize`` of the
file's data (tests/unit/test_gguf_types.py, tests/unit/test_float_kernel.py). The other
types load ``dense``: dequantized to float32 by gguf-py, as every tensor that is not a
layer's matmul weight (norms, the token embedding, the output head) does whatever its type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

Blocks = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]  # q [rows, cols], scale, minimum [rows, cols / group]


@dataclass
class QuantizedTensor:
    """A weight in a GGUF type's own values: w = q * scale + minimum per group of ``group``
    input columns (``minimum`` None: zero). ``kernel`` is ``int4`` (q uint8 in 0..15) or
    ``int8`` (q int8); scale and minimum are float32 [out, in / group]."""

    q: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor | None
    group: int
    kernel: str
    ggml_type: str

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.minimum) if t is not None)

    def rows(self, order: torch.Tensor) -> QuantizedTensor:
        """The same weight with its rows in ``order`` (llama.cpp's q/k permutation undone)."""
        return QuantizedTensor(self.q[order].contiguous(), self.scale[order].contiguous(),
                               None if self.minimum is None else self.minimum[order].contiguous(),
                               self.group, self.kernel, self.ggml_type)

    def dequantize(self) -> torch.Tensor:
        """float32 [out, in]: q * scale + minimum, gguf-py's values exactly."""
        out, cols = self.q.shape
        w = self.q.float().reshape(out, cols // self.group, self.group) * self.scale[..., None]
        if self.minimum is not None:
            w = w + self.minimum[..., None]
        return w.reshape(out, cols)


# The float element types our float kernel reads, by GGML name (a Hugging Face folder's
# safetensors dtypes take the same names: ``float_type_name``).
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass
class FloatTensor:
    """A weight in its source's own float type: ``values`` [out, in] float32, float16 or
    bfloat16 as the file holds it (``ggml_type`` F32, F16 or BF16), for our float kernel."""

    values: torch.Tensor
    ggml_type: str
    kernel: str = "float"

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size()

    def rows(self, order: torch.Tensor) -> FloatTensor:
        """The same weight with its rows in ``order`` (llama.cpp's q/k permutation undone)."""
        return FloatTensor(self.values[order].contiguous(), self.ggml_type)

    def dequantize(self) -> torch.Tensor:
        """float32 [out, in]: the values widened (exact), gguf-py's values bit for bit."""
        return self.values.float()


def float_type_name(dtype: torch.dtype) -> str | None:
    """The GGML name of a float dtype our float kernel reads (``FLOAT_DTYPES``), else None."""
    return next((name for name, d in FLOAT_DTYPES.items() if d == dtype), None)


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte ``at`` of each block, as float32 [rows, blocks]."""
    return raw[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 values: the low nibbles are values 0..15, the high ones 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1's 4 bytes of fifth bits (a little-endian uint32) -> 32 values of 0 or 16."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")  # bit i of the uint32 at index i
    return bits << 4


def _q4_0(raw: np.ndarray) -> Blocks:
    d = _f16(raw, 0)
    return _nibbles(raw[..., 2:]), d, -8 * d


def _q4_1(raw: np.ndarray) -> Blocks:
    return _nibbles(raw[..., 4:]), _f16(raw, 0), _f16(raw, 2)


def _q5_0(raw: np.ndarray) -> Blocks:
    q = (_nibbles(raw[..., 6:]) | _high_bits(raw[..., 2:6])).astype(np.int8) - np.int8(16)
    return q, _f16(raw, 0), None


def _q5_1(raw: np.ndarray) -> Blocks:
    return (_nibbles(raw[..., 8:]) | _high_bits(raw[..., 4:8])).astype(np.int8), _f16(raw, 0), _f16(raw, 2)


def _q8_0(raw: np.ndarray) -> Blocks:
    return raw[..., 2:].copy().view(np.int8), _f16(raw, 0), None


def _k_scales(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: (d * sc, -(dmin * m)) per sub-block of 32, float32 [rows, blocks, 8]."""
    from gguf.quants import Q4_K

    rows, blocks = raw.shape[:2]
    sc, m = Q4_K.get_scale_min(raw[..., 4:16].reshape(-1, 12).copy())
    d, dmin = _f16(raw, 0)[..., None], _f16(raw, 2)[..., None]
    return (d * sc.reshape(rows, blocks, 8).astype(np.float32),
            -(dmin * m.reshape(rows, blocks, 8).astype(np.float32)))


def _q4_k_nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes -> 256 values: 32 bytes per pair of sub-blocks, the low nibbles sub-block
    2j and the high ones sub-block 2j + 1 (llama.cpp's layout)."""
    chunks = qs.reshape(*qs.shape[:-1], 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)
    return (chunks & 0x0F).reshape(*qs.shape[:-1], 256)


def _q4_k(raw: np.ndarray) -> Blocks:
    scale, minimum = _k_scales(raw)
    return _q4_k_nibbles(raw[..., 16:]), scale, minimum


def _q5_k(raw: np.ndarray) -> Blocks:
    scale, minimum = _k_scales(raw)
    qh = raw[..., 16:48]  # bit j of byte i: the fifth bit of value 32 j + i
    high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1  # [..., 8, 32]
    q = _q4_k_nibbles(raw[..., 48:]) | (high.reshape(*qh.shape[:-1], 256) << 4)
    return q.astype(np.int8), scale, minimum


def _q6_k(raw: np.ndarray) -> Blocks:
    ql, qh = raw[..., :128], raw[..., 128:192]
    sc = raw[..., 192:208].copy().view(np.int8).astype(np.float32)  # [rows, blocks, 16]
    d = _f16(raw, 208)[..., None]
    lead = ql.shape[:-1]
    low = ((ql.reshape(*lead, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)) & 0x0F).reshape(*lead, 2, 4, 32)
    high = ((qh.reshape(*lead, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)) & 0x03)
    q = (low | (high << 4)).reshape(*lead, 256).astype(np.int8) - np.int8(32)
    return q, d * sc, None


@dataclass(frozen=True)
class GGMLType:
    """How a GGML type loads: ``native`` into a ``QuantizedTensor`` for ``kernel`` (``int4``
    or ``int8``) by ``blocks`` (a [rows, blocks, bytes] view of the file's blocks -> q,
    scale, minimum), or into a ``FloatTensor`` for ``kernel`` ``float`` (one value a block);
    or ``dense`` (float32, dequantized by gguf-py)."""

    name: str
    load: str
    kernel: str | None = None
    group: int = 32
    block_bytes: int = 0
    block_values: int = 32  # 1 for the float types
    blocks: Callable[[np.ndarray], Blocks] | None = None


def _native(name: str, kernel: str, block_values: int, block_bytes: int, blocks: Callable[[np.ndarray], Blocks],
            group: int = 32) -> GGMLType:
    return GGMLType(name, "native", kernel, group, block_bytes, block_values, blocks)


TYPES: dict[str, GGMLType] = {t.name: t for t in [
    _native("Q4_0", "int4", 32, 18, _q4_0),
    _native("Q4_1", "int4", 32, 20, _q4_1),
    _native("Q4_K", "int4", 256, 144, _q4_k),
    _native("Q8_0", "int8", 32, 34, _q8_0),
    _native("Q6_K", "int8", 256, 210, _q6_k, group=16),
    _native("Q5_0", "int8", 32, 22, _q5_0),
    _native("Q5_1", "int8", 32, 24, _q5_1),
    _native("Q5_K", "int8", 256, 176, _q5_k),
    *(GGMLType(name, "native", "float", group=1, block_bytes=FLOAT_DTYPES[name].itemsize, block_values=1)
      for name in FLOAT_DTYPES),
    # No kernel of ours reads these: dequantized to float32 (a dense copy, 4 bytes a weight).
    *(GGMLType(name, "dense") for name in ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS")),
]}


def unsupported_message(type_name: str) -> str:
    """The one line a ``ModelLoadError`` says for a tensor type outside ``TYPES``."""
    native = ", ".join(n for n, t in TYPES.items() if t.load == "native")
    dense = ", ".join(n for n, t in TYPES.items() if t.load == "dense")
    return f"unsupported type {type_name} (supported: {native} on our kernels; {dense} dequantized to float32)"


def float_tensor(kind: GGMLType, data: np.ndarray, rows: int, cols: int) -> FloatTensor:
    """A ``float`` type's tensor data (the file's values, [rows, cols], or BF16's bytes
    [rows, 2 cols]) as a ``FloatTensor`` in its own element type (a copy: the file's data is a
    read-only map)."""
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, cols * kind.block_bytes)
    return FloatTensor(torch.from_numpy(raw.copy()).view(FLOAT_DTYPES[kind.name]), kind.name)


def quantized_tensor(kind: GGMLType, data: np.ndarray, rows: int, cols: int) -> QuantizedTensor:
    """A ``native`` type's tensor data (the file's bytes, [rows, bytes per row]) as a
    ``QuantizedTensor`` of its own values."""
    if kind.blocks is None or cols % kind.block_values:
        raise ValueError(f"{kind.name}: {cols} columns are not whole blocks of {kind.block_values}")
    raw = np.asarray(data, dtype=np.uint8).reshape(rows, cols // kind.block_values, kind.block_bytes)
    q, scale, minimum = kind.blocks(raw)
    dtype = np.uint8 if kind.kernel == "int4" else np.int8
    q = torch.from_numpy(np.ascontiguousarray(q.astype(dtype, copy=False)).reshape(rows, cols))

    def groups(t: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(t, dtype=np.float32).reshape(rows, cols // kind.group))

    return QuantizedTensor(q, groups(scale), None if minimum is None else groups(minimum), kind.group, kind.kernel,
                           kind.name)
