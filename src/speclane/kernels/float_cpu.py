"""Our float-weight matmul (``float_x86.c``: AVX-512 or AVX2 build), built and loaded by
``build.py``: bfloat16 inputs times a weight kept in its source's own float type
(float32, float16 or bfloat16: a GGUF's F32, F16 and BF16 matmul weights, a Hugging Face
folder's safetensors), float32 sums, bfloat16 out. One entry point, ``float_matmul``, with
the weight's element type as its last argument (``ELEMENT_TYPES``). Each output is one
fixed left-to-right chain of float32 FMAs, so both builds give the same bits and a row's
result does not depend on the other rows of its call (``float_x86.c``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch

from speclane.kernels import build, plan_cpu

__all__ = ["ELEMENT_TYPES", "bind", "load", "pack", "source_digest"]

SOURCE = Path(__file__).with_name("float_x86.c")
ISAS = ("avx512", "avx2")  # the builds of SOURCE, widest first
LANES = 16  # output columns per packed tile (the C file's LANES)
# The weight element types the kernel reads: the C file's FLOAT32, FLOAT16, BFLOAT16.
ELEMENT_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def source_digest() -> str:
    return build.digest(SOURCE)


def declare(lib: ctypes.CDLL) -> None:
    lib.float_matmul.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    lib.float_matmul.restype = None


def load(isa: str | None = None) -> build.Kernel:
    """The ``isa`` build (or the widest at or below it), else the widest this CPU runs.
    KernelUnavailable where it cannot be built or run here."""
    return build.load(SOURCE, declare, ISAS, isa)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (float32, float16 or bfloat16) -> the C kernel's layout [N/16, K, 16],
    the same element type and values."""
    n, k = weight.shape
    if n % LANES or weight.dtype not in ELEMENT_TYPES:
        raise ValueError(f"our float kernel needs N % {LANES} == 0 and one of {', '.join(map(str, ELEMENT_TYPES))}; "
                         f"got [{n}, {k}] {weight.dtype}")
    return weight.reshape(n // LANES, LANES, k).permute(0, 2, 1).contiguous()


def bind(packed: torch.Tensor, lib: ctypes.CDLL) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x [M, K] bfloat16 -> x @ W^T [M, N] bfloat16`` for one packed weight (``pack``), by
    ``lib`` (a build of the kernel); the weight's pointer is taken once here."""
    entry = lib.float_matmul
    n, k = packed.shape[0] * LANES, packed.shape[1]
    weight, element = packed.data_ptr(), ELEMENT_TYPES[packed.dtype]
    bf16, empty = torch.bfloat16, torch.empty

    def call(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != bf16 or not x.is_contiguous():
            x = x.to(bf16).contiguous()
        rows, width = x.shape
        if width != k:
            raise ValueError(f"float matmul: input has {width} columns, the weight {k}")
        y = empty(rows, n, dtype=bf16)
        if rows:
            entry(x.data_ptr(), weight, y.data_ptr(), rows, n, k, element)
        return y

    op = plan_cpu.address(lib, "float_matmul_op")

    def op_row(x: int, y: int, rows: int) -> list[int]:
        """A forward plan's step (``plan_cpu``): this call on ``rows`` rows at addresses x and y."""
        return [op, x, weight, y, rows, n, k, element]

    call.keep_alive = packed  # the pointer above stays valid while the call lives
    call.op_row = op_row
    return call
